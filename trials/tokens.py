"""Tokenization of the rows a trial reads, and the batches built from it.

A trial reads a small share of a large training split (SST-2: at most 1,000 of 67,349 rows in the
reference grid; MNLI: of 392,702), so a worker tokenizes only the rows its trials ask for, each once
(``tokenize_rows``: a ``TokenBook`` per split). A larger share goes through the whole split, tokenized
once per machine and cached on disk (``tokenize_split``).

Sentence pairs are encoded by the tokenizer itself (its pair template and segment ids), truncated
longest-first; every forward pass takes its inputs from ``Batch.model_inputs``.

The key fingerprints the tokenizer by what it *does* (its ids for a probe sentence, its class
and size) and the split by its content, so a changed vocab or changed rows never hit a stale entry.
Files are written to a temporary name and renamed, so concurrent trials never read a partial one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from freezesweep.trials.data import Split
from freezesweep.trials.worker import Lru, WorkerState, process_worker

# Under this share of a split, a trial's rows are tokenized alone; from it on, the whole split (cached on
# disk for the machine's later processes). Measured on a 2-core EPYC (benchmarks/trial_speed.py, part 4),
# SST-2's 67,349 training rows: tokenized 2.2 s, read from the disk cache 30 ms (what tokenizing about a
# seventieth of them costs), a 1,000-row subset tokenized alone 20 ms. At a twentieth, a first process
# saves 95 % of the whole split's tokenization and a later one pays at most ~3.5x the read.
WHOLE_SPLIT_SHARE = 1 / 20

_PROBE = "The quick brown fox can't jump over 12 lazy dogs, can it? Ünïcödé!"


def tokenizer_fingerprint(tokenizer) -> str:
    probe = tokenizer(_PROBE)["input_ids"]
    # model_input_names decides whether segment ids are stored
    blob = f"{type(tokenizer).__name__}|{len(tokenizer)}|{probe}|{tuple(tokenizer.model_input_names)}"
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def tokenize_rows(
    tokenizer, split: Split, rows: np.ndarray, max_length: int, cache_dir: Path, worker: WorkerState | None = None
) -> Tokens:
    """Token ids of ``split``'s rows ``rows`` (no padding), in that order: the ids its whole split
    would give them (each row is encoded on its own). Under ``WHOLE_SPLIT_SHARE`` of the split, only
    the rows this worker has not tokenized before; else the whole split (``tokenize_split``)."""
    worker = worker or process_worker()
    rows = np.asarray(rows, dtype=np.int64)
    path = cache_path(tokenizer, split, max_length, cache_dir)
    if path in worker.token_splits or len(rows) >= WHOLE_SPLIT_SHARE * len(split):
        return _tokenize_cached(tokenizer, split, max_length, path, worker.token_splits).select(rows)
    book = worker.token_rows.fresh(path)
    if book is None:
        book = TokenBook.empty(len(split))
        worker.token_rows.put(path, book)
    return book.add(tokenizer, split, rows, max_length).select(rows)


def tokenize_split(
    tokenizer, split: Split, max_length: int, cache_dir: Path, worker: WorkerState | None = None
) -> Tokens:
    """Token ids of every row of ``split`` (no padding), from the disk cache when present (and from
    the worker's memory when this worker read them before)."""
    path = cache_path(tokenizer, split, max_length, cache_dir)
    return _tokenize_cached(tokenizer, split, max_length, path, (worker or process_worker()).token_splits)


def cache_path(tokenizer, split: Split, max_length: int, cache_dir: Path) -> Path:
    """Where the whole split's ids are cached; also the key of this worker's book of its rows."""
    return cache_dir / "tokens" / f"{tokenizer_fingerprint(tokenizer)}-{split.digest}-{max_length}.parquet"


@dataclass(frozen=True)
class Tokens:
    """Each row's token ids (no padding) and, for sentence pairs, its token type (segment) ids where
    the tokenizer gives them (BERT-like models; RoBERTa's tokenizer gives none, and its model gets none)."""

    input_ids: tuple[np.ndarray, ...]
    token_type_ids: tuple[np.ndarray, ...] | None = None

    def __len__(self) -> int:
        return len(self.input_ids)

    def select(self, rows) -> "Tokens":
        """These rows, in this order."""
        types = self.token_type_ids
        return Tokens(
            tuple(self.input_ids[i] for i in rows), tuple(types[i] for i in rows) if types is not None else None
        )


@dataclass
class TokenBook:
    """The rows of one split this worker has tokenized, each once: ``slots[row]`` is the row's place in
    ``input_ids`` (-1: not yet). One array of positions, so the worker's memory walk (worker.py
    ``held_mib``) pays no call per row."""

    slots: np.ndarray
    input_ids: list[np.ndarray]
    token_type_ids: list[np.ndarray] | None = None

    @classmethod
    def empty(cls, split_rows: int) -> "TokenBook":
        return cls(np.full(split_rows, -1, dtype=np.int64), [])

    def add(self, tokenizer, split: Split, rows: np.ndarray, max_length: int) -> "TokenBook":
        """The book with ``rows`` in it: the ones it lacks encoded in one call."""
        missing = np.unique(rows[self.slots[rows] < 0])
        if len(missing):
            part = Split(
                split.name, tuple(split.texts[i] for i in missing), split.labels[missing], _pairs(split, missing)
            )
            columns = encode(tokenizer, part, max_length)
            self.slots[missing] = np.arange(len(self.input_ids), len(self.input_ids) + len(missing))
            self.input_ids += [np.asarray(ids, dtype=np.int32) for ids in columns["input_ids"]]
            if "token_type_ids" in columns:
                self.token_type_ids = (self.token_type_ids or []) + [
                    np.asarray(ids, dtype=np.int32) for ids in columns["token_type_ids"]
                ]
        return self

    def select(self, rows: np.ndarray) -> Tokens:
        places = self.slots[rows]
        types = self.token_type_ids
        return Tokens(
            tuple(self.input_ids[i] for i in places), tuple(types[i] for i in places) if types is not None else None
        )


def _pairs(split: Split, rows: np.ndarray) -> tuple[str, ...] | None:
    return None if split.pairs is None else tuple(split.pairs[i] for i in rows)


def encode(tokenizer, split: Split, max_length: int) -> dict[str, list]:
    """The tokenizer's own encoding: a pair as the model expects it (its special tokens and segment
    ids), truncated longest-first so both segments keep tokens. A single sentence keeps no segment
    ids: they would all be 0, which is what the model assumes without them. Masks are not asked for
    (batches build their own): a fifth less time on SST-2's 67,349 rows."""
    if split.pairs is None:
        ids = tokenizer(
            list(split.texts),
            truncation=True,
            max_length=max_length,
            return_attention_mask=False,
            return_token_type_ids=False,
        )["input_ids"]
        return {"input_ids": ids}
    encoded = tokenizer(
        list(split.texts),
        list(split.pairs),
        truncation="longest_first",
        max_length=max_length,
        return_attention_mask=False,
    )
    return {name: encoded[name] for name in ("input_ids", "token_type_ids") if name in encoded}


def _read_cache(path: Path) -> Tokens:
    table = pq.read_table(path)

    def rows(name: str) -> tuple[np.ndarray, ...]:
        column = table.column(name).combine_chunks()
        offsets, values = column.offsets.to_numpy(), column.values.to_numpy()
        return tuple(values[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1))

    return Tokens(rows("input_ids"), rows("token_type_ids") if "token_type_ids" in table.column_names else None)


def _tokenize_cached(tokenizer, split: Split, max_length: int, path: Path, read: Lru) -> Tokens:
    if path in read:
        return read.fresh(path)
    if not path.exists():
        columns = encode(tokenizer, split, max_length)
        table = pa.table({name: pa.array(values, type=pa.list_(pa.int32())) for name, values in columns.items()})
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, path)  # atomic: readers see the whole file or none
    tokens = _read_cache(path)
    read.put(path, tokens)
    return tokens


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor  # class ids (long) or scores (float32, regression)
    positions: np.ndarray | None = None  # training batches: the rows' positions in the train subset
    token_type_ids: torch.Tensor | None = None  # sentence pairs on models with segment ids

    def to(self, device: torch.device) -> "Batch":
        """The batch on ``device``. Asynchronous only towards a GPU: a copy to the host that is read at
        once must be synchronous (PyTorch's pinned-memory tutorial: ``cuda_tensor.to("cpu",
        non_blocking=True)`` read before a sync can hold garbage)."""
        asynchronous = non_blocking_to(device)

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=asynchronous)

        return dataclasses.replace(
            self,
            input_ids=move(self.input_ids),
            attention_mask=move(self.attention_mask),
            labels=move(self.labels),
            token_type_ids=move(self.token_type_ids),
        )

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """What every forward pass gets (training, evaluation and both caches): segment ids only
        where the tokenizer gave them."""
        inputs = {"input_ids": self.input_ids, "attention_mask": self.attention_mask}
        if self.token_type_ids is not None:
            inputs["token_type_ids"] = self.token_type_ids
        return inputs


