"""How many trials fit on one GPU: measure one trial's peak GPU memory, then pack (plain PyTorch).

``resources.gpus_per_trial: auto`` in a spec runs ``probe`` on a GPU of the cluster (a Ray task
holding a whole GPU, orchestrator/launch.py); alone, on any machine with torch and transformers:

    python -m freezesweep.trials.memory_probe --model M --batch-size 16 --max-seq-length 128 [--eval-batch-size 64]

What is measured: a few real training steps (forward, backward, clipped fused AdamW step, in the
trial's precision, as trials/train.py runs them) on batches of ``batch_size`` rows of ``max_seq_length``
tokens (the longest a batch can be, so the worst case), fed as a trial feeds them: packed into one row
where the model qualifies (trials/packing.py; its block-diagonal mask is a dense [T, T] matrix, T the
batch's tokens: 32 × 512 rows make it ~1 GiB in fp32), padded otherwise; then one evaluation batch of
``eval_batch_size`` rows of that length, with the fewest frozen layers of the sweep (the most
gradients and optimizer state). A trial process costs the allocator's peak *reserved* memory (what it
holds back from the other processes, not only what its tensors used) plus what the process holds
outside the allocator (the CUDA context and libraries' workspaces, measured as the device's used
memory minus the allocator's reservation) plus the evaluation cache entries a worker keeps on the
device, counted, not measured: a hidden state per token position of each entry (``eval_tokens``: a
sweep counts its validation sets' real padded lengths, one entry per dataset and cached depth, and of
a random init per seed: orchestrator/launch.py; on the command line, a bound of ``--eval-rows`` rows at
``max_seq_length`` tokens per entry; not capped at the worker's budget for them, trials/worker.py
``MAX_EVAL_MIB``: a probe trial holds its every-layer states whatever it). Each trial then keeps a margin
of its own.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass

import torch

from freezesweep.trials.placement import share_for

# A sane bound, not a measured optimum: past a handful of processes a GPU time-slices them, each pays
# its own CUDA context, and each needs its own CPU cores (benchmarks/gpu_check.sh pack compares 1, 4, 8).
MAX_TRIALS_PER_GPU = 8
MARGIN = 0.2  # of each trial's memory, kept free beside it: allocator fragmentation, what a bound misses


@dataclass(frozen=True)
class MemoryProbe:
    peak_reserved_mib: float  # the allocator's peak reservation over the steps and the evaluation batch
    outside_allocator_mib: float  # CUDA context and library workspaces (0 on a CPU)
    eval_cache_mib: float  # the worker's evaluation cache entries: a hidden state per token position
    gpu_total_mib: float | None  # None on a CPU
    gpu_name: str | None
    precision: str
    trials_per_gpu: int | None
    gpus_per_trial: float | None
    width: int = 1  # the cells of the trial array measured (trials/array.py); 1: a single trial
    eval_tokens: int = 0  # the token positions of those entries

    @property
    def per_trial_mib(self) -> float:
        return self.peak_reserved_mib + self.outside_allocator_mib + self.eval_cache_mib


def packing(
    per_trial_mib: float, gpu_total_mib: float, margin: float = MARGIN, max_per_gpu: int = MAX_TRIALS_PER_GPU
) -> tuple[int, float]:
    """(trials per GPU, gpus_per_trial): as many trials as fit on the GPU each with its ``margin`` (a
    fraction of its own memory: n trials keep n margins, not one shared by all), at least 1 (one that
    does not fit still gets a GPU of its own) and at most ``max_per_gpu``. The share is 1/n rounded
    down to Ray's resolution, so n of them fit on one GPU (1/3 -> 0.3333)."""
    if per_trial_mib <= 0 or gpu_total_mib <= 0 or not 0 <= margin < 1:
        raise ValueError(f"cannot pack {per_trial_mib} MiB trials on a {gpu_total_mib} MiB GPU with margin {margin}")
    fits = math.floor(gpu_total_mib / (per_trial_mib * (1 + margin)))
    n = max(1, min(max_per_gpu, fits))
    return n, share_for(n)


