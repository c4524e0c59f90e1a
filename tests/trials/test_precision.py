"""Precision by capability: native bf16 or nothing, decided once, recorded as resolved."""

import dataclasses

import pytest
import torch

from freezesweep.trials import precision
from freezesweep.trials.precision import (
    PrecisionError,
    auto_precision,
    cpu_has_native_bf16,
    resolve_config,
    resolve_precision,
)
from freezesweep.trials.run import run_trial

AVX2_ONLY = {"avx2": True, "avx512_f": False, "avx512_bf16": False, "amx_bf16": False, "avx_ne_convert": False}
AVX512_NO_BF16 = {**AVX2_ONLY, "avx512_f": True, "avx512_bw": True, "avx512_vl": True, "avx512_dq": True}


@pytest.mark.parametrize(
    "caps,native",
    [
        (AVX2_ONLY, False),
        (AVX512_NO_BF16, False),  # oneDNN accepts it for bf16, but emulates: slower than fp32
        ({**AVX512_NO_BF16, "avx512_bf16": True}, True),  # e.g. Zen 4, Cooper Lake
        ({**AVX2_ONLY, "amx_bf16": True}, True),  # Sapphire Rapids
        ({**AVX2_ONLY, "avx_ne_convert": True}, True),
        ({"architecture": "x86_64"}, False),  # no flags known: not native
        ({"architecture": "aarch64", "bf16": False}, False),  # e.g. Graviton 2 / Neoverse N1
        ({"architecture": "aarch64", "bf16": True}, True),  # Graviton 3, Apple M2 and later
    ],
)
def test_cpu_native_bf16_from_the_isa(caps, native):
    assert cpu_has_native_bf16(caps) is native


@pytest.fixture
def cpu_caps(monkeypatch):
    def use(caps):
        monkeypatch.setattr(precision.torch.cpu, "get_capabilities", lambda: caps)
        auto_precision.cache_clear()

    yield use
    auto_precision.cache_clear()


def test_auto_on_cpu_follows_the_capability(cpu_caps):
    cpu_caps(AVX2_ONLY)
    assert resolve_precision("auto", torch.device("cpu")).name == "fp32"
    cpu_caps({**AVX2_ONLY, "avx512_bf16": True})
    assert resolve_precision("auto", torch.device("cpu")).name == "bf16"
    assert resolve_precision("bf16", torch.device("cpu")).name == "bf16"  # forcing still works


def test_avx2_only_cpu_runs_an_auto_trial_in_fp32(cpu_caps, tiny_trial):
    cpu_caps(AVX2_ONLY)
    result = run_trial(dataclasses.replace(tiny_trial, precision="auto"))
    assert result.precision == "fp32" and result.config.precision == "fp32"
    assert result.trial_id == dataclasses.replace(tiny_trial, precision="fp32").trial_id


@pytest.mark.parametrize(
    "capability,expected", [((7, 0), "fp16"), ((7, 5), "fp16"), ((8, 0), "bf16"), ((9, 0), "bf16")]
)
def test_auto_on_cuda_follows_compute_capability(monkeypatch, capability, expected):
    monkeypatch.setattr(precision.torch.cuda, "get_device_capability", lambda index=None: capability)
    auto_precision.cache_clear()
    try:
        plan = resolve_precision("auto", torch.device("cuda"))
    finally:
        auto_precision.cache_clear()
    assert plan.name == expected  # the GradScaler itself is checked on a real GPU (test_gpu.py)


def test_resolve_config_only_touches_auto(cpu_caps, tiny_trial):
    cpu_caps(AVX2_ONLY)
    assert resolve_config(dataclasses.replace(tiny_trial, precision="auto")).precision == "fp32"
    assert resolve_config(dataclasses.replace(tiny_trial, precision="bf16")).precision == "bf16"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
def test_cuda_requested_without_cuda_is_a_clear_error(tiny_trial):
    with pytest.raises(PrecisionError, match="CUDA is not available"):
        resolve_config(dataclasses.replace(tiny_trial, precision="auto", device="cuda"))


def test_cpu_trials_are_told_what_their_precision_costs_here(cpu_caps):
    """An AVX2 walk-through: bf16 asked for ran 3-9x slower than fp32 and nothing said so; what auto chose
    was said nowhere but in the rows."""
    cpu_caps(AVX2_ONLY)
    assert precision.cpu_precision_note("bf16").startswith(
        "precision bf16 on CPU trials: this machine's CPU has no native bf16 (no AVX512-BF16 or AMX): torch emulates"
    )
    assert precision.cpu_precision_note("auto").startswith("precision auto runs fp32 on this machine's CPU")
    assert precision.cpu_precision_note("fp32") is None
    cpu_caps({**AVX2_ONLY, "avx512_bf16": True})
    assert precision.cpu_precision_note("bf16") is None
    assert precision.cpu_precision_note("auto") == "precision auto runs bf16 on this machine's CPU (it has native bf16)"
