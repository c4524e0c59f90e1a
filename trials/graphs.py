"""The training step as CUDA graphs, one per (rows, length bucket): opt-in (``cuda_graphs``), and off
by default until a GPU has measured what it gives (issue 35.4); with it, each evaluation as one graph
(``EvalGraphs``, at the end).

A small model's step on a GPU is about a thousand kernel launches (gpu notes: a BERT-base step at batch
16 is ~0.2 ms of arithmetic and ~70 ms of launching); a captured graph launches them all in one call.
A graph replays fixed shapes, so a batch is padded to the smallest of a few buckets: packed batches
(trials/packing.py) to a token count, with the extra tokens a sequence of their own that no real token
attends to and no head reads; padded batches to a width, masked. The buckets are the quantiles of the
trial's own batch sizes, known on the host before the first step (trials/train.py ``EpochOrders``), so
every batch has one; a batch with fewer rows (an epoch's last) has graphs of its own.

The same weights, the same function: only dropout draws differ (the padding draws masks too), so a
graphed trial is not bit-identical to an eager one. What a graph needs (PyTorch's CUDA graphs notes):
AdamW ``capturable`` with a device-tensor learning rate (the schedule fills it after each replay),
its state created by an eager step first, autocast without its weight cache, no host sync inside (the
loop has none, tests/trials/test_step_syncs.py), a warm-up on the capture stream, and no loss scaling
(fp16's GradScaler decides on the host whether to skip a step: an fp16 trial runs eagerly).

A capture that fails (a model whose forward reads a value on the host, which a capture forbids) is
not a failed trial: the fit goes on eagerly from that step, as an uncaptured one would, and its row
does not list ``cuda_graphs`` (the reason is logged); the worker keeps the verdict, and its later
trials of that model run eagerly from the start (``WorkerState.graph_failures``): a failed capture's
memory pool may stay reserved until the process ends, once at most. Out of GPU memory is not caught here: it is
the trial's, as any other step's (trials/oom.py). A fault that leaves the GPU unusable fails the eager
step too, and the trial with it, as without graphs.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from freezesweep.trials import cpu_graphs
from freezesweep.trials.oom import is_oom
from freezesweep.trials.packing import Packed
from freezesweep.trials.tokens import Batch

log = logging.getLogger(__name__)

BUCKETS = 4  # graphs per row count: captures cost one step's launches each, and a pool of activations
MULTIPLE = 8  # bucket sizes in multiples of 8 tokens (tensor-core friendly shapes)


# FREEZESWEEP_CPU_GRAPHS=1 on a machine without CUDA: a CPU trial with ``cuda_graphs`` records and replays
# its graphs (trials/cpu_graphs.py), so the graphed paths run end to end in worker processes where there
# is no GPU (the GPU check's smoke mode rehearses the GPU's commands so). A rehearsal: slower, never faster.
CPU_GRAPHS = "FREEZESWEEP_CPU_GRAPHS"


def rehearsal() -> bool:
    """Whether graphs run recorded on this machine's CPU (``CPU_GRAPHS``; never where CUDA is)."""
    return os.environ.get(CPU_GRAPHS) == "1" and not torch.cuda.is_available()


def graphs_run_on(device: torch.device) -> bool:
    """Where graphs run: a GPU; a CPU in a rehearsal."""
    return device.type == "cuda" or (device.type == "cpu" and rehearsal())


def cuda_graphs_apply(cfg, device: torch.device, plan, train_prefix) -> bool:
    """Whether this trial's steps run as CUDA graphs: asked for, on a GPU (``graphs_run_on``), without
    fp16's loss scaling and without the opt-in training cache (its states are gathered per step on the
    host)."""
    return bool(cfg.cuda_graphs) and graphs_run_on(device) and plan.name != "fp16" and train_prefix is None


