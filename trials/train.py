"""The reference training loop: AdamW, linear warmup then linear decay to 0, evaluation every
``eval_every_epochs``, every evaluation's metrics kept (the best is picked from them afterwards),
never a weights checkpoint. The loss is the task's: cross-entropy, or MSE for regression.

An optional checkpoint every ``checkpoint_every_epochs`` (trainable weights, optimizer, scheduler,
RNG states, curves) lets a long trial resume where it stopped; a resumed trial follows exactly the
path an uninterrupted one would have.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import get_linear_schedule_with_warmup

from freezesweep.trials import faults
from freezesweep.trials.config import EvalPoint, TrialConfig
from freezesweep.trials.eval_cache import PrefixStates
from freezesweep.trials.graphs import EvalGraphs, StepGraphs, length_buckets
from freezesweep.trials.evaluate import eval_labels, evaluate, task_loss
from freezesweep.trials.packing import Packed, PackedFeed, PaddedFeed
from freezesweep.trials.precision import PrecisionPlan, synchronize
from freezesweep.trials.tokens import Batch, DeviceRows, Tokens, device_rows, to_device
from freezesweep.trials.train_cache import TrainPrefix


@dataclass(frozen=True)
class Schedule:
    steps_per_epoch: int
    total_steps: int
    warmup_steps: int
    eval_steps: frozenset[int]
    checkpoint_steps: frozenset[int]


def steps_for(epochs: float, n_train: int, batch_size: int) -> int:
    """Optimizer steps in ``epochs`` epochs, counted from the float epoch length as HF Trainer does
    (``eval_steps``/``warmup_steps`` given in epochs): ``ceil(epochs * n_train / batch_size)``."""
    return max(1, _ceil(epochs * n_train / batch_size))


def _ceil(x: float) -> int:
    """ceil that ignores float noise: 1.1 * 800 / 16 is 55.000000000000014, which is 55 steps, not 56."""
    return math.ceil(round(x, 9))


def make_schedule(n_train: int, cfg: TrialConfig) -> Schedule:
    """The reference study's schedule (HF Trainer): ``total = ceil(epochs * ceil(n / batch))`` steps;
    evaluate when ``step % eval_every == 0`` with ``eval_every = ceil(eval_every_epochs * n / batch)``,
    never forcing an evaluation at the end (``eval_at_end`` adds one); warmup
    ``ceil(warmup_epochs * n / batch)`` steps. n = 50, 100, 200, 500, 1000 at batch 16, 10 epochs,
    half-epoch evaluation → 20, 17, 18, 20, 19 evaluations."""
    steps_per_epoch = math.ceil(n_train / cfg.batch_size)
    total = max(1, _ceil(cfg.epochs * steps_per_epoch))

    def every(epochs: float | None) -> frozenset[int]:
        if not epochs:
            return frozenset()
        stride = steps_for(epochs, n_train, cfg.batch_size)
        return frozenset(range(stride, total + 1, stride))

    return Schedule(
        steps_per_epoch=steps_per_epoch,
        total_steps=total,
        warmup_steps=_ceil(cfg.warmup_epochs * n_train / cfg.batch_size),
        # A trial shorter than one evaluation interval is still evaluated once, at its end.
        eval_steps=(every(cfg.eval_every_epochs) | ({total} if cfg.eval_at_end else frozenset())) or frozenset({total}),
        checkpoint_steps=every(cfg.checkpoint_every_epochs) - {total},
    )


@dataclass
class FitState:
    """Everything the loop carries between steps; the checkpoint is this plus the weights."""

    step: int = 0
    curve: list[EvalPoint] = field(default_factory=list)
    train_loss_curve: list[tuple[int, float]] = field(default_factory=list)
    loss_sum: float | torch.Tensor = 0.0  # a device tensor while training: read once per evaluation
    loss_count: int = 0
    train_time_s: float = 0.0
    eval_time_s: float = 0.0
    epoch_rng: torch.Tensor | None = None  # shuffle generator state at the start of this epoch
    resumed_from_step: int | None = None  # set when this run continued from a checkpoint
    # The first step whose train loss was not finite (-1: none yet), a device tensor while training (no
    # host sync per step), and the step the trial diverged at: the fit stops there (trials/run.py: diverged).
    nonfinite_step: int | torch.Tensor = -1
    diverged_at_step: int | None = None
    cuda_graphs_failed: str | None = None  # why a graph capture failed (trials/graphs.py): eager from then on
    eval_graphs: bool = False  # whether its evaluations ran as CUDA graphs (trials/graphs.py ``EvalGraphs``)
    eval_graphs_failed: str | None = None  # why an evaluation's capture failed: eager evaluations from then on


@dataclass(frozen=True)
class FitContext:
    cfg: TrialConfig
    plan: PrecisionPlan
    device: torch.device
    schedule: Schedule
    eval_batches: list[Batch]
    on_eval: Callable[[EvalPoint], None]
    eval_prefix: PrefixStates | None = None  # the frozen layers' cached output (trials/eval_cache.py)
    eval_labels: np.ndarray | None = None  # the evaluation batches' labels on the host (evaluate.eval_labels)
    feed: PaddedFeed | PackedFeed = PaddedFeed()  # padded or packed training batches (trials/packing.py)
    train_prefix: TrainPrefix | None = None  # opt-in, not the reference's semantics (trials/train_cache.py)
    # Gets each checkpoint file right after it is saved: whoever runs the trial keeps a copy where a
    # retry on another machine finds it (the Ray adapter hands it to Ray).
    on_checkpoint: Callable[[Path], None] = lambda path: None
    cuda_graphs: bool = False  # the step as CUDA graphs (opt-in; trials/graphs.py cuda_graphs_apply decides)
    eval_graphs: bool = False  # each evaluation as one CUDA graph (trials/graphs.py evaluation_graphs_apply)
    eval_feed: PaddedFeed = PaddedFeed()  # how evaluation batches reach the model (graphed: trials/packing.py)


def fit(model: nn.Module, train_ids: Tokens, train_labels: np.ndarray, pad_id: int, ctx: FitContext) -> FitState:
    """Train to the schedule's end (or the first non-finite loss), evaluating at its evaluation steps.
    Between evaluations nothing is read back from the device: the train subset and every epoch's
    order move there once, batches are gathered there, the loss and the first non-finite step
    accumulate there (tests/trials/test_step_syncs.py counts the host syncs)."""
    cfg, schedule = ctx.cfg, ctx.schedule
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer, scheduler = optimizer_for(params, cfg, schedule, ctx.device, ctx.cuda_graphs)
    scaler = ctx.plan.grad_scaler()
    generator = torch.Generator().manual_seed(cfg.derived_seed)
    state = _restore(model, optimizer, scheduler, scaler, generator, cfg) or FitState()
    rows = device_rows(train_ids, train_labels, ctx.device)
    orders = epoch_orders(len(rows), schedule, state, generator, ctx.device)
    state.nonfinite_step = torch.full((), int(state.nonfinite_step), device=ctx.device)
    if ctx.eval_labels is None:  # read once per trial, not at every evaluation
        ctx = dataclasses.replace(ctx, eval_labels=eval_labels(ctx.eval_batches))
    step = training_step(model, optimizer, scheduler, scaler, params, ctx)
    if ctx.cuda_graphs:
        step = graphed(
            step, model, optimizer, scheduler, params, ctx, batch_sizes(rows, orders, state.step, ctx), pad_id
        )
    eval_graphs = EvalGraphs() if ctx.eval_graphs else None
    model.train()
    segment_started = time.perf_counter()  # train time is counted per segment between evaluations
    while state.step < schedule.total_steps and state.diverged_at_step is None:
        batch = ctx.feed.gather(rows, *orders.batch(state.step, cfg.batch_size), pad_id)
        with ctx.train_prefix.feeding(model, batch) if ctx.train_prefix else contextlib.nullcontext():  # type: ignore[arg-type]  # padded: no packing with the cache (run.py)
            loss = step(batch)  # opt-in training cache: the step starts above k
        count_step(state, loss)
        if state.step in schedule.eval_steps or state.step in schedule.checkpoint_steps:
            synchronize(ctx.device)  # queued GPU work belongs to training, not to what follows
            state.train_time_s += time.perf_counter() - segment_started
            if state.step in schedule.eval_steps:
                _evaluate_into(model, state, ctx, eval_graphs)
            if state.step in schedule.checkpoint_steps:
                _save(model, optimizer, scheduler, scaler, orders, state, ctx)
            segment_started = time.perf_counter()
    synchronize(ctx.device)  # steps after the last evaluation are training time too, up to the last one
    state.train_time_s += time.perf_counter() - segment_started
    state.cuda_graphs_failed = getattr(step, "failed", None)
    state.eval_graphs_failed = eval_graphs.failed if eval_graphs else None
    state.eval_graphs = bool(eval_graphs and eval_graphs.graphs)  # (none where a capture failed)
    _discard_checkpoint(cfg)  # finished: a retry of this cell has nothing to resume
    return state


def count_step(state: FitState, loss: torch.Tensor) -> None:
    """One more step into the state: its loss into the running sum, and the first non-finite one's
    step kept (device tensors: no host sync per step; a trial array counts each member's here)."""
    state.loss_sum, state.loss_count = state.loss_sum + loss, state.loss_count + 1
    state.step += 1
    first = state.nonfinite_step  # a device tensor from the first step on (an int before: fit sets it)
    if not isinstance(first, torch.Tensor):
        first = torch.full((), first, device=loss.device)
    state.nonfinite_step = first_nonfinite(first, loss, state.step)


def optimizer_for(
    params: list[torch.Tensor],
    cfg: TrialConfig,
    schedule: Schedule,
    device: torch.device | None = None,
    capturable: bool = False,
) -> tuple:
    """AdamW over ``params`` (``make_optimizer``) and its learning-rate schedule: linear warmup, then
    linear decay to 0 (a trial array builds its members' the same way, trials/array.py)."""
    optimizer = make_optimizer(params, cfg, device or torch.device("cpu"), capturable)
    return optimizer, get_linear_schedule_with_warmup(optimizer, schedule.warmup_steps, schedule.total_steps)


def optimizer_again(optimizer: torch.optim.AdamW, schedule: Schedule) -> tuple:
    """``optimizer`` as a new one over the same parameters (a trial array's slot taken by its next
    cell, trials/array.py), and a new schedule for it: its state zeroed in place, as a new AdamW's
    first step makes it (step 0, moments 0), so that a CUDA graph that captured its update stays
    valid; the schedule starts from the learning rate it was made with (``initial_lr``, kept)."""
    with torch.no_grad():
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    value.zero_()
    return optimizer, get_linear_schedule_with_warmup(optimizer, schedule.warmup_steps, schedule.total_steps)


def make_optimizer(params, cfg: TrialConfig, device: torch.device, capturable: bool = False) -> torch.optim.AdamW:
    """Fused AdamW (CPU and CUDA since torch 2.4): one vectorised kernel instead of a Python loop of
    per-tensor ops, the same update rule; what HF Trainer uses too (optim "adamw_torch_fused"). Measured
    on one CPU core, MiniLM-L6 with nothing frozen: 0.35 -> 0.26 s per step. ``capturable`` (CUDA
    graphs): its learning rate a device tensor that the schedule fills, its step counts on the device."""
    lr = torch.tensor(cfg.learning_rate, device=device) if capturable else cfg.learning_rate
    return torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay, fused=True, capturable=capturable)


