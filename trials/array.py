"""Trial arrays: the cells that differ only in frozen depth, trained as one (issue 35).

Cells of the same model, dataset, protocol, train size and seed already share the train subset, the
batch order, the classifier head's initialisation and the schedule (paired seeds, trials/config.py).
An array trains them in one process as one model: the parameters any member trains are stacked, one
``[width, ...]`` tensor per parameter, and one forward and backward runs every member at once; the
layers every member freezes are the model's own, unstacked, so they run once for all members; each
member's trainable slices get their own gradient clipping (by the member's own norm) and their own
AdamW (state, step and learning-rate schedule); evaluation runs every member in one pass. The result
is one row per member, as its single trial (trials/run.py, the reference this is tested against)
would give it, to float rounding; rows say ``trial_array`` among their ``optimisations``.

How: ``torch.func.vmap`` over ``torch.func.functional_call`` of the model with the stacked
parameters (PyTorch's model-ensembling tutorial: https://docs.pytorch.org/tutorials/intermediate/
ensembling.html). Under ``vmap`` a tensor without a member dimension stays unbatched, so the frozen
prefix (unstacked weights on the shared batch) computes once, and the first stacked layer turns its
output into one batched matrix product over the members: the horizontal fusion HFTA writes by hand
per operator (Wang et al., "Horizontally Fused Training Array", MLSys 2021: up to 15.1x training
throughput for same-shape jobs on one accelerator), here from the model's own code, so every family,
the narrowed last layer (trials/first_token.py), packed batches (trials/packing.py) and the evaluation
cache (trials/eval_cache.py) work unchanged through it. Masks and the rest of the inputs stay
unbatched (HF's mask-building code branches on their values, which ``vmap`` refuses on batched ones).
Dropout draws with ``randomness="same"``: the members share their seed and step, so each single
trial would draw these very masks (a frozen layer still runs dropout in training).

A member's frozen slices (a layer some member trains and this one freezes) are not in its optimizer:
they keep their initial values bit for bit, weight decay on or off, and their gradients are never in
its norm. Its optimizer is stock fused AdamW over leaves that share the stacked storage (one per
trainable slice), with its own schedule: stock AdamW over the stacked tensors would be exact per
member only with one learning rate and step count for all of them, and could not leave frozen slices
alone under weight decay.

A member whose loss turns non-finite leaves the array at the evaluation that sees it, its row written
(``on_result``); its slices stay in the stacked tensors (inert: no optimizer step), so the other
members go on bit for bit as they would have (each member's numbers never read another's).

Which cells qualify is decided before any trial: ``array_key`` from the config (the freeze method,
bf16 or fp32 — one GradScaler would skip every member's step when one member overflows in fp16 — no
training cache, no checkpoints, the ``trial_array`` switch on), and once per model class and worker a
measured check (``array_agrees``: the stacked model's logits and gradients on a few training rows are
the plain model's, in fp32); a model that fails it (a layer ``vmap`` cannot batch) runs its members
as single trials, one after another, rows without ``trial_array``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.func import functional_call, vmap

from freezesweep.trials import first_token
from freezesweep.trials.config import EvalPoint, TrialConfig, TrialResult
from freezesweep.trials.eval_cache import PrefixStates, eval_mode, starting_at
from freezesweep.trials.evaluate import task_loss
from freezesweep.trials.freezing import FreezeReport, find_encoder_parts
from freezesweep.trials.metrics import compute_metrics
from freezesweep.trials.oom import catch_oom, is_oom
from freezesweep.trials.packing import PackedFeed, PaddedFeed
from freezesweep.trials.precision import PrecisionPlan, resolve_config, synchronize
from freezesweep.trials.run import (
    TrialData,
    adapt,
    check_batch,
    evaluation_prefix,
    feed_of,
    free_memory,
    optimisations_used,
    run_trial,
    run_trial_or_oom,
    start_trial,
    trial_data,
    trial_model,
    trial_result,
)
from freezesweep.trials.tokens import Batch, train_batches
from freezesweep.trials.train import (
    FitContext,
    FitState,
    count_step,
    make_schedule,
    optimizer_for,
    optimizer_step,
    record_evaluation,
)
from freezesweep.trials.worker import FeedKey, WorkerState, process_worker

OPTIMISATION = "trial_array"  # what the rows of an array's members say among their optimisations
ARRAY_PRECISIONS = ("bf16", "fp32")
ArrayEval = Callable[[TrialConfig, EvalPoint], None]


# --- which cells train together: decided from the configs, before any trial ----------------------
def array_key(cfg: TrialConfig) -> TrialConfig | None:
    """What a cell shares with the cells it may train beside (every field but its frozen depth), or
    None when it runs alone: another method (LoRA trains adapters of each its own rank, the probe
    trains no layer), fp16, the opt-in training cache, checkpoints, or the switch off."""
    cfg = resolve_config(cfg)
    if not (
        arrays_pay(cfg)
        and cfg.method == "freeze"
        and cfg.precision in ARRAY_PRECISIONS
        and not cfg.train_cache
        and not cfg.checkpoint_every_epochs
    ):
        return None
    return dataclasses.replace(cfg, frozen_layers=0)


def arrays_pay(cfg: TrialConfig) -> bool:
    """The ``trial_array`` switch: on or off as set; unset (auto), on where the cell runs on a GPU. A
    GPU runs a small model's step far below its arithmetic peak (kernel launches and the host bound
    it, docs/speed.md), so one step for many members costs little more than one; a CPU is bound by
    the arithmetic, and an array computes more of it than its single trials (every member's frozen
    slices of the layers another member trains, and batched products ~20-40 % slower there)."""
    if cfg.trial_array is not None:
        return cfg.trial_array
    if cfg.device != "auto":
        return torch.device(cfg.device).type == "cuda"
    if cfg.gpus_per_trial is not None:
        return cfg.gpus_per_trial > 0
    return torch.cuda.is_available()


def group_cells(cells: Sequence[TrialConfig], width: int) -> list[list[TrialConfig]]:
    """The cells as arrays of at most ``width`` members (in the cells' order, by first member), each
    cell that does not qualify alone. Linear in the cells."""
    groups: dict[object, list[list[TrialConfig]]] = {}
    order: list[list[TrialConfig]] = []
    for i, cell in enumerate(cells):
        key = array_key(cell) if width > 1 else None
        chunks = groups.setdefault(i if key is None else key, [])
        if not chunks or len(chunks[-1]) >= width:
            chunks.append([])
            order.append(chunks[-1])
        chunks[-1].append(cell)
    return order


# --- the stacked model ------------------------------------------------------------------------------
@dataclass
class Stack:
    """The members' parameters that any member trains, one ``[width, ...]`` leaf each; every other
    parameter is the model's own, shared by all members (unstacked: it runs once)."""

    model: nn.Module
    tensors: dict[str, torch.Tensor]
    layers_path: str  # the layer stack's name in the model (eval-cache renaming)
    randomness: str = "same"  # vmap's dropout draws: the members share their seed and step

    @property
    def width(self) -> int:
        return next(iter(self.tensors.values())).shape[0]

    def logits(self, feed: PaddedFeed | PackedFeed, batch, tensors: dict[str, torch.Tensor] | None = None):
        """Every member's logits on ``batch``, ``[width, rows, labels]`` (``tensors``: the stacked
        parameters under other names, for a swapped layer list)."""
        model = self.model

        def member(params: dict[str, torch.Tensor]) -> torch.Tensor:
            return feed.logits(lambda **inputs: functional_call(model, params, (), inputs), batch)

        return vmap(member, randomness=self.randomness)(self.tensors if tensors is None else tensors)

    def starting_at(self, layer: int) -> dict[str, torch.Tensor]:
        """The stacked parameters named as in the layer list ``[injector, layer_k, …]`` (eval cache)."""
        pattern = re.compile(rf"^{re.escape(self.layers_path)}\.(\d+)\.")

        def renamed(name: str) -> str:
            match = pattern.match(name)
            if match is None:
                return name
            return f"{self.layers_path}.{int(match.group(1)) - layer + 1}.{name[match.end() :]}"

        return {renamed(name): tensor for name, tensor in self.tensors.items()}


def stack_model(model: nn.Module, trained: Sequence[set[str]]) -> Stack:
    """``model``'s parameters that any member trains (``trained``: each member's parameter names),
    stacked ``len(trained)`` times from their initial values; the model's own stop requiring grad."""
    width = len(trained)
    names = [n for n, _ in model.named_parameters() if any(n in t for t in trained)]
    params = dict(model.named_parameters())
    model.requires_grad_(False)
    tensors = {
        n: params[n].detach().unsqueeze(0).expand(width, *params[n].shape).clone().requires_grad_() for n in names
    }
    return Stack(model, tensors, _layers_path(model))


def _layers_path(model: nn.Module) -> str:
    try:
        layers = find_encoder_parts(model).layers
    except ValueError:
        return ""
    return next((name for name, module in model.named_modules() if module is layers), "")


# --- members -----------------------------------------------------------------------------------
@dataclass
class Member:
    """One cell of the array: its slot, its trainable slices and its own optimizer and fit state."""

    cfg: TrialConfig
    slot: int
    report: FreezeReport
    leaves: dict[str, torch.Tensor]  # stacked name -> its trainable slice (a leaf sharing the storage)
    optimizer: torch.optim.Optimizer
    scheduler: object
    ctx: FitContext
    state: FitState = field(default_factory=FitState)
    scaler: torch.amp.GradScaler | None = None


def member_leaves(stack: Stack, slot: int, trains: set[str]) -> dict[str, torch.Tensor]:
    """The slot's trainable slices, each a leaf tensor over the stacked storage: what its own
    optimizer steps in place."""
    return {n: t.detach()[slot].requires_grad_() for n, t in stack.tensors.items() if n in trains}


def make_members(
    stack: Stack, cfgs: Sequence[TrialConfig], reports, trained, base: FitContext, on_eval: ArrayEval
) -> list[Member]:
    members = []
    for slot, (cfg, report, trains) in enumerate(zip(cfgs, reports, trained)):
        leaves = member_leaves(stack, slot, trains)
        optimizer, scheduler = optimizer_for(list(leaves.values()), cfg, base.schedule)
        ctx = dataclasses.replace(base, cfg=cfg, on_eval=functools.partial(on_eval, cfg))
        members.append(Member(cfg, slot, report, leaves, optimizer, scheduler, ctx, scaler=base.plan.grad_scaler()))
    return members


# --- one step, one evaluation ------------------------------------------------------------------------
def array_step(stack: Stack, members: Sequence[Member], batch, plan: PrecisionPlan, feed) -> torch.Tensor:
    """One optimisation step of every member in ``members`` on ``batch`` (the others' slices stay
    as they are); returns every slot's loss, ``[width]`` (no host sync)."""
    with plan.autocast():
        logits = stack.logits(feed, batch)
    losses = vmap(task_loss, in_dims=(0, None))(logits, batch.labels)
    losses.sum().backward()  # d(sum)/d(loss_i) = 1: each slot's gradients are its own loss's
    for member in members:
        member_update(stack, member)
    for tensor in stack.tensors.values():
        tensor.grad = None
    return losses.detach().double()


def member_update(stack: Stack, member: Member) -> None:
    """Clip the member's trainable slices by its own norm, then its AdamW step and schedule."""
    params = list(member.leaves.values())
    for name, leaf in member.leaves.items():
        leaf.grad = stack.tensors[name].grad[member.slot]
    torch.nn.utils.clip_grad_norm_(params, member.cfg.max_grad_norm, foreach=True)
    if optimizer_step(member.optimizer, member.scaler):
        member.scheduler.step()
    member.optimizer.zero_grad(set_to_none=True)


@torch.inference_mode()
def evaluate_array(
    stack: Stack, feed, batches: list[Batch], plan: PrecisionPlan, device: torch.device, prefix: PrefixStates | None
) -> list[tuple[dict[str, float], float]]:
    """Every slot's (metrics, mean loss) over the validation batches, as trials/evaluate.py computes
    one trial's, the members in one pass per batch."""
    loss_sums = torch.zeros(stack.width, dtype=torch.float64, device=device)
    predicted, truth = [], []
    tensors = stack.starting_at(prefix.layer) if prefix is not None else None
    with (
        eval_mode(stack.model),
        starting_at(stack.model, prefix.layer, prefix.tuple_output)
        if prefix is not None
        else contextlib.nullcontext() as injector,
    ):
        for i, batch in enumerate(batches):
            if injector is not None:
                injector.states = prefix.states[i]
            with plan.autocast():
                logits = stack.logits(PaddedFeed(), batch, tensors).float()
            loss_sums += vmap(functools.partial(task_loss, reduction="sum"), in_dims=(0, None))(logits, batch.labels)
            predicted.append(logits.squeeze(-1) if batch.labels.is_floating_point() else logits.argmax(-1))
            truth.append(batch.labels)
    labels = torch.cat(truth).cpu().numpy()
    every = torch.cat(predicted, dim=1).cpu().numpy()
    losses = (loss_sums / len(labels)).tolist()
    regression, classes = labels.dtype.kind == "f", logits.shape[-1]
    return [(compute_metrics(every[slot], labels, regression, classes), losses[slot]) for slot in range(stack.width)]


# --- the array's run -------------------------------------------------------------------------------
@dataclass
class ArrayRun:
    """An array ready to train: the stacked model, its members, and what the loop reads besides."""

    stack: Stack
    members: list[Member]
    data: TrialData
    reader: first_token.Reader | None
    feed: PaddedFeed | PackedFeed
    base: FitContext  # the members' shared context (their own cfg and on_eval aside)
    on_result: Callable[[TrialResult], None]
    finish: Callable[[Member], TrialResult]
    results: dict[str, TrialResult] = field(default_factory=dict)


def run_array(
    configs: Sequence[TrialConfig],
    on_eval: ArrayEval | None = None,
    on_result: Callable[[TrialResult], None] | None = None,
    worker: WorkerState | None = None,
) -> list[TrialResult]:
    """Run cells that differ only in frozen depth as one array; their results, in ``configs``' order.
    ``on_eval`` gets every member's evaluations (with its config), ``on_result`` each member's result
    as soon as it is final (a member that diverges leaves early); ``worker`` as ``run_trial``'s. Raises
    on failure, as ``run_trial`` does; cells that cannot share one array raise ValueError at once. A
    model that does not qualify (``array_agrees``) runs its cells as single trials, one by one."""
    started = time.perf_counter()
    worker = worker or process_worker()
    cfgs = [resolve_config(c) for c in configs]
    on_eval, on_result = on_eval or (lambda cfg, point: None), on_result or (lambda result: None)
    check_together(cfgs)
    run = build_array(cfgs, on_eval, on_result, worker, started) if len(cfgs) > 1 else None
    if run is None:
        return [_alone(c, on_eval, on_result, worker) for c in cfgs]
    with first_token.narrowed(run.stack.model, run.reader):
        fit_array(run)
    return [run.results[c.trial_id] for c in cfgs]


def run_array_or_oom(
    configs: Sequence[TrialConfig],
    on_eval: ArrayEval | None = None,
    on_result: Callable[[TrialResult], None] | None = None,
    worker: WorkerState | None = None,
) -> list[TrialResult]:
    """``run_array``, except that an array that runs out of GPU memory gives the memory back
    (trials/oom.py) and its members without a row run again as two arrays of half its width, down to
    single trials, whose out-of-memory is their ``oom`` row (``run_trial_or_oom``). Rows already given
    (a member that diverged before) stay given: every member gets exactly one."""
    worker = worker or process_worker()
    cfgs = [resolve_config(c) for c in configs]
    on_eval, on_result = on_eval or (lambda cfg, point: None), on_result or (lambda result: None)
    if len(cfgs) == 1:
        result = run_trial_or_oom(cfgs[0], on_eval=functools.partial(on_eval, cfgs[0]), worker=worker)
        on_result(result)
        return [result]
    given: dict[str, TrialResult] = {}

    def give(result: TrialResult) -> None:
        given[result.trial_id] = result
        on_result(result)

    done = catch_oom(lambda: run_array(cfgs, on_eval, give, worker), lambda exc: None, free=lambda: free_memory(worker))
    if done is None:
        rest = [c for c in cfgs if c.trial_id not in given]
        half = (len(rest) + 1) // 2
        for part in filter(None, (rest[:half], rest[half:])):
            run_array_or_oom(part, on_eval, give, worker)
    return [given[c.trial_id] for c in cfgs]


def build_array(
    cfgs: Sequence[TrialConfig], on_eval: ArrayEval, on_result, worker: WorkerState, started: float
) -> ArrayRun | None:
    """The array of ``cfgs`` (resolved, checked together) ready to train, or None where the model
    does not qualify (its members then run alone)."""
    first = cfgs[0]
    device, plan = start_trial(first)
    data = trial_data(first, device, worker)
    model = trial_model(first, data, device)
    common = dataclasses.replace(first, frozen_layers=min(c.frozen_layers for c in cfgs))  # what all freeze
    reader, feed = feed_of(common, model, data, device, packed=True)
    with first_token.narrowed(model, reader):
        key = FeedKey(first.model, type(model).__qualname__)
        if not array_agrees(model, check_batch(data, device), feed, key, worker):
            return None
    reports, trained = [], []
    for cfg in cfgs:
        reports.append(adapt(model, cfg)[0])
        trained.append({n for n, p in model.named_parameters() if p.requires_grad})
    fill_started = time.perf_counter()
    prefix = evaluation_prefix(common, model, data, plan, device)
    synchronize(device)
    fill_s = (time.perf_counter() - fill_started) / len(cfgs)
    stack = stack_model(model, trained)
    schedule = make_schedule(len(data.train_rows), common)
    base = FitContext(common, plan, device, schedule, data.batches, on_eval=None, eval_prefix=prefix, feed=feed)
    used = (*optimisations_used(prefix, None, reader, feed), OPTIMISATION)

    def finish(member: Member) -> TrialResult:
        wall_s = (time.perf_counter() - started) / len(cfgs)  # the member's share of the array's time
        result = trial_result(
            member.cfg, data, member.report, member.state, device, plan, (prefix, None), wall_s, fill_s
        )
        return dataclasses.replace(result, optimisations=used)

    members = make_members(stack, cfgs, reports, trained, base, on_eval)
    return ArrayRun(stack, members, data, reader, feed, base, on_result, finish)


def fit_array(run: ArrayRun) -> None:
    """The reference loop (trials/train.py ``fit``) for every member at once: one batch stream (the
    members share it), every member's step on each batch, every member evaluated at the schedule's
    evaluation steps; a member that diverged leaves there, the rest finish together."""
    base, data, schedule = run.base, run.data, run.base.schedule
    labels = data.task.train.labels[data.train_rows]
    generator = torch.Generator().manual_seed(base.cfg.derived_seed)
    active, step = list(run.members), 0
    run.stack.model.train()
    segment_started = time.perf_counter()
    while step < schedule.total_steps and active:
        for batch in train_batches(data.train_tokens, labels, base.cfg.batch_size, data.pad_id, generator):
            if step >= schedule.total_steps or not active:
                break
            batch = run.feed.prepare(batch).to(base.device)
            losses = array_step(run.stack, active, batch, base.plan, run.feed)
            for member in active:
                count_step(member.state, losses[member.slot])
            step += 1
            if step in schedule.eval_steps:
                synchronize(base.device)
                _share(active, "train_time_s", time.perf_counter() - segment_started)
                active = _evaluate_members(run, active)
                segment_started = time.perf_counter()
    synchronize(base.device)
    _share(active, "train_time_s", time.perf_counter() - segment_started)
    for member in active:
        _finished(run, member)


def _share(members: list[Member], name: str, seconds: float) -> None:
    """The array's time, shared by the members that were in it: each row's times are its share."""
    for member in members:
        setattr(member.state, name, getattr(member.state, name) + seconds / max(1, len(members)))


def _evaluate_members(run: ArrayRun, active: list[Member]) -> list[Member]:
    """Every slot evaluated in one pass; each active member's into its state; those that diverged
    leave with their rows written. Returns the members still in."""
    base = run.base
    started = time.perf_counter()
    outcomes = evaluate_array(run.stack, run.feed, base.eval_batches, base.plan, base.device, base.eval_prefix)
    eval_s = (time.perf_counter() - started) / len(active)
    staying = []
    for member in active:
        metrics, loss = outcomes[member.slot]
        record_evaluation(member.state, member.ctx, metrics, loss, eval_s)
        if member.state.diverged_at_step is None:
            staying.append(member)
        else:
            _finished(run, member)
    return staying


def _finished(run: ArrayRun, member: Member) -> None:
    result = run.finish(member)
    run.results[member.cfg.trial_id] = result
    run.on_result(result)


def _alone(cfg: TrialConfig, on_eval: ArrayEval, on_result, worker: WorkerState) -> TrialResult:
    """A member that runs as its single trial (the array steps aside)."""
    result = run_trial(cfg, on_eval=functools.partial(on_eval, cfg), worker=worker)
    on_result(result)
    return result


def check_together(cfgs: Sequence[TrialConfig]) -> None:
    """One array holds cells that qualify and differ only in frozen depth, each once."""
    keys = [array_key(c) for c in cfgs]
    problems = []
    if not cfgs:
        problems.append("no cells")
    if len(cfgs) > 1 and (None in keys or len(set(keys)) > 1):
        problems.append("cells that do not qualify or differ in more than their frozen depth")
    if len({c.trial_id for c in cfgs}) < len(cfgs):
        problems.append("a cell given twice")
    if problems:
        raise ValueError(f"not one trial array: {'; '.join(problems)}")


# --- does the model qualify: measured once per model class, feed and worker --------------------------
def array_agrees(model: nn.Module, batch: Batch, feed, key: FeedKey, worker: WorkerState) -> bool:
    """Whether a 2-member array of ``model`` gives the plain model's logits and gradients on ``batch``
    (a few training rows, fed as the trial feeds them), in fp32, in training mode with the same dropout
    draws; a check that raises (a layer ``vmap`` has no rule for) is a "no". The verdict is kept in the
    worker per (model, class, feed)."""
    verdict = (key, type(feed).__name__)
    if verdict not in worker.array_verdicts:
        worker.array_verdicts[verdict] = _agrees(model, batch, feed)
    return worker.array_verdicts[verdict]


def _agrees(model: nn.Module, batch: Batch, feed) -> bool:
    fed = feed.prepare(batch.to(torch.device("cpu"))).to(batch.input_ids.device)
    params = dict(model.named_parameters())
    devices = [batch.input_ids.device] if batch.input_ids.is_cuda else []
    try:
        with torch.random.fork_rng(devices=devices), _training(model):
            torch.manual_seed(0)
            plain = feed.logits(model, fed)
            plain_grads = torch.autograd.grad(task_loss(plain, fed.labels), list(params.values()), allow_unused=True)
            torch.manual_seed(0)
            stack = Stack(
                model, {n: p.detach().expand(2, *p.shape).clone().requires_grad_() for n, p in params.items()}, ""
            )
            stacked = stack.logits(feed, fed)
            losses = vmap(task_loss, in_dims=(0, None))(stacked, fed.labels)
            grads = torch.autograd.grad(losses.sum(), list(stack.tensors.values()), allow_unused=True)
    except Exception as exc:  # a model this cannot serve trains its members alone, never a failed trial
        if is_oom(exc):
            raise
        return False
    pairs = [(plain, stacked)] + [(g, s) for g, s in zip(plain_grads, grads) if g is not None or s is not None]
    return all(_close(a, b) for a, b in pairs)


def _close(single: torch.Tensor | None, stacked: torch.Tensor | None) -> bool:
    if single is None or stacked is None:
        return False
    scale = float(single.detach().abs().max()) if single.numel() else 0.0
    return all(torch.allclose(m.float(), single.float(), rtol=1e-4, atol=1e-5 * max(1.0, scale)) for m in stacked)


@contextlib.contextmanager
def _training(model: nn.Module):
    was_training = model.training
    model.train()
    try:
        yield
    finally:
        model.train(was_training)
