"""orchestrator/ray_storage.py: where Ray keeps a sweep's experiment state and trial checkpoints, and
the checkpoints found there (no Ray started here)."""

import pyarrow.fs as pafs
import pytest

from freezesweep.orchestrator import tune_adapter
from freezesweep.orchestrator.ray_storage import (
    checkpoint_folders,
    checkpoint_storage_warning,
    drop_checkpoints,
    latest_checkpoints,
    ray_storage,
)
from freezesweep.orchestrator.checks import load_spec
from freezesweep.results.store import ResultStore

S3_URI = "s3://bucket/sweeps?endpoint_override=127.0.0.1:9&scheme=http&region=us-east-1"


@pytest.mark.parametrize("cluster", [False, True])
def test_local_store_keeps_ray_state_beside_its_results(tmp_path, cluster):
    storage = ray_storage(ResultStore(str(tmp_path / "store"), "demo"), cluster=cluster)
    assert storage.path == f"{tmp_path}/store/demo/_ray" and storage.filesystem is None and not storage.shared


def test_remote_store_on_a_cluster_keeps_ray_state_in_the_store_itself():
    """s3://…: the path on the store's own filesystem (its endpoint and region, as Ray's
    storage_filesystem), shared by every node."""
    store = ResultStore(S3_URI, "demo")
    storage = ray_storage(store, cluster=True)
    assert storage.path == "bucket/sweeps/demo/_ray" and storage.shared
    assert isinstance(storage.filesystem, pafs.S3FileSystem) and storage.filesystem is store.fs
    assert storage.filesystem.region == "us-east-1"


def test_remote_store_without_a_cluster_keeps_ray_state_on_this_machine(monkeypatch, tmp_path):
    """The embedded Ray shares nothing: its state stays in the local cache (an outage of the store
    then slows no Ray sync), one folder per store and sweep."""
    monkeypatch.setenv("FREEZESWEEP_CACHE_DIR", str(tmp_path / "cache"))
    storage = ray_storage(ResultStore(S3_URI, "demo"), cluster=False)
    assert storage.path.startswith(f"{tmp_path}/cache/ray/") and storage.path.endswith("/demo")
    assert storage.filesystem is None and not storage.shared
    assert ray_storage(ResultStore(S3_URI.replace("bucket", "other"), "demo"), cluster=False).path != storage.path


def test_cluster_sweep_checkpointing_into_a_local_store_is_warned(write_spec, tmp_path):
    def warning(store, **overrides):
        spec = load_spec(write_spec(**overrides), semantic=False)
        on_cluster = bool(spec.address)
        return checkpoint_storage_warning(
            bool(spec.training.checkpoint_every_epochs),
            spec.store,
            ray_storage(ResultStore(store, spec.name), on_cluster),
            on_cluster,
        )

    local = str(tmp_path / "store")
    checkpointing = {"training": {"checkpoint_every_epochs": 1}}
    message = warning(local, address="10.0.0.1:6379", **checkpointing)
    assert f"{local}/tiny/_ray on this machine's disk" in message and "shared filesystem" in message
    assert warning(local, address="10.0.0.1:6379") is None  # no checkpoints: nothing of Ray's is needed elsewhere
    assert warning(local, **checkpointing) is None  # the embedded Ray: one machine
    assert warning(S3_URI, address="10.0.0.1:6379", **checkpointing) is None  # storage every node reaches


def _checkpoint(root, trial: str, number: int) -> None:
    folder = root / trial / f"checkpoint_{number:06d}"
    folder.mkdir(parents=True)
    (folder / f"{trial}.pt").write_bytes(b"state")


def test_checkpoints_an_earlier_launch_left_are_found_and_dropped(tmp_path):
    """Ray's layout, <storage>/<experiment>/<trial>/checkpoint_NNNNNN: the latest of each pending cell
    is where its first attempt starts; a cell that is over loses all of its, and nothing else."""
    storage = ray_storage(ResultStore(str(tmp_path / "store"), "demo"), cluster=False)
    root = tmp_path / "store" / "demo" / "_ray" / "demo"
    _checkpoint(root, "cell-a", 1)
    _checkpoint(root, "cell-a", 2)
    _checkpoint(root, "cell-b", 0)
    (root / "cell-c").mkdir()
    (root / "cell-c" / "result.json").write_text("{}")
    assert checkpoint_folders(storage, "other") == {}  # no such experiment yet
    assert sorted(checkpoint_folders(storage, "demo")) == ["cell-a", "cell-b"]
    earlier = latest_checkpoints(storage, "demo", {"cell-a", "cell-c"})
    assert earlier == {"cell-a": f"{root}/cell-a/checkpoint_000002"}
    [resumed] = tune_adapter.checkpoints_to_resume(storage, "demo", {"cell-a"}).values()
    assert resumed.path == f"{root}/cell-a/checkpoint_000002"
    drop_checkpoints(storage, "demo", "cell-a")
    drop_checkpoints(storage, "demo", "cell-c")
    drop_checkpoints(storage, "demo", "never-ran")
    assert not list((root / "cell-a").glob("checkpoint_*"))
    assert list(checkpoint_folders(storage, "demo")) == ["cell-b"] and (root / "cell-c" / "result.json").exists()
