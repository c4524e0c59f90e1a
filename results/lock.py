"""One writer per sweep: a lock file in the store that survives a crashed holder.

``<sweep>/_lock.json`` names the holder (host, pid, start, heartbeat). A lock is *stale* when its
holder is gone: on the same host its pid is no longer alive; on another host its heartbeat is older
than ``stale_after_s`` (a live holder refreshes it every ``stale_after_s / 4``).

How "exactly one holder" is made, per kind of store:

- a local folder: exclusive create (``O_EXCL``); a stale lock is moved aside first (an atomic
  rename: of two contenders exactly one wins);
- ``s3://``: S3 conditional writes. The lock is created with ``If-None-Match: *`` (put-if-absent)
  and every later write of it (heartbeat, stale takeover) carries ``If-Match: <ETag>`` of the
  version this process last saw, so of two contenders exactly one succeeds and a heartbeat never
  writes over a holder that took the lock over;
- other object stores: write, then read back who won (not exclusive against a simultaneous start).

A holder that finds the lock gone or held by someone else (its heartbeat failed, or ``check``
before a store write) has *lost* it: ``check`` then raises ``LockLost`` and the driver stops
writing (``ResultStore.guard``).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, unquote, urlsplit

import pyarrow.fs as pafs

if TYPE_CHECKING:
    from freezesweep.results.store import ResultStore

LOCK_FILE = "_lock.json"
STALE_ENV = "FREEZESWEEP_LOCK_STALE_S"


class SweepLocked(RuntimeError):
    pass


class LockLost(SweepLocked):
    """This driver held the sweep's lock and no longer does: it must not write to the store."""


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

    def payload(self) -> bytes:
        return json.dumps(asdict(self)).encode()


def _parse_holder(data: bytes) -> Holder:
    try:
        return Holder(**json.loads(data))
    except (ValueError, TypeError):  # a torn or foreign file: treat as a dead holder
        return Holder(host="?", pid=-1, token="", started_at=0.0, heartbeat_at=0.0)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


