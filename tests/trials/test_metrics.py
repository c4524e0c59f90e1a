"""Each task's metrics agree with scikit-learn and SciPy on known predictions; constants score 0 correlation."""

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from freezesweep.trials.config import EvalPoint
from freezesweep.trials.metrics import METRICS, compute_metrics, task_metrics

LABELS = np.array([1, 0, 1, 1, 0, 1, 0, 0, 1, 1])
PREDICTED = np.array([1, 0, 0, 1, 1, 1, 0, 1, 1, 1])  # tp 5, fn 1, fp 2, tn 2


def test_binary_classification_against_scikit_learn():
    got = compute_metrics(PREDICTED, LABELS, regression=False, num_labels=2)
    assert set(got) == {"accuracy", "f1", "matthews"}
    assert got["accuracy"] == accuracy_score(LABELS, PREDICTED) == 0.7
    assert got["f1"] == pytest.approx(f1_score(LABELS, PREDICTED)) and got["f1"] == pytest.approx(
        2 * 5 / (2 * 5 + 1 + 2)
    )
    mcc = (5 * 2 - 2 * 1) / np.sqrt((5 + 2) * (5 + 1) * (2 + 2) * (2 + 1))  # (tp·tn − fp·fn) / √(…)
    assert got["matthews"] == pytest.approx(matthews_corrcoef(LABELS, PREDICTED)) and got["matthews"] == pytest.approx(
        mcc
    )


def test_three_classes_have_no_f1():
    labels, predicted = np.array([0, 1, 2, 2, 1, 0, 2]), np.array([0, 2, 2, 2, 1, 1, 0])
    got = compute_metrics(predicted, labels, regression=False, num_labels=3)
    assert set(got) == {"accuracy", "matthews"} == set(task_metrics(False, 3))
    assert got["matthews"] == pytest.approx(matthews_corrcoef(labels, predicted))


def test_regression_against_scipy():
    rng = np.random.default_rng(0)
    scores = rng.uniform(0, 5, 200).astype(np.float32)
    predicted = scores + rng.normal(0, 1.5, 200)
    got = compute_metrics(predicted, scores, regression=True, num_labels=1)
    assert set(got) == {"pearson", "spearman"}
    assert got["pearson"] == pytest.approx(stats.pearsonr(scores.astype(float), predicted).statistic)
    assert got["spearman"] == pytest.approx(stats.spearmanr(scores.astype(float), predicted).statistic)
    assert 0.3 < got["spearman"] < 0.95


def test_a_constant_prediction_scores_zero_correlation_and_zero_matthews():
    scores = np.array([0.0, 1.5, 4.0, 5.0])
    assert compute_metrics(np.full(4, 2.6), scores, regression=True, num_labels=1) == {"pearson": 0.0, "spearman": 0.0}
    majority = compute_metrics(np.ones(10, dtype=int), LABELS, regression=False, num_labels=2)
    assert majority["matthews"] == 0.0 and majority["accuracy"] == 0.6
    assert compute_metrics(np.zeros(10, dtype=int), LABELS, regression=False, num_labels=2)["f1"] == 0.0


def test_every_metric_has_a_field_in_the_curve_and_a_column_in_the_store():
    import dataclasses

    from freezesweep.results.store import METRICS as STORED, SCHEMA

    assert STORED == METRICS
    assert set(METRICS) <= {f.name for f in dataclasses.fields(EvalPoint)}
    for name in METRICS:
        assert f"best_val_{name}" in SCHEMA.names and f"baseline_{name}" in SCHEMA.names
    point = EvalPoint(step=1, epoch=0.5, accuracy=None, loss=0.3, pearson=0.8, spearman=0.7)
    assert point.metrics() == {"pearson": 0.8, "spearman": 0.7}
