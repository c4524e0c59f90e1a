"""Where a trial ran, as this process sees it: the host and the CUDA device (plain PyTorch, no Ray).

The scheduler's facts (Ray's node id and IP, the trial's GPU share) are added by the Ray adapter
(orchestrator/tune_adapter.py); both end up in ``TrialResult.placement`` and in the row's columns.
"""

from __future__ import annotations

import math
import os
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

# Ray keeps resource quantities in fixed point, 1/10000 of a unit (ray._raylet.RESOURCE_UNIT_SCALING,
# checked in ray/_common/ray_option_utils.py): a share of 1/3 is 0.3333, and one unit of tolerance keeps
# floor(1 / 0.3333) at 3.
RAY_RESOLUTION = 10_000


def where(device: torch.device) -> dict[str, Any]:
    """The host and, on a CUDA device, the GPU's index, name and UUID and whether CUDA MPS serves this
    process (all None on a CPU)."""
    gpu: dict[str, Any] = {"gpu_index": None, "gpu_name": None, "gpu_uuid": None, "gpu_mps": None}
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        gpu = {
            "gpu_index": physical_index(os.environ.get("CUDA_VISIBLE_DEVICES"), index),
            "gpu_name": props.name,
            "gpu_uuid": _uuid(props),
            "gpu_mps": mps_active(),
        }
    return {"hostname": socket.gethostname(), **gpu}


# --- CUDA MPS -------------------------------------------------------------------------------------
# The control daemon (``nvidia-cuda-mps-control -d``) listens on a UNIX socket named ``control`` in its
# pipe directory: CUDA_MPS_PIPE_DIRECTORY, else nvidia-mps in the system's temporary folder (NVIDIA's
# MPS guide). A CUDA process connects there when it initialises CUDA and, if the daemon answers, becomes
# an MPS client; if not, it runs as it would without MPS. A daemon that died can leave the socket
# behind, refusing connections. The folder is tempfile's (the system's where TMPDIR is unset); the
# project's recipes set CUDA_MPS_PIPE_DIRECTORY for the daemon and the trials alike.
MPS_PIPE_NAME = "nvidia-mps"
# What plan says to do where MPS is off; the clusters page gives the trade and the measurement.
MPS_START = "`nvidia-cuda-mps-control -d` starts it: see the clusters page"
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one entry per GPU the NVIDIA driver drives (Linux)


def mps_pipe_directory(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    return Path(environ.get("CUDA_MPS_PIPE_DIRECTORY") or Path(tempfile.gettempdir()) / MPS_PIPE_NAME)


def mps_active(pipe_directory: Path | None = None) -> bool:
    """Whether a CUDA process started here would be an MPS client: the daemon's control socket is in
    the pipe directory and accepts a connection, as the CUDA driver's would be accepted."""
    control = (pipe_directory or mps_pipe_directory()) / "control"
    if not control.is_socket():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(control))
        except OSError:  # refused (a stale socket), or not ours to open: no MPS for this process
            return False
    return True


def gpus_here(driver: Path | None = None) -> int:
    """The NVIDIA GPUs this machine's driver has (0 without the driver), without initialising CUDA."""
    try:
        return sum(1 for _ in (driver or NVIDIA_GPUS).iterdir())
    except OSError:
        return 0


def mps_here(driver: Path | None = None, pipe_directory: Path | None = None) -> str | None:
    """What ``plan`` says of this machine: None without GPUs, else its GPUs and whether MPS is on."""
    count = gpus_here(driver)
    if not count:
        return None
    state = "on" if mps_active(pipe_directory) else f"off (trials that share a GPU take turns on it; {MPS_START})"
    return f"this machine: {count} GPU(s), CUDA MPS {state}"


def physical_index(visible: str | None, logical: int) -> int:
    """The machine's index of the GPU torch calls ``cuda:<logical>``. Ray gives each trial its GPUs
    by setting CUDA_VISIBLE_DEVICES to their indices (ray.get_gpu_ids()), so this is the index Ray
    assigned; without it (or with UUIDs in it: the UUID column names the GPU then) torch's own."""
    entries = [e.strip() for e in (visible or "").split(",") if e.strip()]
    if logical < len(entries) and entries[logical].isdigit():
        return int(entries[logical])
    return logical


def _uuid(props) -> str | None:
    """As nvidia-smi --query-gpu=uuid prints it ("GPU-…"); torch >= 2.0 has the UUID in the device
    properties (older builds do not: None)."""
    uuid = getattr(props, "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def share_for(n: int) -> float:
    """The GPU share that packs ``n`` trials on one GPU: 1/n rounded down to Ray's resolution (1/3 ->
    0.3333), the inverse of ``trials_per_gpu``."""
    return math.floor(RAY_RESOLUTION / n) / RAY_RESOLUTION


def trials_per_gpu(gpus_per_trial: float | None) -> int | None:
    """How many trials the scheduler packs on one GPU at this share (floor(1 / share)); None for
    CPU trials (no share)."""
    if not gpus_per_trial or gpus_per_trial <= 0:
        return None
    return max(1, math.floor(1 / gpus_per_trial + 1 / RAY_RESOLUTION))
