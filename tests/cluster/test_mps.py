"""CUDA MPS where trials share a GPU (issue 35.5): whether it is on, told from the daemon's control
socket (a live one, a stale one, none; the pipe directory from the environment); what ``plan`` says of
this machine's GPUs and ``status`` of the nodes the rows ran on; and local-cluster.sh starting the
daemon before `ray start` on a machine with GPUs (stub commands stand in for ray and NVIDIA's tools)."""

import os
import socket
import subprocess
import tempfile
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from tests.conftest import REPO
from freezesweep.orchestrator.cli import app
from freezesweep.results.query import mps_summary, placement
from freezesweep.trials import placement as where
from freezesweep.trials.placement import gpus_here, mps_active, mps_here, mps_pipe_directory

runner = CliRunner()


@pytest.fixture
def pipe_dir():
    """A short folder (a UNIX socket's path must fit in 107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="mps-") as folder:
        yield Path(folder)


def _listening(folder) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(folder / "control"))
    server.listen(4)
    return server


def test_mps_is_on_only_where_the_daemon_answers(pipe_dir):
    assert not mps_active(pipe_dir)  # no daemon ever started here
    (pipe_dir / "control").write_text("")
    assert not mps_active(pipe_dir)  # a file of that name is not the daemon's socket
    (pipe_dir / "control").unlink()
    with _listening(pipe_dir):
        assert mps_active(pipe_dir)
    assert (pipe_dir / "control").is_socket() and not mps_active(pipe_dir)  # left by a daemon that died


def test_the_pipe_directory_is_the_environments_else_nvidias_default():
    assert mps_pipe_directory({}) == Path(tempfile.gettempdir()) / "nvidia-mps"
    assert str(mps_pipe_directory({"CUDA_MPS_PIPE_DIRECTORY": "/run/mps"})) == "/run/mps"


def test_this_machines_gpus_are_counted_from_the_driver(tmp_path, pipe_dir):
    driver = tmp_path / "gpus"
    assert gpus_here(driver) == 0 and mps_here(driver, pipe_dir) is None  # no driver: nothing to say
    for bus in ("0000:17:00.0", "0000:65:00.0"):
        (driver / bus).mkdir(parents=True)
    assert mps_here(driver, pipe_dir) == (
        "this machine: 2 GPU(s), CUDA MPS off (trials that share a GPU take turns on it; "
        "`nvidia-cuda-mps-control -d` starts it: see the clusters page)"
    )
    with _listening(pipe_dir):
        assert mps_here(driver, pipe_dir) == "this machine: 2 GPU(s), CUDA MPS on"


def test_plan_says_whether_mps_is_on_where_it_sees_gpus(write_spec, tmp_path, pipe_dir, monkeypatch):
    spec = write_spec("mps")
    monkeypatch.setattr(where, "NVIDIA_GPUS", tmp_path / "no-driver")
    assert "CUDA MPS" not in runner.invoke(app, ["plan", str(spec)]).output  # no GPU here: not a word
    (tmp_path / "gpus" / "0000:17:00.0").mkdir(parents=True)
    monkeypatch.setattr(where, "NVIDIA_GPUS", tmp_path / "gpus")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipe_dir))
    with _listening(pipe_dir):
        done = runner.invoke(app, ["plan", str(spec)])
    assert done.exit_code == 0, done.output
    assert "this machine: 1 GPU(s), CUDA MPS on" in done.output


def test_status_says_whether_mps_served_each_nodes_gpu_rows():
    rows = pd.DataFrame(
        {
            "node_id": ["a", "a", "b", "c", "d"],
            "node_ip": ["10.0.0.1"] * 2 + ["10.0.0.2", "10.0.0.3", "10.0.0.4"],
            "hostname": ["ha", "ha", "hb", "hc", "hd"],
            "node": ["ha", "ha", "hb", "hc", "hd"],
            "gpu_uuid": ["GPU-1", "GPU-1", "GPU-2", None, "GPU-4"],
            "gpu_mps": [True, True, False, None, None],  # c: a CPU node; d: a row from before the column
            "status": ["ok", "failed", "ok", "ok", "ok"],
        }
    )
    nodes = placement(rows).set_index("node")
    assert nodes["mps"].to_dict() == {"a": "on", "b": "off", "c": "", "d": ""}
    assert mps_summary(nodes.reset_index()) == (
        "CUDA MPS on at 1 of 2 GPU node(s): trials that share a GPU there take turns on it"
    )
    assert mps_summary(placement(rows.assign(gpu_mps=None))) is None  # nothing said: no line
    assert "mps" in placement(rows.drop(columns="gpu_mps")).columns  # a store from before the column


STUBS = {
    # each records its call; `nvidia-smi -L` lists one GPU, or none (exit 6, as without a device)
    "ray": 'echo "ray $*" >> "$CALLS"',
    "nvidia-smi": '[ "${STUB_GPUS:-0}" -gt 0 ] && echo "GPU 0: NVIDIA H100 (UUID: GPU-1)" || exit 6',
    "nvidia-cuda-mps-control": 'if [ "$*" = -d ]; then echo "mps -d" >> "$CALLS"; else echo "mps $(cat)" >> "$CALLS"; fi',
}


def _local_cluster(tmp_path, command: list[str], gpus: int, **extra: str) -> list[str]:
    """The calls local-cluster.sh makes to ray and NVIDIA's tools (stubs that record them)."""
    stubs = tmp_path / "bin"
    stubs.mkdir(parents=True, exist_ok=True)
    for name, body in STUBS.items():
        (stubs / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (stubs / name).chmod(0o755)
    calls = tmp_path / "calls"
    env = {
        **os.environ,
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "CALLS": str(calls),
        "STUB_GPUS": str(gpus),
        "RAY_CLUSTER_DIR": str(tmp_path / "cluster"),
        "RAY_STOP_GRACE_S": "1",
        **extra,
    }
    done = subprocess.run(
        ["bash", str(REPO / "cluster" / "local-cluster.sh"), *command], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return calls.read_text().splitlines() if calls.exists() else []


def test_local_cluster_starts_mps_before_ray_on_a_machine_with_gpus_and_stops_it(tmp_path):
    calls = _local_cluster(tmp_path, ["start", "1", "1"], gpus=1)
    assert calls[0] == "mps -d" and calls[1].startswith("ray start --head")
    assert any(c.startswith("ray start --address") for c in calls)
    assert _local_cluster(tmp_path, ["stop"], gpus=1)[-1] == "mps quit"  # it started the daemon: it ends it


def test_local_cluster_leaves_mps_alone_without_gpus_or_when_told(tmp_path):
    assert not any(c.startswith("mps") for c in _local_cluster(tmp_path / "a", ["start", "1", "1"], gpus=0))
    calls = _local_cluster(tmp_path / "b", ["start", "1", "1"], gpus=1, FREEZESWEEP_MPS="0")
    assert not any(c.startswith("mps") for c in calls) and calls[0].startswith("ray start --head")
