"""CUDA paths on a real GPU (run with -m gpu where one exists): fp16 with a GradScaler, bf16, and what
``auto`` picks from the compute capability."""

import dataclasses

import pytest
import torch

from freezesweep.trials.precision import resolve_precision
from freezesweep.trials.run import run_trial

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


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_cuda_evaluation_cache_training_cache_and_fused_adamw(tiny_trial, precision):
    """The caches' CUDA paths in each precision: the evaluation cache (chained, early-stopped prefix;
    its bit-exactness check on the GPU: where it holds, the curve is the full model's to the bit; fp32
    must hold), the opt-in training cache, a template copied then moved to the GPU."""
    if precision == "bf16" and _native() != "bf16":
        pytest.skip("bf16 is emulated before compute capability 8.0")
    cfg = dataclasses.replace(tiny_trial, device="cuda", precision=precision, frozen_layers=1, epochs=3)
    plain = run_trial(dataclasses.replace(cfg, eval_cache=False))
    cached = run_trial(cfg)
    assert plain.eval_cached_layers is None and (cached.eval_cached_layers == 1 or precision != "fp32")
    if cached.eval_cached_layers == 1:
        assert [p.loss for p in cached.eval_curve] == pytest.approx([p.loss for p in plain.eval_curve], rel=1e-5)
    print(
        f"{precision}: evaluation cache {'used (bit-exact)' if cached.eval_cached_layers else 'refused by its check'}"
    )
    with_train_cache = run_trial(dataclasses.replace(cfg, train_cache=True))
    assert with_train_cache.train_cached_layers == 1 and with_train_cache.status == "ok"
    assert with_train_cache.peak_mem_mb > 0
