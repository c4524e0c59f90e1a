"""The CUDA paths: fp16 with a GradScaler, bf16, what ``auto`` picks from the compute capability, the
caches in each precision. Every test runs its logic on the CPU too (tests/devices.py), so a changed
signature fails in CI; only what a GPU alone shows is asserted under the ``gpu`` mark."""

import dataclasses

import pytest
import torch

from tests.devices import CUDA
from freezesweep.trials.precision import PrecisionPlan, auto_precision, resolve_precision
from freezesweep.trials.run import run_trial


def _native(device: str) -> str:
    """What ``auto`` resolves to on this machine's device of that type."""
    return auto_precision(device)


def _precisions():
    """(device, precision) pairs: fp16 only on CUDA (a CPU has no loss-scaled fp16 path); fp32 on the CPU
    is every other test's."""
    cuda = [pytest.param("cuda", p, marks=CUDA.marks, id=f"cuda-{p}") for p in ("fp16", "bf16", "auto")]
    return [pytest.param("cpu", p, id=f"cpu-{p}") for p in ("bf16", "auto")] + cuda


@pytest.mark.parametrize("device,precision", _precisions())
def test_a_trial_in_each_precision(tiny_trial, device, precision):
    result = run_trial(dataclasses.replace(tiny_trial, precision=precision, device=device, epochs=10, train_size=120))
    assert result.status == "ok" and result.device.startswith(f"{device}:")
    assert result.precision == (_native(device) if precision == "auto" else precision)
    assert result.peak_mem_mb > 0
    assert result.best_val_accuracy > result.majority_baseline  # it learns in every precision


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_the_fp16_scaler_scales_and_bf16s_does_not(device):
    fp16, bf16 = PrecisionPlan("fp16", device).grad_scaler(), PrecisionPlan("bf16", device).grad_scaler()
    assert fp16.is_enabled() and fp16.scale(torch.ones((), device=device)).item() > 1
    assert not bf16.is_enabled()
    if device == "cuda":  # fp16 is a precision a trial can ask for on a GPU only
        assert resolve_precision("fp16", torch.device("cuda")) == PrecisionPlan("fp16", "cuda")


def _cache_cells():
    cpu = [pytest.param("cpu", p, id=f"cpu-{p}") for p in ("fp32", "bf16")]
    return cpu + [pytest.param("cuda", p, marks=CUDA.marks, id=f"cuda-{p}") for p in ("fp32", "bf16", "fp16")]


@pytest.mark.parametrize("device,precision", _cache_cells())
def test_evaluation_cache_training_cache_and_fused_adamw(tiny_trial, device, precision):
    """The caches' paths in each precision: the evaluation cache (chained, early-stopped prefix; its
    bit-exactness check on the device: where it holds, the curve is the full model's; fp32 must hold),
    the opt-in training cache, a template copied then moved to the device."""
    if device == "cuda" and precision == "bf16" and _native("cuda") != "bf16":
        pytest.skip("bf16 is emulated before compute capability 8.0")
    cfg = dataclasses.replace(tiny_trial, device=device, precision=precision, frozen_layers=1, epochs=3)
    plain = run_trial(dataclasses.replace(cfg, eval_cache=False))
    cached = run_trial(cfg)
    assert plain.eval_cached_layers is None and (cached.eval_cached_layers == 1 or precision != "fp32")
    if cached.eval_cached_layers == 1:
        assert [p.loss for p in cached.eval_curve] == pytest.approx([p.loss for p in plain.eval_curve], rel=1e-5)
    print(
        f"{device} {precision}: evaluation cache "
        f"{'used (bit-exact)' if cached.eval_cached_layers else 'refused by its check'}"
    )
    with_train_cache = run_trial(dataclasses.replace(cfg, train_cache=True))
    assert with_train_cache.train_cached_layers == 1 and with_train_cache.status == "ok"
    assert with_train_cache.peak_mem_mb > 0


def test_no_test_runs_on_a_gpu_alone():
    """A test whose every case needs a GPU never runs in CI and rots (two did, issue 35): the gpu mark
    is given by tests/devices.py alone, to the CUDA case of a test that also has a CPU one."""
    from tests.conftest import REPO

    mark = "pytest.mark." + "gpu"  # spelled apart: this file holds no use of it
    offenders = [p.name for p in (REPO / "tests").rglob("*.py") if p.name != "devices.py" and mark in p.read_text()]
    assert offenders == []