def probe(
    model: str,
    batch_size: int,
    max_seq_length: int,
    eval_batch_size: int = 64,
    precision: str = "auto",
    frozen_layers: int = 0,
    model_init: str = "pretrained",
    num_labels: int = 2,
    steps: int = 3,
    device: str = "cuda",
    margin: float = MARGIN,
    max_per_gpu: int = MAX_TRIALS_PER_GPU,
    width: int = 1,
    eval_tokens: int = 0,
) -> MemoryProbe:
    """Measure one trial (``device="cpu"`` runs the same steps for tests and reports the process's
    peak RSS, with no packing) and pick the packing. ``width`` > 1: one trial array of that many
    cells, each at ``frozen_layers`` (the most an array of the grid stacks); on a GPU one that does not
    fit is measured again at half its width, down to 1: the width is the one that fits.
    ``eval_tokens``: the token positions of the evaluation cache entries a worker keeps (it keeps every
    depth it met, up to trials/worker.py's ``MAX_EVAL_ENTRIES``; an array holds each of its depths)."""
    from freezesweep.trials.freezing import freeze
    from freezesweep.trials.model import attention_kernels, build_model
    from freezesweep.trials.precision import resolve_device, resolve_precision

    target = resolve_device(device)
    plan = resolve_precision(precision, target)
    attention_kernels(
        target
    )  # the kernels its trials will run (trials/model.py): process-wide, in the caller's process
    while True:
        torch.manual_seed(0)
        net = build_model(model, num_labels, model_init)
        freeze(net, frozen_layers)
        peak, outside = _measure(net, plan, target, (batch_size, max_seq_length, eval_batch_size, steps), width)
        cache = states_mib(net, eval_tokens, plan)  # uncapped: a probe trial holds its states whatever the budget
        if target.type != "cuda":
            return MemoryProbe(peak, outside, cache, None, None, plan.name, None, None, width, eval_tokens)
        props = torch.cuda.get_device_properties(target)
        total = props.total_memory / 2**20
        if width == 1 or (peak + outside + cache) * (1 + margin) <= total:
            n, share = packing(peak + outside + cache, total, margin, max_per_gpu)
            return MemoryProbe(peak, outside, cache, total, props.name, plan.name, n, share, width, eval_tokens)
        del net
        width //= 2


def states_mib(net, tokens: int, plan) -> float:
    """A hidden state per token position, in the precision the frozen layers compute in
    (trials/eval_cache.py)."""
    element = 4 if plan.name == "fp32" else 2
    return tokens * net.config.hidden_size * element / 2**20


def _measure(net, plan, device: torch.device, shape: tuple[int, int, int, int], width: int) -> tuple[float, float]:
    """(peak MiB, MiB outside the allocator) of moving the model to ``device`` and running the steps
    (``shape``: batch size, sequence length, evaluation batch size, steps) as one trial or an array."""
    from freezesweep.trials.run import peak_memory_mb, reset_peak_memory

    if device.type == "cuda":
        torch.cuda.empty_cache()
    reset_peak_memory(device)
    net.to(device)
    if width > 1:
        _run_array_steps(net, plan, device, *shape, width)
    else:
        _run_steps(net, plan, device, *shape)
    if device.type != "cuda":
        return peak_memory_mb(device), 0.0
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    outside = max(0.0, (total - free - torch.cuda.memory_reserved(device)) / 2**20)
    return torch.cuda.max_memory_reserved(device) / 2**20, outside


def _run_steps(
    net, plan, device: torch.device, batch_size: int, max_seq_length: int, eval_batch_size: int, steps: int
) -> None:
    """Training steps as trials/train.py takes them, fed as a trial feeds them (packed where the model
    qualifies: trials/packing.py), then one evaluation batch as trials/evaluate.py."""
    from transformers import get_linear_schedule_with_warmup

    from freezesweep.trials import first_token
    from freezesweep.trials.evaluate import evaluate
    from freezesweep.trials.packing import training_feed
    from freezesweep.trials.train import train_step
    from freezesweep.trials.worker import FeedKey

    vocab, labels = net.config.vocab_size, net.config.num_labels
    generator = torch.Generator().manual_seed(0)
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5, fused=True)  # its state is part of a trial's footprint
    scheduler = get_linear_schedule_with_warmup(optimizer, 0, steps)
    scaler = plan.grad_scaler()
    check = _batch(min(batch_size, 8), max_seq_length, vocab, labels, generator, ragged=True).to(device)
    reader, feed = training_feed(net, check, FeedKey("probe", type(net).__qualname__), {})
    net.train()
    with first_token.narrowed(net, reader):
        for _ in range(steps):
            batch = feed.prepare(_batch(batch_size, max_seq_length, vocab, labels, generator)).to(device)
            train_step(net, batch, optimizer, scheduler, scaler, params, plan, feed, max_grad_norm=1.0)
        evaluate(net, [_batch(eval_batch_size, max_seq_length, vocab, labels, generator).to(device)], plan, device)