def training_step(
    model, optimizer, scheduler, scaler, params, ctx: FitContext
) -> Callable[[Batch | Packed], torch.Tensor]:
    """One optimisation step of a batch, as ``train_step`` takes it (the eager step)."""
    return lambda batch: train_step(
        model, batch, optimizer, scheduler, scaler, params, ctx.plan, ctx.feed, ctx.cfg.max_grad_norm
    )


def graphed(eager, model, optimizer, scheduler, params, ctx: FitContext, sizes: list[int], pad_id: int) -> StepGraphs:
    """The step as CUDA graphs over the buckets of this fit's batch sizes (trials/graphs.py): the
    captured part is the update without the schedule, its warm-up the same without AdamW."""
    scaler = ctx.plan.grad_scaler()  # a pass-through: no fp16 trial runs as graphs (graphs.cuda_graphs_apply)

    def backward(batch) -> torch.Tensor:  # autocast's weight cache off: graphs (trials/graphs.py)
        return backward_step(model, batch, optimizer, scaler, params, ctx.plan, ctx.feed, ctx.cfg.max_grad_norm, False)

    def update(batch) -> torch.Tensor:
        loss = backward(batch)
        optimizer.step()
        return loss

    return StepGraphs(
        eager,
        step=update,
        warm=backward,
        after=scheduler.step,
        reset=lambda: optimizer.zero_grad(set_to_none=True),
        ready=lambda: bool(optimizer.state),  # AdamW's state exists: an eager step came first
        buckets=length_buckets(sizes),
        pad_id=pad_id,
    )