def padding_id(tokenizer) -> int:
    """The id batches are padded with (always on the right; the attention mask hides it): the
    tokenizer's pad token; where it has none (most decoder LLM tokenizers: Llama, Mistral, GPT-2) its
    end-of-sequence token, as Hugging Face's own examples choose; else 0. A decoder classifier's head
    reads each row's last token that is not this id (trials/model.py ``set_padding``)."""
    for token_id in (tokenizer.pad_token_id, getattr(tokenizer, "eos_token_id", None)):
        if isinstance(token_id, int):
            return token_id
    return 0


def non_blocking_to(device: torch.device | str) -> bool:
    """Whether a copy to ``device`` may be asynchronous: towards a GPU only (the stream orders it
    before any kernel that reads it); never towards the host, which reads it at once."""
    return torch.device(device).type != "cpu"


def _padded(rows: tuple[np.ndarray, ...], width: int, value: int) -> torch.Tensor:
    out = np.full((len(rows), width), value, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return torch.from_numpy(out)


def collate(tokens: Tokens, labels: np.ndarray, pad_id: int) -> Batch:
    """Dynamic padding: to the longest row of this batch, not to max_seq_length."""
    labels = np.asarray(labels)
    width = max(len(x) for x in tokens.input_ids)
    lengths = np.array([len(x) for x in tokens.input_ids])
    mask = torch.from_numpy((np.arange(width) < lengths[:, None]).astype(np.int64))
    types = _padded(tokens.token_type_ids, width, 0) if tokens.token_type_ids is not None else None  # padding is masked
    label_dtype = torch.float32 if labels.dtype.kind == "f" else torch.long
    return Batch(
        _padded(tokens.input_ids, width, pad_id), mask, torch.as_tensor(labels, dtype=label_dtype), token_type_ids=types
    )


def eval_batches(tokens: Tokens, labels: np.ndarray, batch_size: int, pad_id: int) -> list[Batch]:
    """Evaluation batches sorted by length, so each pads to near its own rows' length; built once
    per trial and reused by every evaluation."""
    return [collate(tokens.select(chunk), labels[chunk], pad_id) for chunk in eval_chunks(tokens, batch_size)]


def eval_chunks(tokens: Tokens, batch_size: int) -> list[np.ndarray]:
    """The rows of each evaluation batch, by length: the shortest first."""
    order = np.argsort([len(x) for x in tokens.input_ids], kind="stable")
    return np.array_split(order, max(1, -(-len(order) // batch_size)))


def padded_tokens(tokens: Tokens, batch_size: int) -> int:
    """The token positions ``eval_batches`` pads these rows to (each batch at its longest row): what
    an evaluation cache entry holds a hidden state for (trials/eval_cache.py)."""
    return sum(len(tokens.input_ids[chunk[-1]]) * len(chunk) for chunk in eval_chunks(tokens, batch_size) if len(chunk))


def train_batches(
    tokens: Tokens, labels: np.ndarray, batch_size: int, pad_id: int, generator: torch.Generator
) -> list[Batch]:
    """One epoch of shuffled batches built on the host; the generator (seeded from the cell) fixes the
    order. The training loop builds the same batches on the device instead (``DeviceRows``)."""
    order = torch.randperm(len(tokens), generator=generator).numpy()
    return [
        dataclasses.replace(collate(tokens.select(chunk), labels[chunk], pad_id), positions=chunk)
        for chunk in (order[s : s + batch_size] for s in range(0, len(order), batch_size))
    ]


# --- the train subset on the device ------------------------------------------------------------------
def to_device(values: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host array on ``device``: through pinned memory towards a GPU, so the copy is a DMA the host
    does not wait for (a pageable buffer is staged by the host first; PyTorch's pinned-memory
    tutorial); as it is on the CPU."""
    tensor = torch.as_tensor(values)
    if not non_blocking_to(device):
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


@dataclass(frozen=True)
class DeviceRows:
    """A train subset on the device, moved there once per trial: every row's tokens end to end, where
    each row starts, its length and its label. Training batches are gathered from it on the device
    (``collate_rows``; packed: trials/packing.py ``pack_rows``), so a step copies nothing from the
    host. Shapes (a batch's width, its token count) come from ``host_lengths``, never from reading
    the device."""

    tokens: torch.Tensor  # [tokens of every row], int64
    token_types: torch.Tensor | None  # the same positions' segment ids, where the tokenizer gives them
    starts: torch.Tensor  # [rows]: where each row's first token is in ``tokens``
    lengths: torch.Tensor  # [rows]
    labels: torch.Tensor  # [rows]: class ids (long) or scores (float32)
    host_lengths: np.ndarray  # [rows], on the host
    columns: torch.Tensor  # arange(longest row): a batch's column indices are a slice of it

    def __len__(self) -> int:
        return len(self.host_lengths)


def device_rows(tokens: Tokens, labels: np.ndarray, device: torch.device, width: int = 0) -> DeviceRows:
    """``tokens`` (a train subset's rows, in subset order) and their ``labels`` on ``device``;
    ``width``: the widest batch to be gathered, when wider than the longest row (a trial array's slots
    share one shape, trials/array.py)."""
    lengths = np.array([len(x) for x in tokens.input_ids], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    labels = np.asarray(labels)

    def joined(rows: tuple[np.ndarray, ...] | None) -> torch.Tensor | None:
        return None if rows is None else to_device(np.concatenate(rows).astype(np.int64), device)

    return DeviceRows(
        tokens=joined(tokens.input_ids),
        token_types=joined(tokens.token_type_ids),
        starts=to_device(starts, device),
        lengths=to_device(lengths, device),
        labels=to_device(labels.astype(np.float32 if labels.dtype.kind == "f" else np.int64), device),
        host_lengths=lengths,
        columns=to_device(np.arange(max(int(lengths.max()), width), dtype=np.int64), device),
    )


def collate_rows(
    rows: DeviceRows, positions: np.ndarray, on_device: torch.Tensor, pad_id: int, width: int | None = None
) -> Batch:
    """The batch of these rows (``positions`` in the subset, on the host; ``on_device``: the same
    positions on the device), padded to its longest row (or to ``width`` tokens): ``collate``'s batch,
    built on the device."""
    width = width or int(rows.host_lengths[positions].max())
    columns = rows.columns[:width]
    mask = columns[None, :] < rows.lengths[on_device][:, None]
    index = torch.where(mask, rows.starts[on_device][:, None] + columns[None, :], 0)
    types = None if rows.token_types is None else torch.where(mask, rows.token_types[index], 0)
    return Batch(
        input_ids=torch.where(mask, rows.tokens[index], pad_id),
        attention_mask=mask.long(),
        labels=rows.labels[on_device],
        positions=positions,
        token_type_ids=types,
    )
