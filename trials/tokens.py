"""Tokenization once per (tokenizer, split), cached on disk, and the batches built from it.

The cache key fingerprints the tokenizer by what it *does* (its ids for a probe sentence, its class
and size) and the split by its content, so a changed vocab or changed rows never hit a stale entry.
Files are written to a temporary name and renamed, so concurrent trials never read a partial one.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from trials.data import Split

_PROBE = "The quick brown fox can't jump over 12 lazy dogs, can it? Ünïcödé!"


def tokenizer_fingerprint(tokenizer) -> str:
    probe = tokenizer(_PROBE)["input_ids"]
    blob = f"{type(tokenizer).__name__}|{len(tokenizer)}|{probe}"
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def tokenize_split(tokenizer, split: Split, max_length: int, cache_dir: Path) -> tuple[np.ndarray, ...]:
    """Token ids of every row of ``split`` (no padding), from the disk cache when present."""
    key = f"{tokenizer_fingerprint(tokenizer)}-{split.digest}-{max_length}"
    return _tokenize_cached(tokenizer, split, max_length, cache_dir / "tokens" / f"{key}.parquet")


@functools.lru_cache(maxsize=16)
def _read_cache(path: Path) -> tuple[np.ndarray, ...]:
    column = pq.read_table(path).column("input_ids").combine_chunks()
    offsets, values = column.offsets.to_numpy(), column.values.to_numpy()
    return tuple(values[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1))


def _tokenize_cached(tokenizer, split: Split, max_length: int, path: Path) -> tuple[np.ndarray, ...]:
    if not path.exists():
        ids = tokenizer(list(split.texts), truncation=True, max_length=max_length)["input_ids"]
        table = pa.table({"input_ids": pa.array(ids, type=pa.list_(pa.int32()))})
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, path)  # atomic: readers see the whole file or none
    return _read_cache(path)


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    positions: np.ndarray | None = None  # training batches: the rows' positions in the train subset

    def to(self, device: torch.device) -> "Batch":
        return Batch(*(t.to(device, non_blocking=True) for t in (self.input_ids, self.attention_mask, self.labels)),
                     positions=self.positions)


def collate(ids: list[np.ndarray], labels: np.ndarray, pad_id: int) -> Batch:
    """Dynamic padding: to the longest row of this batch, not to max_seq_length."""
    width = max(len(x) for x in ids)
    input_ids = np.full((len(ids), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(ids), width), dtype=np.int64)
    for i, row in enumerate(ids):
        input_ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return Batch(torch.from_numpy(input_ids), torch.from_numpy(mask), torch.as_tensor(labels, dtype=torch.long))


def eval_batches(ids: tuple[np.ndarray, ...], labels: np.ndarray, batch_size: int, pad_id: int) -> list[Batch]:
    """Evaluation batches sorted by length, so each pads to near its own rows' length; built once
    per trial and reused by every evaluation."""
    order = np.argsort([len(x) for x in ids], kind="stable")
    return [
        collate([ids[i] for i in chunk], labels[chunk], pad_id)
        for chunk in np.array_split(order, max(1, -(-len(order) // batch_size)))
    ]


def train_batches(
    ids: tuple[np.ndarray, ...], labels: np.ndarray, batch_size: int, pad_id: int, generator: torch.Generator
) -> list[Batch]:
    """One epoch of shuffled batches; the generator (seeded from the cell) fixes the order."""
    order = torch.randperm(len(ids), generator=generator).numpy()
    return [
        dataclasses.replace(collate([ids[i] for i in chunk], labels[chunk], pad_id), positions=chunk)
        for chunk in (order[s : s + batch_size] for s in range(0, len(order), batch_size))
    ]
