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

Whether a model takes the cached path is checked, not assumed (``usable_prefix``): once per entry,
the first train row's logits fed from the cache must agree with the full model's (eval mode, the
same precision); a disagreement, or an exception in the cache or its check, is a "no": the trial
trains in full and its row's ``train_cached_layers`` is empty.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from torch.nn.utils.rnn import pad_sequence

from freezesweep.trials.eval_cache import eval_mode, injected_layers, layers_swapped, output_of
from freezesweep.trials.first_token import logits_agree
from freezesweep.trials.freezing import EncoderParts, find_encoder_parts
from freezesweep.trials.oom import is_oom
from freezesweep.trials.precision import PrecisionPlan
from freezesweep.trials.tokens import Batch, Tokens, collate
from freezesweep.trials.worker import PrefixKey, TrainKey, WorkerState


@dataclass
class _Entry:
    rows: dict[int, torch.Tensor] = field(default_factory=dict)  # train-split row index → [tokens, hidden]
    tuple_output: int = 0  # the length of the tuple the model's layers return (0: a tensor)
    nbytes: int = 0  # the rows' bytes, kept as they are added: the worker's budget reads it at every put


@dataclass(frozen=True)
class TrainPrefix:
    layer: int  # the states enter layer ``layer`` (0-based): the first layer that trains
    states: tuple[torch.Tensor, ...]  # per position in the train subset: [tokens, hidden], on the device
    parts: EncoderParts
    injector: nn.Module  # built once per trial with the list it heads: a step only swaps them in
    layers: nn.ModuleList

    @contextlib.contextmanager
    def feeding(self, model: nn.Module, batch: Batch):
        """Within the block, ``model`` starts above the frozen layers, fed this batch's cached states
        (zero-padded to the batch's width, which is its longest row's: padding is masked)."""
        self.injector.states = pad_sequence([self.states[p] for p in batch.positions], batch_first=True)
        with layers_swapped(model, self.parts, self.layers):
            yield


def train_prefix(
    model: nn.Module,
    train_ids: Tokens,
    train_rows: np.ndarray,
    plan: PrecisionPlan,
    device: torch.device,
    layer: int,
    key: TrainKey,
    worker: WorkerState,
) -> TrainPrefix:
    """The frozen prefix's output for each row of the subset (``train_rows``: their indices in the
    split, ``train_ids``: their tokens, in the same order); computed for rows not yet cached. An
    entry per (model, split, k, precision, device): the nested train sizes of each k share rows; the
    worker keeps its entries within ``worker.MAX_TRAIN_MIB``."""
    held = PrefixKey(key, layer)
    entry = worker.train_states.fresh(held) or _Entry()
    parts = find_encoder_parts(model)
    todo = [(int(r), position) for position, r in enumerate(train_rows) if int(r) not in entry.rows]
    if todo:
        _run_prefix(model, parts.layers[layer - 1], train_ids, todo, entry, plan, device)
    if todo or held not in worker.train_states:
        worker.train_states.put(held, entry)  # priced as it is now (worker.MAX_TRAIN_MIB)
    injector, layers = injected_layers(parts, layer, entry.tuple_output)
    return TrainPrefix(
        layer=layer, states=tuple(entry.rows[int(r)] for r in train_rows), parts=parts, injector=injector, layers=layers
    )


@torch.inference_mode()
def _run_prefix(
    model, last_frozen: nn.Module, tokens: Tokens, todo: list, entry: _Entry, plan: PrecisionPlan, device: torch.device
) -> None:
    with eval_mode(model):  # no dropout: the deviation this cache is
        for row, position in todo:
            alone = collate(tokens.select([position]), np.zeros(1, dtype=np.int64), pad_id=0).to(device)  # no padding
            states, entry.tuple_output = output_of(model, last_frozen, alone, plan)  # segment ids too, for pairs
            entry.rows[row] = states[0]
            entry.nbytes += states[0].nbytes


def usable_prefix(
    model: nn.Module,
    train_ids: Tokens,
    train_rows: np.ndarray,
    plan: PrecisionPlan,
    device: torch.device,
    layer: int,
    key: TrainKey,
    worker: WorkerState,
) -> TrainPrefix | None:
    """``train_prefix`` where the cached path gives this model's own logits (checked once per entry,
    the verdict kept in the worker), else None: the trial trains in full."""
    entry = PrefixKey(key, layer)
    if worker.train_exact.get(entry) is False:
        return None
    try:
        prefix = train_prefix(model, train_ids, train_rows, plan, device, layer, key, worker)
        if entry not in worker.train_exact:
            worker.train_exact[entry] = _feeds_exactly(model, prefix, train_ids, plan, device)
    except Exception as exc:  # the cached path cannot run this model: a "no", never a failed trial
        if is_oom(exc):
            raise  # the trial's to handle (trials/oom.py)
        worker.train_exact[entry] = False
    if not worker.train_exact[entry]:
        worker.train_states.pop(entry, None)
        return None
    return prefix


@torch.inference_mode()
def _feeds_exactly(
    model: nn.Module, prefix: TrainPrefix, train_ids: Tokens, plan: PrecisionPlan, device: torch.device
) -> bool:
    """The first train row alone, in eval mode: the model fed from the cache and the full model agree."""
    row = dataclasses.replace(
        collate(train_ids.select([0]), np.zeros(1, dtype=np.int64), pad_id=0), positions=np.zeros(1, dtype=np.int64)
    ).to(device)
    with eval_mode(model), plan.autocast():
        full = model(**row.model_inputs()).logits
        with prefix.feeding(model, row):
            cached = model(**row.model_inputs()).logits
    return logits_agree(full, cached)


def entries(worker: WorkerState) -> list[int]:
    """The number of cached rows of each entry (most recently used last)."""
    return [len(entry.rows) for entry in worker.train_states.values()]