def batch_sizes(rows: DeviceRows, orders: "EpochOrders", first_step: int, ctx: FitContext) -> list[int]:
    """Every remaining batch's size as the feed builds it (token count or width), from the host's lengths."""
    return [
        ctx.feed.length(rows.host_lengths[orders.batch(s, ctx.cfg.batch_size)[0]])
        for s in range(first_step, ctx.schedule.total_steps)
    ]


def first_nonfinite(first: torch.Tensor, loss: torch.Tensor, step: int) -> torch.Tensor:
    """The first step whose loss was not finite (-1: none yet), kept on the device: read at evaluations."""
    return torch.where((first < 0) & ~torch.isfinite(loss), step, first)


@dataclass(frozen=True)
class EpochOrders:
    """The order of the train subset in each epoch left to train, drawn once per trial with the cell's
    generator (the same ``randperm`` draws, in the same sequence, as one epoch at a time would make)
    and moved to the device in one copy. ``start_states``: the generator's state at the start of each
    of those epochs and after the last one (what a checkpoint saves)."""

    first_epoch: int
    steps_per_epoch: int
    host: np.ndarray  # [epochs, rows]: positions in the train subset
    device: torch.Tensor  # the same, on the device
    start_states: tuple[torch.Tensor, ...]

    def batch(self, step: int, batch_size: int) -> tuple[np.ndarray, torch.Tensor]:
        """The positions (host, device) of the batch that optimizer step ``step`` (0-based) trains on."""
        epoch, index = divmod(step, self.steps_per_epoch)
        rows = slice(index * batch_size, (index + 1) * batch_size)
        return self.host[epoch - self.first_epoch, rows], self.device[epoch - self.first_epoch, rows]

    def state_at(self, epoch: int) -> torch.Tensor:
        return self.start_states[epoch - self.first_epoch]


