"""What a worker process keeps between trials, in one object with one ``clear()``.

A Ray worker runs many trials (``reuse_actors``), and keeping what they share is most of the speed:
the initial models (trials/run.py), the evaluation cache's states and exactness verdicts
(trials/eval_cache.py), the opt-in training cache (trials/train_cache.py), the packing and narrowing
verdicts (trials/packing.py), tokenized splits read from the disk cache and the rows tokenized alone
(trials/tokens.py) and loaded datasets (trials/data.py). A trial takes a ``WorkerState``; without one
it uses this process's (``process_worker``). ``clear`` empties it all: after a CUDA out-of-memory error
(states and models may sit on the GPU beside the trials packed there), and in tests that want a cold
worker.

Not here: look-ups that are pure functions of their arguments and hold no trial's data (a model's
config and tokenizer, what ``auto`` precision means on this machine): lru_caches beside them.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:
    import torch

MAX_TEMPLATES = 2  # initial models kept (a base-size model is ~0.5 GB in fp32)
MAX_EVAL_ENTRIES = 8  # evaluation cache entries (a few MB to a few hundred MB each)
# The evaluation cache's states a worker keeps, in all: the reference grid's entries are ~40 MB each
# (SST-2's 872 rows through roberta-base in fp16), but an entry grows with the validation set (QQP's
# 40,430 pairs of ~40 tokens: ~2.5 GB in bf16, ~5 GB in fp32), and eight such would end a CPU worker or
# crowd a GPU's packed trials. Past it the least recently used entries go; one that would pass it alone is not made
# (trials/eval_cache.py: its trials evaluate in full, a "no").
MAX_EVAL_MIB = 2048
MAX_TRAIN_ENTRIES = 8  # training cache entries: a grid's k values all fit
# The training cache's states (train_cache: true, and the probe's features), in all: an entry holds a
# state per train row, so it grows with the train size (SST-2's 67,349 rows of ~13 tokens through a
# base-size model: ~1.3 GB in bf16). Past it the least recently used entries go; one that passes it
# alone is used by its trial and not kept.
MAX_TRAIN_MIB = 2048
MAX_TOKEN_SPLITS = 16
MAX_TASKS = 4


class Lru(OrderedDict):
    """A mapping of at most ``maxsize`` entries (and, given ``max_bytes`` and ``size``, entries of at most
    that many bytes together); ``put`` drops the least recently used and says which."""

    def __init__(self, maxsize: int, max_bytes: int | None = None, size: Callable[[Any], int] | None = None):
        super().__init__()
        self.maxsize, self.max_bytes, self.size = maxsize, max_bytes, size

    def held_bytes(self) -> int:
        return sum(map(self.size, self.values())) if self.size else 0

    def fresh(self, key: Any) -> Any:
        """The entry (None if absent), now the most recently used."""
        if key not in self:
            return None
        self.move_to_end(key)
        return self[key]

    def put(self, key: Any, value: Any) -> list[Any]:
        """Store ``value``; returns the keys dropped to make room."""
        if self.max_bytes is not None and self.size and self.size(value) > self.max_bytes:
            self.pop(key, None)
            return [key]  # too large alone: not kept, and nothing else dropped for it
        self[key] = value
        self.move_to_end(key)
        dropped = []
        while self and (len(self) > self.maxsize or self._too_big()):
            dropped.append(self.popitem(last=False)[0])
        return dropped

    def _too_big(self) -> bool:
        return self.max_bytes is not None and self.held_bytes() > self.max_bytes


# --- what the caches are keyed by ----------------------------------------------------------------
class TemplateKey(NamedTuple):
    model: str
    model_init: str
    num_labels: int
    derived_seed: int


class EvalKey(NamedTuple):
    """The validation rows' frozen-prefix states: the same for every trial sharing all of these."""

    model: str
    split_digest: str
    rows_digest: str
    eval_batch_size: int
    max_seq_length: int
    weights: str  # "pretrained", or the random init's seed (a random init differs per seed)
    precision: str
    device: str
    attention: str = ""  # the model's attention kernels (model.attention_of): SDPA and eager round apart


class TrainKey(NamedTuple):
    model: str
    weights: str
    split_digest: str
    max_seq_length: int
    precision: str
    device: str


class PrefixKey(NamedTuple):
    """A cache entry: the states after ``layer`` frozen layers."""

    base: EvalKey | TrainKey
    layer: int


class FeedKey(NamedTuple):
    model: str
    model_class: str
    attention: str = ""  # as EvalKey's: a verdict on one attention's numbers is not the other's