def length_buckets(sizes: Iterable[int], count: int = BUCKETS, multiple: int = MULTIPLE) -> tuple[int, ...]:
    """At most ``count`` sizes covering ``sizes`` (each batch's token count or width): their quantiles,
    rounded up to a multiple of ``multiple``; the largest covers the largest batch."""
    values = np.asarray(list(sizes))
    quantiles = np.quantile(values, np.linspace(0, 1, count + 1)[1:], method="higher")
    return tuple(sorted({int(-(-q // multiple) * multiple) for q in quantiles}))


def bucket_for(size: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket that holds ``size`` (None: none does)."""
    return next((b for b in buckets if b >= size), None)


Fed = TypeVar("Fed", Batch, Packed)


def padded_to(batch: Fed, size: int, pad_id: int) -> Fed:
    """``batch`` with ``size`` columns: a packed row's extra tokens are a sequence of their own (id -1:
    only they attend to each other, at the first row's starting position), a padded batch's are masked."""
    extra = size - batch.input_ids.shape[1]
    if isinstance(batch, Packed):
        tail = torch.full((extra,), -1, dtype=batch.sequence.dtype, device=batch.sequence.device)
        return dataclasses.replace(
            batch,
            input_ids=F.pad(batch.input_ids, (0, extra), value=pad_id),
            position_ids=torch.cat([batch.position_ids, batch.position_ids[:, :1].expand(1, extra)], 1),
            sequence=torch.cat([batch.sequence, tail]),
            token_type_ids=None if batch.token_type_ids is None else F.pad(batch.token_type_ids, (0, extra)),
        )
    return dataclasses.replace(
        batch,
        input_ids=F.pad(batch.input_ids, (0, extra), value=pad_id),
        attention_mask=F.pad(batch.attention_mask, (0, extra)),
        token_type_ids=None if batch.token_type_ids is None else F.pad(batch.token_type_ids, (0, extra)),
    )


def _tensors(batch: Batch | Packed) -> list[torch.Tensor]:
    return [v for f in dataclasses.fields(batch) if isinstance(v := getattr(batch, f.name), torch.Tensor)]


def capture(
    step: Callable, warm: Callable, inputs: Batch | Packed, shared: dict
) -> tuple[Callable[[], None], torch.Tensor]:
    """``step(inputs)`` captured as a CUDA graph (after ``warm(inputs)`` on the capture stream, which
    initialises what the libraries set up lazily): (replay, the loss it writes). A trial's graphs share
    one memory pool and capture stream (``shared``): they replay one at a time, and nothing one of them
    writes is read after another replays (the loss is copied at once, the gradients used within). In a
    rehearsal, recorded on the CPU (``capture_on_cpu``)."""
    if rehearsal():
        return capture_on_cpu(step, warm, inputs, shared)
    stream = shared.setdefault("stream", torch.cuda.Stream())
    pool = shared.setdefault("pool", torch.cuda.graph_pool_handle())
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        warm(inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph, previous = torch.cuda.CUDAGraph(), torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            loss = step(inputs)
    except BaseException:
        # torch.cuda.graph's __exit__ ends the capture before it leaves its stream context, so a failed
        # capture leaves the capture stream current (torch/cuda/graphs.py): the eager steps run where
        # the trial's did
        torch.cuda.set_stream(previous)
        raise
    shared.setdefault("graphs", []).append(graph)
    return graph.replay, loss


def capture_on_cpu(
    step: Callable, warm: Callable, inputs: Batch | Packed, shared: dict
) -> tuple[Callable[[], None], torch.Tensor]:
    """``capture``'s stand-in where there is no GPU (tests, a rehearsal): warmed up, then recorded with a CUDA
    graph's contract (trials/cpu_graphs.py: a replay runs the recorded operators on the captured
    tensors, no Python; the capture itself updates nothing; a host read in it fails)."""
    warm(inputs)
    return cpu_graphs.record(lambda: step(inputs))


@dataclass
class _Graph:
    inputs: Batch | Packed  # the static batch each replay reads (a new one is copied into it): ``fit``'s
    replay: Callable[[], None]
    loss: torch.Tensor  # the static loss each replay writes


class StepGraphs:
    """A training step (``eager(batch) -> loss``) that replays a captured graph of ``step`` for every
    batch a bucket holds, once ``ready()`` (the optimizer's state exists): ``step`` is the update
    without the schedule (forward, backward, clipping, the optimizer), ``warm`` the same without the
    optimizer (weights untouched), ``after`` what follows each replay (the schedule), ``reset`` drops
    the gradients' references around a capture. ``capture``: how a graph is made (``capture_on_cpu``
    stands in on a CPU). ``fit``: a batch's graph key and the batch as that graph takes it, or None
    (eager); default: its (rows, length bucket), padded to the bucket."""

    def __init__(
        self, eager, step, warm, after, reset, ready, buckets: tuple[int, ...], pad_id: int, capture=None, fit=None
    ):
        self.eager, self.step, self.warm, self.after, self.reset, self.ready = eager, step, warm, after, reset, ready
        self.buckets, self.pad_id = buckets, pad_id
        self.capture = capture
        self.fit = fit or self._bucketed
        self.graphs: dict[object, _Graph] = {}
        self.shared: dict = {}  # what the captures share (a CUDA memory pool and stream)
        self.failed: str | None = None  # why a capture failed: every step from then on is eager

    def _bucketed(self, batch: Fed) -> tuple[tuple[int, int], Fed] | None:
        bucket = bucket_for(batch.input_ids.shape[1], self.buckets)
        return None if bucket is None else ((len(batch.labels), bucket), padded_to(batch, bucket, self.pad_id))

    def __call__(self, batch) -> torch.Tensor:
        fitted = None if self.failed or not self.ready() else self.fit(batch)
        if fitted is None:
            return self.eager(batch)
        key, padded = fitted
        graph = self.graphs.get(key)
        if graph is None:
            graph = self._capture_or_none(padded)
            if graph is None:
                return self.eager(batch)
            self.graphs[key] = graph
        for static, new in zip(_tensors(graph.inputs), _tensors(padded)):
            static.copy_(new)
        graph.replay()
        self.reset()  # a replay leaves no gradient behind (a captured backward writes into its own memory)
        self.after()
        return graph.loss.clone()  # the static output is overwritten by the next replay

    def _capture_or_none(self, inputs: Batch | Packed) -> _Graph | None:
        """The graph of ``inputs``' shape, or None where capturing failed (then never again: eager)."""
        try:
            return self._capture(inputs)
        except RuntimeError as exc:
            if is_oom(exc):
                raise
            self.failed = capture_error(exc)
            log.warning("a CUDA graph capture failed, the fit goes on eagerly: %s", self.failed)
            self.graphs.clear()  # (their pool may stay reserved: PyTorch releases a pool after an ended capture)
            self.shared.clear()
            self.reset()  # the failed step's gradients (a capture's writes never ran)
            return None

    def _capture(self, inputs: Batch | Packed) -> _Graph:
        inputs = dataclasses.replace(
            inputs, **{f.name: _clone(getattr(inputs, f.name)) for f in dataclasses.fields(inputs)}
        )
        self.reset()
        replay, loss = (self.capture or capture)(self.step, self._warm_then_reset, inputs, self.shared)
        self.reset()
        return _Graph(inputs, replay, loss)

    def _warm_then_reset(self, inputs: Batch | Packed) -> torch.Tensor:
        loss = self.warm(inputs)
        self.reset()
        return loss


def capture_error(exc: BaseException) -> str:
    """What made a capture fail: the first error of the chain (the capture's end then raises its own,
    "operation failed due to a previous error during capture"), on one line."""
    first = exc
    while first.__context__ is not None:
        first = first.__context__
    said = f"{type(first).__name__}: {first}".splitlines()
    return (said[0] if said else type(first).__name__)[:300]


def _clone(value):
    return value.clone() if isinstance(value, torch.Tensor) else value


# --- evaluations as graphs -------------------------------------------------------------------------
# An evaluation is the same computation every time: the validation batches, on the device from the
# trial's start, through weights the optimizer updates in place. On a GPU an eager one is a few hundred
# kernel launches per batch (a trial array's: per batch and depth group), which the host issues one by
# one: on an H200 an array's evaluations took 36 % of its trial time (docs/speed.md, 2026-11-29).
def evaluation_graphs_apply(graphed: bool, device: torch.device) -> bool:
    """Whether evaluations run as CUDA graphs: where the training step does (``cuda_graphs_apply``), on a
    GPU (``graphs_run_on``)."""
    return graphed and graphs_run_on(device)


def capture_evaluation(run: Callable[[], tuple[torch.Tensor, ...]], shared: dict):
    """``run()`` captured as a CUDA graph after a warm-up run on the capture stream: (replay, its outputs);
    in a rehearsal, recorded on the CPU. Through ``capture``, so a stand-in for it (``capture_on_cpu``)
    stands in here too."""
    return capture(lambda _: run(), lambda _: run(), None, shared)


class EvalGraphs:
    """Evaluations as CUDA graphs: each ``key``'s evaluation (``run()``: every validation batch through
    the model, its device outputs) captured at its first time and replayed at the later ones. The
    captured run reads what it reads where it is, so a replay sees the weights as they are now; it reads
    nothing on the host (a capture refuses a host sync or a host-to-device copy, so the model gets its
    padding mask prebuilt where it can: trials/packing.py ``evaluation_feed``). A capture that fails
    is not a failed trial: that evaluation and every later one run eagerly, and ``failed`` says why.
    The graphs share one memory pool: one replays at a time, and its outputs are copied at once."""

    def __init__(self) -> None:
        self.graphs: dict = {}
        self.shared: dict = {}  # the captures' memory pool and stream
        self.failed: str | None = None

    def __call__(self, key, run: Callable[..., tuple[torch.Tensor, ...]], inputs: Callable[[], tuple] = tuple):
        """``run(*inputs())``'s outputs, replayed from ``key``'s graph; ``inputs`` makes what the run
        reads from the host (an index, say), once per graph: kept with it, as the replays read it."""
        if self.failed is not None:
            return run(*inputs())
        graph = self.graphs.get(key)
        if graph is None:
            held = inputs()
            try:
                graph = self.graphs[key] = (*capture_evaluation(lambda: run(*held), self.shared), held)
            except RuntimeError as exc:
                if is_oom(exc):
                    raise  # the trial's, as any step's (trials/oom.py)
                self.failed = capture_error(exc)
                log.warning("an evaluation's CUDA graph capture failed, evaluations run eagerly: %s", self.failed)
                self.graphs.clear()
                self.shared.clear()
                return run(*held)
        replay, outputs, _ = graph
        replay()
        return tuple(output.clone() for output in outputs)  # the next replay overwrites them
