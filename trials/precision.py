"""Precision is decided once per trial; the loop only ever calls ``plan.autocast()`` and the scaler.

auto: CUDA → bf16 where the GPU supports it, else fp16; CPU → bf16 autocast (faster than fp32 on
recent x86, and has no fp16 overflow). Master weights stay fp32 in every mode (mixed precision).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

PRECISIONS = ("auto", "fp16", "bf16", "fp32")
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": None}


class PrecisionError(ValueError):
    pass


@dataclass(frozen=True)
class PrecisionPlan:
    name: str  # fp16 | bf16 | fp32 (resolved)
    device_type: str  # cpu | cuda

    def autocast(self) -> contextlib.AbstractContextManager:
        dtype = _DTYPES[self.name]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=dtype)

    def grad_scaler(self) -> torch.amp.GradScaler:
        # Only fp16 has the narrow exponent that needs loss scaling; disabled it is a pass-through.
        return torch.amp.GradScaler(self.device_type, enabled=self.name == "fp16")


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise PrecisionError(f"device {device!r} requested but CUDA is not available")
    return resolved


def resolve_precision(precision: str, device: torch.device) -> PrecisionPlan:
    if precision not in PRECISIONS:
        raise PrecisionError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if precision == "auto":
        if device.type == "cuda":
            precision = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        else:
            precision = "bf16"
    if precision == "fp16" and device.type != "cuda":
        raise PrecisionError("precision fp16 needs a CUDA device (use bf16 or fp32 on CPU)")
    return PrecisionPlan(name=precision, device_type=device.type)
