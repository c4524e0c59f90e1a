"""A sweep's rows in MLflow, against a real tracking server on loopback (sqlite backend), read back with
MLflow's own client: ``freezesweep export mlflow`` (idempotent; new and replaced rows added) and a
launch's live tracking through the row writer, whose failures never fail the sweep."""

import pytest
from urllib.parse import urlsplit
from dataclasses import replace

from typer.testing import CliRunner

from freezesweep.orchestrator.checks import load_spec
from freezesweep.orchestrator.cli import app
from freezesweep.orchestrator.launch import RowWriter
from freezesweep.orchestrator.progress import SweepProgress
from freezesweep.orchestrator.rows import result_row
from freezesweep.orchestrator.sweeps import resolve_here
from freezesweep.results.store import ResultStore, SpoolingWriter
from tests.factories import trial_result

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

runner = CliRunner()
# The server's start (its database migrations, on 2 busy cores up to a minute) makes these slow.
with_server = pytest.mark.slow


def _result(seed=0, status="ok", acc=0.8):
    """A row as a trial on a host returns it: the precision it ran in, the node it ran on."""
    return replace(trial_result(seed, status, acc), precision="fp32", placement={"hostname": "node-a"})


def _runs(uri: str, experiment: str) -> dict[str, object]:
    """trial_id → run, as MLflow's own client reads them back."""
    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id], max_results=1000) if found else []
    return {run.data.tags["freezesweep.trial_id"]: run for run in runs}


def _stored_sweep(write_spec, tmp_path, name: str) -> ResultStore:
    """A stored sweep (its spec, as a launch stores it) holding three ok rows and one failed row."""
    store = ResultStore(str(tmp_path / "store"), name)
    store.write_spec(resolve_here(load_spec(write_spec(name))).spec.to_yaml())
    for seed in range(3):
        store.write_row(result_row(name, _result(seed, acc=0.7 + seed / 10)))
    store.write_row(result_row(name, _result(3, status="failed")))
    return store


@with_server
def test_export_writes_each_row_as_a_run_and_adds_only_what_is_new(mlflow_server, write_spec, tmp_path):
    store = _stored_sweep(write_spec, tmp_path, "exported")
    args = [
        "export",
        "mlflow",
        "exported",
        "--store",
        str(tmp_path / "store"),
        "--tracking-uri",
        mlflow_server,
        "--experiment",
        "freeze-study",
    ]
    done = runner.invoke(app, args)
    assert done.exit_code == 0, done.output
    assert "4 run(s) added, 0 replaced by a newer row" in done.stdout
    # issue 36: MLflow printed two "View run" lines per run it ended; the export says where, once
    assert "View run" not in done.stdout and "View experiment" not in done.stdout
    assert f"at {mlflow_server})" in done.stdout
    runs = _runs(mlflow_server, "freeze-study")
    assert set(runs) == {_result(seed).trial_id for seed in range(4)}

    run = runs[_result(1).trial_id]  # accuracy 0.8 at step 4, 0.7 at step 2
    assert run.data.params["dataset"] == "glue/sst2" and run.data.params["train_size"] == "50"
    assert run.data.params["frozen_layers"] == "2" and run.data.params["seed"] == "1"
    assert run.data.params["precision"] == "fp32" and "learning_rate" in run.data.params  # the protocol
    assert run.data.metrics["best_val_accuracy"] == pytest.approx(0.8)
    assert run.data.metrics["final_val_accuracy"] == pytest.approx(0.8)
    assert (run.data.tags["status"], run.data.tags["precision"], run.data.tags["node"]) == ("ok", "fp32", "node-a")
    assert run.info.status == "FINISHED" and runs[_result(3).trial_id].info.status == "FAILED"
    curve = MlflowClient(tracking_uri=mlflow_server).get_metric_history(run.info.run_id, "eval_accuracy")
    assert [(m.step, round(m.value, 6)) for m in sorted(curve, key=lambda m: m.step)] == [(2, 0.7), (4, 0.8)]
    losses = MlflowClient(tracking_uri=mlflow_server).get_metric_history(run.info.run_id, "train_loss")
    assert sorted((m.step, m.value) for m in losses) == [(2, 0.7), (4, 0.6)]

    again = runner.invoke(app, args)
    assert "0 run(s) added, 0 replaced by a newer row, 4 already in MLflow" in again.stdout
    assert {t: r.info.run_id for t, r in _runs(mlflow_server, "freeze-study").items()} == {
        t: r.info.run_id for t, r in runs.items()
    }  # the same runs, nothing added

    store.write_row(result_row("exported", _result(3)))  # the failed cell's retry: ok now
    store.write_row(result_row("exported", _result(4)))  # a new cell
    third = runner.invoke(app, args)
    assert "1 run(s) added, 1 replaced by a newer row, 3 already in MLflow" in third.stdout
    after = _runs(mlflow_server, "freeze-study")
    assert len(after) == 5 and after[_result(3).trial_id].data.tags["status"] == "ok"


