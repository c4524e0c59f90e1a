"""Exact evaluation cache: the validation set's hidden states after the frozen prefix.

In evaluation every frozen layer runs in eval mode (no dropout) on the same inputs with the same,
pretrained weights, so for a given (model, validation rows, batching, precision, device) the hidden
states entering layer k are the same in every trial that freezes k layers, at every evaluation. They
are computed once per worker process and reused: an evaluation then runs only the embeddings (cheap),
layers k+1..L and the head. A trial checks the cached path against the full model on its first batch
and falls back to the full model if they differ by a single bit (e.g. an architecture whose encoder
does not simply loop over its layers).

How: the encoder's ``ModuleList`` of layers is swapped, for the duration of an evaluation, for
``[injector, layer_k+1, …, layer_L]``; the injector ignores the hidden states it is given and returns
the cached ones for the current batch. Attention masks and everything else stay the model's own.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn

from trials.freezing import find_encoder_parts
from trials.precision import PrecisionPlan
from trials.tokens import Batch

_MAX_ENTRIES = 8  # (dataset, k, ...) entries kept per worker process: a few MB to a few hundred MB each
_STATES: OrderedDict[tuple, "PrefixStates"] = OrderedDict()


@dataclass(frozen=True)
class PrefixStates:
    layer: int  # the states enter layer ``layer`` (0-based): the first layer that trains
    states: tuple[torch.Tensor, ...]  # one per evaluation batch, on the evaluation device
    tuple_output: bool  # the model's layers return tuples (transformers 4) or tensors (5)


class _Injector(nn.Module):
    """Stands in for the frozen layers: returns the cached states of the current batch."""

    def __init__(self, tuple_output: bool):
        super().__init__()
        self.tuple_output, self.states = tuple_output, None

    def forward(self, *args, **kwargs):
        return (self.states,) if self.tuple_output else self.states


def prefix_states(model: nn.Module, batches: list[Batch], plan: PrecisionPlan, device: torch.device,
                  layer: int, key: tuple) -> PrefixStates:
    """The cached states for ``key`` (computed with ``model``'s pretrained prefix on a miss)."""
    key = (*key, layer, plan.name, str(device))
    if key in _STATES:
        _STATES.move_to_end(key)
        return _STATES[key]
    _STATES[key] = _compute(model, batches, plan, device, layer)
    while len(_STATES) > _MAX_ENTRIES:
        _STATES.popitem(last=False)
    return _STATES[key]


@torch.inference_mode()
def _compute(model: nn.Module, batches: list[Batch], plan: PrecisionPlan, device: torch.device,
             layer: int) -> PrefixStates:
    layers = find_encoder_parts(model).layers
    captured: list[torch.Tensor] = []
    tuple_output = []

    def keep_output(module, args, output):  # the last frozen layer's output is what enters `layer`
        tuple_output.append(isinstance(output, tuple))
        captured.append((output[0] if isinstance(output, tuple) else output).detach().clone())

    handle = layers[layer - 1].register_forward_hook(keep_output)
    was_training = model.training
    model.eval()
    try:
        for batch in batches:
            batch = batch.to(device)
            with plan.autocast():
                model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    finally:
        handle.remove()
        model.train(was_training)
    return PrefixStates(layer=layer, states=tuple(captured), tuple_output=bool(tuple_output and tuple_output[0]))


@contextlib.contextmanager
def starting_at(model: nn.Module, prefix: PrefixStates):
    """Within the block, the model's encoder starts at ``prefix.layer`` fed by the injector."""
    parts = find_encoder_parts(model)
    base = getattr(model, "base_model", model)
    container_name, _, attribute = parts.layers_name.rpartition(".")
    container = base.get_submodule(container_name) if container_name else base
    injector = _Injector(prefix.tuple_output)
    setattr(container, attribute, nn.ModuleList([injector, *parts.layers[prefix.layer:]]))
    try:
        yield injector
    finally:
        setattr(container, attribute, parts.layers)


@torch.inference_mode()
def matches_full_model(model: nn.Module, batch: Batch, prefix: PrefixStates, plan: PrecisionPlan,
                       device: torch.device) -> bool:
    """True when the cached path gives bit-identical logits to the full model on ``batch`` (the
    first evaluation batch, whose states are ``prefix.states[0]``)."""
    was_training = model.training
    model.eval()
    batch = batch.to(device)
    try:
        with plan.autocast():
            full = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
            with starting_at(model, prefix) as injector:
                injector.states = prefix.states[0]
                cached = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    finally:
        model.train(was_training)
    return torch.equal(full, cached)