def epoch_orders(
    n_rows: int, schedule: Schedule, state: FitState, generator: torch.Generator, device: torch.device
) -> EpochOrders:
    """Every remaining epoch's order, from ``state.step`` on. A fit resumed mid-epoch draws that
    epoch again from its start state (``state.epoch_rng``); at an epoch's start the generator is
    where the last draw left it (a fresh fit: as seeded)."""
    first = state.step // schedule.steps_per_epoch
    last = (schedule.total_steps - 1) // schedule.steps_per_epoch
    if state.step % schedule.steps_per_epoch:
        generator.set_state(state.epoch_rng)
    states, orders = [], []
    for _ in range(first, last + 1):
        states.append(generator.get_state())
        orders.append(torch.randperm(n_rows, generator=generator).numpy())
    states.append(generator.get_state())
    host = np.stack(orders) if orders else np.zeros((0, n_rows), dtype=np.int64)
    return EpochOrders(first, schedule.steps_per_epoch, host, to_device(host, device), tuple(states))


def train_step(
    model,
    batch: Batch | Packed,  # as the feed prepared it
    optimizer,
    scheduler,
    scaler,
    params,
    plan: PrecisionPlan,
    feed: PaddedFeed | PackedFeed,
    max_grad_norm: float,
) -> torch.Tensor:
    """One optimisation step (also what trials/memory_probe.py measures)."""
    loss = backward_step(model, batch, optimizer, scaler, params, plan, feed, max_grad_norm)
    if optimizer_step(optimizer, scaler):
        scheduler.step()  # a step the scaler skipped does not advance the schedule (HF Trainer)
    optimizer.zero_grad(set_to_none=True)
    return loss


def backward_step(
    model,
    batch: Batch | Packed,  # as the feed gathered it
    optimizer,
    scaler,
    params,
    plan: PrecisionPlan,
    feed: PaddedFeed | PackedFeed,
    max_grad_norm: float,
    autocast_cache: bool = True,
) -> torch.Tensor:
    """A step but its update: forward, the loss, backward (through fp16's scaler, then unscaled) and
    clipping by the global norm; the loss as a device tensor (no ``.item()``: a per-step host sync
    would stall the GPU). ``scaler``: the plan's, a pass-through without fp16 (decided once, no branch here)."""
    with plan.autocast(cache=autocast_cache):
        logits = feed.logits(model, batch)  # type: ignore[arg-type]  # gathered by this feed: its own kind
    loss = task_loss(logits, batch.labels)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(params, max_grad_norm, foreach=True)
    return loss.detach().double()