@with_server
def test_live_tracking_logs_each_row_as_it_lands_and_a_dead_server_never_fails_the_sweep(
    mlflow_server, tmp_path, capsys, monkeypatch
):
    from freezesweep.orchestrator.launch import row_tracker

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the dead server below: fail at once, not in minutes

    store = ResultStore(str(tmp_path / "store"), "live")
    sweep = _tracked_sweep(mlflow_server, "live")
    writer = RowWriter(
        "live",
        SpoolingWriter(store, str(tmp_path / "spool")),
        set(),
        SweepProgress(total=3, done=0, enabled=False),
        on_row=row_tracker(sweep),
    )
    writer.write(_result(0), 1)
    assert set(_runs(mlflow_server, "live")) == {_result(0).trial_id}  # logged as it landed
    writer.write(_result(1, status="failed"), 2)
    writer.write(_result(1), 1)  # the retry's row replaces the failed cell's run
    runs = _runs(mlflow_server, "live")
    assert len(runs) == 2 and runs[_result(1).trial_id].data.tags["status"] == "ok"
    assert "View run" not in capsys.readouterr().out  # a launch's progress, not MLflow's links

    dead = RowWriter(
        "dead",
        SpoolingWriter(ResultStore(str(tmp_path / "store"), "dead"), str(tmp_path / "spool2")),
        set(),
        SweepProgress(total=2, done=0, enabled=False),
        on_row=row_tracker(_tracked_sweep("http://127.0.0.1:9", "dead")),
    )  # nothing listens there
    for seed in range(2):
        dead.write(_result(seed), 1)
    assert dead.ok == 2 and len(ResultStore(str(tmp_path / "store"), "dead").statuses()) == 2  # rows all stored
    assert capsys.readouterr().err.count("warning: MLflow tracking at http://127.0.0.1:9 stopped") == 1


def _tracked_sweep(uri: str, name: str):
    """The little of a resolved sweep ``row_tracker`` reads: its name and the spec's tracking."""
    from types import SimpleNamespace

    from freezesweep.orchestrator.spec import TrackingSpec

    return SimpleNamespace(name=name, spec=SimpleNamespace(tracking=TrackingSpec(mlflow=uri)))


def test_a_spec_asking_for_mlflow_without_it_installed_is_refused_before_anything_runs(write_spec, monkeypatch):
    import importlib.util

    from freezesweep.orchestrator.spec import SpecError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(SpecError, match=r"tracking.mlflow: MLflow is not installed"):
        load_spec(write_spec("tracked", tracking={"mlflow": "http://127.0.0.1:5000"}))


