"""Stratified, nested train subsets.

One deterministic *stratified order* of the whole split is drawn from ``split_seed``; the subset of
size n is its first n entries. So every subset contains each smaller one (nesting for free), and
every prefix keeps each label's count within one of ``n * fraction_in_split`` (stratification; but
for the head's one row of a class rarer than that, below), whatever sizes a sweep asks for. The trial seed plays no part: every seed of a cell sees the same
examples, and only the fine-tune's randomness varies.

Every class has a row in each subset of at least as many rows as there are classes: a class too rare
for its quota to come up early is brought forward (``cover_every_class``), its first row moved to the
head of the order. Only the prefix up to where the last class first appeared is reordered, so the
subsets that already held every class are the same rows as before, and the nesting stays.

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
    order = _interleave(queues, length)
    return cover_every_class(order, labels)[:length]


def _interleave(queues: list[np.ndarray], length: int) -> np.ndarray:
    """The rows class by class, each next row from the class furthest below its share; at least
    ``length`` of them, and on until every class has had its first row."""
    sizes = np.array([len(q) for q in queues], dtype=np.int64)
    fractions = sizes / sizes.sum()
    taken = np.zeros(len(queues), dtype=np.int64)
    order: list[int] = []
    while len(order) < length or not taken.all():
        # Largest deficit against the exact quota (n+1)*fraction; ties go to the lower class id.
        deficit = fractions * (len(order) + 1) - taken
        deficit[taken >= sizes] = -np.inf
        c = int(np.argmax(deficit))
        order.append(queues[c][taken[c]])
        taken[c] += 1
    return np.asarray(order, dtype=np.int64)


def cover_every_class(order: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``order`` (which holds every class) with the first row of each class moved to the head, in the
    order the classes first appear: every prefix of at least as many rows as classes holds each class.
    The rows past the last class's first row keep their places, so a prefix that already held every
    class is the same set of rows, and an order whose first rows are distinct classes is returned as is."""
    classes = np.unique(labels[order])
    firsts = np.sort([int(np.flatnonzero(labels[order] == c)[0]) for c in classes])
    last = int(firsts[-1])  # every prefix up to here lacks a class
    if last < len(classes):
        return order
    rest = np.delete(order[: last + 1], firsts)
    return np.concatenate([order[firsts], rest, order[last + 1 :]])


def subset_indices(labels: np.ndarray, size: int, split_seed: int) -> np.ndarray:
    """Row indices of the stratified subset of ``size`` rows, sorted ascending."""
    if size <= 0:
        raise SubsetError(f"train size must be positive, got {size}")
    labels = np.asarray(labels)
    if labels.dtype.kind != "f":  # classes (score bins of regression need no row each)
        classes, counts = np.unique(labels, return_counts=True)
        if size < len(classes):
            rarest = ", ".join(f"class {c} ({n} rows)" for c, n in sorted(zip(classes, counts), key=lambda cn: cn[1]))
            raise SubsetError(
                f"train size {size} is below the {len(classes)} classes of the split: a stratified "
                f"subset holds at least one row of each (classes, rarest first: {rarest})"
            )
    return np.sort(stratified_order(labels, split_seed, size))


def indices_digest(indices: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(indices, dtype=np.int64).tobytes()).hexdigest()[:16]
