"""A real tiny sweep through Ray: launch, kill the driver mid-way, resume, grow, refuse changes."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.compute  # noqa: F401 (pa.compute)
import pytest

from freezesweep.orchestrator.plan import build_grid
from freezesweep.orchestrator.sweeps import resolve_here
from freezesweep.orchestrator.launch import launch
from freezesweep.orchestrator.checks import load_spec
from freezesweep.orchestrator.spec import SpecError
from tests.conftest import count_rows, ray_sweeps, rows_by_id

CLI = [sys.executable, "-m", "freezesweep.orchestrator.cli"]


@pytest.fixture(scope="module", autouse=True)
def _ray_once():
    yield
    import ray

    ray.shutdown()


def _rows(store_dir: Path, name: str) -> pd.DataFrame:
    return pd.read_parquet(store_dir / name / "results")


def _assert_exactly_once(spec_path):
    spec = load_spec(spec_path)
    rows = _rows(Path(spec.store), spec.name)
    expected = {c.trial_id for c in build_grid(resolve_here(spec))}
    assert not rows["trial_id"].duplicated().any()
    assert set(rows["trial_id"]) == expected
    assert (rows["status"] == "ok").all(), rows[["trial_id", "status", "error"]]
    return rows


def test_kill_driver_then_resume_runs_each_cell_once(write_spec, tmp_path):
    path = write_spec(
        "killed",
        train_sizes=[24, 48, 96],
        frozen_layers=[0, 1, 2],
        training={"epochs": 4},
        resources={"max_concurrent_trials": 1},
    )
    results_dir = tmp_path / "store" / "killed" / "results"
    log = tmp_path / "launch.log"
    with open(log, "w") as stdout:  # a file, as a cluster job's log: lines must reach it while the sweep runs
        driver = subprocess.Popen(
            CLI + ["launch", str(path)], start_new_session=True, stdout=stdout, stderr=subprocess.DEVNULL
        )
    deadline = time.time() + 240
    while time.time() < deadline and count_rows(results_dir) < 2:
        time.sleep(0.1)
    os.killpg(driver.pid, signal.SIGKILL)  # the driver and its embedded Ray, no goodbye
    driver.wait()
    done_at_kill = count_rows(results_dir)
    assert 2 <= done_at_kill < 9, "the kill must land mid-sweep for this test to mean anything"
    # a trial's line follows its row: every stored row but the last is in the log of the killed driver
    lines = [line for line in log.read_text().splitlines() if line.startswith("trial ")]
    assert done_at_kill - 1 <= len(lines) <= done_at_kill and lines[0].startswith("trial 1/9: "), lines

    before = rows_by_id(results_dir)
    resumed = subprocess.run(
        CLI + ["resume", "killed", "--store", str(tmp_path / "store")], capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert f"{done_at_kill} already done, ran {9 - done_at_kill}" in resumed.stdout
    rows = _assert_exactly_once(path)
    assert len(rows) == 9
    assert {tid: row for tid, row in rows_by_id(results_dir).items() if tid in before} == before


@ray_sweeps
def test_grow_by_one_depth_runs_only_new_cells(write_spec, tmp_path):
    first = launch(load_spec(write_spec("grow", frozen_layers=[0, 1])), show_progress=False)
    assert (first.total, first.ran, first.ok) == (4, 4, 4)
    store = tmp_path / "store" / "grow" / "results"
    stamps = rows_by_id(store)

    # (a deeper depth: a fixed grid's seeds, or a depth below its deepest, may not grow once a group may
    # have been decided, a second look: orchestrator/checks.py)
    grown = launch(load_spec(write_spec("grow", frozen_layers=[0, 1, 2])), show_progress=False)
    assert (grown.total, grown.already_ok, grown.ran, grown.ok) == (6, 4, 2, 2)
    assert {tid: row for tid, row in rows_by_id(store).items() if tid in stamps} == stamps
    rows = _assert_exactly_once(write_spec("grow", frozen_layers=[0, 1, 2]))
    assert sorted(rows["frozen_layers"].tolist()) == [0, 0, 1, 1, 2, 2]

    again = launch(load_spec(write_spec("grow", frozen_layers=[0, 1, 2])), show_progress=False)
    assert again.ran == 0

    # A row Ray finished but the driver never stored (it died in between): taken from Ray's
    # experiment state through Tuner.restore, not run again.
    newest = rows[rows["frozen_layers"] == 2]["trial_id"].iloc[0]  # run by the latest Tuner, whose state Ray keeps
    kept = _drop_row(store, newest)
    recovered = launch(load_spec(write_spec("grow", frozen_layers=[0, 1, 2])), show_progress=False)
    assert (recovered.recovered, recovered.ran) == (1, 0)
    back = pd.read_parquet(store, filters=[("trial_id", "==", newest)]).reset_index(drop=True)
    assert back.loc[0, "best_val_accuracy"] == kept.loc[0, "best_val_accuracy"]
    assert back.loc[0, "node_id"] == kept.loc[0, "node_id"] and back.loc[0, "gpus_per_trial"] == 0
    assert list(back.loc[0, "eval_curve"]) == list(kept.loc[0, "eval_curve"])

    # The store as it is, read with no freezesweep code.
    assert duckdb.sql(f"SELECT count(*) FROM read_parquet('{store}/*.parquet')").fetchall() == [(6,)]
    assert pl.read_parquet(f"{store}/*.parquet").filter(pl.col("status") == "ok").height == 6
    row = rows.iloc[0]
    assert row["node"] and row["attempts"] == 1 and row["device"].startswith("cpu")
    # Where every row ran: the embedded Ray's one node, this host; CPU trials name no GPU and share none.
    import socket

    import ray

    assert set(rows["node_id"]) == {ray.get_runtime_context().get_node_id()}
    assert set(rows["node_ip"]) == {ray.util.get_node_ip_address()}
    assert set(rows["hostname"]) == set(rows["node"]) == {socket.gethostname()}
    assert rows["gpu_uuid"].isna().all() and rows["gpu_index"].isna().all() and rows["trials_per_gpu"].isna().all()
    assert (rows["gpus_per_trial"] == 0).all() and not rows["oom_retry"].any()
    assert '"torch"' in row["versions"]
    # the reference schedule, 2 epochs: n=24 → every ceil(0.5*24/16)=1 of 4 steps; n=48 → every 2 of 6
    assert {n: len(curve) for n, curve in zip(rows["train_size"], rows["eval_curve"])} == {24: 4, 48: 3}

    # Changing the protocol of a sweep that has rows is refused, and nothing is touched.
    files = {p.name: p.read_bytes() for p in store.glob("*.parquet")}
    with pytest.raises(SpecError, match="training.learning_rate: changed from 0.003 to 0.001"):
        load_spec(write_spec("grow", seeds=[0, 1], training={"learning_rate": 0.001}))
    assert {p.name: p.read_bytes() for p in store.glob("*.parquet")} == files

    # Shrunk (k = 2 removed, a seed added: one seed decided nothing): Ray's saved state still holds the
    # k = 2 trials, which are rows already; none is written again, nor counted as a cell of the grid (a
    # review: the first draft "recovered" them, a second row each, and "22/18" came back)
    shrunk = launch(load_spec(write_spec("grow", frozen_layers=[0, 1], seeds=[0, 1])), show_progress=False)
    assert (shrunk.total, shrunk.already_ok, shrunk.recovered, shrunk.ran) == (8, 4, 0, 4)
    ids = duckdb.sql(f"SELECT trial_id FROM read_parquet('{store}/*.parquet')").df()["trial_id"]
    assert len(ids) == 10 and not ids.duplicated().any()


def _drop_row(results: Path, trial_id: str) -> pd.DataFrame:
    """The row gone from whichever file holds it (as if the driver died before storing it); returns it."""
    import pyarrow.parquet as pq

    for path in results.glob("*.parquet"):
        table = pq.read_table(path)
        mine = pa.compute.equal(table["trial_id"], trial_id)
        if pa.compute.any(mine).as_py():
            rest = table.filter(pa.compute.invert(mine))
            if len(rest):
                pq.write_table(rest, path)
            else:
                path.unlink()
            return table.filter(mine).to_pandas()
    raise AssertionError(f"no row of {trial_id}")


def test_cli_status_query_summary(write_spec, tmp_path):
    """Also the one sweep with precision auto: resolved once, stored resolved, named in every row."""
    from freezesweep.trials.precision import auto_precision

    path = write_spec("cli", training={"precision": "auto"})
    launch(load_spec(path), show_progress=False)
    store = str(tmp_path / "store")
    stored = load_spec(tmp_path / "store" / "cli" / "spec.yaml", semantic=False)
    rows = pd.read_parquet(tmp_path / "store" / "cli" / "results")
    assert stored.training.precision == auto_precision("cpu") == rows["precision"].unique().item()
    assert launch(load_spec(path), show_progress=False).ran == 0  # auto again, same machine: nothing to redo
    status = subprocess.run(CLI + ["status", "cli", "--store", store], capture_output=True, text=True)
    assert status.returncode == 0 and "total" in status.stdout
    assert "rows ran on 1 node(s), 0 GPU(s)" in status.stdout  # counted by Ray node id
    query = subprocess.run(
        CLI
        + [
            "query",
            "cli",
            "--store",
            store,
            "--format",
            "csv",
            "--sql",
            "SELECT frozen_layers, count(*) AS n FROM results GROUP BY 1 ORDER BY 1",
        ],
        capture_output=True,
        text=True,
    )
    assert query.stdout.splitlines() == ["frozen_layers,n", "0,2", "2,2"]
    summary = subprocess.run(
        CLI + ["summary", "cli", "--store", store, "--format", "json"], capture_output=True, text=True
    )
    table = pd.read_json(__import__("io").StringIO(summary.stdout))
    assert len(table) == 4 and set(table["n"]) == {1}
    missing = subprocess.run(CLI + ["status", "nope", "--store", store], capture_output=True, text=True)
    assert missing.returncode == 2 and "no sweep named 'nope'" in missing.stderr


def _launch_until_rows(write_spec, tmp_path, name: str, rows: int):
    """A 9-cell launch in its own process, returned once it has stored ``rows`` rows."""
    path = write_spec(
        name,
        train_sizes=[24, 48, 96],
        frozen_layers=[0, 1, 2],
        training={"epochs": 8},
        resources={"max_concurrent_trials": 1},
    )
    results = tmp_path / "store" / name / "results"
    driver = subprocess.Popen(
        CLI + ["launch", str(path)], start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 240
    while time.time() < deadline and count_rows(results) < rows:
        time.sleep(0.1)
    return path, results, driver


@ray_sweeps
def test_ctrl_c_stops_cleanly_and_says_what_is_left(write_spec, tmp_path):
    path, results, driver = _launch_until_rows(write_spec, tmp_path, "interrupted", rows=2)
    driver.send_signal(signal.SIGINT)
    out, _ = driver.communicate(timeout=120)
    done = count_rows(results)
    assert driver.returncode == 130 and done < 9
    # the spec names its own store: the hint names it (a walk-through ran `resume NAME` and found nothing)
    assert (
        f"{9 - done} cells not finished (interrupted): `freezesweep resume interrupted --store {tmp_path / 'store'}`"
        in out
    )
    assert not (tmp_path / "store" / "interrupted" / "_lock.json").exists()  # released on the way out
    resumed = launch(load_spec(path), show_progress=False)
    assert resumed.ran == 9 - done and resumed.unfinished == 0
    _assert_exactly_once(path)


@pytest.mark.slow  # a long end-to-end run: `make test-slow` (CI runs both suites)
def test_sigterm_stops_like_ctrl_c(write_spec, tmp_path):
    """SIGTERM (a scheduler stopping the driver): trials stopped, lock released, every process the driver
    started gone, exit 143 and the resume hint (before: exit 134 and Ray's native crash dump)."""
    import psutil

    _, _, driver = _launch_until_rows(write_spec, tmp_path, "terminated", rows=1)
    started = psutil.Process(driver.pid).children(recursive=True)
    assert started, "the driver should have started Ray's processes"
    driver.send_signal(signal.SIGTERM)
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 143, err[-3000:]
    assert (
        f"cells not finished (stopped by SIGTERM): `freezesweep resume terminated --store {tmp_path / 'store'}`" in out
    )
    assert "core dumped" not in err and "*** SIGTERM received" not in err
    assert not (tmp_path / "store" / "terminated" / "_lock.json").exists()
    _, alive = psutil.wait_procs(started, timeout=60)
    assert not alive, [p.info if hasattr(p, "info") else p for p in alive]


@ray_sweeps
def test_resume_from_another_folder_reads_relative_paths_from_the_launch_folder(
    tiny_bert, toy_dataset, tmp_path, monkeypatch, capsys
):
    """Before: a spec naming its dataset and model by relative paths, resumed from another folder,
    refused with "no such folder here" (a new user's walk-through); the cell ids name them as written."""
    import shutil

    import freezesweep as fs

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    shutil.copytree(toy_dataset, project / "data" / "toy")
    shutil.copytree(tiny_bert, project / "models" / "tiny")
    elsewhere.mkdir()
    spec = {
        "name": "relative",
        "model": "models/tiny",
        "datasets": ["data/toy"],
        "train_sizes": [24],
        "frozen_layers": [0],
        "seeds": [0],
        "training": {"epochs": 1, "learning_rate": 0.003, "eval_batch_size": 32, "precision": "fp32"},
        "resources": {"cpus_per_trial": 1},
        "store": "sweeps",
    }
    monkeypatch.chdir(project)
    first = fs.launch(fs.build_spec(**spec), progress=False)
    assert (first.ran, first.ok) == (1, 1)
    sweep = project / "sweeps" / "relative"
    for kept in ("results", "_ray"):  # every row and Ray's record of them gone: its cell pending again
        shutil.rmtree(sweep / kept)
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    again = fs.resume("relative", store=str(project / "sweeps"), progress=False)
    assert (again.ran, again.ok) == (1, 1)
    assert f"read from the folder it was launched in, {project}" in capsys.readouterr().err
    assert Path.cwd() == elsewhere  # the folder the caller works in is given back
    assert set(pd.read_parquet(sweep / "results")["dataset"]) == {"data/toy"}  # the ids name the paths as written