@with_server
def test_a_launch_with_tracking_in_its_spec_logs_every_row(mlflow_server, write_spec, tmp_path):
    """The spec's opt-in, end to end: a real launch (Ray, the tiny model) and its rows as runs."""
    import ray

    from freezesweep.orchestrator.launch import launch

    spec = load_spec(write_spec("tracked", tracking={"mlflow": mlflow_server, "experiment": "tracked-live"}))
    try:
        summary = launch(spec, show_progress=False)
    finally:
        ray.shutdown()
    stored = ResultStore(spec.store, "tracked").statuses()
    runs = _runs(mlflow_server, "tracked-live")
    assert summary.ok == 4 and set(runs) == set(stored)
    assert {run.data.tags["status"] for run in runs.values()} == {"ok"}
    assert all("eval_accuracy" in run.data.metrics and "best_val_score" in run.data.metrics for run in runs.values())


# --- issue 36: an unreachable or refused tracker is found out in seconds, once, before the rows ---------
def _closed_port_uri() -> str:
    """A loopback port nothing listens on: a connection is refused at once."""
    from tests.conftest import free_port

    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture
def attempts(monkeypatch) -> list[tuple[str, int]]:
    """Every connection urllib3 opens (requests', so MLflow's HTTP client's too), as (host, port): a tracker that
    does not answer is asked once, not retried with MLflow's backoff (before: 7 retries, 251 s for an unknown
    host; a 57 s sweep took 321 s) — counted, not timed."""
    import urllib3.util.connection as connection

    opened: list[tuple[str, int]] = []
    real = connection.create_connection

    def counted(address, *args, **kwargs):
        opened.append(address)
        return real(address, *args, **kwargs)

    monkeypatch.setattr(connection, "create_connection", counted)
    return opened


def _asked(attempts: list[tuple[str, int]], uri: str) -> int:
    return sum(host == urlsplit(uri).hostname for host, _ in attempts)


@pytest.mark.parametrize("uri", ["closed-port", "http://no-such-host.invalid:5000"])
def test_export_to_a_tracker_that_does_not_answer_is_one_line_before_any_row(
    uri, write_spec, tmp_path, monkeypatch, attempts
):
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)  # MLflow's own retries, as a user has them
    uri = _closed_port_uri() if uri == "closed-port" else uri
    _stored_sweep(write_spec, tmp_path, "away")
    done = runner.invoke(app, ["export", "mlflow", "away", "--store", str(tmp_path / "store"), "--tracking-uri", uri])
    assert done.exit_code == 2, done.output
    assert done.exception is None or isinstance(done.exception, SystemExit)
    assert (
        f"freezesweep export mlflow: error: nothing exported: no MLflow tracking server answers at {uri}" in done.stderr
    )
    assert "View run" not in done.stdout
    assert _asked(attempts, uri) == 1  # one probe, no retries


@pytest.mark.parametrize("how", ["--tracking-uri", "file URI", "MLFLOW_TRACKING_URI"])
def test_a_folder_as_tracking_uri_gets_a_sentence_saying_what_to_use(how, write_spec, tmp_path, monkeypatch):
    """MLflow 3 refuses its folder store (./mlruns, which the docs named as the default): said in one sentence
    with what to use, before any row; nothing is made."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    _stored_sweep(write_spec, tmp_path, "local")
    args = ["export", "mlflow", "local", "--store", str(tmp_path / "store")]
    if how == "MLFLOW_TRACKING_URI":
        monkeypatch.setenv("MLFLOW_TRACKING_URI", "./mlruns")
    else:
        args += ["--tracking-uri", "./mlruns" if how == "--tracking-uri" else (tmp_path / "mlruns").as_uri()]
    done = runner.invoke(app, args)
    assert done.exit_code == 2, done.output
    assert "MLflow 3 no longer tracks into one: use a SQLite file (sqlite:///mlflow.db" in done.stderr
    assert "or a tracking server (http://host:5000)" in done.stderr
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "mlflow.db").exists()


def test_a_spec_tracking_into_a_folder_is_refused_with_what_to_use(write_spec, monkeypatch):
    from freezesweep.orchestrator.spec import SpecError

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(SpecError, match=r"tracking.mlflow: \./mlruns is a folder, and MLflow 3 no longer"):
        load_spec(write_spec("tracked", tracking={"mlflow": "./mlruns"}))


def test_live_tracking_with_nothing_listening_says_so_once_before_the_first_row(
    tmp_path, capsys, monkeypatch, attempts
):
    """Before: a 57 s sweep took 321 s, stuck at "0/4 done" while MLflow retried each row's first call."""
    from freezesweep.orchestrator.launch import row_tracker

    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    uri = _closed_port_uri()
    tracker = row_tracker(_tracked_sweep(uri, "dead"))
    said = capsys.readouterr().err
    assert said.count(f"warning: MLflow tracking at {uri} stopped before the first row: no MLflow") == 1
    writer = RowWriter(
        "dead",
        SpoolingWriter(ResultStore(str(tmp_path / "store"), "dead"), str(tmp_path / "spool")),
        set(),
        SweepProgress(total=4, done=0, enabled=False),
        on_row=tracker,
    )
    for seed in range(4):
        writer.write(_result(seed), 1)
    assert writer.ok == 4 and len(ResultStore(str(tmp_path / "store"), "dead").statuses()) == 4
    assert "MLflow" not in capsys.readouterr().err  # said once, before the rows; not again
    assert _asked(attempts, uri) == 1  # one probe; no row asked the tracker again


