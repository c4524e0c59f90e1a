"""Where Ray keeps a sweep's experiment state and trial checkpoints, and what a trial does when that
storage refuses its checkpoint (no Ray started here)."""

import json

import pyarrow.fs as pafs
import pytest

from orchestrator import tune_adapter
from orchestrator.grid import build_grid
from orchestrator.ray_storage import (checkpoint_folders, checkpoint_storage_warning, drop_checkpoints,
                                      earlier_checkpoints, ray_storage)
from orchestrator.spec import load_spec
from results.store import ResultStore

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
        return checkpoint_storage_warning(spec, ray_storage(ResultStore(store, spec.name), on_cluster), on_cluster)

    local = str(tmp_path / "store")
    checkpointing = {"training": {"checkpoint_every_epochs": 1}}
    message = warning(local, address="10.0.0.1:6379", **checkpointing)
    assert f"{local}/tiny/_ray on this machine's disk" in message and "shared filesystem" in message
    assert warning(local, address="10.0.0.1:6379") is None  # no checkpoints: nothing of Ray's is needed elsewhere
    assert warning(local, **checkpointing) is None  # the embedded Ray: one machine
    assert warning(S3_URI, address="10.0.0.1:6379", **checkpointing) is None  # storage every node reaches


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
    assert len(reports) == 1 and "RuntimeError: Unable to set up cluster storage" in \
        reports[0][tune_adapter.CHECKPOINT_ERROR_KEY]


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

    writer = tune_adapter.StoreWriter(lambda *args: None)
    refused = {tune_adapter.CHECKPOINT_ERROR_KEY: "RuntimeError: no storage",
               tune_adapter.PLACEMENT_KEY: json.dumps({"node_ip": "10.0.0.2"})}
    writer.on_trial_result(0, [], Trial(), refused)
    writer.on_trial_result(0, [], Trial(), refused)
    err = capsys.readouterr().err
    assert err.count("warning: trials on 10.0.0.2 cannot use checkpoints") == 1 and "no storage" in err


def test_hang_is_a_fault_kind(tiny_trial, monkeypatch):
    """Rules are parsed at every evaluation; a hang fires only at its own."""
    from trials import faults

    monkeypatch.setenv(faults.FAULT_ENV, "hang@2:seed=0*1")
    faults.maybe_inject(tiny_trial, evals_done=1)
    monkeypatch.setenv(faults.FAULT_ENV, "stall@2")
    with pytest.raises(ValueError, match="oom<SHARE or hang"):
        faults.maybe_inject(tiny_trial, evals_done=1)


def test_cluster_run_ends_normally_when_the_remote_store_is_gone_by_its_end(monkeypatch, write_spec):
    """Ray reads its state back from its storage after the last trial: a remote store gone by then
    fails that read, yet every outcome is spooled, so the run returns (the launch's flush then says
    what is kept where). A local store's error is not the store going away: it propagates."""
    from ray import tune

    from orchestrator import launch as launching

    class Tuner:  # Ray's, as it ends with the store unreachable
        def __init__(self, *args, **kwargs):
            pass

        def fit(self):
            raise OSError("When listing objects under key '…/_ray/…': Could not connect to server")

    monkeypatch.setattr(launching, "_init_ray", lambda address: None)
    monkeypatch.setattr(tune, "Tuner", Tuner)
    remote = load_spec(write_spec("remote", address="10.0.0.1:6379", store=S3_URI), semantic=False)
    shared = ray_storage(ResultStore(S3_URI, "remote"), cluster=True)
    launching._run_tune(remote, [], shared, write=lambda *args: None)
    # With a cell that has no outcome yet the error is not the end's read: it propagates.
    with pytest.raises(OSError, match="Could not connect"):
        launching._run_tune(remote, build_grid(remote)[:1], shared, write=lambda *args: None)
    local = load_spec(write_spec("local", address="10.0.0.1:6379"), semantic=False)
    with pytest.raises(OSError, match="Could not connect"):
        launching._run_tune(local, [], ray_storage(ResultStore(local.store, "local"), cluster=True),
                            write=lambda *args: None)


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
    earlier = earlier_checkpoints(storage, "demo", {"cell-a", "cell-c"})
    assert list(earlier) == ["cell-a"] and earlier["cell-a"].path == f"{root}/cell-a/checkpoint_000002"
    drop_checkpoints(storage, "demo", "cell-a")
    drop_checkpoints(storage, "demo", "cell-c")
    drop_checkpoints(storage, "demo", "never-ran")
    assert not list((root / "cell-a").glob("checkpoint_*"))
    assert list(checkpoint_folders(storage, "demo")) == ["cell-b"] and (root / "cell-c" / "result.json").exists()


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
