"""orchestrator/tune_adapter.py, the only user of Ray Tune, in units (no Ray started): the trial's side
of checkpoints, the driver's outcome callback, a run whose storage goes away at its end, and what
Tune's state gives back."""

import dataclasses
import json

import pytest

from freezesweep.orchestrator import tune_adapter
from freezesweep.orchestrator.checks import load_spec
from freezesweep.orchestrator.plan import build_grid
from freezesweep.orchestrator.ray_storage import ray_storage
from freezesweep.orchestrator.sweeps import resolve_here
from freezesweep.results.store import ResultStore

S3_URI = "s3://bucket/sweeps?endpoint_override=127.0.0.1:9&scheme=http&region=us-east-1"


def test_checkpoint_refused_by_ray_storage_lets_the_trial_run_on(monkeypatch, tmp_path):
    """A node that cannot write Ray's storage (a local store on another machine): the first refusal is
    reported to the driver in words, later checkpoints are not even tried, and nothing is raised."""
    reports = []

    def report(metrics, checkpoint=None):
        if checkpoint is not None:
            raise RuntimeError("Unable to set up cluster storage")
        reports.append(metrics)

    monkeypatch.setattr(tune_adapter.tune, "report", report)
    keeper = tune_adapter.RayCheckpoints(str(tmp_path), json.dumps({"node_ip": "10.0.0.2"}))
    keeper(tmp_path / "cell.pt")
    keeper(tmp_path / "cell.pt")
    assert (
        len(reports) == 1
        and "RuntimeError: Unable to set up cluster storage" in reports[0][tune_adapter.CHECKPOINT_ERROR_KEY]
    )


def test_a_passing_checkpoint_failure_after_a_saved_one_is_tried_again(monkeypatch, tmp_path):
    """Storage that took a checkpoint from this node and then failed once (briefly unreachable): the
    failure is reported and the next checkpoint is tried, and saved."""
    outcomes = iter([None, OSError("connection reset"), None])
    saved, reports = [], []

    def report(metrics, checkpoint=None):
        if checkpoint is None:
            reports.append(metrics)
            return
        failure = next(outcomes)
        if failure:
            raise failure
        saved.append(checkpoint)

    monkeypatch.setattr(tune_adapter.tune, "report", report)
    keeper = tune_adapter.RayCheckpoints(str(tmp_path), json.dumps({"node_ip": "10.0.0.2"}))
    for _ in range(3):
        keeper(tmp_path / "cell.pt")
    assert len(saved) == 2 and not keeper.refused
    assert len(reports) == 1 and "connection reset" in reports[0][tune_adapter.CHECKPOINT_ERROR_KEY]


def test_driver_warns_once_about_refused_checkpoints(capsys):
    class Trial:
        num_failures = 0

    writer = tune_adapter.OutcomeCallback(lambda *args: None, {})
    refused = {
        tune_adapter.CHECKPOINT_ERROR_KEY: "RuntimeError: no storage",
        tune_adapter.PLACEMENT_KEY: json.dumps({"node_ip": "10.0.0.2"}),
    }
    writer.on_trial_result(0, [], Trial(), refused)
    writer.on_trial_result(0, [], Trial(), refused)
    err = capsys.readouterr().err
    assert err.count("warning: trials on 10.0.0.2 cannot use checkpoints") == 1 and "no storage" in err


def test_hang_is_a_fault_kind(tiny_trial, monkeypatch):
    """Rules are parsed at every evaluation; a hang fires only at its own."""
    from freezesweep.trials import faults

    monkeypatch.setenv(faults.FAULT_ENV, "hang@2:seed=0*1")
    faults.maybe_inject(tiny_trial, evals_done=1)
    monkeypatch.setenv(faults.FAULT_ENV, "stall@2")
    with pytest.raises(ValueError, match="oom<SHARE, hang or meetK"):
        faults.maybe_inject(tiny_trial, evals_done=1)