@with_server
def test_an_export_with_no_uri_writes_mlflows_own_default_and_says_where(write_spec, tmp_path, monkeypatch):
    """The docs said ./mlruns; MLflow 3 writes sqlite:///mlflow.db in the current folder: the docs now say
    so, and the export names where its runs went."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _stored_sweep(write_spec, tmp_path, "here")
    done = runner.invoke(app, ["export", "mlflow", "here", "--store", str(tmp_path / "store")])
    assert done.exit_code == 0, done.output
    assert f"at sqlite:///{tmp_path / 'mlflow.db'})" in done.stdout.replace("\n", "")
    assert (tmp_path / "mlflow.db").is_file() and not (tmp_path / "mlruns").exists()
    assert len(_runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "here")) == 4


def test_a_runs_params_say_what_the_row_ran_not_what_its_config_asked():
    """Before: a probe asked for pooling "auto" that ran with "mean" was logged as "auto" (the config's
    value overwrote the row's)."""
    import json

    from freezesweep.results.mlflow_export import run_params

    config = {"probe_pooling": "auto", "learning_rate": 5e-5, "method": "probe", "seed": 0}
    row = {"method": "probe", "seed": 0, "probe_pooling": "mean", "probe_c": 0.5, "config": json.dumps(config)}
    params = run_params(row)
    assert params["probe_pooling"] == "mean" and params["probe_c"] == "0.5" and params["learning_rate"] == "5e-05"


def test_a_new_sqlite_stores_set_up_stays_out_of_the_sweeps_lines(tmp_path, capfd):
    """Before: live tracking into a new SQLite file printed MLflow's INFO lines ("Creating initial MLflow
    database tables...") among the trials' lines."""
    from freezesweep.results.mlflow_export import MlflowRuns

    MlflowRuns(f"sqlite:///{tmp_path / 'mlflow.db'}", "quiet", "s")
    printed = capfd.readouterr()
    assert "Creating initial MLflow database tables" not in printed.err + printed.out
    assert (tmp_path / "mlflow.db").exists()


def test_a_folder_uri_is_told_to_migrate_only_runs_it_holds(tmp_path, monkeypatch):
    """A walk-through: a folder that does not exist was told `mlflow migrate-filestore` would move its runs."""
    from freezesweep.results.mlflow_export import folder_store_problem

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    assert "migrate-filestore" not in folder_store_problem(str(tmp_path / "none"))
    (tmp_path / "mlruns").mkdir()
    assert f"`mlflow migrate-filestore` moves {tmp_path / 'mlruns'}'s runs" in folder_store_problem(
        str(tmp_path / "mlruns")
    )
