"""Trial arrays through the orchestrator: one Ray Tune trial per array, cells in and rows out as
before (ids, schema, exactly once), resume running only an array's missing members."""

import pandas as pd
import pytest

from freezesweep.orchestrator import tune_adapter
from freezesweep.orchestrator.checks import load_spec
from freezesweep.orchestrator.launch import launch
from freezesweep.orchestrator.plan import build_grid
from freezesweep.orchestrator.sweeps import resolve_here
from tests.conftest import killed_launch, ray_sweeps

ON = {"trial_array": True}  # these cells run on a CPU, where auto trains them alone


@pytest.fixture(scope="module", autouse=True)
def _ray_once():
    yield
    import ray

    ray.shutdown()


@pytest.fixture
def tune_trials(monkeypatch):
    """What Tune was handed, one entry per Ray trial (the driver's searcher runs in this process)."""
    handed = []
    suggest = tune_adapter.CellSearcher.suggest

    def spy(self, trial_id):
        config = suggest(self, trial_id)
        if isinstance(config, dict):
            handed.append(config[tune_adapter.CELL_KEY].split(tune_adapter.ARRAY_SEPARATOR))
        return config

    monkeypatch.setattr(tune_adapter.CellSearcher, "suggest", spy)
    return handed


@pytest.fixture
def files_written(monkeypatch):
    """The name of every row file the driver wrote (before compaction absorbed it)."""
    from freezesweep.results.store import ResultStore

    names = []
    write = ResultStore._write_atomic

    def spy(self, final, payload, *args, **kwargs):
        names.append(final.rsplit("/", 1)[-1])
        return write(self, final, payload, *args, **kwargs)

    monkeypatch.setattr(ResultStore, "_write_atomic", spy)
    return names


def _rows(spec_path) -> pd.DataFrame:
    spec = load_spec(spec_path)
    rows = pd.read_parquet(f"{spec.store}/{spec.name}/results")
    assert not rows["trial_id"].duplicated().any(), "a cell has two rows"
    assert set(rows["trial_id"]) == {c.trial_id for c in build_grid(resolve_here(spec))}
    return rows.set_index("trial_id")


@ray_sweeps
def test_one_tune_trial_per_array_and_the_rows_of_single_trials(write_spec, tune_trials, files_written):
    """Each array is one Tune trial and its rows one file (the driver's work per cell divided by the
    width); the rows are the single trials' rows."""
    alone = write_spec("alone")
    arrayed = write_spec("arrayed", training=ON, resources={"array_width": 2})
    slotted = write_spec("slotted", training=ON)  # width 8: arrays of 2 pool into one queue of slots
    assert launch(load_spec(alone), show_progress=False).ok == 4
    assert len(tune_trials) == 4 and all(len(unit) == 1 for unit in tune_trials)
    assert sum(name.endswith(".parquet") and "-" not in name for name in files_written) == 4  # a file per row
    tune_trials.clear()
    files_written.clear()
    summary = launch(load_spec(arrayed), show_progress=False)
    assert (summary.ran, summary.ok) == (4, 4)
    assert sorted(len(unit) for unit in tune_trials) == [2, 2]  # (n = 24: k = 0, 2), (n = 48: k = 0, 2)
    assert sum(name.startswith("rows-") for name in files_written) == 2  # a file per array
    assert not any(name.endswith(".parquet") and "-" not in name for name in files_written)
    tune_trials.clear()
    assert launch(load_spec(slotted), show_progress=False).ok == 4
    assert [len(unit) for unit in tune_trials] == [4]
    assert set(_rows(slotted).index) == set(_rows(arrayed).index)
    assert all("trial_array" in o for o in _rows(slotted)["optimisations"])
    singles, members = _rows(alone), _rows(arrayed)
    assert set(singles.index) == set(members.index)  # the same cells: ids do not see the switch
    assert list(singles.columns) == list(members.columns)  # the same schema
    for trial_id, row in members.iterrows():
        single = singles.loc[trial_id]
        assert "trial_array" in row["optimisations"] and "trial_array" not in single["optimisations"]
        assert row["status"] == single["status"] == "ok" and row["attempts"] == 1
        assert row["best_step"] == single["best_step"]
        assert row["best_val_score"] == pytest.approx(single["best_val_score"], abs=1e-9)


