"""Stratified, nested train subsets.

One deterministic *stratified order* of the whole split is drawn from ``split_seed``; the subset of
size n is its first n entries. So every subset contains each smaller one (nesting for free), and
every prefix keeps each label's count within one of ``n * fraction_in_split`` (stratification),
whatever sizes a sweep asks for. The trial seed plays no part: every seed of a cell sees the same
examples, and only the fine-tune's randomness varies.

Regression scores (float labels) are stratified by score bins: ``SCORE_BINS`` bins of equal
frequency over the split's scores (quantiles, so a skewed score distribution still fills every bin),
so each subset spans the whole score range in the split's proportions.
"""

from __future__ import annotations

import hashlib

import numpy as np

SCORE_BINS = 5  # regression strata: at n = 50, ten rows per bin


class SubsetError(ValueError):
    pass


def strata(labels: np.ndarray) -> np.ndarray:
    """What is stratified: the class ids, or for float scores their quantile bin (0..SCORE_BINS-1)."""
    labels = np.asarray(labels)
    if labels.dtype.kind != "f":
        return labels
    edges = np.quantile(labels, np.arange(1, SCORE_BINS) / SCORE_BINS)
    return np.searchsorted(edges, labels, side="right")


def stratified_order(labels: np.ndarray, split_seed: int, length: int | None = None) -> np.ndarray:
    """The first ``length`` positions (default all) of the stratified order of ``labels``."""
    labels = strata(labels)
    length = len(labels) if length is None else length
    if length > len(labels):
        raise SubsetError(f"train size {length} is larger than the split ({len(labels)} rows)")
    rng = np.random.default_rng(split_seed)
    classes = np.unique(labels)
    # Each class's members in a random order; the interleave below decides only *which class* comes next.
    queues = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    fractions = np.array([len(q) for q in queues], dtype=np.float64) / len(labels)
    taken = np.zeros(len(classes), dtype=np.int64)
    order = np.empty(length, dtype=np.int64)
    for n in range(length):
        # Largest deficit against the exact quota (n+1)*fraction; ties go to the lower class id.
        deficit = fractions * (n + 1) - taken
        deficit[taken >= [len(q) for q in queues]] = -np.inf
        c = int(np.argmax(deficit))
        order[n] = queues[c][taken[c]]
        taken[c] += 1
    return order


def subset_indices(labels: np.ndarray, size: int, split_seed: int) -> np.ndarray:
    """Row indices of the stratified subset of ``size`` rows, sorted ascending."""
    if size <= 0:
        raise SubsetError(f"train size must be positive, got {size}")
    return np.sort(stratified_order(labels, split_seed, size))


def indices_digest(indices: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(indices, dtype=np.int64).tobytes()).hexdigest()[:16]
