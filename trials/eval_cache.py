"""Exact evaluation cache: the validation set's hidden states after the frozen prefix.

In evaluation every frozen layer runs in eval mode (no dropout) on the same inputs with the same
weights (the pretrained ones, or a random init's of the same seed: the key says which), so for a given (model, validation rows, batching, precision, device) the hidden
states entering layer k are the same in every trial that freezes k layers, at every evaluation. They
are computed once per worker process and reused: an evaluation then runs only the embeddings (cheap),
layers k+1..L and the head. The states after layer j also serve every k > j: a miss at k starts from
the deepest cached j < k and runs only layers j+1..k (and never the layers above k): met in ascending
order, a grid's prefixes cost one pass of the pretrained model over the validation set per worker.
Each entry is checked once against the full model on the first batch; an entry that differs by a
single bit (e.g. an architecture whose encoder does not simply loop over its layers), or whose
cached path raises (a model whose layer loop the injector cannot stand in for), is dropped and its
trials evaluate the full model: a "no", never a failed trial.
The states a worker keeps are bounded in bytes (trials/worker.py ``MAX_EVAL_MIB``), the least
recently used going first; an entry that would not fit alone (a large validation set) is not made:
the first batch's states price it, and its trials evaluate the full model, as for a "no".

How: the encoder's ``ModuleList`` of layers is swapped, for the duration of an evaluation, for
``[injector, layer_k+1, …, layer_L]``; the injector ignores the hidden states it is given and returns
the cached ones for the current batch, shaped as the layer's own output (a tensor, or a tuple of
that length: DeBERTa's layers return (states, attention)), and answers attribute look-ups as the
first layer would (ModernBERT's loop reads each layer's ``attention_type``). Attention masks and
everything else stay the model's own.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from freezesweep.trials.freezing import EncoderParts, find_encoder_parts
from freezesweep.trials.oom import is_oom
from freezesweep.trials.precision import PrecisionPlan
from freezesweep.trials.tokens import Batch
from freezesweep.trials.worker import EvalKey, PrefixKey, WorkerState


@dataclass(frozen=True)
class PrefixStates:
    layer: int  # the states enter layer ``layer`` (0-based): the first layer that trains
    states: tuple[torch.Tensor, ...]  # one per evaluation batch, on the evaluation device
    tuple_output: int  # the length of the tuple the model's layers return (0: a tensor; True: 1)


class _Injector(nn.Module):
    """Stands in for the frozen layers: returns the cached states of the current batch."""

    def __init__(self, tuple_output: int, stands_for: nn.Module | None = None):
        super().__init__()
        self.tuple_output, self.states = int(tuple_output), None
        self.__dict__["_stands_for"] = stands_for  # not a submodule: its parameters stay the layer's alone

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            stands_for = self.__dict__.get("_stands_for")
            if stands_for is None:
                raise
            return getattr(stands_for, name)  # what the encoder's loop reads of a layer (ModernBERT: attention_type)

    def forward(self, *args, **kwargs):
        if not self.tuple_output:
            return self.states
        return (self.states,) + (None,) * (self.tuple_output - 1)  # no attention weights were asked for


def exact_prefix(
    model: nn.Module,
    batches: list[Batch],
    plan: PrecisionPlan,
    device: torch.device,
    layer: int,
    key: EvalKey,
    worker: WorkerState,
    room: int | None = None,
) -> PrefixStates | None:
    """The cached states for ``key`` if the cached path is bit-identical to the full model, else
    None. Checked once per entry: every trial sharing it feeds the same states through the same code
    path, and identical states give identical logits whatever the trained layers' weights. None too
    where the entry would take more than ``room`` bytes (default: the worker's whole budget)."""
    entry = PrefixKey(key, layer)
    if worker.eval_exact.get(entry) is False:
        return None  # failed once: never computed (nor kept, nor chained from) again
    room = worker.eval_states.max_bytes if room is None else room
    try:
        prefix = prefix_states(model, batches, plan, device, layer, key, worker, room)
        if entry not in worker.eval_exact:
            worker.eval_exact[entry] = matches_full_model(model, batches[0], prefix, plan, device)
    except TooLarge:
        return None  # not a verdict on the model: with more room (another trial's) it may be made
    except Exception as exc:  # the cached path cannot run this model: a "no", the trial evaluates in full
        if is_oom(exc):
            raise  # out of memory is the trial's to handle (trials/oom.py), not a verdict on the model
        worker.eval_exact[entry] = False
    if not worker.eval_exact[entry]:
        worker.eval_states.pop(entry, None)  # never a starting point for deeper prefixes
        return None
    return prefix


def prefix_states(
    model: nn.Module,
    batches: list[Batch],
    plan: PrecisionPlan,
    device: torch.device,
    layer: int,
    key: EvalKey,
    worker: WorkerState,
    room: int | None = None,
) -> PrefixStates:
    """The cached states for ``key`` after ``layer`` layers (computed with ``model``'s frozen
    prefix on a miss, from the deepest cached shallower entry when there is one). A miss whose states
    would take more than ``room`` bytes raises ``TooLarge`` after the first batch (None: no bound)."""
    cached = worker.eval_states.fresh(PrefixKey(key, layer))
    if cached is not None:
        return cached
    below = [j for j in range(layer - 1, 0, -1) if PrefixKey(key, j) in worker.eval_states]
    start = worker.eval_states[PrefixKey(key, below[0])] if below else None
    try:
        states = _compute(model, batches, plan, device, layer, start, room)
    except Exception as exc:
        if start is None or is_oom(exc) or isinstance(exc, TooLarge):
            raise
        states = _compute(
            model, batches, plan, device, layer, room=room
        )  # the injected start fails: from the embeddings
    for dropped in worker.eval_states.put(PrefixKey(key, layer), states):
        worker.eval_exact.pop(dropped, None)
    return states


@torch.inference_mode()
def _compute(
    model: nn.Module,
    batches: list[Batch],
    plan: PrecisionPlan,
    device: torch.device,
    layer: int,
    start: PrefixStates | None = None,
    room: int | None = None,
) -> PrefixStates:
    """The output of layer ``layer`` (1-based count of frozen layers) for every batch, from the
    embeddings or, with ``start``, from the cached states entering layer ``start.layer``; ``TooLarge``
    once the first batch's states show that all of them would take more than ``room`` bytes."""
    parts = find_encoder_parts(model)
    captured, tuple_output = [], 0
    with (
        eval_mode(model),
        starting_at(model, start.layer, start.tuple_output, parts) if start else contextlib.nullcontext() as injector,
    ):
        for i, batch in enumerate(batches):
            if injector is not None:
                injector.states = start.states[i]
            states, tuple_output = output_of(model, parts.layers[layer - 1], batch.to(device), plan)
            if i == 0 and room is not None and projected_bytes(states, batches) > room:
                raise TooLarge(f"{projected_bytes(states, batches)} bytes of states, room for {room}")
            captured.append(states)
    return PrefixStates(layer=layer, states=tuple(captured), tuple_output=tuple_output)


class TooLarge(Exception):
    """An entry that would take more bytes than its room: not made, its trials evaluate in full."""


def projected_bytes(first: torch.Tensor, batches: list[Batch]) -> int:
    """All batches' states, priced by the first batch's (``first``: [rows, tokens, hidden]): a state
    per token position the batches pad to."""
    per_position = first.nbytes // max(1, first.shape[0] * first.shape[1])
    return per_position * sum(batch.input_ids.numel() for batch in batches)


class _Stop(Exception):
    """Raised by the capture hook: nothing above the captured layer needs to run."""


def output_of(model: nn.Module, module: nn.Module, batch: Batch, plan: PrecisionPlan) -> tuple[torch.Tensor, int]:
    """``module``'s output for ``batch`` (and the length of the tuple it returns, 0 for a tensor);
    the forward pass stops there. The caller sets inference and eval mode."""
    captured = []

    def keep(module, args, output):
        captured.append((output[0] if isinstance(output, tuple) else output).detach().clone())
        captured.append(len(output) if isinstance(output, tuple) else 0)
        raise _Stop

    handle = module.register_forward_hook(keep)
    try:
        with plan.autocast(), contextlib.suppress(_Stop):
            model(**batch.model_inputs())
    finally:
        handle.remove()
    return captured[0], captured[1]


@contextlib.contextmanager
def eval_mode(model: nn.Module):
    """The model in eval mode within the block, its own mode restored after."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def injected_layers(parts: EncoderParts, layer: int, tuple_output: int) -> tuple[_Injector, nn.ModuleList]:
    """``[injector, layer_k+1, …, layer_L]``: the list that stands in for the encoder's layers."""
    injector = _Injector(tuple_output, stands_for=parts.layers[0])
    return injector, nn.ModuleList([injector, *parts.layers[layer:]])


@contextlib.contextmanager
def layers_swapped(model: nn.Module, parts: EncoderParts, layers: nn.ModuleList):
    """Within the block, the encoder runs ``layers`` instead of its own."""
    base = getattr(model, "base_model", model)
    container_name, _, attribute = parts.layers_name.rpartition(".")
    container = base.get_submodule(container_name) if container_name else base
    setattr(container, attribute, layers)
    try:
        yield
    finally:
        setattr(container, attribute, parts.layers)


@contextlib.contextmanager
def starting_at(model: nn.Module, layer: int, tuple_output: int, parts: EncoderParts | None = None):
    """Within the block, the model's encoder starts at layer ``layer`` (0-based), fed by the
    injector the block receives: set its ``states`` before each forward pass."""
    parts = parts or find_encoder_parts(model)
    injector, layers = injected_layers(parts, layer, tuple_output)
    with layers_swapped(model, parts, layers):
        yield injector


@torch.inference_mode()
def matches_full_model(
    model: nn.Module, batch: Batch, prefix: PrefixStates, plan: PrecisionPlan, device: torch.device
) -> bool:
    """True when the cached path gives bit-identical logits to the full model on ``batch`` (the
    first evaluation batch, whose states are ``prefix.states[0]``)."""
    batch = batch.to(device)
    with eval_mode(model), plan.autocast():
        full = model(**batch.model_inputs()).logits
        with starting_at(model, prefix.layer, prefix.tuple_output) as injector:
            injector.states = prefix.states[0]
            cached = model(**batch.model_inputs()).logits
    return torch.equal(full, cached)
