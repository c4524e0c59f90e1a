"""The sweep lock on a real S3 API (moto's server on loopback): conditional writes make it exclusive."""

import json
import time

import pyarrow.fs as pafs
import pytest

from tests.conftest import ok_ids

from freezesweep.orchestrator.rows import result_row
from freezesweep.results.lock import LOCK_FILE, LockLost, SweepLock, SweepLocked
from freezesweep.results.store import ResultStore, SpoolingWriter
from tests.factories import trial_result


def plant_holder(store: ResultStore, **holder) -> None:
    """Write the lock object as another driver would have (plain pyarrow, not the code under test)."""
    base = {"host": "elsewhere", "pid": 4242, "token": "theirs", "started_at": time.time(), "heartbeat_at": time.time()}
    with store.fs.open_output_stream(f"{store.sweep_dir}/{LOCK_FILE}") as f:
        f.write(json.dumps({**base, **holder}).encode())


def read_holder(store: ResultStore) -> dict | None:
    try:
        with store.fs.open_input_stream(f"{store.sweep_dir}/{LOCK_FILE}") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return None


def _lock(s3, sweep: str, **kw) -> tuple[SweepLock, ResultStore]:
    store = ResultStore(s3.uri, sweep)
    return SweepLock(store.fs, store.sweep_dir, uri=s3.uri, **kw), store


def test_two_contenders_exactly_one_holds(s3):
    first, store = _lock(s3, "race")
    second, _ = _lock(s3, "race")
    second._read = lambda: (None, None)  # it looked before the first wrote: both saw a free sweep
    first.acquire()
    with pytest.raises(SweepLocked, match="already running"):
        second.acquire()  # its put-if-absent is refused: it never believes it holds the sweep
    assert read_holder(store)["token"] == first.me.token
    first.release()
    assert read_holder(store) is None


def test_live_holder_refuses_another_driver(s3):
    store = ResultStore(s3.uri, "busy")
    plant_holder(store)  # fresh heartbeat, another host
    with pytest.raises(SweepLocked, match="pid 4242 on host elsewhere"):
        _lock(s3, "busy", stale_after_s=60)[0].acquire()
    assert read_holder(store)["token"] == "theirs"


def test_stale_lock_is_taken_over_by_exactly_one(s3):
    first, store = _lock(s3, "stale", stale_after_s=60)
    second, _ = _lock(s3, "stale", stale_after_s=60)
    plant_holder(store, heartbeat_at=time.time() - 600)  # a crashed driver on another host
    snapshot = second._read()  # the second reads the stale lock ...
    first.acquire()  # ... the first takes it over ...
    second._read = lambda: snapshot
    with pytest.raises(SweepLocked, match="already running"):
        second.acquire()  # ... so replacing the version the second saw fails
    assert read_holder(store)["token"] == first.me.token
    aside = [i for i in store.fs.get_file_info(pafs.FileSelector(store.sweep_dir)) if "_lock.stale-" in i.path]
    assert len(aside) == 1  # the crashed holder's lock kept, not lost
    first.release()


def test_lost_lock_stops_store_writes(s3, tmp_path):
    lock, store = _lock(s3, "lost", stale_after_s=60)
    lock.acquire()
    store.guard = lock.check
    sink = SpoolingWriter(store, str(tmp_path / "spool"))
    assert sink.write_row(result_row("lost", trial_result(0)))
    plant_holder(store)  # taken over: this driver was presumed dead
    with pytest.raises(LockLost, match="now held by pid 4242 on host elsewhere.*stopped writing"):
        sink.write_row(result_row("lost", trial_result(1)))
    assert ok_ids(store) == {trial_result(0).trial_id}  # nothing written after the takeover
    assert len(sink.pending()) == 1  # the finished result kept locally, not dropped
    lock.release()
    assert read_holder(store)["token"] == "theirs"  # the loser leaves the new holder's lock alone


# The beats below are called here, one at a time: moto checks a precondition and stores the object in
# two steps, so a write racing a running beat could slip between them (S3 itself does both at once).


def test_heartbeat_notices_a_takeover_and_never_writes_over_it(s3):
    lock, store = _lock(s3, "beat", stale_after_s=60)
    lock.acquire()
    first = read_holder(store)["heartbeat_at"]
    assert lock._beat_once() and read_holder(store)["heartbeat_at"] > first  # a live holder's beat lands
    plant_holder(store)  # taken over: this driver was presumed dead
    assert lock._beat_once() is False
    with pytest.raises(LockLost, match="now held by pid 4242 on host elsewhere"):
        lock.raise_if_lost()
    assert read_holder(store)["token"] == "theirs"  # the beat did not write over the new holder
    lock.release()


def test_heartbeat_does_not_recreate_a_deleted_lock(s3):
    lock, store = _lock(s3, "deleted", stale_after_s=60)
    lock.acquire()
    store.fs.delete_file(f"{store.sweep_dir}/{LOCK_FILE}")
    assert lock._beat_once() is False
    with pytest.raises(LockLost, match="was deleted"):
        lock.check()
    assert read_holder(store) is None
    lock.release()
