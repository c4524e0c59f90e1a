"""Trial arrays: many cells of one model and task trained as one (issue 35).

Cells of the same model, dataset, protocol, train size and seed already share the train subset, the
batch order, the classifier head's initialisation and the schedule (paired seeds, trials/config.py).
An array trains them in one process as one model: the parameters any member trains are stacked, one
``[width, ...]`` tensor per parameter, and one forward and backward runs every member at once; the
layers every member freezes are the model's own, unstacked, so they run once for all members; each
member's trainable slices get their own gradient clipping (by the member's own norm) and their own
AdamW (state, step and learning-rate schedule); evaluation runs each member from its own frozen depth's
cached states (trials/eval_cache.py), the members of one depth in one pass (``EvalDepths``). The result
is one row per member, as its single trial (trials/run.py, the reference this is tested against)
would give it: to float rounding on a CPU; on a GPU in distribution (dropout masks and attention kernels
differ, below), so there an array's rows pair with each other, not with single trials' rows; rows say
``trial_array`` among their ``optimisations``.

How: ``torch.func.vmap`` over ``torch.func.functional_call`` of the model with the stacked
parameters (PyTorch's model-ensembling tutorial: https://docs.pytorch.org/tutorials/intermediate/
ensembling.html). Under ``vmap`` a tensor without a member dimension stays unbatched, so the frozen
prefix (unstacked weights on the shared batch) computes once, and the first stacked layer turns its
output into one batched matrix product over the members: the horizontal fusion HFTA writes by hand
per operator (Wang et al., "Horizontally Fused Training Array", MLSys 2021: up to 15.1x training
throughput for same-shape jobs on one accelerator). Chosen over HFTA's way (members folded into the
batch dimension, every layer type rewritten as its batched twin) because it runs the model's own
code: every family, the narrowed last layer (trials/first_token.py), packed batches
(trials/packing.py) and the evaluation cache's layer swap (trials/eval_cache.py) work unchanged
through it, with no layer library of our own to keep exact. Masks and the rest of the inputs stay
unbatched (HF's mask-building code branches on their values, which ``vmap`` refuses on batched ones).
Dropout draws with ``randomness="same"``: the members share their seed and step, so they draw the same
masks (a frozen layer still runs dropout in training). On a CPU these are their single trials' very
masks; on a GPU vmap draws them with another kernel than the plain model's fused dropout (seen on an
H100: the same function, other masks), so there a member's curve is its single trial's in distribution.
The array's model runs eager attention on every device (trials/model.py ``eager_attention``): a GPU's
fused SDPA cannot draw dropout under ``randomness="same"`` (vmap raises).

A member's frozen slices (a layer some member trains and this one freezes) are not in its optimizer:
they keep their initial values bit for bit, weight decay on or off, and their gradients are never in
its norm. Its optimizer is stock fused AdamW over leaves that share the stacked storage (one per
trainable slice), with its own schedule: stock AdamW over the stacked tensors would be exact per
member only with one learning rate and step count for all of them (slots, below, are at different
points of their schedules), and could not leave frozen slices alone under weight decay.

A member whose loss turns non-finite leaves the array at the evaluation that sees it, its row written
(``on_results``); its slices stay in the stacked tensors (inert: no optimizer step), so the other
members go on bit for bit as they would have (each member's numbers never read another's; under CUDA
graphs with dropout, in distribution: below).

Slots (continuous batching, as LLM servers batch requests: Orca, OSDI 2022; vLLM, SOSP 2023): cells of
one model and task with other seeds or train sizes take turns in an array of ``width`` slots; when a
member is over its row is given and the next cell takes its slot with its own initial weights,
subset, batches, schedule and optimizer. Each slot then draws its own batch, so inputs are batched
too, in one shape for the whole run: packed where the model qualifies (each slot's rows in one row of
its real tokens, as a single trial's, ``packed_slots_agree``; the width is the most tokens any step
of any queued cell packs, ``packed_tokens``: on SST-2 ~3x fewer positions than padding), else padded
(the longest row of any queued cell's subset), and its
dropout draws are its own but the array's stream, not its single trial's (``randomness=
"different"``): without dropout a slot gives its single trial's numbers to float rounding, with it
the same distribution. A padding mask is batched as the model's code takes it under ``vmap``
(``mask_as``, measured per model: ``slots_mask_form``). No slot's numbers read another's, and the
training step's shapes never change, so refilling a slot leaves the others bit for bit. A slot is
evaluated at its own schedule's steps only, from its own depth's cached states where its frozen
weights are the array model's (a pretrained model's: every seed's).

CUDA graphs (opt-in ``cuda_graphs``, as a single trial's: trials/graphs.py): an array on one stream
captures its step per (rows, length bucket) once every member's AdamW has its state, the capture
holding every member's forward, backward, clipping and capturable AdamW update, each member's schedule
filling its learning-rate tensor after a replay; a member that leaves takes the graphs with it, and the
others' are captured again (with dropout, a capture's warm-up draws masks of its own: after it the
others go on in distribution, no longer bit for bit). A GPU runs an array's step far below its arithmetic, its host bound (an
array of 7 calls ~2.6x a single step's operators: benchmarks/step_profile.py on a CPU); replayed, the
launches go. Its evaluations too: one graph per group of slots evaluated from one depth (trials/graphs.py
``EvalGraphs``; slots not next to each other picked by an index made on the device before the capture).
Slots capture their step as one graph (``slot_graphs``: a cell taking a slot of its depth takes over its
optimizer, so the graph stays), and their evaluations as a graph per slot and depth (``EvalDepths.groups``
``apart``: a member replays the graph its slot's earlier member of its depth captured, reading the
slot's weights as they are now).

Which cells qualify is decided before any trial: ``array_key`` from the config (the freeze method,
bf16 or fp32 — one GradScaler would skip every member's step when one member overflows in fp16 — no
training cache, no checkpoints, and the ``trial_array`` switch: unset, on where the cell runs on a
GPU; ``arrays_pay``), and once per model class and worker a measured check (``array_agrees``: the
stacked model's logits and gradients on a few training rows are the plain model's, in fp32); a model
that fails it (a layer ``vmap`` cannot batch) runs its members as single trials, one after another,
rows without ``trial_array``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from freezesweep.trials import first_token, graphs
from freezesweep.trials.config import EvalPoint, TrialConfig, TrialResult
from freezesweep.trials.eval_cache import PrefixStates, eval_mode, starting_at
from freezesweep.trials.evaluate import eval_labels, task_loss
from freezesweep.trials.freezing import FreezeReport, find_encoder_parts, prefix_names
from freezesweep.trials.graphs import MULTIPLE, EvalGraphs, StepGraphs, length_buckets, padded_to
from freezesweep.trials.metrics import compute_metrics, constant
from freezesweep.trials.model import eager_attention
from freezesweep.trials.oom import catch_oom, is_oom
from freezesweep.trials.packing import AdditiveMaskFeed, Packed, PackedFeed, PaddedFeed, mask_as, packed_mask, widened
from freezesweep.trials.precision import PrecisionPlan, resolve_config, resolve_precision, synchronize, trial_device
from freezesweep.trials.run import (
    TrialData,
    adapt,
    check_batch,
    evaluation_feed_of,
    evaluation_graphed,
    evaluation_prefix,
    feed_of,
    free_memory,
    initial_model,
    model_key,
    optimisations_used,
    prebuilt_mask,
    run_trial,
    run_trial_or_oom,
    seeded_weights,
    start_trial,
    trial_data,
    trial_model,
    trial_result,
    weights_key,
)
from freezesweep.trials.tokens import Batch, DeviceRows, collate_rows, device_rows
from freezesweep.trials.train import (
    EpochOrders,
    FitContext,
    FitState,
    Schedule,
    batch_sizes,
    count_step,
    epoch_orders,
    make_schedule,
    optimizer_again,
    optimizer_for,
    optimizer_step,
    record_evaluation,
)
from freezesweep.trials.worker import FeedKey, WorkerState, process_worker, states_bytes

log = logging.getLogger(__name__)
OPTIMISATION = "trial_array"  # what the rows of an array's members say among their optimisations
ARRAY_PRECISIONS = ("bf16", "fp32")
ArrayEval = Callable[[TrialConfig, EvalPoint], None]
Results = Callable[[list[TrialResult]], None]  # the members' results that became final at one step


# --- which cells train together: decided from the configs, before any trial ----------------------
def array_key(cfg: TrialConfig, anywhere: bool = False) -> tuple | None:
    """What a cell shares with the cells it may train beside (every field of its identity but its
    frozen depth, the precision resolved), or None when it runs alone: another method (LoRA trains
    adapters of each its own rank, the probe trains no layer), fp16, the opt-in training cache,
    checkpoints, the switch off, or (unless ``anywhere``: a caller of ``run_array`` asks for an array
    on any device) where arrays do not pay. A tuple of the fields, not a config: a sweep asks it of
    every cell (``dataclasses.replace`` of a config costs ~40 µs; 100,000 cells took 6.6 s)."""
    precision = cfg.precision if cfg.precision != "auto" else resolve_precision("auto", trial_device(cfg)).name
    if not (
        (arrays_pay(cfg) if not anywhere else cfg.trial_array is not False)
        and cfg.method == "freeze"
        and precision in ARRAY_PRECISIONS
        and not cfg.train_cache
        and not cfg.checkpoint_every_epochs
    ):
        return None
    return (precision, *(getattr(cfg, name) for name in _STREAM_FIELDS))


# A cell's identity (TrialConfig's compared fields) but its depth (and precision: resolved above);
# cells that take turns in slots also differ in seed and train size.
_STREAM_FIELDS = tuple(
    f.name for f in dataclasses.fields(TrialConfig) if f.compare and f.name not in ("frozen_layers", "precision")
)
_SLOT_FIELDS = tuple(n for n in _STREAM_FIELDS if n not in ("seed", "train_size"))


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


def slot_key(cfg: TrialConfig, anywhere: bool = False) -> tuple | None:
    """What a cell shares with the cells that may take turns in an array's slots (every field but its
    frozen depth, seed and train size: the same model and task), or None when it runs alone."""
    key = array_key(cfg, anywhere)
    return None if key is None else (key[0], *(getattr(cfg, name) for name in _SLOT_FIELDS))


QUEUE_WIDTHS = 4  # a slot array's cells: at most this many times its width (a crash runs them again)


def group_cells(
    cells: Sequence[TrialConfig], width: int, slots: bool = True, anywhere: bool = False
) -> list[list[TrialConfig]]:
    """The cells as arrays of at most ``width`` members that share their stream (seed and train size;
    in the cells' order, by first member), each cell that does not qualify alone. With ``slots``, the
    arrays under half the width (few depths in the grid) pool, per model and task, into queues of at
    most ``QUEUE_WIDTHS * width`` cells that an array of ``width`` slots works through (``run_array``).
    ``anywhere``: as ``array_key``'s (arrays known to pay). Linear in the cells."""
    arrays = _chunks(cells, width, lambda cell: array_key(cell, anywhere) if width > 1 else None)
    if not slots or width < 2:
        return arrays
    small = [cell for unit in arrays if 1 < len(unit) < width / 2 for cell in unit]
    pooled = {id(unit) for unit in arrays if 1 < len(unit) < width / 2}
    queues = _chunks(small, QUEUE_WIDTHS * width, functools.partial(slot_key, anywhere=anywhere))
    return [unit for unit in arrays if id(unit) not in pooled] + queues


def _chunks(cells: Sequence[TrialConfig], size: int, key) -> list[list[TrialConfig]]:
    groups: dict[object, list[list[TrialConfig]]] = {}
    order: list[list[TrialConfig]] = []
    for i, cell in enumerate(cells):
        k = key(cell)
        chunks = groups.setdefault(("alone", i) if k is None else k, [])
        if not chunks or len(chunks[-1]) >= size:
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

    def own_logits(self, inputs: dict[str, torch.Tensor], reader: first_token.Reader | None = None) -> torch.Tensor:
        """Every member's logits on its own inputs (each ``[width, ...]``: slots, ``OwnStreams``); packed
        ones (``PackedSlots``) with their sequences' ids, the mask made from them here, and where each
        sequence starts, for ``reader`` (the narrowed last layer, trials/first_token.py)."""
        model = self.model

        def member(params: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor]) -> torch.Tensor:
            inputs = dict(inputs)
            first_tokens, sequence = inputs.pop("first_tokens", None), inputs.pop("sequence", None)
            if sequence is None:
                return functional_call(model, params, (), inputs).logits
            assert reader is not None, "a packed batch's head reads its sequences' first tokens"
            reader.rows = first_tokens
            try:
                return functional_call(model, params, (), inputs | {"attention_mask": packed_mask(sequence)}).logits
            finally:
                reader.rows = None  # evaluation batches are padded: position 0 again

        return vmap(member, randomness=self.randomness)(self.tensors, inputs)

    def starting_at(
        self,
        layer: int,
        slots: Sequence[int] | None = None,
        skip: frozenset[str] = frozenset(),
        index: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """The stacked parameters named as in the layer list ``[injector, layer_k, …]`` (eval cache):
        ``slots``' slices only (a view where they follow each other; default: every slot), without
        ``skip`` (the frozen prefix the injector stands in for: the model's own weights run there).
        ``index``: ``slots`` on the device already (a CUDA graph's capture copies nothing from the host)."""
        pattern = re.compile(rf"^{re.escape(self.layers_path)}\.(\d+)\.")
        pick: slice | list[int] | torch.Tensor = (
            slice(None) if slots is None else list(slots) if index is None else index
        )
        if slots is not None and list(slots) == list(range(slots[0], slots[-1] + 1)):
            pick = slice(slots[0], slots[-1] + 1)  # a view, no copy

        def renamed(name: str) -> str:
            match = pattern.match(name)
            if match is None or layer == 0:
                return name
            return f"{self.layers_path}.{int(match.group(1)) - layer + 1}.{name[match.end() :]}"

        return {renamed(name): tensor[pick] for name, tensor in self.tensors.items() if name not in skip}


def stack_model(model: nn.Module, names: set[str], width: int, randomness: str = "same") -> Stack:
    """``model``'s parameters ``names`` (what any member trains, and what differs between members)
    stacked ``width`` times from their values in ``model``; the model's own stop requiring grad."""
    params = dict(model.named_parameters())
    ordered = [n for n in params if n in names]
    model.requires_grad_(False)
    tensors = {
        n: params[n].detach().unsqueeze(0).expand(width, *params[n].shape).clone().requires_grad_() for n in ordered
    }
    return Stack(model, tensors, _layers_path(model), randomness)


def _layers_path(model: nn.Module) -> str:
    try:
        layers = find_encoder_parts(model).layers
    except ValueError:
        return ""
    return next((name for name, module in model.named_modules() if module is layers), "")


# --- members -----------------------------------------------------------------------------------
@dataclass(eq=False)  # one member is itself only (its tensors compare by identity)
class Member:
    """One cell in a slot of the array: its trainable slices, its own optimizer and fit state, and
    (slots) its own train subset and batches."""

    cfg: TrialConfig
    slot: int
    report: FreezeReport
    leaves: dict[str, torch.Tensor]  # stacked name -> its trainable slice (a leaf sharing the storage)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    ctx: FitContext  # its own cfg, schedule and on_eval
    data: TrialData
    stream: DeviceStream | None = None  # its own batches (slots); None: the array's shared stream
    state: FitState = field(default_factory=FitState)
    scaler: torch.amp.GradScaler | None = None
    entered: float = field(default_factory=time.perf_counter)


def new_member(
    stack: Stack,
    slot: int,
    cfg: TrialConfig,
    plan: Plan,
    data: TrialData,
    base: FitContext,
    own_tokens: int = 0,
    before: Member | None = None,
) -> Member:
    """``cfg`` in ``slot``: its trainable slices (``plan``: what each cell trains), its optimizer and
    schedule over them, its batches when it draws its own (``own_tokens``: the slots' batch width;
    0: the array's shared stream). ``before``: the member that held the slot; where it trained the
    same slices, its leaves and optimizer are taken over, the optimizer as new (``optimizer_again``):
    a CUDA graph of the slots' update stays valid (``OwnStreams``)."""
    report, trains = plan.adapted[cfg.trial_id]
    schedule = make_schedule(len(data.train_rows), cfg)
    if before is not None and set(before.leaves) == trains:
        leaves = before.leaves
        optimizer, scheduler = optimizer_again(before.optimizer, schedule)
    else:
        leaves = {n: t.detach()[slot].requires_grad_() for n, t in stack.tensors.items() if n in trains}
        optimizer, scheduler = optimizer_for(list(leaves.values()), cfg, schedule, base.device, base.cuda_graphs)
    ctx = dataclasses.replace(base, cfg=cfg, schedule=schedule, on_eval=functools.partial(plan.on_eval, cfg))
    stream = device_stream(data, cfg, schedule, base.device, own_tokens) if own_tokens else None
    return Member(cfg, slot, report, leaves, optimizer, scheduler, ctx, data, stream, scaler=base.plan.grad_scaler())


@dataclass
class DeviceStream:
    """A cell's training batches as trials/train.py ``fit`` draws them: its train subset moved to the
    device once, every epoch's order drawn once (``epoch_orders``), each step's positions read in
    turn; the batches are gathered on the device, nothing is copied from the host per step."""

    rows: DeviceRows
    orders: EpochOrders
    batch_size: int
    step: int = 0

    def next(self) -> tuple[np.ndarray, torch.Tensor]:
        """The next step's positions in the subset (host, device). Only the schedule's steps are drawn:
        a member leaves the array at its last step (``fit_array``), its stream with it."""
        self.step += 1
        return self.orders.batch(self.step - 1, self.batch_size)


def device_stream(
    data: TrialData, cfg: TrialConfig, schedule: Schedule, device: torch.device, width: int = 0
) -> DeviceStream:
    """``cfg``'s batches (``width``: the widest batch its slot is padded to)."""
    rows = device_rows(data.train_tokens, data.task.train.labels[data.train_rows], device, width)
    return DeviceStream(rows, cell_orders(cfg, len(rows), schedule, device), cfg.batch_size)


def cell_orders(cfg: TrialConfig, n_rows: int, schedule: Schedule, device: torch.device) -> EpochOrders:
    """The epochs' orders ``cfg``'s fit draws, from its seed (trials/train.py ``fit``'s own draws)."""
    return epoch_orders(n_rows, schedule, FitState(), torch.Generator().manual_seed(cfg.derived_seed), device)


def packed_tokens(cfgs: Sequence[TrialConfig], datas: dict[int, TrialData]) -> int:
    """Packed slots' one width: the most real tokens any batch of any of ``cfgs`` holds (their orders
    drawn as their streams draw them), up to a multiple of 8. A function of the queue alone, not of
    which cells share a step: no slot's shape, so none of its numbers, depends on its neighbours."""
    most = 1
    for cfg in cfgs:
        data = datas[cfg.train_size]
        lengths = np.array([len(row) for row in data.train_tokens.input_ids], dtype=np.int64)
        schedule = make_schedule(len(lengths), cfg)
        orders = cell_orders(cfg, len(lengths), schedule, torch.device("cpu")).host
        starts = np.arange(0, orders.shape[1], cfg.batch_size)
        if orders.size:
            most = max(most, int(np.add.reduceat(lengths[orders], starts, axis=1).max()))
    return -(-most // MULTIPLE) * MULTIPLE


# --- one step, one evaluation ------------------------------------------------------------------------
def array_step(stack: Stack, members: Sequence[Member], batch, plan: PrecisionPlan, feed) -> torch.Tensor:
    """One optimisation step of every member in ``members`` on ``batch`` (the others' slices stay
    as they are); returns every slot's loss, ``[width]`` (no host sync)."""
    return update(stack, members, array_losses(stack, batch, plan, feed))


def array_losses(stack: Stack, batch, plan: PrecisionPlan, feed, autocast_cache: bool = True) -> torch.Tensor:
    """Every slot's loss on ``batch``, ``[width]`` (``autocast_cache`` off where a CUDA graph is captured)."""
    with plan.autocast(cache=autocast_cache):
        logits = stack.logits(feed, batch)
    return vmap(task_loss, in_dims=(0, None))(logits, batch.labels)


def own_step(
    stack: Stack, members: Sequence[Member], batch, plan: PrecisionPlan, reader: first_token.Reader | None = None
):
    """``array_step`` with every slot on its own batch (``SlotBatch`` or ``PackedSlots``: inputs,
    labels and row weights, each ``[width, rows, ...]``; a row of weight 0 pads a short batch and
    counts nowhere)."""
    return update(stack, members, own_losses(stack, batch, plan, reader))


def own_losses(
    stack: Stack, batch, plan: PrecisionPlan, reader: first_token.Reader | None = None, autocast_cache: bool = True
):
    """Every slot's loss on its own batch, ``[width]`` (``reader``: a packed batch's, ``own_logits``;
    ``autocast_cache``: as ``array_losses``')."""
    with plan.autocast(cache=autocast_cache):
        logits = stack.own_logits(batch.inputs(), reader)
    rows = vmap(functools.partial(task_loss, reduction="none"))(logits, batch.labels)
    return torch.where(batch.weights > 0, rows, 0.0).sum(1) / batch.weights.sum(1).clamp(min=1)


def update(stack: Stack, members: Sequence[Member], losses: torch.Tensor) -> torch.Tensor:
    losses.sum().backward()  # d(sum)/d(loss_i) = 1: each slot's gradients are its own loss's
    for member in members:
        member_update(stack, member)
    for tensor in stack.tensors.values():
        tensor.grad = None
    return losses.detach().double()


def member_update(stack: Stack, member: Member) -> None:
    """Clip the member's trainable slices by its own norm, then its AdamW step and schedule."""
    clip_member(stack, member)
    if optimizer_step(member.optimizer, member.scaler):
        member.scheduler.step()
    member.optimizer.zero_grad(set_to_none=True)


def clip_member(stack: Stack, member: Member) -> None:
    """The member's gradients (its slices of the stacked ones), clipped by its own norm."""
    for name, leaf in member.leaves.items():
        leaf.grad = stack.tensors[name].grad[member.slot]
    torch.nn.utils.clip_grad_norm_(list(member.leaves.values()), member.cfg.max_grad_norm, foreach=True)


# --- the step as CUDA graphs (opt-in ``cuda_graphs``; an array on one stream) ----------------------------
def array_graphs(stack: Stack, active: list[Member], stream: SharedStream, plan: PrecisionPlan) -> StepGraphs:
    """``active``'s step as CUDA graphs over the stream's length buckets (trials/graphs.py, as a single
    trial's): captured, the update without the schedules (every member's clipping and capturable
    AdamW, whose learning rate each member's schedule fills after a replay); its warm-up the same
    without AdamW. Made for one set of members: one that leaves is in these graphs' updates, so the
    others' graphs are captured again (``SharedStream``)."""
    feed = stream.feed
    return members_graphs(
        stack,
        active,
        lambda batch: array_losses(stack, batch, plan, feed, autocast_cache=False),
        lambda batch: array_step(stack, active, batch, plan, feed),
        lambda: active,
        buckets=stream.buckets,
        pad_id=stream.pad_id,
    )


def slot_graphs(stack: Stack, held: dict[int, Member], streams: OwnStreams, plan: PrecisionPlan) -> StepGraphs:
    """The slots' step as one CUDA graph (their batches are one shape: ``OwnStreams``): every slot's
    update, its member's or, in a slot left free, its last member's (``held``). A free slot trains
    copies of another's rows at weight 0: its slices are nobody's, and its next cell loads its own
    initial weights over them (``load_initial``). Captured once for a set of slot optimizers: a cell
    that takes a slot and trains its slices takes over its optimizer (``new_member``), so the graph
    stays valid; another set is captured again. The schedules of the members in the slots now are
    stepped after each replay (``streams.current``)."""
    reader = streams.reader
    return members_graphs(
        stack,
        list(held.values()),  # (a successor shares its leaves, optimizer and clipping norm)
        lambda batch: own_losses(stack, batch, plan, reader, autocast_cache=False),
        lambda batch: own_step(stack, streams.current, batch, plan, reader),
        lambda: streams.current,
        buckets=(),
        pad_id=0,
        fit=lambda batch: ("slots", batch),  # one shape: the slots' rows and tokens (``OwnStreams``)
    )


def members_graphs(
    stack: Stack,
    members: list[Member],
    losses_of: Callable,
    eager: Callable,
    scheduled: Callable[[], list[Member]],
    **shapes,
) -> StepGraphs:
    """``members``' update on ``losses_of(batch)`` (every slot's loss) as CUDA graphs (``StepGraphs``,
    ``shapes`` its buckets, pad id and fit): captured, every member's clipping and capturable AdamW;
    its warm-up the same without AdamW; ``eager`` the step until AdamW's state exists; after a replay
    the schedules of ``scheduled()``'s members."""

    def backward(batch) -> torch.Tensor:
        losses = losses_of(batch)
        losses.sum().backward()
        for member in members:
            clip_member(stack, member)
        return losses.detach().double()

    def graphed_update(batch) -> torch.Tensor:
        losses = backward(batch)
        for member in members:
            member.optimizer.step()
        return losses

    def reset() -> None:
        for member in members:
            member.optimizer.zero_grad(set_to_none=True)
        for tensor in stack.tensors.values():
            tensor.grad = None

    return StepGraphs(
        eager,
        step=graphed_update,
        warm=backward,
        after=lambda: [member.scheduler.step() for member in scheduled()],
        reset=reset,
        ready=lambda: all(member.optimizer.state for member in members),  # an eager step made AdamW's state
        **shapes,
    )


@dataclass(frozen=True)
class EvalGroup:
    """Slots evaluated in one pass: from ``prefix``'s cached states (the frozen layers they share, run
    once per worker: trials/eval_cache.py), or from the embeddings where it is None."""

    slots: tuple[int, ...]
    prefix: PrefixStates | None = None
    skip: frozenset[str] = frozenset()  # stacked names inside the prefix (the model's own values there)


@dataclass(frozen=True)
class EvalDepths:
    """Where an array's members are evaluated from, decided at its build: each frozen depth's cached
    states (with the stacked names they stand in for), for the members whose initial weights are the
    array model's own (``seed``: that seed's only, where its weights below the head are drawn from it;
    None: every seed's, a pretrained model's); the others, and the depths without a cache, from the
    embeddings."""

    prefixes: dict[int, tuple[PrefixStates, frozenset[str]]]  # the cached depths only
    seed: int | None = None
    fill_s: float = 0.0  # the time filling them took, per cell of the array

    def prefix(self, cfg: TrialConfig) -> PrefixStates | None:
        cached = self.prefixes.get(cfg.frozen_layers) if self.seed in (None, cfg.derived_seed) else None
        return cached[0] if cached else None

    def groups(self, members: Sequence[Member], apart: bool = False) -> tuple[EvalGroup, ...]:
        """``members`` (those due an evaluation) in one pass per cached depth, the rest in one pass from
        the embeddings: per member the layers its single trial runs, and no slot that is not due.
        ``apart``: a pass per member (graphed slots: each slot's evaluations from its depth are one
        graph, however its neighbours fall due; a graph per set of slots due would be many captures)."""
        by_depth: dict[int | None, list[int]] = {}
        for member in sorted(members, key=lambda m: m.slot):
            depth = member.cfg.frozen_layers if self.prefix(member.cfg) is not None else None
            by_depth.setdefault(depth, []).append(member.slot)
        uncached = by_depth.pop(None, [])
        passes = [(None, tuple(uncached))] * bool(uncached) + [(d, tuple(s)) for d, s in sorted(by_depth.items())]
        if apart:
            passes = [(depth, (slot,)) for depth, slots in passes for slot in slots]
        return tuple(
            EvalGroup(slots, *self.prefixes[depth]) if depth is not None else EvalGroup(slots)
            for depth, slots in passes
        )


@torch.inference_mode()
def evaluate_array(
    stack: Stack,
    batches: list[Batch],
    plan: PrecisionPlan,
    device: torch.device,
    groups: Sequence[EvalGroup] | None = None,
    labels: np.ndarray | None = None,
    feed: PaddedFeed | None = None,
    eval_graphs: EvalGraphs | None = None,
) -> dict[int, tuple[dict[str, float], float, bool]]:
    """Each grouped slot's (metrics, mean loss, whether every row got one prediction) over the
    validation batches, as trials/evaluate.py computes one trial's: the members in one pass per batch
    for each group (default: one group of every slot, uncached); ``feed`` and ``eval_graphs`` as
    there, a graph per group."""
    slots: list[int] = []
    sums, predicted = [], []  # (put together on the device: no index tensor from the host)
    for group in groups or (EvalGroup(tuple(range(stack.width))),):
        run = functools.partial(_evaluate_group, stack, batches, plan, device, group, feed or PaddedFeed())
        if eval_graphs is None:
            group_sums, predictions = run()
        else:  # one graph per group (its slots, from its depth), its device index made once with it
            key = (group.slots, group.prefix and group.prefix.layer)
            group_sums, predictions = eval_graphs(key, run, functools.partial(slot_index, group.slots, device))
        slots += group.slots
        sums.append(group_sums)
        predicted.append(predictions)
    labels = eval_labels(batches) if labels is None else labels  # as trials/evaluate.py: once per array
    every = torch.cat(predicted).cpu().numpy()
    losses = (torch.cat(sums) / len(labels)).tolist()
    regression, classes = labels.dtype.kind == "f", stack.model.config.num_labels
    return {
        slot: (compute_metrics(every[i], labels, regression, classes), losses[i], constant(every[i]))
        for i, slot in enumerate(slots)
    }


def _evaluate_group(
    stack: Stack,
    batches: list[Batch],
    plan: PrecisionPlan,
    device: torch.device,
    group: EvalGroup,
    feed: PaddedFeed,
    index: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One group's loss sums ``[slots]`` and predictions ``[slots, rows]`` over the batches, on the
    device (``index``: its slots there, where a CUDA graph captures the pass)."""
    prefix = group.prefix
    tensors = stack.starting_at(prefix.layer if prefix else 0, group.slots, group.skip, index)
    loss_sums, predicted = torch.zeros(len(group.slots), dtype=torch.float64, device=device), []
    with (
        eval_mode(stack.model),
        starting_at(stack.model, prefix.layer, prefix.tuple_output) if prefix else contextlib.nullcontext() as injector,
    ):
        for i, batch in enumerate(batches):
            if injector is not None:
                injector.states = prefix.states[i]  # type: ignore[union-attr]  # set with the injector
            with plan.autocast(cache=False):  # (a capture outlives no cast weight: trials/graphs.py)
                logits = stack.logits(feed, batch, tensors).float()
            loss_sums += vmap(functools.partial(task_loss, reduction="sum"), in_dims=(0, None))(logits, batch.labels)
            predicted.append(logits.squeeze(-1) if batch.labels.is_floating_point() else logits.argmax(-1))
    return loss_sums, torch.cat(predicted, dim=1)


def slot_index(slots: Sequence[int], device: torch.device) -> tuple[torch.Tensor | None]:
    """(``slots`` as a device index,), or (None,) where they follow each other (a view picks them)."""
    following = list(slots) == list(range(slots[0], slots[-1] + 1))
    return (None if following else torch.tensor(list(slots), device=device),)


# --- how batches reach the slots: one stream for all, or one per slot ----------------------------------
@dataclass
class SharedStream:
    """Every member on the same batch (they share seed and train size): packed where the model
    qualifies, inputs unbatched, so the frozen prefix runs once for all. ``buckets``: the step as CUDA
    graphs over these length buckets (``array_graphs``), the graphs of one set of members at a time;
    empty: eager."""

    stream: DeviceStream
    feed: PaddedFeed | PackedFeed
    pad_id: int
    buckets: tuple[int, ...] = ()
    graphed: dict[tuple, StepGraphs] = field(default_factory=dict)  # the active members' -> their graphs
    failures: dict = field(default_factory=dict)  # the worker's graph_failures: a failed capture's verdict
    key: FeedKey | None = None  # the model's, there (listed: eager from then on, for all members)

    def __call__(self, run: ArrayRun, active: list[Member]) -> torch.Tensor:
        batch = self.feed.gather(self.stream.rows, *self.stream.next(), self.pad_id)
        if not self.buckets or self.key in self.failures:
            return array_step(run.stack, active, batch, run.base.plan, self.feed)
        members = tuple((member.slot, member.cfg.trial_id) for member in active)
        if members not in self.graphed:
            self.graphed.clear()  # a member left: its update is in these graphs (and they hold it alive)
            self.graphed[members] = array_graphs(run.stack, active, self, run.base.plan)
        losses = self.graphed[members](batch)
        if self.graphed[members].failed:
            self.failures[self.key] = self.graphed[members].failed
            self.graphed.clear()
        return losses


@dataclass
class SlotBatch:
    """Every slot's batch, ``[width, rows, ...]`` each; ``weights``: a row's weight (0: padding)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor | None
    labels: torch.Tensor
    weights: torch.Tensor

    def inputs(self) -> dict[str, torch.Tensor]:
        names = ("input_ids", "attention_mask", "token_type_ids")
        return {name: value for name in names if (value := getattr(self, name)) is not None}


@dataclass
class PackedSlots:
    """Every slot's batch packed (trials/packing.py ``Packed``), one row of ``tokens`` tokens each: its
    rows' real tokens, then tokens of a sequence of their own (id -1) up to the slots' width;
    ``first_tokens``, ``labels``, ``weights``: ``[width, rows]`` (a short batch's extra rows repeat its
    rows at weight 0)."""

    input_ids: torch.Tensor  # [width, 1, tokens]
    position_ids: torch.Tensor  # [width, 1, tokens]
    sequence: torch.Tensor  # [width, tokens]: each token's row in its slot's batch
    first_tokens: torch.Tensor  # [width, rows]
    token_type_ids: torch.Tensor | None
    labels: torch.Tensor
    weights: torch.Tensor

    def inputs(self) -> dict[str, torch.Tensor]:
        names = ("input_ids", "position_ids", "sequence", "first_tokens", "token_type_ids")
        return {name: value for name in names if (value := getattr(self, name)) is not None}


@dataclass
class OwnStreams:
    """Every slot on its own member's next batch (slots across seeds and train sizes), in one shape
    for all: ``rows`` rows, packed (``feed``: ``PackedSlots``, ``tokens`` tokens a slot:
    ``packed_tokens``) or padded (``SlotBatch``, ``tokens`` tokens a row: the longest row of any queued
    cell's subset), so that no slot's numbers depend on what the others hold; a free slot trains a copy
    of another's batch with weight 0 (eager, its slices step nowhere; graphed, its last member's update
    runs on them: ``slot_graphs``). ``mask``: how the padding mask is given (``mask_form``).
    ``graphed``: the step as one CUDA graph (``slot_graphs``), captured again when a slot's optimizer
    changes; a failed capture, eager from then on (``failures``, the worker's, under ``key``)."""

    rows: int
    tokens: int
    mask: str
    feed: PackedFeed | None = None  # packed, its reader the head's (None: padded)
    pad_id: int = 0
    graphed: bool = False
    failures: dict = field(default_factory=dict)
    key: FeedKey | None = None
    current: list[Member] = field(default_factory=list)  # the members in the slots at this step
    held: dict[int, Member] = field(default_factory=dict)  # each slot's member, or its last (graphed)
    graphs: dict[tuple, StepGraphs] = field(default_factory=dict)  # the slots' optimizers -> their graph

    @property
    def reader(self) -> first_token.Reader | None:
        return None if self.feed is None else self.feed.reader

    def __call__(self, run: ArrayRun, active: list[Member]) -> torch.Tensor:
        batch = self.batch(run.stack.width, active) if self.feed is None else self.packed(run.stack.width, active)
        if not self.graphed or self.key in self.failures:
            return own_step(run.stack, active, batch, run.base.plan, self.reader)
        self.current = active
        self.held.update((member.slot, member) for member in active)
        optimizers = tuple((slot, id(member.optimizer)) for slot, member in sorted(self.held.items()))
        if optimizers not in self.graphs:
            self.graphs.clear()  # (they hold the members they captured alive)
            self.graphs[optimizers] = slot_graphs(run.stack, dict(self.held), self, run.base.plan)
        step = self.graphs[optimizers]
        losses = step(batch)
        if step.failed:
            self.failures[self.key] = step.failed
            self.graphs.clear()
        return losses

    def batch(self, width: int, active: list[Member]) -> SlotBatch:
        """Each slot's next batch (a free slot: another's rows at weight 0), gathered on the device."""
        own = {m.slot: padded(m.stream, self.rows, self.tokens, m.data.pad_id) for m in active if m.stream}
        filler = next(iter(own.values()))
        slots = [own.get(slot, (filler[0], torch.zeros_like(filler[1]))) for slot in range(width)]
        batches = [b for b, _ in slots]
        types = None if batches[0].token_type_ids is None else torch.stack([b.token_type_ids for b in batches])
        return SlotBatch(
            torch.stack([b.input_ids for b in batches]),
            mask_as(torch.stack([b.attention_mask for b in batches]), self.mask),
            types,
            torch.stack([b.labels for b in batches]),
            torch.stack([w for _, w in slots]),
        )

    def packed(self, width: int, active: list[Member]) -> PackedSlots:
        """Each slot's next batch packed (a free slot: another's at weight 0), gathered on the device."""
        assert self.feed is not None
        feed = self.feed
        own = {m.slot: packed_slot(m.stream, self.rows, self.tokens, feed, m.data.pad_id) for m in active if m.stream}
        filler = next(iter(own.values()))
        slots = [own.get(slot, (filler[0], torch.zeros_like(filler[1]))) for slot in range(width)]
        return stacked_slots([p for p, _ in slots], torch.stack([w for _, w in slots]))


def stacked_slots(packs: Sequence[Packed], weights: torch.Tensor) -> PackedSlots:
    """The slots' packed batches (each one row of the same width) as one ``PackedSlots``."""
    names = ("input_ids", "position_ids", "sequence", "first_tokens", "token_type_ids", "labels")
    fields = {n: None if getattr(packs[0], n) is None else torch.stack([getattr(p, n) for p in packs]) for n in names}
    return PackedSlots(**fields, weights=weights)


def packed_slot(
    stream: DeviceStream, rows: int, tokens: int, feed: PackedFeed, pad_id: int
) -> tuple[Packed, torch.Tensor]:
    """The stream's next batch packed into one row of ``tokens`` tokens (``padded_to``), gathered on the
    device (a short batch's first tokens and labels repeat to ``rows``, weight 0), and its rows' weights."""
    positions, on_device = stream.next()
    real = len(positions)
    packed = padded_to(feed.gather(stream.rows, positions, on_device, pad_id), tokens, pad_id)
    index = torch.arange(rows, device=on_device.device)
    if real < rows:  # the epoch's last batch: its rows again (no host data)
        packed = dataclasses.replace(
            packed, first_tokens=packed.first_tokens[index % real], labels=packed.labels[index % real]
        )
    return packed, (index < real).float()


def padded(stream: DeviceStream, rows: int, tokens: int, pad_id: int) -> tuple[Batch, torch.Tensor]:
    """The stream's next batch as ``rows`` rows of ``tokens`` tokens, gathered on the device (padding on
    the right, masked; a short batch repeats its rows, with weight 0), and its rows' weights."""
    positions, on_device = stream.next()
    real, device = len(positions), on_device.device
    if real < rows:  # the epoch's last batch: its rows again, on the device (no host data)
        positions, on_device = positions[np.arange(rows) % real], on_device[torch.arange(rows, device=device) % real]
    batch = collate_rows(stream.rows, positions, on_device, pad_id, width=tokens)
    return batch, (torch.arange(rows, device=device) < real).float()


# --- the array's run -------------------------------------------------------------------------------
@dataclass
class Plan:
    """What every member of an array is, decided before its first step: each cell's freeze report
    and trained parameter names, and where its evaluations go."""

    adapted: dict[str, tuple[FreezeReport, set[str]]]
    on_eval: ArrayEval


@dataclass
class ArrayRun:
    """An array ready to train: the stacked model, the members in its slots, and the loop's parts."""

    stack: Stack
    members: list[Member]
    base: FitContext  # the members' shared context (their own cfg, schedule and on_eval aside)
    reader: first_token.Reader | None
    step: Callable[[ArrayRun, list[Member]], torch.Tensor]  # SharedStream or OwnStreams
    finish: Callable[[Member], TrialResult]
    on_results: Results
    refill: Callable[[int, Member], Member | None] = lambda slot, before: None  # a free slot's next cell (slots)
    eval_depths: EvalDepths = EvalDepths({})  # where each member is evaluated from
    results: dict[str, TrialResult] = field(default_factory=dict)
    eval_graphs: EvalGraphs | None = None  # its evaluations as CUDA graphs


def run_array(
    configs: Sequence[TrialConfig],
    on_eval: ArrayEval | None = None,
    on_results: Results | None = None,
    worker: WorkerState | None = None,
    width: int | None = None,
) -> list[TrialResult]:
    """Run cells of one model and task as one array; their results, in ``configs``' order.
    ``on_eval`` gets every member's evaluations (with its config), ``on_results`` the results that
    became final at one step, together, as soon as they are (a Ray trial reports them as one result:
    the driver's work per report is paid once); ``worker`` as ``run_trial``'s. Cells that differ only
    in frozen depth all train at once on one batch stream; others take turns in ``width`` slots
    (default: as many as the cells), the next cell taking a slot as soon as its member is over. Raises on failure, as
    ``run_trial`` does; cells that cannot share one array raise ValueError at once. A model that does
    not qualify (``array_agrees``) runs its cells as single trials, one after another."""
    started = time.perf_counter()
    worker = worker or process_worker()
    cfgs = [resolve_config(c) for c in configs]
    on_eval, on_results = on_eval or (lambda cfg, point: None), on_results or (lambda results: None)
    check_together(cfgs)
    run = build_array(cfgs, width or len(cfgs), Plan({}, on_eval), on_results, worker, started)
    if run is None:
        return [_alone(c, on_eval, on_results, worker) for c in cfgs]
    with first_token.narrowed(run.stack.model, run.reader):
        fit_array(run)
    return [run.results[c.trial_id] for c in cfgs]


def run_array_or_oom(
    configs: Sequence[TrialConfig],
    on_eval: ArrayEval | None = None,
    on_results: Results | None = None,
    worker: WorkerState | None = None,
    width: int | None = None,
) -> list[TrialResult]:
    """``run_array``, except that an array that runs out of GPU memory gives the memory back
    (trials/oom.py) and its members without a row run again as two arrays of half its width, down to
    single trials, whose out-of-memory is their ``oom`` row (``run_trial_or_oom``). Rows already given
    (a member that diverged or finished before) stay given: every member gets exactly one."""
    worker = worker or process_worker()
    cfgs = [resolve_config(c) for c in configs]
    on_eval, on_results = on_eval or (lambda cfg, point: None), on_results or (lambda results: None)
    width = min(width or len(cfgs), len(cfgs))
    if width == 1:
        return [_alone(c, on_eval, on_results, worker, run_trial_or_oom) for c in cfgs]
    given: dict[str, TrialResult] = {}

    def give(results: list[TrialResult]) -> None:
        given.update((result.trial_id, result) for result in results)
        on_results(results)

    done = catch_oom(
        lambda: run_array(cfgs, on_eval, give, worker, width), lambda exc: None, free=lambda: free_memory(worker)
    )
    if done is None:
        rest = [c for c in cfgs if c.trial_id not in given]
        half = (len(rest) + 1) // 2
        for part in filter(None, (rest[:half], rest[half:])):
            run_array_or_oom(part, on_eval, give, worker, max(1, width // 2))
    return [given[c.trial_id] for c in cfgs]


def build_array(
    cfgs: Sequence[TrialConfig], width: int, plan: Plan, on_results: Results, worker: WorkerState, started: float
) -> ArrayRun | None:
    """The array of ``cfgs`` (resolved, checked together) ready to train, or None where the model
    does not qualify (its members then run alone)."""
    first = cfgs[0]
    device, precision = start_trial(first)
    data = trial_data(first, device, worker)
    model = eager_attention(trial_model(first, data, device))  # vmap draws its dropout (trials/model.py)
    own = len({(c.seed, c.train_size) for c in cfgs}) > 1 or len(cfgs) > width  # slots: a stream each
    common = dataclasses.replace(first, frozen_layers=min(c.frozen_layers for c in cfgs))  # what all freeze
    reader, feed = feed_of(common, model, data, device, packed=True)
    key = model_key(first, model)
    check = check_batch(data, device)  # the rows the model's checks run on (qualifies, graph_feed)
    if own and not packed_slots_agree(model, check, data.pad_id, feed, key, worker):
        feed = PaddedFeed()  # slots padded (a packed feed the model's vmapped forward does not take so)
    mask = qualifies(model, check, data.pad_id, (reader, feed), key, own, worker)
    if mask is None:
        return None
    datas = {first.train_size: data} | {c.train_size: trial_data(c, device, worker) for c in cfgs[1:] if own}
    packed = own and isinstance(feed, PackedFeed)
    differ = differing(model, cfgs, worker) if own else set()
    names = plan_members(model, cfgs, plan) | differ
    depths = eval_depths(cfgs, model, names, (data, precision, device))
    stack = stack_model(model, names, min(width, len(cfgs)), "different" if own else "same")
    schedule = make_schedule(len(data.train_rows), common)
    graphed = array_graphs_apply(cfgs, common, (device, precision), key, worker)
    base = _array_context(common, precision, device, schedule, data, feed, graphed)
    base, eval_graphs = array_evaluation(base, model, (check, data.pad_id, reader), key, worker)
    queue = collections.deque(cfgs)
    # the slots' one batch shape: the most tokens a packed batch holds, or the longest row
    tokens = (packed_tokens(cfgs, datas) if packed else max(map(longest, datas.values()))) if own else 0

    def start(slot: int, before: Member | None = None, entered: float | None = None) -> Member | None:
        if not queue:
            return None
        cfg = next_cell(queue, before, plan) if graphed else queue.popleft()
        if own:
            load_initial(stack, slot, cfg, datas[cfg.train_size], worker)
        member = new_member(stack, slot, cfg, plan, datas[cfg.train_size], base, tokens, before if graphed else None)
        member.entered = entered or member.entered
        return member

    def finish(member: Member) -> TrialResult:
        wall_s = (time.perf_counter() - member.entered) / stack.width  # its share of the array's time
        m, prefix = member, depths.prefix(member.cfg)
        result = trial_result(
            m.cfg, m.data, m.report, m.state, device, precision, (prefix, None), wall_s, depths.fill_s
        )
        # (a capture that failed in this array put the model among the worker's graph failures)
        on = graphed and key not in worker.graph_failures
        evaluated = evaluated_graphed(eval_graphs, key, worker)
        used = optimisations_used(prefix, None, reader, feed, cuda_graphs=on, eval_graphs=evaluated)
        return dataclasses.replace(result, optimisations=(*used, OPTIMISATION))

    members = [start(slot, None, started) for slot in range(stack.width)]
    if own:
        own_feed = feed if isinstance(feed, PackedFeed) else None
        streams = OwnStreams(first.batch_size, tokens, mask, own_feed, data.pad_id, graphed, worker.graph_failures, key)
        return ArrayRun(
            stack, members, base, reader, streams, finish, on_results, start, depths, eval_graphs=eval_graphs
        )
    stream_feed = graph_feed(model, check, data.pad_id, (reader, feed), key, worker) if graphed else feed
    shared = SharedStream(device_stream(data, first, schedule, device), stream_feed, data.pad_id)
    if graphed:
        shared.buckets = length_buckets(batch_sizes(shared.stream.rows, shared.stream.orders, 0, base))
        shared.failures, shared.key = worker.graph_failures, key
    return ArrayRun(stack, members, base, reader, shared, finish, on_results, start, depths, eval_graphs=eval_graphs)


def _array_context(
    common: TrialConfig,
    precision: PrecisionPlan,
    device: torch.device,
    schedule: Schedule,
    data: TrialData,
    feed,
    graphed: bool,
) -> FitContext:
    """What every member's fit shares: the common config's schedule, the evaluation batches and their
    labels (on the host once per array, not at every evaluation), the feed, CUDA graphs or not."""
    return FitContext(
        common,
        precision,
        device,
        schedule,
        data.batches,
        on_eval=None,
        feed=feed,
        eval_labels=eval_labels(data.batches),
        cuda_graphs=graphed,
    )


def array_evaluation(
    base: FitContext, model: nn.Module, check: tuple, key: FeedKey, worker: WorkerState
) -> tuple[FitContext, EvalGraphs | None]:
    """The array's evaluations as CUDA graphs where its step is graphed (``evaluation_graphed``, as a
    single trial's; slots, a graph per slot and depth: ``EvalDepths.groups``), and how they feed the
    model (``prebuilt_mask``, ``evaluation_feed_of``: on ``check``'s rows); else as they were."""
    eval_graphed = evaluation_graphed(base.cuda_graphs, base.device, key, worker)
    if not prebuilt_mask(eval_graphed, base.device, base.plan):
        return base, None
    batch, pad_id, reader = check
    feed = evaluation_feed_of(model, batch, pad_id, key, worker, reader)
    return dataclasses.replace(base, eval_graphs=eval_graphed, eval_feed=feed), EvalGraphs() if eval_graphed else None


def evaluated_graphed(eval_graphs: EvalGraphs | None, key: FeedKey, worker: WorkerState) -> bool:
    """Whether the array's evaluations ran as CUDA graphs; a capture that failed is kept in the worker
    (its later arrays of the model evaluate eagerly)."""
    if eval_graphs is not None and eval_graphs.failed:
        worker.graph_failures[(key, "evaluation")] = eval_graphs.failed
    return bool(eval_graphs and eval_graphs.graphs)  # (none where a capture failed)


def eval_depths(cfgs: Sequence[TrialConfig], model: nn.Module, names: set[str], where: tuple) -> EvalDepths:
    """Each depth's cached states (``where``: the data, precision and device), filled here, shallow
    first (a deeper entry starts from a shallower one), with the time it took per cell: an array's
    evaluation runs the layers its members' single trials run, no more (one pass for all would run
    every member through every layer the least frozen one trains). The states are the array model's
    own, the first cell's initial weights, so they are filled for the depths of the cells whose
    weights those are (``weights_key``: a pretrained model's, every seed, unless its checkpoint lacks
    a prefix weight; a random init, its seed's) and used by those cells only (``EvalDepths.prefix``).
    The depths' states together keep to the worker's budget for the cache: past it, from the embeddings."""
    data, precision, device = where
    first, started = cfgs[0], time.perf_counter()
    prefixes: dict[int, tuple[PrefixStates, frozenset[str]]] = {}
    weights, room = weights_key(first, data.worker), data.worker.eval_states.max_bytes
    for depth in sorted({c.frozen_layers for c in cfgs if weights_key(c, data.worker) == weights}):
        at = dataclasses.replace(first, frozen_layers=depth)  # (its weights are the model's: the first cell's)
        held = sum(states_bytes(p) for p, _ in prefixes.values())  # the array holds them all: one budget
        prefix = evaluation_prefix(at, model, data, precision, device, None if room is None else room - held)
        if prefix is not None:
            prefixes[depth] = (prefix, frozenset(names & prefix_names(model, depth)))
    synchronize(device)
    seed = first.derived_seed if seeded_weights(first, data.worker) else None
    return EvalDepths(prefixes, seed, (time.perf_counter() - started) / len(cfgs))


def array_graphs_apply(
    cfgs: Sequence[TrialConfig], common: TrialConfig, where: tuple, key: FeedKey, worker: WorkerState
) -> bool:
    """CUDA graphs for an array where every member asks for them (on one stream, over its length
    buckets; slots, their one shape: ``OwnStreams``), unless this worker saw a capture of the model fail."""
    device, precision = where
    return (
        all(c.cuda_graphs for c in cfgs)
        and graphs.cuda_graphs_apply(common, device, precision, None)
        and key not in worker.graph_failures
    )


def graph_feed(model: nn.Module, check: Batch, pad_id: int, feeding, key: FeedKey, worker: WorkerState):
    """The feed a graphed array on one stream captures: ``AdditiveMaskFeed`` for a padded one where the
    model takes a 4-D additive mask to the same logits, else the feed as it is."""
    reader, feed = feeding
    if type(feed) is not PaddedFeed:
        return feed
    with first_token.narrowed(model, reader):
        form = slots_mask_form(model, check, pad_id, key, worker)
    return AdditiveMaskFeed() if form == "4d" else feed


def next_cell(queue: collections.deque, before: Member | None, plan: Plan) -> TrialConfig:
    """The queue's first cell that trains what ``before`` (the slot's last member) trained, else its
    first: taking over that slot's optimizer, it keeps the slots' CUDA graph (``new_member``). A
    member's numbers do not depend on the order (each slot draws its own batches), its dropout draws
    aside (the array's, whatever the order). Linear in the queue."""
    if before is not None:
        trains = plan.adapted[before.cfg.trial_id][1]
        for i, cfg in enumerate(queue):
            if plan.adapted[cfg.trial_id][1] == trains:
                del queue[i]
                return cfg
    return queue.popleft()


def qualifies(
    model: nn.Module, check: Batch, pad_id: int, feeding, key: FeedKey, own: bool, worker: WorkerState
) -> str | None:
    """Whether the model trains as an array (``array_agrees``) fed as it will be; for slots, also how
    it takes a batched padding mask (``slots_mask_form``). The mask form, "" for an array on one
    stream, None where it does not qualify."""
    reader, feed = feeding
    with first_token.narrowed(model, reader):
        mask = slots_mask_form(model, check, pad_id, key, worker) if own else ""
        randomness = "different" if own else "same"  # as stack_model will draw (build_array)
        return mask if mask is not None and array_agrees(model, check, feed, key, worker, randomness) else None


def plan_members(model: nn.Module, cfgs: Sequence[TrialConfig], plan: Plan) -> set[str]:
    """Each cell's freeze report and trained parameters into ``plan``; returns what any of them trains."""
    for cfg in cfgs:
        report = adapt(model, cfg)[0]
        plan.adapted[cfg.trial_id] = (report, {n for n, p in model.named_parameters() if p.requires_grad})
    return set().union(*(trains for _, trains in plan.adapted.values()))


def load_initial(stack: Stack, slot: int, cfg: TrialConfig, data: TrialData, worker: WorkerState) -> None:
    """``cfg``'s initial weights into its slot (its head's initialisation is its seed's). The array's
    random stream (its dropout draws) is not the one building a model seeds: it is put back after."""
    with _rng_kept(stack.model):
        params = dict(initial_model(cfg, data.task.num_labels, worker).named_parameters())
    with torch.no_grad():
        for name, tensor in stack.tensors.items():
            tensor[slot].copy_(params[name])


def differing(model: nn.Module, cfgs: Sequence[TrialConfig], worker: WorkerState) -> set[str]:
    """The parameters whose initial values differ between the cells' seeds (the new head; a random
    initialisation; a layer the checkpoint lacks): stacked, each slot its own, whether some cell trains
    them or not."""
    mine, differ = dict(model.named_parameters()), set()
    for cfg in {c.derived_seed: c for c in cfgs}.values():
        with _rng_kept(model):
            other = initial_model(cfg, model.config.num_labels, worker)
        differ |= {n for n, p in other.named_parameters() if not torch.equal(p, mine[n].detach().cpu())}
    return differ


@contextlib.contextmanager
def _rng_kept(model: nn.Module):
    devices = [p.device for p in model.parameters() if p.is_cuda][:1]
    with torch.random.fork_rng(devices=devices):
        yield


def longest(data: TrialData) -> int:
    return max(len(row) for row in data.train_tokens.input_ids)


def fit_array(run: ArrayRun) -> None:
    """The reference loop (trials/train.py ``fit``) for every member at once: each step trains every
    active member on its batch, each member is evaluated at its own schedule's steps (those due, in a
    pass per depth: ``EvalDepths.groups``), and a member that is over (its last step, or diverged at an
    evaluation) leaves with its row written; the next cell, if any, takes its slot."""
    active = list(filter(None, run.members))
    # A member lives only while it holds its slot: its optimizer state (AdamW: twice its trainable
    # slices) is freed before its successor's first step makes one, so a queue of cells never holds
    # more than the width the memory probe measured. Kept here, the first members stayed to the end.
    run.members.clear()
    run.stack.model.train()
    segment_started = time.perf_counter()
    while active:
        _count_steps(active, run.step(run, active))  # (no loop variable here keeps a leaver alive)
        going_on = _evaluate_and_rotate(run, active, segment_started)
        if going_on is None:
            continue
        active = going_on
        run.stack.model.train()
        segment_started = time.perf_counter()


def _count_steps(active: list[Member], losses: torch.Tensor) -> None:
    for member in active:
        count_step(member.state, losses[member.slot])


def _evaluate_and_rotate(run: ArrayRun, active: list[Member], segment_started: float) -> list[Member] | None:
    """At a step where a member is due an evaluation or over: the segment's time shared, the due ones
    evaluated, those over (or diverged) gone with their rows, together, and their slots refilled;
    returns the members that go on (None at any other step). No list of leavers outlives the call."""
    due = [m for m in active if m.state.step in m.ctx.schedule.eval_steps]
    over = [m for m in active if m.state.step >= m.ctx.schedule.total_steps]
    if not (due or over):
        return None
    synchronize(run.base.device)
    _share(active, "train_time_s", time.perf_counter() - segment_started)
    if due:
        _evaluate_members(run, due)
    leaving = [m for m in active if m in over or m.state.diverged_at_step is not None]
    if not leaving:
        return active
    _finished(run, leaving)  # their rows, together, before the next cells take their slots
    staying = [m for m in active if m not in leaving]
    return staying + [m for m in (run.refill(m.slot, m) for m in leaving) if m is not None]


def _share(members: list[Member], name: str, seconds: float) -> None:
    """The array's time, shared by the members that were in it: each row's times are its share."""
    for member in members:
        setattr(member.state, name, getattr(member.state, name) + seconds / max(1, len(members)))


def _evaluate_members(run: ArrayRun, due: list[Member]) -> None:
    """The members due evaluated (``EvalDepths.groups``: slots on other schedules are not, so a slot
    queue of n = 50 and n = 1,000 cells evaluates each at its own steps only); each one's evaluation
    into its state (a diverged one is marked so)."""
    base = run.base
    started = time.perf_counter()
    graphed = run.eval_graphs is not None and run.eval_graphs.failed is None  # (a failed capture: eager)
    groups = run.eval_depths.groups(due, apart=graphed and isinstance(run.step, OwnStreams))
    where = (base.eval_batches, base.plan, base.device)
    outcomes = evaluate_array(run.stack, *where, groups, base.eval_labels, base.eval_feed, run.eval_graphs)
    eval_s = (time.perf_counter() - started) / len(due)
    for member in due:
        metrics, loss, one_prediction = outcomes[member.slot]
        record_evaluation(member.state, member.ctx, metrics, loss, eval_s, one_prediction)


def _finished(run: ArrayRun, members: list[Member]) -> None:
    results = [run.finish(member) for member in members]
    run.results.update((result.trial_id, result) for result in results)
    run.on_results(results)


def _alone(cfg: TrialConfig, on_eval: ArrayEval, on_results: Results, worker: WorkerState, trial=None) -> TrialResult:
    """A member that runs as its single trial (the array steps aside)."""
    result = (trial or run_trial)(cfg, on_eval=functools.partial(on_eval, cfg), worker=worker)
    on_results([result])
    return result


def check_together(cfgs: Sequence[TrialConfig]) -> None:
    """One array holds cells of one model and task that qualify (on any device: the caller asks for
    an array), each once."""
    keys = [slot_key(c, anywhere=True) for c in cfgs]
    problems = []
    if not cfgs:
        problems.append("no cells")
    if len(cfgs) > 1 and (None in keys or len(set(keys)) > 1):
        problems.append("cells that do not qualify or differ in more than their frozen depth, seed and train size")
    if len({c.trial_id for c in cfgs}) < len(cfgs):
        problems.append("a cell given twice")
    if problems:
        raise ValueError(f"not one trial array: {'; '.join(problems)}")


# --- does the model qualify: measured once per model class, feed and worker --------------------------
def array_agrees(
    model: nn.Module, batch: Batch, feed, key: FeedKey, worker: WorkerState, randomness: str = "same"
) -> bool:
    """Whether a 2-member array of ``model`` gives the plain model's logits and gradients on ``batch``
    (a few training rows, fed as the trial feeds them), in fp32, dropout off, and trains in training
    mode with its dropout drawn by ``vmap`` as the array will draw it (``randomness``; under "same" two
    equal members must then agree); a check that raises (a layer ``vmap`` has no rule for) is a "no".
    The verdict is kept in the worker per (model, class, attention, feed, randomness); a "no" is logged
    with what differed."""
    verdict = (key, type(feed).__name__, randomness)
    if verdict not in worker.array_verdicts:
        reason = _disagreement(model, batch, feed, randomness)
        if reason:  # said once per worker and model: its cells' rows then lack trial_array
            log.warning("%s trains its members as single trials, not as an array: %s", key.model, reason)
        worker.array_verdicts[verdict] = not reason
    return worker.array_verdicts[verdict]


def _disagreement(model: nn.Module, batch: Batch, feed, randomness: str) -> str:
    """An empty string where a 2-member array gives the plain model's numbers, else what differs (or
    what raised). The numbers are compared with dropout off: a GPU's vmapped dropout draws other masks
    than the plain model's fused kernel, the same function either way (module docstring)."""
    fed = feed.prepare(batch.to(torch.device("cpu"))).to(batch.input_ids.device)
    params = dict(model.named_parameters())
    devices = [batch.input_ids.device] if batch.input_ids.is_cuda else []
    try:
        with eval_mode(model):
            reason = _differs(model, params, feed, fed)
        if reason:
            return reason
        with torch.random.fork_rng(devices=devices), _training(model):  # the trial's draws stay its own
            stacked, _ = _stacked_pass(model, params, feed, fed, randomness)  # dropout under vmap: it must run
    except Exception as exc:  # a model this cannot serve trains its members alone, never a failed trial
        if is_oom(exc):
            raise
        return f"{type(exc).__name__}: {exc}"
    if randomness == "same" and not _close(stacked[0], stacked[1:]):
        return f"two equal members differ in training by {_gap(stacked[0], stacked[1:])}"
    return ""


def _differs(model: nn.Module, params: dict, feed, fed) -> str:
    """What differs between the plain model and two stacked copies (logits, then each gradient)."""
    plain = feed.logits(model, fed)
    plain_grads = torch.autograd.grad(task_loss(plain, fed.labels), list(params.values()), allow_unused=True)
    stacked, grads = _stacked_pass(model, params, feed, fed, "same")
    pairs = [("logits", plain, stacked)] + [
        (f"{name}'s gradient", g, s) for name, g, s in zip(params, plain_grads, grads) if g is not None or s is not None
    ]
    return next((f"{name} differ by {_gap(a, b)}" for name, a, b in pairs if not _close(a, b)), "")


def _stacked_pass(model: nn.Module, params: dict, feed, fed, randomness: str) -> tuple[torch.Tensor, tuple]:
    """Two members (copies of ``params``): their logits on ``fed`` and their gradients."""
    tensors = {n: p.detach().expand(2, *p.shape).clone().requires_grad_() for n, p in params.items()}
    stack = Stack(model, tensors, "", randomness)
    stacked = stack.logits(feed, fed)
    losses = vmap(task_loss, in_dims=(0, None))(stacked, fed.labels)
    return stacked, torch.autograd.grad(losses.sum(), list(stack.tensors.values()), allow_unused=True)


def slots_mask_form(model: nn.Module, batch: Batch, pad_id: int, key: FeedKey, worker: WorkerState) -> str | None:
    """How a model takes a batched padding mask under ``vmap`` (``mask_as``), or None where neither
    form gives its logits (slots then step aside): two slots on differently padded rows, in fp32, in
    eval mode, against the plain model on each. Kept in the worker per model and class."""
    verdict = (key, "slots")
    if verdict not in worker.array_verdicts:
        worker.array_verdicts[verdict] = _mask_form(model, batch, pad_id)
        if worker.array_verdicts[verdict] is None:
            log.warning("%s takes no batched padding mask: its cells of other seeds and sizes run apart", key.model)
    return worker.array_verdicts[verdict]


def _mask_form(model: nn.Module, batch: Batch, pad_id: int) -> str | None:
    tokens = batch.input_ids.shape[1] + 1
    slots = [widened(b, tokens, pad_id) for b in (batch, _flipped(batch))]
    stack = _two_copies(model)
    with eval_mode(model), torch.no_grad():
        plain = [model(**b.model_inputs()).logits for b in slots]
        for form in ("2d", "4d"):
            inputs = {
                n: torch.stack([v for v in (b.model_inputs()[n] for b in slots)]) for n in slots[0].model_inputs()
            }
            inputs["attention_mask"] = mask_as(inputs["attention_mask"], form)
            try:
                logits = stack.own_logits(inputs)
            except Exception as exc:  # a form the model's code refuses under vmap: the next one
                if is_oom(exc):
                    raise
                continue
            if all(first_token.logits_agree(a, b) for a, b in zip(plain, logits)):
                return form
    return None


def packed_slots_agree(model: nn.Module, batch: Batch, pad_id: int, feed, key: FeedKey, worker: WorkerState) -> bool:
    """Whether slots train packed (``PackedSlots``): ``feed`` packs (the model qualified for packing and
    the narrowed last layer, trials/packing.py ``training_feed``) and two slots on ``batch``'s rows in
    two orders, packed to one width, give the plain model's logits on each (fp32, eval mode: a batched
    mask from the sequences' ids, batched first tokens for the head). Kept in the worker per model and
    class; a "no" pads the slots."""
    if not isinstance(feed, PackedFeed):
        return False
    verdict = (key, "packed slots")
    if verdict not in worker.array_verdicts:
        worker.array_verdicts[verdict] = _packed_slots_agree(model, batch, pad_id, feed.offset)
        if not worker.array_verdicts[verdict]:
            log.warning("%s takes no packed batch per slot: its slots are padded", key.model)
    return worker.array_verdicts[verdict]


def _packed_slots_agree(model: nn.Module, batch: Batch, pad_id: int, offset: int) -> bool:
    feed = PackedFeed(first_token.Reader(), offset)  # (narrowed in evaluation too: the check runs in eval mode)
    packs = [feed.prepare(b.to(torch.device("cpu"))).to(batch.input_ids.device) for b in (batch, _flipped(batch))]
    tokens = max(p.input_ids.shape[1] for p in packs) + 3  # tokens of no row's too
    packs = [padded_to(p, tokens, pad_id) for p in packs]
    slots = stacked_slots(packs, torch.ones(2, len(batch.labels), device=batch.input_ids.device))
    with eval_mode(model), torch.no_grad(), first_token.narrowed(model, feed.reader):
        plain = [feed.logits(model, p) for p in packs]
        try:
            logits = _two_copies(model).own_logits(slots.inputs(), feed.reader)
        except Exception as exc:  # a model whose vmapped forward refuses these inputs: padded slots
            if is_oom(exc):
                raise
            return False
    return all(first_token.logits_agree(a, b) for a, b in zip(plain, logits))


def _flipped(batch: Batch) -> Batch:
    """``batch``'s rows in the reverse order."""
    names = ("input_ids", "attention_mask", "labels", "token_type_ids")
    return dataclasses.replace(batch, **{n: getattr(batch, n).flip(0) for n in names if getattr(batch, n) is not None})


def _two_copies(model: nn.Module) -> Stack:
    return Stack(model, {n: p.detach().expand(2, *p.shape).clone() for n, p in model.named_parameters()}, "")


def _gap(single: torch.Tensor | None, stacked: torch.Tensor | None) -> str:
    """How far ``stacked``'s members are from ``single`` at most, for the log."""
    if single is None or stacked is None:
        return "a missing gradient"
    return f"{max(float((m.detach().float() - single.detach().float()).abs().max()) for m in stacked):.3g} at most"


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