@dataclass
class WorkerState:
    templates: Lru = field(default_factory=lambda: Lru(MAX_TEMPLATES))  # TemplateKey -> (model, RNG states)
    seeded_prefix: dict = field(default_factory=dict)  # pretrained model -> its checkpoint lacks a prefix weight
    eval_states: Lru = field(  # PrefixKey -> PrefixStates
        default_factory=lambda: Lru(MAX_EVAL_ENTRIES, MAX_EVAL_MIB * 2**20, states_bytes)
    )
    eval_exact: dict = field(default_factory=dict)  # PrefixKey -> the cached path is bit-identical
    train_states: Lru = field(  # PrefixKey -> rows' states
        default_factory=lambda: Lru(MAX_TRAIN_ENTRIES, MAX_TRAIN_MIB * 2**20, rows_bytes)
    )
    train_exact: dict = field(default_factory=dict)  # PrefixKey -> the cached training path gives the model's logits
    # FeedKey -> (narrowing exact, packing exact); (FeedKey, "additive_mask") -> a prebuilt mask exact
    feed_verdicts: dict = field(default_factory=dict)
    array_verdicts: dict = field(default_factory=dict)  # (FeedKey, feed) -> a trial array gives the model's numbers
    graph_failures: dict = field(default_factory=dict)  # FeedKey -> why a CUDA graph capture failed (eager since)
    token_splits: Lru = field(default_factory=lambda: Lru(MAX_TOKEN_SPLITS))  # cache file -> Tokens
    token_rows: Lru = field(default_factory=lambda: Lru(MAX_TOKEN_SPLITS))  # cache file -> TokenBook (its rows so far)
    tasks: Lru = field(default_factory=lambda: Lru(MAX_TASKS))  # how a dataset is read -> TaskData

    def clear(self) -> None:
        for part in fields(self):
            getattr(self, part.name).clear()

    def sizes(self) -> dict[str, int]:
        return {part.name: len(getattr(self, part.name)) for part in fields(self)}

    def held_mib(self, device: torch.device) -> float:
        """What this worker keeps on ``device``'s kind of memory: tensors on a GPU; on the CPU its
        tensors and arrays too (cached states, initial models, token ids, labels). A trial's own peak
        is the process's minus this (trials/run.py): the caches are the worker's, shared by its trials
        and grown over its life, not what a cell costs."""
        return sum(_bytes(getattr(self, part.name), device.type) for part in fields(self)) / 2**20


def _bytes(value: Any, device_type: str, seen: set[int] | None = None) -> int:
    """The bytes of the tensors (and, for the CPU, numpy arrays) reachable from ``value``, each counted once."""
    import torch  # deferred on purpose: trials.data imports this module, and inspection must not pay for torch

    seen = set() if seen is None else seen
    if id(value) in seen:
        return 0
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        return value.nbytes if value.device.type == device_type else 0
    if isinstance(value, np.ndarray):
        return value.nbytes if device_type == "cpu" else 0
    if isinstance(value, torch.nn.Module):
        return sum(_bytes(t, device_type, seen) for t in (*value.parameters(), *value.buffers()))
    if isinstance(value, dict):
        return sum(_bytes(v, device_type, seen) for v in value.values())
    if isinstance(value, (list, tuple)):
        kinds = set(map(type, value))  # a split's rows (one array or string each): counted without a call per row
        if kinds <= _NO_TENSORS:
            return 0
        if kinds == {np.ndarray}:
            return _arrays_bytes(value, device_type, seen)
        return sum(_bytes(v, device_type, seen) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(_bytes(getattr(value, f.name), device_type, seen) for f in fields(value))
    return 0


_NO_TENSORS = {str, bytes, int, float, bool, type(None)}


def _arrays_bytes(arrays, device_type: str, seen: set[int]) -> int:
    """The bytes of numpy arrays not yet counted (none on a GPU). A trial's row takes this walk; a call
    per row of a split cost 0.17 s a trial with SST-2 in the worker (measured on a 2-core CPU; 0.88 s
    under cProfile with SST-2 and CoLA on the H100 run, benchmarks/results/gpu_check_h100.log)."""
    if device_type != "cpu":
        return 0
    new = {id(a): a for a in arrays if id(a) not in seen}
    seen.update(new)
    return sum(a.nbytes for a in new.values())


def rows_bytes(entry: Any) -> int:
    """A training cache entry's bytes (trials/train_cache.py: a tensor per cached train row, counted as added)."""
    return entry.nbytes


def states_bytes(prefix: Any) -> int:
    """An evaluation cache entry's bytes (trials/eval_cache.py ``PrefixStates``: a tensor per batch)."""
    return sum(t.nbytes for t in prefix.states)


_PROCESS = WorkerState()  # this process's: a worker process runs one trial at a time


def process_worker() -> WorkerState:
    return _PROCESS
