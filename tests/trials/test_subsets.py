import numpy as np
import pytest

from tests.conftest import needs_glue
from trials.data import load_task
from trials.subsets import SubsetError, indices_digest, stratified_order, subset_indices

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
