"""gpus_per_trial auto: the packing arithmetic, the probe's steps (on a CPU here, on a GPU with -m gpu),
its command line; and where a trial says it ran (trials/placement.py)."""

import json
import socket
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO
from tests.devices import DEVICES
from freezesweep.trials.memory_probe import main, packing, probe
from freezesweep.trials.placement import physical_index, trials_per_gpu, where


@pytest.mark.parametrize(
    "per_trial_mib,gpu_mib,expected",
    [
        (10_000, 81_559, (6, 0.1666)),  # 81559 / (10000 * 1.2) = 6.8: six fit; 1/6 rounded down to Ray's 1/10000
        (20_000, 81_559, (3, 0.3333)),  # 3.4
        (16_311, 81_559, (4, 0.25)),  # 4.17: four, each with its own 20 % beside it
        (40_000, 81_559, (1, 1.0)),  # 1.7: one trial per GPU
        (90_000, 81_559, (1, 1.0)),  # does not fit even alone: a GPU of its own (its OOM row will say so)
        (500, 143_771, (8, 0.125)),  # 230 would fit: capped at 8
    ],
)
def test_packing_fits_as_many_trials_as_the_margin_allows(per_trial_mib, gpu_mib, expected):
    n, share = packing(per_trial_mib, gpu_mib)
    assert (n, share) == expected
    assert n * share <= 1  # Ray can place n trials of that share on one GPU
    assert trials_per_gpu(share) == n  # and the rows will say n trials shared it


def test_packing_margin_and_cap_are_parameters():
    assert packing(10_000, 100_000, margin=0.0) == (8, 0.125)
    assert packing(10_000, 100_000, margin=0.0, max_per_gpu=16) == (10, 0.1)
    assert packing(10_000, 100_000, margin=0.5) == (6, 0.1666)  # each trial keeps 5,000 free: 15,000 apiece
    with pytest.raises(ValueError):
        packing(0, 100_000)
    with pytest.raises(ValueError):
        packing(1_000, 100_000, margin=1.0)


def test_trials_per_gpu_from_the_share():
    assert [trials_per_gpu(s) for s in (0.25, 0.5, 1.0, 0.3333, 0.1428, 0.2)] == [4, 2, 1, 3, 7, 5]
    assert trials_per_gpu(0.0) is None and trials_per_gpu(None) is None  # CPU trials share no GPU
    assert trials_per_gpu(0.6) == 1  # 1.67: one such trial per GPU


def test_physical_index_is_the_one_ray_assigned():
    assert physical_index("3,5", 0) == 3 and physical_index("3,5", 1) == 5  # Ray: CUDA_VISIBLE_DEVICES=ids
    assert physical_index(None, 0) == 0 and physical_index("", 2) == 2
    assert physical_index("GPU-8f2a0c1e-1b2c-4d5e-9f00-112233445566", 0) == 0  # named by UUID: torch's own


def test_a_cpu_trial_names_its_host_and_no_gpu():
    assert where(torch.device("cpu")) == {
        "hostname": socket.gethostname(),
        "gpu_index": None,
        "gpu_name": None,
        "gpu_uuid": None,
        "gpu_mps": None,
    }


def test_the_command_line_refuses_without_a_gpu_and_reports_on_a_cpu(tiny_bert, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["--model", tiny_bert]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err
    assert (
        main(
            [
                "--model",
                tiny_bert,
                "--device",
                "cpu",
                "--precision",
                "fp32",
                "--batch-size",
                "2",
                "--max-seq-length",
                "8",
                "--json",
            ]
        )
        == 0
    )
    reported = json.loads(capsys.readouterr().out)
    assert reported["peak_reserved_mib"] > 0 and reported["gpus_per_trial"] is None


def test_the_probe_runs_without_ray(tiny_bert):
    """The device machines have torch and transformers but no Ray: the probe's command must not
    import it (nor the orchestrator, which does)."""
    code = f"""
import sys
from freezesweep.trials.memory_probe import main
main(["--model", {tiny_bert!r}, "--device", "cpu", "--precision", "fp32", "--batch-size", "2", "--max-seq-length", "8"])
print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'orchestrator')))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "on the CPU (no packing)" in done.stdout and done.stdout.splitlines()[-1] == "[]"


@pytest.mark.parametrize("device", DEVICES)
def test_the_probe_measures_and_packs(tiny_bert, device):
    """The same code path on either device (build, freeze, fused AdamW steps, an evaluation batch); on a
    GPU its reading is the allocator's, beside the context's memory, it packs by the GPU's size, and a
    larger shape reads more; on a CPU it reports the process's peak RSS and picks no packing."""
    from freezesweep.trials.placement import where as placed

    precision = "auto" if device == "cuda" else "fp32"
    light = probe(tiny_bert, batch_size=4, max_seq_length=32, eval_batch_size=8, precision=precision, device=device)
    assert light.peak_reserved_mib > 0
    gpu = placed(torch.device(device))
    if device == "cpu":  # the larger shape's steps only where they take a moment
        assert light.trials_per_gpu is None and light.gpus_per_trial is None and gpu["gpu_uuid"] is None
        assert light.precision == "fp32" and light.outside_allocator_mib == 0
        return
    heavy = probe(tiny_bert, batch_size=64, max_seq_length=128, eval_batch_size=256, device=device)
    assert light.peak_reserved_mib <= heavy.peak_reserved_mib
    assert light.outside_allocator_mib > 0  # the CUDA context, at least
    assert light.gpu_total_mib == torch.cuda.get_device_properties(0).total_memory / 2**20
    assert 1 <= light.trials_per_gpu <= 8 and light.gpus_per_trial * light.trials_per_gpu <= 1
    assert gpu["gpu_uuid"].startswith(("GPU-", "MIG-")) and gpu["gpu_name"] == torch.cuda.get_device_name(0)


def test_the_probe_measures_a_trial_array_on_the_cpu(tiny_bert):
    from freezesweep.trials.memory_probe import describe

    array = probe(
        tiny_bert, batch_size=4, max_seq_length=16, eval_batch_size=8, precision="fp32", device="cpu", width=3
    )
    assert array.width == 3 and array.peak_reserved_mib > 0
    assert describe(array).startswith("one trial array of 3 cells:")


def test_an_array_that_does_not_fit_its_gpu_is_measured_at_half_its_width(tiny_bert, monkeypatch):
    """A (pretend) 3,000 MiB GPU and arrays that take 1,000 MiB per cell: 8 and 4 do not fit with their
    margin, 2 does; the share then packs arrays of 2 (one per GPU: 2,400 MiB with its margin)."""
    import types

    from freezesweep.trials import memory_probe, precision

    measured = []
    monkeypatch.setattr(precision, "resolve_device", lambda device, share=None: torch.device("cuda"))
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda device: types.SimpleNamespace(total_memory=3000 * 2**20, name="pretend"),
    )
    monkeypatch.setattr(
        memory_probe,
        "_measure",
        lambda net, plan, device, shape, width: measured.append(width) or (1000.0 * width, 0.0),
    )
    result = probe(tiny_bert, batch_size=4, max_seq_length=16, precision="fp32", device="cuda", width=8)
    assert measured == [8, 4, 2] and (result.width, result.trials_per_gpu, result.gpus_per_trial) == (2, 1, 1.0)
