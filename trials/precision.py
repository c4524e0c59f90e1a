"""Precision is decided once per trial, from what the hardware does natively; the loop only ever
calls ``plan.autocast()`` and the scaler.

``auto``:
- CUDA: bf16 on compute capability >= 8.0 (Ampere and later have bf16 tensor cores), else fp16 with
  a GradScaler. ``torch.cuda.is_bf16_supported()`` is not used: it also says yes where bf16 is
  emulated (pre-Ampere).
- CPU: bf16 autocast only where the CPU has bf16 instructions (x86: AVX512_BF16, AMX_BF16 or
  AVX-NE-CONVERT, the ISAs on which oneDNN runs bf16 natively; elsewhere oneDNN's own check), else
  fp32. Without them oneDNN emulates bf16 and a MiniLM-L6 forward pass runs ~8x slower than fp32.
``fp16``/``bf16``/``fp32`` force. Master weights stay fp32 in every mode (mixed precision).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

PRECISIONS = ("auto", "fp16", "bf16", "fp32")
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": None}
# cpuinfo flags (torch.cpu.get_capabilities) of the x86 ISAs with bf16 instructions.
_X86_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "avx_ne_convert")
_ARM_BF16_FLAGS = ("bf16", "sve_bf16")  # cpuinfo / Linux names of Arm's BF16 extension
_X86 = ("x86_64", "amd64", "x86", "i686")


class PrecisionError(ValueError):
    pass


@dataclass(frozen=True)
class PrecisionPlan:
    name: str  # fp16 | bf16 | fp32 (resolved)
    device_type: str  # cpu | cuda

    def autocast(self, cache: bool = True) -> contextlib.AbstractContextManager:
        """``cache``: autocast's cache of cast weights (off where a CUDA graph is captured: PyTorch's
        CUDA graphs notes, the cache's tensors would outlive the capture)."""
        dtype = _DTYPES[self.name]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=dtype, cache_enabled=cache)

    def grad_scaler(self) -> torch.amp.GradScaler:
        # Only fp16 has the narrow exponent that needs loss scaling; disabled it is a pass-through.
        return torch.amp.GradScaler(self.device_type, enabled=self.name == "fp16")


def resolve_device(device: str, gpus_per_trial: float | None = None) -> torch.device:
    """``auto``: the CPU for a cell scheduled without a GPU share (Ray 2.60 leaves CUDA_VISIBLE_DEVICES
    alone for an actor holding no GPU, ray/_private/utils.py set_visible_accelerator_ids, so a CPU
    cell on a GPU node would otherwise open a context on GPU 0, outside Ray's accounting), else the
    GPU Ray assigned (CUDA_VISIBLE_DEVICES makes it cuda:0), or the CPU where there is none."""
    if device == "auto":
        if gpus_per_trial == 0:
            return torch.device("cpu")
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise PrecisionError(f"device {device!r} requested but CUDA is not available")
    return resolved


def cpu_has_native_bf16(capabilities: Mapping[str, Any] | None = None) -> bool:
    """True where the CPU executes bf16 in hardware (``capabilities``: cpuinfo flags, for tests)."""
    caps = cpu_capabilities() if capabilities is None else capabilities
    architecture = str(caps.get("architecture", "")).lower()
    if architecture in _X86 or any(flag in caps for flag in _X86_BF16_FLAGS):
        return any(bool(caps.get(flag)) for flag in _X86_BF16_FLAGS)
    if any(flag in caps for flag in _ARM_BF16_FLAGS):  # Arm: the BF16 extension (FEAT_BF16)
        return any(bool(caps.get(flag)) for flag in _ARM_BF16_FLAGS)
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)  # oneDNN's own view, if built in
    try:
        return bool(check()) if check is not None else False
    except RuntimeError:
        return False


def cpu_capabilities() -> Mapping[str, Any]:
    """cpuinfo's flags as torch reports them; on a torch without that call, the kernel's (Linux)."""
    if hasattr(torch.cpu, "get_capabilities"):
        return torch.cpu.get_capabilities()
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith(("flags", "Features"))), [])
    except OSError:
        flags = []
    return {"architecture": platform.machine(), **{flag: True for flag in flags}}


def cuda_has_native_bf16(capability: tuple[int, int]) -> bool:
    return capability >= (8, 0)


@functools.lru_cache(maxsize=8)
def auto_precision(device_type: str, device_index: int | None = None) -> str:
    """What ``auto`` means on this machine's device of that type."""
    if device_type == "cuda":
        return "bf16" if cuda_has_native_bf16(torch.cuda.get_device_capability(device_index)) else "fp16"
    return "bf16" if cpu_has_native_bf16() else "fp32"


# Measured on a 2-core AMD EPYC with AVX2 only, MiniLM-L6 (an AVX2 walk-through): a train step 9.6×, a
# forward 7.6× slower in bf16 autocast than in fp32; on a CPU with native bf16, bf16 is ~1.5× faster.
EMULATED_BF16 = (
    "this machine's CPU has no native bf16 (no AVX512-BF16 or AMX): torch emulates it, several times slower "
    "than fp32 (about 8× measured on an AVX2 CPU)"
)


def cpu_precision_note(precision: str) -> str | None:
    """What CPU trials on this machine meet in ``precision`` (as asked: ``auto`` is said as what it runs):
    bf16 where the CPU emulates it, and what auto chose (the README's CPU figures are native bf16's)."""
    if precision not in ("auto", "bf16"):
        return None
    native = cpu_has_native_bf16()
    if precision == "bf16":
        return None if native else f"precision bf16 on CPU trials: {EMULATED_BF16}; auto runs fp32 here"
    if native:
        return "precision auto runs bf16 on this machine's CPU (it has native bf16)"
    return "precision auto runs fp32 on this machine's CPU (no native bf16 there: emulated, bf16 runs several times slower)"


def resolve_precision(precision: str, device: torch.device) -> PrecisionPlan:
    if precision not in PRECISIONS:
        raise PrecisionError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if precision == "auto":
        precision = auto_precision(device.type, device.index)
    if precision == "fp16" and device.type != "cuda":
        raise PrecisionError(
            "precision fp16 needs a CUDA device (on CPU use auto: bf16 where the CPU has it natively, else fp32)"
        )
    return PrecisionPlan(name=precision, device_type=device.type)


def resolve_config(cfg):
    """``cfg`` (a TrialConfig) with ``precision`` resolved for the device it will run on."""
    if cfg.precision != "auto":
        return cfg
    return dataclasses.replace(cfg, precision=resolve_precision("auto", trial_device(cfg)).name)


def trial_device(cfg) -> torch.device:
    """The device a cell (a TrialConfig) runs on: its ``device``, ``auto`` by its GPU share."""
    return resolve_device(cfg.device, cfg.gpus_per_trial)


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work (so a timer stops at the work's end, not its launch); no-op on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
