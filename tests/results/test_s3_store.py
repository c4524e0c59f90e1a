"""The store on a real S3 API (moto's server on loopback), and what happens when it goes away."""

import pytest

from tests.conftest import ok_ids, ray_sweeps

from freezesweep.orchestrator.launch import launch, spool_dir
from freezesweep.results.store import StoreUnavailable
from freezesweep.orchestrator.checks import load_spec
from freezesweep.orchestrator.rows import result_row
from freezesweep.results.lock import LockLost
from freezesweep.results.store import ResultStore, SpoolingWriter
from tests.results.test_s3_lock import plant_holder, read_holder
from tests.factories import trial_result


def test_rows_round_trip_on_s3(s3):
    store = ResultStore(s3.uri, "remote")
    store.check_writable()
    for seed in range(3):
        store.write_row(result_row("remote", trial_result(seed)))
    assert len(store.read()) == 3 and ok_ids(store) == {trial_result(s).trial_id for s in range(3)}
    assert trial_result(0).trial_id in ok_ids(store)


def test_a_compaction_on_s3_leaves_no_compacting_marker(s3):
    """An object store has no empty folders, but its filesystem keeps a marker object for one."""
    import pyarrow.fs as pafs

    store = ResultStore(s3.uri, "remote")
    for seed in range(3):
        store.write_row(result_row("remote", trial_result(seed)))
    assert store.compact() == 3
    assert store.fs.get_file_info(store.compacting_dir).type == pafs.FileType.NotFound
    assert len(store.read()) == 3


def test_unreachable_store_spools_and_flushes(s3, tmp_path):
    store = ResultStore(s3.uri, "flaky")
    sink = SpoolingWriter(store, str(tmp_path / "spool"))
    assert sink.write_row(result_row("flaky", trial_result(0)))
    s3.stop()
    assert not sink.write_row(result_row("flaky", trial_result(1)))  # kept locally, not raised, not dropped
    assert not sink.write_row(result_row("flaky", trial_result(2)))
    assert len(sink.pending()) == 2 and isinstance(sink.last_error, OSError)
    s3.start()  # moto keeps its state in-process: the same bucket is back
    assert sink.flush() == 0
    assert len(store.read()) == 3


@pytest.mark.slow  # a long end-to-end run: `make test-slow` (CI runs both suites)
def test_sweep_on_s3_survives_the_store_going_away(s3, write_spec, monkeypatch):
    import ray

    from freezesweep.orchestrator import progress

    ray.shutdown()
    path = write_spec("s3sweep", store=s3.uri)
    original = progress.SweepProgress.advance

    def advance_then_outage(self, result, **kwargs):  # the store goes down right after the first stored row
        original(self, result, **kwargs)
        if self.failed == 0 and s3.server is not None:
            s3.stop()

    monkeypatch.setattr(progress.SweepProgress, "advance", advance_then_outage)
    with pytest.raises(StoreUnavailable, match="3 finished result.*kept in"):
        launch(load_spec(path, semantic=False), show_progress=False)
    store = ResultStore(s3.uri, "s3sweep")
    assert len(SpoolingWriter(store, spool_dir(store)).pending()) == 3

    monkeypatch.setattr(progress.SweepProgress, "advance", original)
    s3.start()
    again = launch(load_spec(path), show_progress=False)
    assert again.ran == 0  # the spooled rows were flushed first: nothing runs twice
    rows = store.read()
    assert len(rows) == 4 and (rows["status"] == "ok").all() and not rows["trial_id"].duplicated().any()
    ray.shutdown()


@ray_sweeps
def test_sweep_whose_lock_is_taken_over_stops_writing(s3, write_spec, monkeypatch):
    """Another driver takes the sweep over (this one was presumed dead) after the first stored row:
    the next row is not written to the store, and the launch ends saying why."""
    import ray

    from freezesweep.orchestrator import progress

    ray.shutdown()
    path = write_spec("taken", store=s3.uri, resources={"max_concurrent_trials": 1})
    store = ResultStore(s3.uri, "taken")
    original = progress.SweepProgress.advance

    def advance_then_takeover(self, result, **kwargs):
        original(self, result, **kwargs)
        plant_holder(store, pid=4242, host="elsewhere")

    monkeypatch.setattr(progress.SweepProgress, "advance", advance_then_takeover)
    with pytest.raises(LockLost, match="now held by pid 4242 on host elsewhere.*stopped writing"):
        launch(load_spec(path, semantic=False), show_progress=False)
    assert len(store.read()) == 1  # the row written before the takeover, none after
    assert len(SpoolingWriter(store, spool_dir(store)).pending()) == 1  # the finished result is kept locally
    assert read_holder(store)["pid"] == 4242  # the loser did not delete the new holder's lock
    ray.shutdown()