def test_meet_fault_holds_each_trial_until_enough_have_come(tiny_trial, monkeypatch, tmp_path):
    """`meetK` is a barrier across processes (marks in a shared folder), bounded in time."""
    import dataclasses
    import threading

    from freezesweep.trials import faults

    monkeypatch.setenv(faults.FAULT_ENV, "meet2@1")
    monkeypatch.setenv(faults.FAULT_DIR_ENV, str(tmp_path))
    first = threading.Thread(target=faults.maybe_inject, args=(tiny_trial, 1))
    first.start()
    first.join(timeout=1.0)
    assert first.is_alive()  # alone at the meeting point, it waits
    faults.maybe_inject(dataclasses.replace(tiny_trial, seed=tiny_trial.seed + 1), evals_done=1)
    first.join(timeout=30)
    assert not first.is_alive()
    monkeypatch.setattr(faults, "MEET_TIMEOUT_S", 0.1)
    monkeypatch.setenv(faults.FAULT_ENV, "meet9@1")
    faults.maybe_inject(tiny_trial, evals_done=1)  # nine never come: it goes on at the bound
    for bad in ("meet@1", "meet0@1", "meetx@1"):
        monkeypatch.setenv(faults.FAULT_ENV, bad)
        with pytest.raises(ValueError, match="meetK"):
            faults.maybe_inject(tiny_trial, evals_done=1)


def test_cluster_run_ends_normally_when_the_remote_store_is_gone_by_its_end(monkeypatch, write_spec):
    """Ray reads its state back from its storage after the last trial: a remote store gone by then
    fails that read, yet every outcome is spooled, so the run returns (the launch's flush then says
    what is kept where). A local store's error is not the store going away: it propagates."""
    import dataclasses

    from ray import tune

    class Tuner:  # Ray's, as it ends with the store unreachable
        def __init__(self, *args, **kwargs):
            pass

        def fit(self):
            raise OSError("When listing objects under key '…/_ray/…': Could not connect to server")

    monkeypatch.setattr(tune, "Tuner", Tuner)

    def on_cluster(name, **store):
        spec = load_spec(write_spec(name, address="10.0.0.1:6379", **store), semantic=False)
        return dataclasses.replace(resolve_here(spec), address=spec.address)

    remote, ignore = on_cluster("remote", store=S3_URI), lambda *args: None
    shared = ray_storage(ResultStore(S3_URI, "remote"), cluster=True)
    tune_adapter.run_tune(remote, [], shared, ignore, experiment="remote")
    # With a cell that has no outcome yet the error is not the end's read: it propagates.
    with pytest.raises(OSError, match="Could not connect"):
        tune_adapter.run_tune(remote, build_grid(remote)[:1], shared, ignore, experiment="remote")
    local = on_cluster("local")
    with pytest.raises(OSError, match="Could not connect"):
        tune_adapter.run_tune(
            local, [], ray_storage(ResultStore(local.spec.store, "local"), cluster=True), ignore, experiment="local"
        )


def test_a_checkpoint_this_node_cannot_read_starts_the_trial_over(monkeypatch, tmp_path):
    """Filling the trial's folder from a checkpoint that cannot be read (another machine's disk) leaves
    it empty and tells the driver, instead of failing the attempt."""
    from ray import tune

    reports = []
    monkeypatch.setattr(tune_adapter.tune, "report", lambda metrics, checkpoint=None: reports.append(metrics))
    folder = tmp_path / "trial"
    folder.mkdir()
    (folder / "stale.pt").write_bytes(b"x")
    tune_adapter.fill_from(folder, tune.Checkpoint(str(tmp_path / "elsewhere" / "checkpoint_000001")), "{}")
    assert folder.is_dir() and not list(folder.iterdir())
    assert len(reports) == 1 and reports[0][tune_adapter.CHECKPOINT_ERROR_KEY].startswith("reading ")