def optimizer_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> bool:
    """The optimizer's step through the scaler; False when fp16 loss scaling skipped it (an inf or NaN
    gradient: the scale then shrinks). The HF Trainer leaves the learning-rate schedule alone then:
    accelerate's optimizer wrapper compares the scale before and after (accelerate/optimizer.py,
    ``step_was_skipped``) and transformers' Trainer steps the scheduler only when it is False. Without
    loss scaling (bf16, fp32) no step is skipped, and no host sync is paid to ask: a disabled scaler's
    ``get_scale`` is the constant 1.0 (torch.amp.GradScaler), its ``step`` the optimizer's."""
    scale = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    return scaler.get_scale() >= scale


def _evaluate_into(model: nn.Module, state: FitState, ctx: FitContext, graphs: EvalGraphs | None = None) -> None:
    """One evaluation into the curve; a non-finite train or validation loss ends the fit instead
    (``diverged_at_step``: the first non-finite train step, else this one): no best evaluation is
    ever taken from a non-finite one, and its metrics never enter the curve."""
    started = time.perf_counter()
    metrics, loss, one_prediction = evaluate(
        model, ctx.eval_batches, ctx.plan, ctx.device, ctx.eval_prefix, ctx.eval_labels, ctx.eval_feed, graphs
    )
    record_evaluation(state, ctx, metrics, loss, time.perf_counter() - started, one_prediction)


def record_evaluation(
    state: FitState, ctx: FitContext, metrics: dict[str, float], loss: float, eval_s: float, one_prediction: bool
) -> None:
    """An evaluation's metrics, mean loss and whether it gave every row one prediction into the trial's
    state (``_evaluate_into``'s rules; a trial array records each member's here, trials/array.py)."""
    state.eval_time_s += eval_s
    train_loss = float(state.loss_sum) / max(1, state.loss_count)
    if not (math.isfinite(loss) and math.isfinite(train_loss)):
        first = int(state.nonfinite_step)
        state.diverged_at_step = first if first >= 0 else state.step
        return
    point = EvalPoint(
        step=state.step,
        epoch=state.step / ctx.schedule.steps_per_epoch,
        loss=loss,
        constant_predictions=one_prediction,
        **{"accuracy": None, **metrics},
    )
    state.curve.append(point)
    state.train_loss_curve.append((state.step, train_loss))
    state.loss_sum, state.loss_count = 0.0, 0
    ctx.on_eval(point)
    faults.maybe_inject(ctx.cfg, evals_done=len(state.curve))


# --- optional checkpoints for long trials --------------------------------------------------------
def _checkpoint_path(cfg: TrialConfig) -> Path | None:
    if not (cfg.checkpoint_dir and cfg.checkpoint_every_epochs):
        return None
    return Path(cfg.checkpoint_dir) / f"{cfg.trial_id}.pt"


def _save(model, optimizer, scheduler, scaler, orders: EpochOrders, state: FitState, ctx: FitContext) -> None:
    cfg = ctx.cfg
    path = _checkpoint_path(cfg)
    if path is None:
        return
    # As an epoch-at-a-time loop left them: the last step's epoch's start state, and the generator
    # after that epoch's draw (the next epoch's start), whichever a resumed fit needs.
    epoch = (state.step - 1) // ctx.schedule.steps_per_epoch
    state.epoch_rng = orders.state_at(epoch)
    trainable = {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}
    payload = {
        "trial_id": cfg.trial_id,
        "weights": trainable,  # frozen weights are the pretrained ones: never written
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "generator": orders.state_at(epoch + 1),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        # no device tensor in the file
        "state": dataclasses.replace(state, loss_sum=float(state.loss_sum), nonfinite_step=int(state.nonfinite_step)),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    ctx.on_checkpoint(path)


def _restore(model, optimizer, scheduler, scaler, generator, cfg: TrialConfig) -> FitState | None:
    path = _checkpoint_path(cfg)
    if path is None or not path.exists():
        return None
    payload = torch.load(path, weights_only=False)
    if payload["trial_id"] != cfg.trial_id:
        return None
    model.load_state_dict(payload["weights"], strict=False)
    optimizer.load_state_dict(payload["optimizer"])
    scheduler.load_state_dict(payload["scheduler"])
    scaler.load_state_dict(payload["scaler"])
    generator.set_state(payload["generator"])
    torch.set_rng_state(payload["torch_rng"])
    if payload.get("cuda_rng") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(payload["cuda_rng"])  # dropout masks on the GPU continue too
    return dataclasses.replace(payload["state"], resumed_from_step=payload["state"].step)


def _discard_checkpoint(cfg: TrialConfig) -> None:
    path = _checkpoint_path(cfg)
    if path is not None:
        path.unlink(missing_ok=True)
