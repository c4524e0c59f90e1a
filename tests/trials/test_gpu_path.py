"""The GPU path, checked on a CPU (issue 23): each test stands in for what only a GPU machine would show,
with CUDA mocked where it must be, and failed on the code before its fix."""

import dataclasses

import pytest
import torch

from freezesweep.trials import memory_probe, packing, run, train
from freezesweep.trials.precision import PrecisionPlan, resolve_device, trial_device
from freezesweep.trials.tokens import Batch, collate


def test_a_cpu_cell_runs_on_the_cpu_on_a_node_with_gpus(tiny_trial, monkeypatch):
    """Ray leaves CUDA_VISIBLE_DEVICES alone for an actor holding no GPU: a cell scheduled without a
    GPU share must pin itself to the CPU, or it opens a CUDA context on GPU 0 outside Ray's accounting."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert trial_device(dataclasses.replace(tiny_trial, gpus_per_trial=0.0)).type == "cpu"
    assert trial_device(dataclasses.replace(tiny_trial, gpus_per_trial=0.25)).type == "cuda"  # the GPU Ray gave it
    assert trial_device(dataclasses.replace(tiny_trial, gpus_per_trial=None)).type == "cuda"  # `trial` outside a sweep
    assert resolve_device("cpu", 0.5).type == "cpu"  # an explicit device is the user's


def test_the_plan_gives_each_cell_its_share(write_spec):
    pytest.importorskip("ray")  # the device machines run trials/ without Ray or the orchestrator
    from freezesweep.orchestrator.checks import load_spec
    from freezesweep.orchestrator.plan import build_grid, with_doubled_gpu_share, with_resources
    from freezesweep.orchestrator.sweeps import resolve_here

    sweep = resolve_here(load_spec(write_spec()))
    assert {with_resources(c, sweep).gpus_per_trial for c in build_grid(sweep)} == {0.0}
    shared = dataclasses.replace(sweep, gpu_share=0.25)
    retry = with_doubled_gpu_share(shared)
    assert with_resources(build_grid(sweep)[0], retry).gpus_per_trial == 0.5  # the retry's cells ask for more


def test_copies_to_the_host_are_synchronous(tiny_trial, monkeypatch):
    """A CUDA tensor copied to the host with non_blocking=True and read before a sync can be garbage
    (PyTorch's pinned-memory tutorial); the packing verdict reads its host copy at once."""
    calls = []
    original = torch.Tensor.to

    def spy(self, *args, **kwargs):
        calls.append((str(args[0]) if args else str(kwargs.get("device")), kwargs.get("non_blocking", False)))
        return original(self, *args, **kwargs)

    batch = collate(_tokens([[101, 7, 102], [101, 102]]), torch.tensor([1, 0]).numpy(), pad_id=0)
    monkeypatch.setattr(torch.Tensor, "to", spy)
    batch.to(torch.device("cpu"))
    packing.pack(batch, 0).to(torch.device("cpu"))
    assert calls and all(not non_blocking for device, non_blocking in calls if device.startswith("cpu"))
    from freezesweep.trials.tokens import non_blocking_to

    assert non_blocking_to("cuda:0") and not non_blocking_to("cpu")  # towards a GPU it may stay asynchronous


def _tokens(rows):
    import numpy as np

    from freezesweep.trials.tokens import Tokens

    return Tokens(input_ids=tuple(np.array(r) for r in rows), token_type_ids=None)


def test_a_step_the_scaler_skips_does_not_advance_the_schedule():
    """fp16 with loss scaling: an inf gradient makes the scaler skip the optimizer step; the HF Trainer
    then leaves the learning rate where it was (accelerate's step_was_skipped)."""
    from transformers import get_linear_schedule_with_warmup

    net = torch.nn.Linear(3, 2)
    params = list(net.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-3, fused=True)
    scheduler = get_linear_schedule_with_warmup(optimizer, 0, 10)
    scaler = torch.amp.GradScaler("cpu", enabled=True)  # fp16's scaler, on a CPU

    class Feed:  # logits from the linear layer; an inf gradient on the first step only
        def logits(self, model, batch):
            return model(batch.input_ids.float())

    batch = Batch(input_ids=torch.ones(4, 3), attention_mask=torch.ones(4, 3), labels=torch.tensor([0, 1, 0, 1]))
    plan = PrecisionPlan("fp32", "cpu")  # the autocast is not what this is about
    hook = net.weight.register_hook(lambda grad: torch.full_like(grad, float("inf")))
    before = net.weight.detach().clone()
    train.train_step(net, batch, optimizer, scheduler, scaler, params, plan, Feed(), max_grad_norm=1.0)
    assert scheduler.last_epoch == 0 and torch.equal(net.weight.detach(), before)  # skipped: nothing moved
    hook.remove()
    train.train_step(net, batch, optimizer, scheduler, scaler, params, plan, Feed(), max_grad_norm=1.0)
    assert scheduler.last_epoch == 1 and not torch.equal(net.weight.detach(), before)


def test_cuda_is_initialised_before_its_memory_statistics(monkeypatch):
    """On cuda:N in a fresh process, resetting the peak before CUDA is initialised raises "Invalid
    device argument ... did you call init?"."""
    events = []
    monkeypatch.setattr(torch.cuda, "init", lambda: events.append("init"))

    def reset(device=None):
        if "init" not in events:
            raise RuntimeError("Invalid device argument : did you call init?")
        events.append("reset")

    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    run.reset_peak_memory(torch.device("cuda:1"))
    assert events == ["init", "reset"]


def test_the_memory_probe_measures_a_packed_trial_and_counts_the_evaluation_cache(tiny_bert, monkeypatch):
    """Packed batches build dense [T, T] masks (no bound from padded ones), and a worker keeps its
    evaluation cache entries beside its trial (a hidden state per token position): both are in what
    the probe counts; its command line bounds the entries at max_seq_length tokens a row."""
    fed = []
    logits = packing.PackedFeed.logits
    monkeypatch.setattr(
        packing.PackedFeed, "logits", lambda self, model, packed: fed.append(packed) or logits(self, model, packed)
    )
    shape = dict(batch_size=4, max_seq_length=16, eval_batch_size=8, precision="fp32", device="cpu")
    result = memory_probe.probe(tiny_bert, **shape, eval_tokens=3 * 1000 * 16)
    assert fed and fed[-1].input_ids.shape == (1, 4 * 16)  # packed: every token of the batch in one row
    assert result.eval_cache_mib == pytest.approx(3 * 1000 * 16 * 32 * 4 / 2**20)  # positions × hidden × fp32
    assert result.per_trial_mib == pytest.approx(result.peak_reserved_mib + result.eval_cache_mib)
    probed = []
    monkeypatch.setattr(memory_probe, "probe", lambda **kwargs: probed.append(kwargs) or result)
    flags = "--batch-size 4 --max-seq-length 16 --device cpu --eval-rows 1000 --eval-entries 3"
    assert memory_probe.main(["--model", tiny_bert, *flags.split()]) == 0
    assert probed[0]["eval_tokens"] == 3 * 1000 * 16  # 3 entries of 1,000 rows at 16 tokens


def test_train_time_runs_to_the_last_step(tiny_trial, monkeypatch):
    """The steps after the last evaluation are trained too: the clock stops after a synchronize that
    follows the last step, not at the last evaluation."""
    events = []
    step, sync = train.train_step, train.synchronize
    monkeypatch.setattr(train, "train_step", lambda *a, **k: events.append("step") or step(*a, **k))
    monkeypatch.setattr(train, "synchronize", lambda device: events.append("sync") or sync(device))
    # 40 rows at batch 16: 3 steps an epoch, so 1.5 epochs are 5 steps; evaluations every ceil(0.5 * 40 / 16)
    # = 2 steps, at 2 and 4: step 5 comes after the last evaluation.
    result = run.run_trial(dataclasses.replace(tiny_trial, train_size=40, epochs=1.5))
    assert [p.step for p in result.eval_curve] == [2, 4] and events.count("step") == 5
    assert events[-1] == "sync" and events[-2] == "step"


def test_a_gpu_trial_runs_attention_without_cudnns_kernels(tiny_trial, monkeypatch):
    """cuDNN attention builds a plan for every new shape (~0.1 s a packed token count on an H100, where
    a step is ~35 ms): a trial on a GPU starts with it off; a CPU trial leaves the switch alone."""
    calls = []
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", calls.append)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a, **k: None)
    monkeypatch.setattr(run, "reset_peak_memory", lambda device: None)
    run.start_trial(dataclasses.replace(tiny_trial, device="cpu"))
    assert calls == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    device, _ = run.start_trial(dataclasses.replace(tiny_trial, device="cuda", precision="fp32"))
    assert device.type == "cuda" and calls == [False]