class _Trial:
    """What the callback reads of Ray's trial object."""

    def __init__(self, cell, num_failures=0, last_result=None, error_file=None):
        self.config = {tune_adapter.CELL_KEY: cell.trial_id}
        self.num_failures, self.last_result = num_failures, last_result or {}
        self.error_file, self.pickled_error_file = error_file, None


def test_a_ray_config_with_unknown_keys_is_refused(tiny_trial):
    cells = {"abc": tiny_trial.to_dict()}
    assert tune_adapter.trial_config_from_ray({tune_adapter.CELL_KEY: "abc"}, cells) == tiny_trial
    with pytest.raises(ValueError, match="unknown keys in Ray trial config: lr"):
        tune_adapter.trial_config_from_ray({tune_adapter.CELL_KEY: "abc", "lr": 1}, cells)


def test_the_callback_hands_over_each_outcome_once_with_its_attempts(tiny_trial, tmp_path):
    """A finished trial's result (its JSON in the last report) and a trial whose retries are spent (a
    failed row, with Ray's traceback and where it last reported from); checkpoints dropped for both."""
    from freezesweep.trials.config import TrialResult

    outcomes, over = [], []
    cell = dataclasses.replace(tiny_trial, precision="fp32")
    callback = tune_adapter.OutcomeCallback(
        lambda results, attempts: outcomes.extend((result, attempts) for result in results),
        {cell.trial_id: cell.to_dict()},
        trial_over=over.append,
    )
    done = TrialResult(trial_id=cell.trial_id, config=cell, status="ok", best_val_score=0.9)
    callback.on_trial_result(0, [], _Trial(cell), {"val_accuracy": 0.5})  # an evaluation: nothing yet
    callback.on_trial_result(
        0, [], _Trial(cell, num_failures=1), {tune_adapter.RESULT_KEY: json.dumps(done.to_dict(), default=str)}
    )
    callback.on_trial_complete(0, [], _Trial(cell))
    error_file = tmp_path / "error.txt"
    error_file.write_text("Traceback (most recent call last):\n  ...\nRuntimeError: boom\n")
    placed = {tune_adapter.PLACEMENT_KEY: json.dumps({"node_ip": "10.0.0.7"})}
    callback.on_trial_error(0, [], _Trial(cell, num_failures=3, last_result=placed, error_file=str(error_file)))
    [(ok, ok_attempts), (failed, failed_attempts)] = outcomes
    assert (ok.status, ok.best_val_score, ok_attempts) == ("ok", 0.9, 2)
    assert (failed.status, failed_attempts, failed.placement) == ("failed", 3, {"node_ip": "10.0.0.7"})
    assert "RuntimeError: boom" in failed.error
    assert over == [cell.trial_id, cell.trial_id]


def test_an_arrays_report_of_several_rows_hands_over_each(tiny_trial):
    """A trial array reports the rows that became final at one step as one result (a list): they reach
    the sink together (one file of rows), with the array's attempts; a single trial's report (one row)
    as before."""
    from freezesweep.trials.config import TrialResult

    cells = [dataclasses.replace(tiny_trial, precision="fp32", frozen_layers=k) for k in (0, 1, 2)]
    outcomes = []
    callback = tune_adapter.OutcomeCallback(
        lambda results, attempts: outcomes.append([(r.trial_id, r.status, attempts) for r in results]),
        {c.trial_id: c.to_dict() for c in cells},
    )
    rows = [TrialResult(trial_id=c.trial_id, config=c, status="ok", best_val_score=0.8) for c in cells]
    trial = _Trial(cells[0], num_failures=1)
    payload = json.dumps([r.to_dict() for r in rows[:2]], default=str)
    callback.on_trial_result(0, [], trial, {tune_adapter.RESULT_KEY: payload})
    callback.on_trial_result(0, [], trial, {tune_adapter.RESULT_KEY: json.dumps(rows[2].to_dict(), default=str)})
    assert outcomes == [[(c.trial_id, "ok", 2) for c in cells[:2]], [(cells[2].trial_id, "ok", 2)]]
    assert [r.trial_id for r in tune_adapter.reported_rows(payload)] == [c.trial_id for c in cells[:2]]


