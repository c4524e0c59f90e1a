import json
import subprocess
import sys
import time

import pyarrow.fs as pafs
import pytest

from tests.conftest import ok_ids

from freezesweep.orchestrator.rows import result_row
from freezesweep.results.lock import LockLost, SweepLock, SweepLocked
from freezesweep.results.store import ResultStore
from tests.factories import trial_result


def _lock(tmp_path, **kw) -> SweepLock:
    return SweepLock(pafs.LocalFileSystem(), str(tmp_path / "sweep"), **kw)


def _plant(tmp_path, **holder):
    (tmp_path / "sweep").mkdir(exist_ok=True)
    base = {"host": "elsewhere", "pid": 1, "token": "t", "started_at": time.time(), "heartbeat_at": time.time()}
    staged = tmp_path / "sweep" / "_lock.planted"
    staged.write_text(json.dumps({**base, **holder}))
    staged.replace(tmp_path / "sweep" / "_lock.json")  # whole, as a heartbeat running beside it must see it


def test_held_lock_refuses_a_second_holder_and_is_released(tmp_path):
    first = _lock(tmp_path).acquire()
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            f"""
import pyarrow.fs as pafs
from freezesweep.results.lock import SweepLock, SweepLocked
try:
    SweepLock(pafs.LocalFileSystem(), {str(tmp_path / "sweep")!r}).acquire()
except SweepLocked as exc:
    print(exc)
""",
        ],
        capture_output=True,
        text=True,
    )
    assert "already running" in other.stdout and f"pid {first.me.pid}" in other.stdout
    first.release()
    assert not (tmp_path / "sweep" / "_lock.json").exists()
    _lock(tmp_path).acquire().release()


def test_dead_pid_on_this_host_is_stale(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket

    _plant(tmp_path, host=socket.gethostname(), pid=int(dead.stdout))
    lock = _lock(tmp_path).acquire()
    assert json.loads((tmp_path / "sweep" / "_lock.json").read_text())["token"] == lock.me.token
    assert list((tmp_path / "sweep").glob("_lock.stale-*.json"))  # the old one kept aside, not lost
    lock.release()


def test_other_host_fresh_heartbeat_refused_old_heartbeat_taken_over(tmp_path):
    _plant(tmp_path, heartbeat_at=time.time())
    with pytest.raises(SweepLocked, match="pid 1 on host elsewhere"):
        _lock(tmp_path, stale_after_s=60).acquire()
    _plant(tmp_path, heartbeat_at=time.time() - 600)
    _lock(tmp_path, stale_after_s=60).acquire().release()


def test_torn_lock_file_is_stale(tmp_path):
    """A lock file cut mid-write (its holder crashed writing it) holds no one: it is taken over, the new
    holder's record replaces it whole, and release removes it."""
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "_lock.json").write_text('{"host": "x", "pi')
    lock = _lock(tmp_path).acquire()
    held = json.loads((tmp_path / "sweep" / "_lock.json").read_text())
    assert (held["pid"], held["token"]) == (lock.me.pid, lock.me.token)
    lock.release()
    assert not (tmp_path / "sweep" / "_lock.json").exists()


def test_heartbeat_refreshes(tmp_path):
    lock = _lock(tmp_path, stale_after_s=0.2).acquire()
    beat = lambda: json.loads((tmp_path / "sweep" / "_lock.json").read_text())["heartbeat_at"]  # noqa: E731
    first, deadline = beat(), time.monotonic() + 10
    while beat() == first and time.monotonic() < deadline:  # wait for the file to change, not a fixed time
        time.sleep(0.01)
    assert beat() > first
    lock.release()
    assert not (tmp_path / "sweep" / "_lock.json").exists()


def test_lost_lock_stops_store_writes(tmp_path):
    store = ResultStore(str(tmp_path), "sweep")
    lock = SweepLock(store.fs, store.sweep_dir, stale_after_s=60).acquire()
    store.guard = lock.check
    store.write_row(result_row("sweep", trial_result(0)))
    _plant(tmp_path)  # another driver took the sweep over
    with pytest.raises(LockLost, match="now held by pid 1 on host elsewhere"):
        store.write_row(result_row("sweep", trial_result(1)))
    assert ok_ids(store) == {trial_result(0).trial_id}
    lock.release()
    assert json.loads((tmp_path / "sweep" / "_lock.json").read_text())["token"] == "t"


def test_heartbeat_notices_a_takeover(tmp_path):
    lock = _lock(tmp_path, stale_after_s=60).acquire()
    _plant(tmp_path)
    # One beat, called here: on a local disk a beat is read-compare-rename, so a takeover landing
    # inside a running beat would race it (S3's conditional beat has no such window: test_s3_lock).
    assert lock._beat_once() is False
    with pytest.raises(LockLost, match="pid 1 on host elsewhere"):
        lock.raise_if_lost()
    assert json.loads((tmp_path / "sweep" / "_lock.json").read_text())["token"] == "t"
    lock.release()
