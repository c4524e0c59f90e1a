"""Opt-in training cache (``train_cache: true``): the frozen prefix runs once per train row, without
dropout, and every training step starts at the first trained layer.

A documented deviation from the reference, off by default. In the reference, frozen layers still
apply dropout while training: the HF Trainer puts the whole model in train mode, and
``requires_grad=False`` does not turn dropout off, so their output differs at every step and cannot
be cached exactly. With this cache the frozen embeddings and layers run in eval mode, once: the
trained layers see the frozen layers' deterministic output instead of a dropped-out one. Its
accuracy effect is measured by ``benchmarks/grid_speed.py --train-cache``; rows say
``train_cached_layers``, and the flag is part of a cell's identity.

Each row's states are computed on that row alone (no padding), so they depend neither on which
rows shared a batch nor on which trials ran before in this worker: a cell's result is the same
wherever it runs. Rows are cached by their index in the train split, so the nested subsets of a
sweep (50 ⊂ 100 ⊂ …) share them.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from trials.eval_cache import starting_at
from trials.freezing import EncoderParts, find_encoder_parts
from trials.precision import PrecisionPlan
from trials.tokens import Batch, Tokens, collate

# (model, split, k, precision, device) entries per worker process: a grid's k values all fit, so the
# nested train sizes of each k share rows (an entry holds at most the largest subset's rows).
_MAX_ENTRIES = 8


@dataclass
class _Entry:
    rows: dict[int, torch.Tensor] = field(default_factory=dict)  # train-split row index → [tokens, hidden]
    tuple_output: bool = False  # the model's layers return tuples (transformers 4) or tensors (5)


_ROWS: OrderedDict[tuple, _Entry] = OrderedDict()


@dataclass(frozen=True)
class TrainPrefix:
    layer: int  # the states enter layer ``layer`` (0-based): the first layer that trains
    states: tuple[torch.Tensor, ...]  # per position in the train subset: [tokens, hidden], on the device
    tuple_output: bool
    parts: EncoderParts

    def batch_states(self, positions: np.ndarray, width: int) -> torch.Tensor:
        """The states of a batch's rows, zero-padded to the batch's width (padding is masked)."""
        rows = [self.states[p] for p in positions]
        out = rows[0].new_zeros((len(rows), width, rows[0].shape[-1]))
        for i, row in enumerate(rows):
            out[i, : len(row)] = row
        return out


def train_prefix(model: nn.Module, train_ids: Tokens, train_rows: np.ndarray, plan: PrecisionPlan,
                 device: torch.device, layer: int, key: tuple) -> TrainPrefix:
    """The frozen prefix's output for each row of the subset (``train_rows``: their indices in the
    split, ``train_ids``: their tokens, in the same order); computed for rows not yet cached."""
    key = (*key, layer, plan.name, str(device))
    entry = _ROWS.setdefault(key, _Entry())
    _ROWS.move_to_end(key)
    parts = find_encoder_parts(model)
    todo = [(int(r), position) for position, r in enumerate(train_rows) if int(r) not in entry.rows]
    if todo:
        _run_prefix(model, parts, train_ids, todo, entry, plan, device, layer)
    while len(_ROWS) > _MAX_ENTRIES:
        _ROWS.popitem(last=False)
    return TrainPrefix(layer=layer, states=tuple(entry.rows[int(r)] for r in train_rows),
                       tuple_output=entry.tuple_output, parts=parts)


class _Stop(Exception):
    """Raised by the capture hook: nothing above the last frozen layer needs to run."""


@torch.inference_mode()
def _run_prefix(model, parts: EncoderParts, tokens: Tokens, todo: list, entry: _Entry, plan: PrecisionPlan,
                device: torch.device, layer: int) -> None:
    captured: list[torch.Tensor] = []

    def keep(module, args, output):
        entry.tuple_output = isinstance(output, tuple)
        captured.append((output[0] if isinstance(output, tuple) else output)[0].detach().clone())
        raise _Stop

    handle = parts.layers[layer - 1].register_forward_hook(keep)
    was_training = model.training
    model.eval()  # no dropout: the deviation this cache is
    try:
        for row, position in todo:
            alone = collate(tokens.select([position]), np.zeros(1, dtype=np.int64), pad_id=0).to(device)  # no padding
            with plan.autocast(), contextlib.suppress(_Stop):
                model(**alone.model_inputs())  # segment ids too, for sentence pairs
            entry.rows[row] = captured.pop()
    finally:
        handle.remove()
        model.train(was_training)


def clear() -> None:
    _ROWS.clear()


def entries() -> list[int]:
    """The number of cached rows of each entry (most recently used last)."""
    return [len(entry.rows) for entry in _ROWS.values()]


def training_from(prefix: TrainPrefix | None, model: nn.Module):
    """A context in which training steps start at ``prefix.layer`` (a no-op without a prefix)."""
    if prefix is None:
        return contextlib.nullcontext()
    return starting_at(model, prefix.layer, prefix.tuple_output, prefix.parts)


def feed(injector, prefix: TrainPrefix | None, batch: Batch) -> None:
    if prefix is not None:
        injector.states = prefix.batch_states(batch.positions, batch.input_ids.shape[1]).to(batch.input_ids.device)