def test_an_array_reports_the_rows_over_at_one_step_once(tiny_trial, monkeypatch):
    """A Ray trial running an array of two depths (one seed: over at the same step): its first member's
    evaluations as progress, then one report with both rows, placed where they ran."""
    reports = []
    monkeypatch.setattr(tune_adapter.tune, "report", lambda metrics, checkpoint=None: reports.append(metrics))
    cells = [dataclasses.replace(tiny_trial, trial_array=True, frozen_layers=k) for k in (0, 1)]
    tune_adapter.array_trainable(cells, cells, {"node_ip": "10.0.0.7"}, width=None)
    rows = [r for r in reports if tune_adapter.RESULT_KEY in r]
    assert len(rows) == 1 and reports[-1] is rows[0]
    given = tune_adapter.reported_rows(rows[0][tune_adapter.RESULT_KEY])
    assert [r.trial_id for r in given] == [c.trial_id for c in cells]
    assert all(r.status == "ok" and "trial_array" in r.optimisations for r in given)
    assert all(r.placement["node_ip"] == "10.0.0.7" for r in given)
    assert len(reports) - 1 == len(given[0].eval_curve)  # the first member's evaluations, one report each


def test_nothing_is_recovered_from_a_state_ray_never_wrote(tmp_path):
    storage = ray_storage(ResultStore(str(tmp_path / "store"), "s"), cluster=False)
    assert tune_adapter.recover_from_ray(storage, "s", {"a"}) == []
    (tmp_path / "store" / "s" / "_ray" / "s").mkdir(parents=True)
    (tmp_path / "store" / "s" / "_ray" / "s" / "tuner.pkl").write_bytes(b"not a pickle")  # corrupt: re-run
    assert tune_adapter.recover_from_ray(storage, "s", {"a"}) == []


def test_a_fed_run_hands_out_the_feeds_cells_with_their_fields_and_tells_it_each_trial_is_over(write_spec):
    """CellSearcher with a feed (settle mode's next cells): the first units by id (their fields are in the
    object store), the ones added as the run went with their fields in the trial's config; None while
    the feed waits, Tune's FINISHED once it has no more; the feed told of each trial that is over, and
    left out of what Tune pickles (tuner.pkl)."""
    import pickle
    import threading

    cells = build_grid(resolve_here(load_spec(write_spec("fed", seeds=[0, 1]), semantic=False)))
    first, later = [[c] for c in cells[:2]], [[c] for c in cells[2:]]

    ended = []

    class Feed:
        lock = threading.Lock()  # something a live feed holds that pickles not
        answers = [None, later, None, []]

        def more(self):
            return self.answers.pop(0)

        def over(self, unit):
            ended.append(unit)

    searcher = tune_adapter.CellSearcher(first, Feed())
    configs = [searcher.suggest(f"t{i}") for i in range(2)]
    assert configs == [{tune_adapter.CELL_KEY: c.trial_id} for [c] in first]
    assert searcher.suggest("t2") is None  # the feed waits for rows
    added = [searcher.suggest(f"t{i}") for i in range(2, 2 + len(later))]
    assert [tune_adapter.trial_config_from_ray(config, {}) for config in added] == [c for [c] in later]
    assert searcher.suggest("tx") is None and searcher.suggest("ty") == tune_adapter.Searcher.FINISHED
    searcher.on_trial_complete("t2")
    searcher.on_trial_complete("t0", error=True)
    assert ended == [later[0], first[0]]
    assert pickle.loads(pickle.dumps(searcher))._feed is None
    with pytest.raises(ValueError, match="unknown keys in Ray trial config: other"):
        tune_adapter.trial_configs_from_ray({**added[0], "other": 1}, {})