class S3Object:
    """One S3 object written only under a precondition (S3 conditional writes): put-if-absent
    (``If-None-Match: *``) and put-if-unchanged (``If-Match: <ETag>``). A failed precondition is
    412 PreconditionFailed; 409 ConditionalRequestConflict is the loser of two simultaneous
    conditional writes; 404 NoSuchKey an ``If-Match`` on an object that is gone. Other failures
    (the store unreachable, credentials) are raised as ``OSError``, like pyarrow's."""

    LOST = ("PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "404", "409", "412")

    def __init__(self, client, bucket: str, key: str):
        self.client, self.bucket, self.key = client, bucket, key

    @classmethod
    def from_uri(cls, uri: str, path: str) -> "S3Object":
        """The object at pyarrow path ``path`` (``bucket/key``) of the store at ``uri``, with the
        endpoint, scheme, region and credentials that pyarrow reads from the same URI."""
        try:
            import boto3
        except ImportError:
            raise SweepLocked(
                "an s3:// store needs boto3 for its exclusive lock: pip install 'freezesweep[s3]'"
            ) from None
        parts = urlsplit(uri)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        options = {}
        if "endpoint_override" in query:
            endpoint = query["endpoint_override"]
            options["endpoint_url"] = endpoint if "://" in endpoint else f"{query.get('scheme', 'https')}://{endpoint}"
        if "region" in query:
            options["region_name"] = query["region"]
        if parts.username:
            options["aws_access_key_id"] = unquote(parts.username)
            options["aws_secret_access_key"] = unquote(parts.password or "")
        bucket, _, key = path.partition("/")
        return cls(boto3.client("s3", **options), bucket, key)

    def read(self) -> tuple[bytes | None, str | None]:
        """(content, ETag), or (None, None) when there is no such object."""
        try:
            answer = self._call(self.client.get_object, Bucket=self.bucket, Key=self.key)
        except _Lost:
            return None, None
        return answer["Body"].read(), answer["ETag"]

    def put(
        self, body: bytes, *, if_absent: bool = False, if_match: str | None = None, key: str | None = None
    ) -> str | None:
        """The new ETag, or None when the precondition failed (someone else wrote first)."""
        conditions = {"IfNoneMatch": "*"} if if_absent else {"IfMatch": if_match} if if_match else {}
        try:
            answer = self._call(
                self.client.put_object, Bucket=self.bucket, Key=key or self.key, Body=body, **conditions
            )
        except _Lost:
            return None
        return answer["ETag"]

    def _call(self, operation, **kwargs):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return operation(**kwargs)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in self.LOST:
                raise _Lost from exc
            raise OSError(f"s3://{self.bucket}/{self.key}: {exc}") from exc
        except BotoCoreError as exc:  # unreachable endpoint, no credentials: the store is away
            raise OSError(f"s3://{self.bucket}/{self.key}: {exc}") from exc


class _Lost(Exception):
    pass


class SweepLock:
    """``uri``: the store's URI, which says how to reach an ``s3://`` store for conditional writes."""

    def __init__(self, fs: pafs.FileSystem, sweep_dir: str, stale_after_s: float | None = None, uri: str | None = None):
        self.fs, self.path = fs, f"{sweep_dir}/{LOCK_FILE}"
        self.sweep_dir = sweep_dir
        self.stale_after_s = stale_after_s or float(os.environ.get(STALE_ENV, "120"))
        self.me = Holder(socket.gethostname(), os.getpid(), uuid.uuid4().hex, time.time(), time.time())
        self.s3 = S3Object.from_uri(uri, self.path) if uri and urlsplit(uri).scheme == "s3" else None
        self.lost: str | None = None  # why this holder lost the lock, once it has
        self._etag: str | None = None  # S3: the version of the lock object this holder wrote last
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    # --- acquire / release ----------------------------------------------------------------------
    def acquire(self) -> "SweepLock":
        self.fs.create_dir(self.sweep_dir, recursive=True)
        holder, version = self._read()
        if holder is not None and not self.is_stale(holder):
            raise self._refusal(holder)
        if not self._claim(holder, version):
            raise self._refusal(self.holder())
        if self.s3 is None:
            self._remove_leftovers()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True, name="sweep-lock-heartbeat")
        self._beat.start()
        return self

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:  # a beat in flight must not write the lock again after it is deleted
            self._beat.join(timeout=30)
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

    def check(self) -> None:
        """Raise ``LockLost`` unless the lock still names this holder; called before every store
        write. ``OSError`` when the store cannot be read (the caller keeps the row for later)."""
        if self.lost is None:
            current = self.holder()
            if current is None or current.token != self.me.token:
                self._mark_lost(current)
        self.raise_if_lost()

    def raise_if_lost(self) -> None:
        """``LockLost`` once the heartbeat (or ``check``) found the lock taken: no store read."""
        if self.lost is not None:
            raise LockLost(self.lost)

    # --- state ----------------------------------------------------------------------------------
    def holder(self) -> Holder | None:
        try:
            with self.fs.open_input_stream(self.path) as f:
                return _parse_holder(f.read())
        except FileNotFoundError:
            return None

    def is_stale(self, holder: Holder) -> bool:
        if holder.host == self.me.host and holder.pid > 0:
            # Our own pid with another token: a lock this process could not release earlier.
            return holder.pid == self.me.pid or not _pid_alive(holder.pid)
        return time.time() - holder.heartbeat_at > self.stale_after_s

    def _read(self) -> tuple[Holder | None, str | None]:
        """The current holder and, on S3, the ETag of the version read (what a takeover replaces)."""
        if self.s3 is None:
            return self.holder(), None
        data, etag = self.s3.read()
        return (None if data is None else _parse_holder(data)), etag

    def _refusal(self, holder: Holder | None) -> SweepLocked:
        who = holder.describe() if holder is not None else "another launch that is taking the lock right now"
        return SweepLocked(f"sweep is already running: {who}; lock file {self.path}")

    def _mark_lost(self, current: Holder | None) -> None:
        now = "was deleted" if current is None else f"is now held by {current.describe()}"
        self.lost = (
            f"this driver lost the sweep's lock: {self.path} {now}. It stopped writing to the store "
            f"(a lock whose heartbeat is older than {self.stale_after_s:g}s is taken over by the next "
            "launch); the sweep's holder writes the remaining cells"
        )

    # --- taking the lock ------------------------------------------------------------------------
    def _claim(self, stale: Holder | None, version: str | None) -> bool:
        if self.s3 is not None:
            return self._claim_s3(stale, version)
        if stale is not None:
            self._move_aside()
        return self._create_exclusive(self.me)

    def _claim_s3(self, stale: Holder | None, version: str | None) -> bool:
        # Replacing exactly the stale version we read: if another contender (or the holder's own
        # heartbeat) wrote in between, the ETag differs and this put fails.
        self._etag = self.s3.put(self.me.payload(), if_absent=stale is None, if_match=version)
        if self._etag is not None and stale is not None:  # kept aside, as on a local disk
            self.s3.put(stale.payload(), key=f"{self.s3.key.rsplit('/', 1)[0]}/_lock.stale-{uuid.uuid4().hex}.json")
        return self._etag is not None

    def _move_aside(self) -> None:
        try:
            self.fs.move(self.path, f"{self.sweep_dir}/_lock.stale-{uuid.uuid4().hex}.json")
        except FileNotFoundError:
            pass  # another contender moved it first; exclusive create decides between us

    def _create_exclusive(self, holder: Holder) -> bool:
        if isinstance(self.fs, pafs.LocalFileSystem):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(holder.payload())
            return True
        # Object stores other than S3 have no exclusive create here: write, then read back who won.
        with self.fs.open_output_stream(self.path) as f:
            f.write(holder.payload())
        current = self.holder()
        return current is not None and current.token == holder.token

    # --- heartbeat ------------------------------------------------------------------------------
    def _heartbeat(self) -> None:
        while not self._stop.wait(self.stale_after_s / 4):
            try:
                if not self._beat_once():
                    return
            except OSError:
                continue  # store briefly unreachable: try again at the next beat

    def _beat_once(self) -> bool:
        beat = Holder(**{**asdict(self.me), "heartbeat_at": time.time()})
        if self.s3 is not None:
            etag = self.s3.put(beat.payload(), if_match=self._etag)
            if etag is None:  # replaced or deleted since our last write, or a simultaneous write (409)
                current = self.holder()
                if current is not None and current.token == self.me.token:
                    return True  # that simultaneous write did not land: still ours, beat again next time
                self._mark_lost(current)
                return False
            self._etag = etag
            return True
        current = self.holder()
        if current is None or current.token != self.me.token:
            self._mark_lost(current)
            return False  # taken over (we were presumed dead): never write over the new holder
        tmp = f"{self.sweep_dir}/_lock.{self.me.token}.tmp"
        try:
            with self.fs.open_output_stream(tmp) as f:
                f.write(beat.payload())
            self.fs.move(tmp, self.path)
        except OSError:
            self._remove(tmp)  # a full disk leaves an empty one: the lock file itself is unchanged
            raise
        return True

    def _remove_leftovers(self) -> None:
        """Heartbeat files of holders killed mid-write (``_lock.<token>.tmp``): the lock is ours now."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.sweep_dir, allow_not_found=True))
        except OSError:
            return
        for info in infos:
            name = info.path.rsplit("/", 1)[-1]
            if name.startswith("_lock.") and name.endswith(".tmp") and self.me.token not in name:
                self._remove(info.path)

    def _remove(self, path: str) -> None:
        try:
            self.fs.delete_file(path)
        except OSError:  # not there (FileNotFoundError) or the store is away: nothing more to do
            pass


def store_notes(store: "ResultStore") -> list[str]:
    """What ``status`` says of a sweep's store beside its rows: a compaction that was interrupted (plain
    readers of results/ miss rows until it is finished), a lock whose holder is gone, and one held now."""
    lock = SweepLock(store.fs, store.sweep_dir)  # reads the lock file only: never takes it
    holder = lock.holder()
    alive = holder is not None and not lock.is_stale(holder)
    notes = []
    if holder is not None and not alive:
        notes.append(
            f"note: a stale lock: {lock.path} names {holder.describe()}, which is gone (the next launch, "
            "resume or compact takes it over)"
        )
    pending = store.unfinished_compaction()
    if alive and not pending:  # a walk-through's status mid-launch showed missing cells, not that they run
        notes.append(f"note: the sweep is running now ({holder.describe()}): its missing cells may be under way")
    if pending and not alive:
        notes.append(
            f"note: an interrupted compaction holds {pending} row file(s) in {store.compacting_dir}, where "
            "plain readers of results/ (pandas, DuckDB) miss them (freezesweep's own readers count them); "
            f"`freezesweep compact {store.sweep}` or `freezesweep resume {store.sweep}` finishes it"
        )
    elif pending:
        notes.append(
            f"note: a compaction is under way ({holder.describe()}): {pending} row file(s) are moving into a part"
        )
    return notes
