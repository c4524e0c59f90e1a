"""CUDA paths on a real GPU (run with -m gpu where one exists): fp16 with a GradScaler, bf16, and what
``auto`` picks from the compute capability."""

import dataclasses

import pytest
import torch

from trials.precision import resolve_precision
from trials.run import run_trial

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _native() -> str:
    return "bf16" if torch.cuda.get_device_capability() >= (8, 0) else "fp16"


@pytest.mark.parametrize("precision", ["fp16", "bf16", "auto"])
def test_cuda_trial_in_each_precision(tiny_trial, precision):
    result = run_trial(dataclasses.replace(tiny_trial, precision=precision, device="cuda", epochs=10, train_size=120))
    assert result.status == "ok" and result.device.startswith("cuda:")
    assert result.precision == (_native() if precision == "auto" else precision)
    assert result.peak_mem_mb > 0
    assert result.best_val_accuracy > result.majority_baseline  # it learns in every precision


def test_fp16_scaler_scales_and_bf16_does_not():
    fp16 = resolve_precision("fp16", torch.device("cuda")).grad_scaler()
    assert fp16.is_enabled() and fp16.scale(torch.ones((), device="cuda")).item() > 1
    assert not resolve_precision("bf16", torch.device("cuda")).grad_scaler().is_enabled()