def _run_array_steps(
    net, plan, device: torch.device, batch_size: int, max_seq_length: int, eval_batch_size: int, steps: int, width: int
) -> None:
    """``_run_steps`` for a trial array of ``width`` cells (trials/array.py): the stacked copies of what
    they train, with AdamW's state for each, then one evaluation batch for all."""
    from torch.func import vmap

    from freezesweep.trials import first_token
    from freezesweep.trials.array import evaluate_array, stack_model
    from freezesweep.trials.evaluate import task_loss
    from freezesweep.trials.model import eager_attention
    from freezesweep.trials.packing import training_feed
    from freezesweep.trials.worker import FeedKey

    eager_attention(net)  # as an array's model runs (trials/array.py build_array)
    vocab, labels = net.config.vocab_size, net.config.num_labels
    generator = torch.Generator().manual_seed(0)
    check = _batch(min(batch_size, 8), max_seq_length, vocab, labels, generator, ragged=True).to(device)
    reader, feed = training_feed(net, check, FeedKey("probe", type(net).__qualname__), {})
    stack = stack_model(net, {n for n, p in net.named_parameters() if p.requires_grad}, width)
    optimizer = torch.optim.AdamW(list(stack.tensors.values()), lr=1e-5, fused=True)  # as the members' together
    net.train()
    with first_token.narrowed(net, reader):
        for _ in range(steps):
            batch = feed.prepare(_batch(batch_size, max_seq_length, vocab, labels, generator)).to(device)
            with plan.autocast():
                logits = stack.logits(feed, batch)
            vmap(task_loss, in_dims=(0, None))(logits, batch.labels).sum().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        evaluate_array(
            stack, [_batch(eval_batch_size, max_seq_length, vocab, labels, generator).to(device)], plan, device, None
        )


def _batch(rows: int, length: int, vocab: int, num_labels: int, generator: torch.Generator, ragged: bool = False):
    """``rows`` random token sequences of exactly ``length`` tokens (no padding: the worst case);
    ``ragged``: of different lengths (what the packing check needs: padding to remove)."""
    from freezesweep.trials.tokens import Batch

    ids = torch.randint(vocab, (rows, length), generator=generator)
    mask = torch.ones_like(ids)
    if ragged:
        mask = (torch.arange(length)[None, :] < torch.linspace(2, length, rows).long()[:, None]).long()
    labels = torch.arange(rows) % num_labels if num_labels > 1 else torch.rand(rows, generator=generator) * 5
    return Batch(input_ids=ids, attention_mask=mask, labels=labels)


def describe(result: MemoryProbe) -> str:
    what = "one trial" if result.width == 1 else f"one trial array of {result.width} cells"
    if result.gpu_total_mib is None:
        return (
            f"{what}: the process's peak RSS {result.peak_reserved_mib:.0f} MiB ({result.precision}) "
            "on the CPU (no packing)"
        )
    return (
        f"{what}: peak {result.peak_reserved_mib:.0f} MiB reserved + {result.outside_allocator_mib:.0f} MiB "
        f"outside the allocator + {result.eval_cache_mib:.0f} MiB evaluation cache ({result.eval_tokens:,} "
        "token positions) = "
        f"{result.per_trial_mib:.0f} MiB ({result.precision}) on {result.gpu_name} "
        f"({result.gpu_total_mib:.0f} MiB): {result.trials_per_gpu} trials per GPU, "
        f"gpus_per_trial {result.gpus_per_trial:g}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Measure one trial's peak GPU memory and pick gpus_per_trial.")
    parser.add_argument("--model", required=True, help="hub id or local model folder")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--eval-batch-size", type=int, default=64)
    parser.add_argument("--precision", default="auto", choices=["auto", "fp16", "bf16", "fp32"])
    parser.add_argument("--frozen-layers", type=int, default=0, help="the sweep's fewest (the largest footprint)")
    parser.add_argument("--model-init", default="pretrained", choices=["pretrained", "random"])
    parser.add_argument("--num-labels", type=int, default=2)
    parser.add_argument(
        "--eval-rows", type=int, default=0, help="validation rows a worker caches (bounded at max_seq_length tokens)"
    )
    parser.add_argument(
        "--eval-entries", type=int, default=1, help="evaluation cache entries a worker keeps (each bounded as above)"
    )
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--width", type=int, default=1, help="a trial array of this many cells (halved until it fits)")
    parser.add_argument("--margin", type=float, default=MARGIN)
    parser.add_argument("--max-per-gpu", type=int, default=MAX_TRIALS_PER_GPU)
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N (cpu: the same steps, peak RSS, no packing)")
    parser.add_argument("--json", action="store_true", help="print the measurement as JSON")
    args = vars(parser.parse_args(argv))
    as_json = args.pop("json")
    args["eval_tokens"] = args.pop("eval_rows") * args["max_seq_length"] * args.pop("eval_entries")  # a bound
    if args["device"].startswith("cuda") and not torch.cuda.is_available():
        print("error: no CUDA GPU here: the probe measures GPU memory", file=sys.stderr)
        return 2
    import transformers

    transformers.logging.set_verbosity_error()  # the new head's "missing weights" report is expected
    transformers.utils.logging.disable_progress_bar()
    result = probe(**args)
    print(json.dumps({**asdict(result), "per_trial_mib": result.per_trial_mib}) if as_json else describe(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
