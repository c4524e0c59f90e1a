"""One writer per sweep: a lock file in the store that survives a crashed holder.

``<sweep>/_lock.json`` names the holder (host, pid, start, heartbeat). A lock is *stale* when its
holder is gone: on the same host its pid is no longer alive; on another host its heartbeat is older
than ``stale_after_s`` (a live holder refreshes it every ``stale_after_s / 4``). A stale lock is
moved aside (an atomic rename: of two contenders exactly one wins) and a fresh one created with
exclusive-create, so two launches can never both hold a sweep.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass

import pyarrow.fs as pafs

LOCK_FILE = "_lock.json"
STALE_ENV = "FREEZESWEEP_LOCK_STALE_S"


class SweepLocked(RuntimeError):
    pass


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    token: str
    started_at: float
    heartbeat_at: float

    def describe(self) -> str:
        age = time.time() - self.heartbeat_at
        return f"pid {self.pid} on host {self.host} (started {time.ctime(self.started_at)}, heartbeat {age:.0f}s ago)"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


class SweepLock:
    def __init__(self, fs: pafs.FileSystem, sweep_dir: str, stale_after_s: float | None = None):
        self.fs, self.path = fs, f"{sweep_dir}/{LOCK_FILE}"
        self.sweep_dir = sweep_dir
        self.stale_after_s = stale_after_s or float(os.environ.get(STALE_ENV, "120"))
        self.me = Holder(socket.gethostname(), os.getpid(), uuid.uuid4().hex, time.time(), time.time())
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    # --- acquire / release ----------------------------------------------------------------------
    def acquire(self) -> "SweepLock":
        self.fs.create_dir(self.sweep_dir, recursive=True)
        holder = self.holder()
        if holder is not None:
            if not self.is_stale(holder):
                raise SweepLocked(f"sweep is already running: {holder.describe()}; lock file {self.path}")
            self._move_aside()
        if not self._create_exclusive(self.me):
            raise SweepLocked(f"sweep is already running: {self.holder().describe()}; lock file {self.path}")
        self._beat = threading.Thread(target=self._heartbeat, daemon=True, name="sweep-lock-heartbeat")
        self._beat.start()
        return self

    def release(self) -> None:
        self._stop.set()
        try:
            holder = self.holder()
            if holder is not None and holder.token == self.me.token:
                self.fs.delete_file(self.path)
        except OSError:
            pass  # store unreachable: the lock goes stale (dead pid / old heartbeat) and is taken over

    def __enter__(self) -> "SweepLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    # --- state ----------------------------------------------------------------------------------
    def holder(self) -> Holder | None:
        try:
            with self.fs.open_input_stream(self.path) as f:
                return Holder(**json.loads(f.read()))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError):  # a torn or foreign file: treat as a dead holder
            return Holder(host="?", pid=-1, token="", started_at=0.0, heartbeat_at=0.0)

    def is_stale(self, holder: Holder) -> bool:
        if holder.host == self.me.host and holder.pid > 0:
            # Our own pid with another token: a lock this process could not release earlier.
            return holder.pid == self.me.pid or not _pid_alive(holder.pid)
        return time.time() - holder.heartbeat_at > self.stale_after_s

    def _move_aside(self) -> None:
        try:
            self.fs.move(self.path, f"{self.sweep_dir}/_lock.stale-{uuid.uuid4().hex}.json")
        except FileNotFoundError:
            pass  # another contender moved it first; exclusive create decides between us

    def _create_exclusive(self, holder: Holder) -> bool:
        payload = json.dumps(asdict(holder)).encode()
        if isinstance(self.fs, pafs.LocalFileSystem):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
            return True
        # Object stores have no exclusive create here: write, then read back who won.
        with self.fs.open_output_stream(self.path) as f:
            f.write(payload)
        current = self.holder()
        return current is not None and current.token == holder.token

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.stale_after_s / 4):
            try:
                if not self._beat_once():
                    return
            except OSError:
                continue  # store briefly unreachable: try again at the next beat

    def _beat_once(self) -> bool:
        current = self.holder()
        if current is None or current.token != self.me.token:
            return False  # taken over (we were presumed dead): never write over the new holder
        beat = Holder(**{**asdict(self.me), "heartbeat_at": time.time()})
        tmp = f"{self.sweep_dir}/_lock.{self.me.token}.tmp"
        with self.fs.open_output_stream(tmp) as f:
            f.write(json.dumps(asdict(beat)).encode())
        self.fs.move(tmp, self.path)
        return True
