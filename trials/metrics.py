"""Each task's metrics on a set of predictions (scikit-learn and SciPy), and which metrics fit a task.

Classification: accuracy, Matthews correlation (CoLA's official metric) and, with two classes, F1 of
class 1 (MRPC's and QQP's official metric beside accuracy; class 1 is GLUE's "equivalent" /
"duplicate", or the second label in sorted order for a local file with string labels).
Regression: Pearson and Spearman correlation (STS-B's official metrics).

A correlation with a constant (a model, or the mean-prediction baseline, that gives every row the
same score) is undefined; it is reported as 0.0 (no relation), so a curve never holds NaN and the
mean-prediction baseline scores 0.0 on both correlations.

Predictions that are one value for every row (``constant``: one class, or one score) are the constant
predictor's, whatever they score: trials/run.py counts such a best evaluation as a collapse.
"""

from __future__ import annotations

import numpy as np

METRICS = ("accuracy", "f1", "matthews", "pearson", "spearman")  # every metric a row can hold
REGRESSION_METRICS = ("pearson", "spearman")


def task_metrics(regression: bool, num_labels: int) -> tuple[str, ...]:
    """The metrics recorded for a task of this shape (F1 needs a positive class: two classes only)."""
    if regression:
        return REGRESSION_METRICS
    return ("accuracy", "f1", "matthews") if num_labels == 2 else ("accuracy", "matthews")


def describe_shape(regression: bool, num_labels: int) -> str:
    """The task's shape in words, for errors."""
    return "a regression task" if regression else f"a {num_labels}-class classification task"


def constant(values: np.ndarray) -> bool:
    """Every row holds the same value: one class id, or one score (an empty set is not a prediction)."""
    values = np.asarray(values)
    return values.size > 0 and bool(np.ptp(values) == 0)


def _correlation(name: str, labels: np.ndarray, predictions: np.ndarray) -> float:
    from scipy import stats

    if constant(predictions) or constant(labels):
        return 0.0  # undefined for a constant: see the module docstring
    return float(getattr(stats, f"{name}r")(labels, predictions).statistic)


def _metric(name: str, labels: np.ndarray, predictions: np.ndarray) -> float:
    # Imported here: the spec, the grid and the CLI read the names above without paying ~1 s for scikit-learn.
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    if name == "accuracy":
        return float(accuracy_score(labels, predictions))
    if name == "f1":
        return float(f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0.0))
    if name == "matthews":
        return float(matthews_corrcoef(labels, predictions))
    return _correlation(name, labels, predictions)


def metric_value(name: str, labels: np.ndarray, predictions: np.ndarray) -> float:
    """One metric (``name`` of METRICS) of class ids or scores against the labels."""
    return _metric(name, np.asarray(labels), np.asarray(predictions))


def compute_metrics(predictions: np.ndarray, labels: np.ndarray, regression: bool, num_labels: int) -> dict[str, float]:
    """Every metric of the task: ``predictions`` are class ids (classification) or scores (regression)."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if regression:
        predictions, labels = predictions.astype(np.float64), labels.astype(np.float64)
    return {name: _metric(name, labels, predictions) for name in task_metrics(regression, num_labels)}
