"""Devices to run a test's logic on: the CPU always, CUDA where there is a GPU (marked ``gpu``), so a
CUDA test's code runs in CI too and only its CUDA-specific assertions wait for a GPU (issue 35.6)."""

from __future__ import annotations

import pytest
import torch

CUDA = pytest.param(
    "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
)
DEVICES = ["cpu", CUDA]