@ray_sweeps
def test_rounds_keep_an_arrays_members_together(write_spec, tune_trials):
    """The grid's order puts an array's members as far apart as it has seeds (n, k, then seed): rounds
    cut in that order (2 cells a round: k = 0 of both seeds, then k = 2) split every array into cells
    alone. Rounds counted in Ray trials (one array a round here) keep both depths of a seed in one."""
    path = write_spec(
        "rounds", train_sizes=[24], seeds=[0, 1], training=ON, resources={"array_width": 2, "trials_per_round": 1}
    )
    summary = launch(load_spec(path), show_progress=False)
    assert (summary.ran, summary.ok) == (4, 4)
    cells = {c.trial_id: c for c in build_grid(resolve_here(load_spec(path)))}
    assert sorted(len(unit) for unit in tune_trials) == [2, 2]
    assert all(len({cells[i].seed for i in unit}) == 1 for unit in tune_trials)  # one seed, both depths
    assert all("trial_array" in o for o in _rows(path)["optimisations"])


@ray_sweeps
def test_a_crashing_member_retries_its_array_and_every_cell_gets_one_row(write_spec, tmp_path, monkeypatch):
    import ray

    monkeypatch.setenv("FREEZESWEEP_FAULT_DIR", str(tmp_path / "faults"))
    monkeypatch.setenv("FREEZESWEEP_FAULT", "crash@1:train_size=48,frozen_layers=2*1")
    ray.shutdown()  # workers must start with the fault switch in their environment
    path = write_spec("crashing", training=ON, resources={"max_failures": 1, "array_width": 2})
    summary = launch(load_spec(path), show_progress=False)
    assert (summary.ran, summary.ok) == (4, 4)
    rows = _rows(path).set_index(["train_size", "frozen_layers"])
    assert list(rows.loc[[(48, 0), (48, 2)], "attempts"]) == [2, 2]  # the array ran again, both members
    assert list(rows.loc[[(24, 0), (24, 2)], "attempts"]) == [1, 1]
    monkeypatch.delenv("FREEZESWEEP_FAULT")
    ray.shutdown()


@ray_sweeps
def test_a_member_that_always_crashes_fails_alone_and_its_array_mates_end_ok(write_spec, tmp_path, monkeypatch):
    """Before: one member's crash failed every member of its array, each row naming the crashing
    member's error (a new user's walk-through on a local cluster). Ray's retries of the array spent,
    its members run once more alone: each row says its own outcome."""
    import ray

    monkeypatch.setenv("FREEZESWEEP_FAULT", "crash@1:train_size=48,frozen_layers=2")
    ray.shutdown()  # workers must start with the fault switch in their environment
    path = write_spec("always", training=ON, resources={"max_failures": 0, "array_width": 2})
    summary = launch(load_spec(path), show_progress=False)
    assert (summary.total, summary.ok, summary.failed) == (4, 3, 1)
    rows = _rows(path).reset_index().set_index(["train_size", "frozen_layers"])
    assert rows.loc[(48, 0), "status"] == "ok"  # its array mate crashed; alone, it ends ok
    crashed = rows.loc[(48, 2)]
    assert crashed["status"] == "failed" and crashed["error"].startswith("RuntimeError: injected crash")
    assert crashed["trial_id"][:16] in crashed["error"].splitlines()[0]  # its own error, not its array's
    monkeypatch.delenv("FREEZESWEEP_FAULT")
    ray.shutdown()


@ray_sweeps
def test_resume_runs_only_the_missing_members_of_a_half_finished_array(write_spec, tmp_path, tune_trials):
    """One array of slots (n = 24 and 48, k = 0 and 2): the n = 24 members end first and their rows land
    as one file; the driver dies writing the n = 48 members' file. Resume runs those two, as one
    array (or writes Ray's record of them), and every cell ends with exactly one row."""
    path = write_spec("half", training=ON)
    killed_launch(path, "kill-in-write@2")
    spec = load_spec(path)
    first = pd.read_parquet(f"{spec.store}/half/results")
    assert sorted(first["train_size"]) == [24, 24]
    summary = launch(spec, show_progress=False)
    assert summary.ran + summary.recovered == 2 and summary.already_ok == 2
    missing = sorted(set(summary_ids(path)) - set(first["trial_id"]))
    assert [sorted(unit) for unit in tune_trials] == ([missing] if summary.ran == 2 else [])
    rows = _rows(path)
    assert len(rows) == 4 and (rows["status"] == "ok").all()
    kept = rows.loc[list(first["trial_id"])]
    assert list(kept["best_step"]) == list(first["best_step"])  # kept as they were
    assert all("trial_array" in o for o in rows["optimisations"])


def summary_ids(path) -> list[str]:
    return [c.trial_id for c in build_grid(resolve_here(load_spec(path)))]
