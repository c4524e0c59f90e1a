"""Where Ray keeps a sweep's experiment state and its trials' checkpoints (``RunConfig.storage_path``),
and the checkpoints found there.

Ray persists each checkpoint a trial reports as ``<storage>/<experiment>/<trial folder>/checkpoint_NNNNNN``
(numbered in the order reported; the trial folder is the cell's ``trial_id``: launch's
``trial_dirname_creator``). A launch whose driver died leaves its running trials' latest checkpoints
there; the next launch starts those cells from them (``latest_checkpoints``), and a cell that is over
has all of its deleted (``drop_checkpoints``): the trainable weights and the optimizer's state would
otherwise stay in storage for good.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import PurePosixPath

import pyarrow.fs as pafs

from freezesweep.results.store import ResultStore
from freezesweep.trials.data import resolve_cache_dir

CHECKPOINT_PREFIX = "checkpoint_"  # Ray's name for a persisted checkpoint folder (ray.train StorageContext)


@dataclass(frozen=True)
class RayStorage:
    """Where Ray keeps a sweep's experiment state and trial checkpoints."""

    path: str  # on ``filesystem``; a local path when that is None
    filesystem: pafs.FileSystem | None  # the store's own (its credentials, endpoint) for a remote store
    shared: bool  # every node reaches it: a trial whose node dies resumes on another from its checkpoint

    @property
    def fs(self) -> pafs.FileSystem:
        return self.filesystem or pafs.LocalFileSystem()


def ray_storage(store: ResultStore, cluster: bool) -> RayStorage:
    """On a cluster with a remote store (s3://, gs://, …): ``<store>/<sweep>/_ray``, storage every node
    reaches, so trial checkpoints outlive their node (Ray gets the store's own filesystem: its
    credentials and endpoint). A local store: its ``<sweep>/_ray`` folder on the driver's disk, which
    other nodes reach only when it is a network filesystem mounted at the same path on each (nothing
    here can tell). The embedded Ray with a remote store: the driver's cache, as
    before clusters mattered: one machine needs nothing shared, and a store outage then slows no Ray sync."""
    if isinstance(store.fs, pafs.LocalFileSystem):
        return RayStorage(f"{store.sweep_dir}/_ray", None, shared=False)
    if cluster:
        return RayStorage(f"{store.sweep_dir}/_ray", store.fs, shared=True)
    return RayStorage(store_cache_dir(store, "ray"), None, shared=False)


def store_cache_dir(store: ResultStore, what: str) -> str:
    """``<cache>/<what>/<store's hash>/<sweep>``: this machine's folder for one store's sweep, the same
    however the store is spelled (``results.store.store_identity``)."""
    key = hashlib.sha256(store.identity.encode()).hexdigest()[:12]
    return str(resolve_cache_dir(None) / what / key / store.sweep)


def checkpoint_storage_warning(checkpoints: bool, store: str, storage: RayStorage, on_cluster: bool) -> str | None:
    """A warning, not an error, for a cluster sweep that checkpoints into a local store: the folder may
    well be a shared filesystem (NFS), which the driver cannot tell, and where it is not, trials on
    other nodes run on without checkpoints (tune_adapter) and the rows are as good: only a trial
    whose node dies starts over instead of resuming."""
    if not (checkpoints and on_cluster and not storage.shared):
        return None
    return (
        f"training.checkpoint_every_epochs on a cluster with the local store {store!r}: Ray keeps trial "
        f"checkpoints in {storage.path} on this machine's disk, which trials on other nodes can write only if "
        "it is a shared filesystem mounted at that path on every node; elsewhere they run without checkpoints, "
        "and a trial whose node dies starts over. A remote store (s3://…, gs://…) keeps them where every "
        "node reaches them."
    )


def checkpoint_folders(storage: RayStorage, experiment: str) -> dict[str, list[str]]:
    """Each trial folder's checkpoint folders in the experiment, oldest first: one listing (derived
    from file paths, so object stores that list no directories answer the same)."""
    root = f"{storage.path}/{experiment}"
    infos = storage.fs.get_file_info(pafs.FileSelector(root, allow_not_found=True, recursive=True))
    found: dict[str, set[str]] = {}
    for info in infos:
        parts = PurePosixPath(info.path).relative_to(root).parts
        inside = len(parts) > 2 or info.type == pafs.FileType.Directory
        if len(parts) >= 2 and parts[1].startswith(CHECKPOINT_PREFIX) and inside:
            found.setdefault(parts[0], set()).add(f"{root}/{parts[0]}/{parts[1]}")
    return {trial: sorted(folders) for trial, folders in found.items()}


def latest_checkpoints(storage: RayStorage, experiment: str, trial_ids: set[str]) -> dict[str, str]:
    """The latest checkpoint folder an earlier launch's Ray kept of each of these cells (on the
    storage's filesystem, by trial id): their first attempt in this launch starts from it."""
    return {
        trial: folders[-1] for trial, folders in checkpoint_folders(storage, experiment).items() if trial in trial_ids
    }


def drop_checkpoints(storage: RayStorage, experiment: str, trial_id: str) -> None:
    """Delete every checkpoint of a cell that is over (Ray keeps its latest one; an earlier launch's may
    lie beside it). Storage unreachable for now: only space is lost, never the sweep."""
    folder = f"{storage.path}/{experiment}/{trial_id}"
    try:
        infos = storage.fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
        for info in infos:
            if PurePosixPath(info.path).name.startswith(CHECKPOINT_PREFIX):
                storage.fs.delete_dir(info.path)
    except OSError:
        pass
