import numpy as np
import pytest

from tests.conftest import needs_glue
from freezesweep.trials.data import load_task
from freezesweep.trials.subsets import SubsetError, indices_digest, stratified_order, subset_indices

SIZES = [50, 100, 200, 500, 1000]


@needs_glue
@pytest.mark.parametrize("dataset", ["glue/sst2", "glue/cola"])
def test_real_subsets_are_nested_and_stratified(dataset, glue_dir):
    labels = load_task(dataset, str(glue_dir)).train.labels
    fraction = np.bincount(labels) / len(labels)
    previous = set()
    for size in SIZES:
        rows = subset_indices(labels, size, split_seed=0)
        assert len(rows) == size == len(set(rows))
        assert previous <= set(rows), f"{size} does not contain the smaller subset"
        counts = np.bincount(labels[rows], minlength=len(fraction))
        assert np.all(np.abs(counts - size * fraction) <= 1), (size, counts, size * fraction)
        previous = set(rows)


@needs_glue
def test_real_subsets_depend_on_split_seed_only(glue_dir):
    labels = load_task("glue/sst2", str(glue_dir)).train.labels
    a, b = subset_indices(labels, 200, 0), subset_indices(labels, 200, 0)
    c = subset_indices(labels, 200, 1)
    assert indices_digest(a) == indices_digest(b)
    assert indices_digest(a) != indices_digest(c)
    assert len(set(a) & set(c)) < 50  # a different draw, not a shuffle of the same rows


def test_stratified_prefix_on_skewed_three_classes():
    labels = np.array([0] * 700 + [1] * 250 + [2] * 50)
    order = stratified_order(labels, split_seed=3)
    assert sorted(order.tolist()) == list(range(1000))  # a permutation: every row once
    for n in (10, 37, 100, 999):
        counts = np.bincount(labels[order[:n]], minlength=3)
        assert np.all(np.abs(counts - n * np.array([0.7, 0.25, 0.05])) <= 1)


@pytest.mark.parametrize("size", [0, -5, 1001])
def test_bad_sizes_are_errors(size):
    labels = np.array([0, 1] * 500)
    with pytest.raises(SubsetError):
        subset_indices(labels, size, 0)


def _bin_counts_follow_the_split(scores: np.ndarray, sizes) -> None:
    from freezesweep.trials.subsets import SCORE_BINS, strata

    bins = strata(scores)
    fraction = np.bincount(bins, minlength=SCORE_BINS) / len(bins)
    previous = set()
    for size in sizes:
        rows = subset_indices(scores, size, split_seed=0)
        assert previous <= set(rows), f"{size} does not contain the smaller subset"
        counts = np.bincount(bins[rows], minlength=SCORE_BINS)
        assert np.all(np.abs(counts - size * fraction) <= 1), (size, counts, size * fraction)
        previous = set(rows)


def test_regression_subsets_are_stratified_by_score_bins():
    """Skewed scores: equal-frequency bins, each holding a fifth of the split, and every nested subset
    keeps each bin's share within one row; a plain random draw would not."""
    from freezesweep.trials.subsets import SCORE_BINS, strata

    scores = np.random.default_rng(0).exponential(1.0, 2000).astype(np.float32)
    assert np.all(np.bincount(strata(scores), minlength=SCORE_BINS) == 2000 // SCORE_BINS)
    _bin_counts_follow_the_split(scores, SIZES)
    low = subset_indices(scores, 50, 0)
    assert scores[low].min() < np.quantile(scores, 0.2) and scores[low].max() > np.quantile(scores, 0.8)


@needs_glue
def test_real_stsb_subsets_span_the_score_range(glue_dir):
    scores = load_task("glue/stsb", str(glue_dir)).train.labels
    _bin_counts_follow_the_split(scores, SIZES)


def _rare_minority() -> np.ndarray:
    """Issue 29's split: 198 rows of class 1, 2 of class 0, shuffled."""
    labels = np.array([1] * 198 + [0] * 2)
    np.random.default_rng(0).shuffle(labels)
    return labels


@pytest.mark.parametrize("split_seed", [0, 1, 2])
def test_a_rare_class_has_a_row_in_every_subset_at_least_as_large_as_the_classes(split_seed):
    """Before: subsets of 2, 4, 16 and 32 rows held only class 1 (the minority's quota came up at ~100)."""
    labels = _rare_minority()
    previous = set()
    for size in (2, 4, 16, 32, 50, 100, 150, 200):
        rows = subset_indices(labels, size, split_seed)
        assert set(labels[rows]) == {0, 1}, (size, np.bincount(labels[rows]))
        assert previous <= set(rows), f"{size} does not contain the smaller subset"
        previous = set(rows)
    # once the minority's quota comes up on its own, the subsets are the plain stratified ones
    assert np.bincount(labels[subset_indices(labels, 150, split_seed)]).tolist() == [2, 148]


def test_subsets_that_held_every_class_keep_their_rows():
    """Only the head of the order moves: every prefix that already held each class keeps its rows, and
    an order whose first rows are distinct classes is left as it is."""
    from freezesweep.trials.subsets import cover_every_class

    labels = np.array([0] * 6 + [1] * 3 + [2])
    order = np.array([0, 6, 1, 2, 7, 3, 4, 9, 5, 8])  # class 2 first comes up at position 7
    covered = cover_every_class(order, labels)
    assert labels[covered[:3]].tolist() == [0, 1, 2]
    assert all(set(labels[covered[:n]]) == {0, 1, 2} for n in range(3, 11))
    assert all(set(covered[:n]) == set(order[:n]) for n in range(8, 11))  # these held every class before
    assert sorted(covered) == sorted(order)
    distinct = np.array([0, 6, 9, 1, 7, 2, 3, 4, 5, 8])
    assert np.array_equal(cover_every_class(distinct, labels), distinct)


def test_a_train_size_below_the_classes_names_them_with_their_counts():
    labels = np.array([0] * 90 + [1] * 8 + [2] * 2)
    with pytest.raises(
        SubsetError, match=r"train size 2 is below the 3 classes .* class 2 \(2 rows\), class 1 \(8 rows\)"
    ):
        subset_indices(labels, 2, 0)
    assert set(labels[subset_indices(labels, 3, 0)]) == {0, 1, 2}
