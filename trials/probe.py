"""The probe: an L2-regularised logistic regression (ridge regression on a regression task) on pooled
features of the frozen model — the linear probe of Alain & Bengio (2016, arXiv:1610.01644), the
cheap alternative practitioners try before fine-tuning.

Features: the last layer's token states, averaged over the real tokens (the attention mask), the
first token's state where the model was trained to pool that way (``auto`` reads the
sentence-transformers pooling config a model folder may carry, ``1_Pooling/config.json``), or, on a
decoder-only model (Llama, Qwen2, GPT-2, …), the last real token's: under causal attention only it
has seen the whole text, and it is the token the model's own classification head reads (``auto``
picks it there). The states are the last layer's output, before a decoder's final norm (the probe
standardises its features anyway).
They come from the worker's caches, computed once per (model, dataset, split): validation rows from
the evaluation cache (the states after the last layer, shared with freeze cells at k = L), train rows
from the per-row cache (rows by split index, so nested subsets share them). Both run the frozen model
in eval mode, so the features are exactly the pretrained model's.

Selection never sees the validation set: ``select_and_fit`` takes the train subset's features and
labels only. It scores each regularisation strength C (``probe_cs`` values log-spaced over
1e-4 … 1e4, scikit-learn's LogisticRegressionCV grid) by stratified k-fold cross-validation on the
train subset with the cell's ``select_metric``, keeps the best (ties: the smaller C, the stronger
regularisation), refits it on the whole subset, and only then is the validation set scored, once.
Features are standardised inside each fold (the scaler is part of the fitted pipeline).
Deterministic: the folds are shuffled by the cell's seed (its ``seed`` axis alone: the same folds
whatever the dataset is called), lbfgs and the ridge solver are exact.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from freezesweep.trials.eval_cache import PrefixStates
from freezesweep.trials.metrics import metric_value
from freezesweep.trials.tokens import Batch


class ProbeError(ValueError):
    pass


# The fewest train rows of each class (of a regression task: in all) the probe's cross-validation takes:
# k-fold needs k >= 2 folds, and a stratified fold a row of each class in each. The spec checks refuse a
# train subset with fewer before any trial (orchestrator/checks.py), which would fail here on every resume.
MIN_FOLD_ROWS = 2


def resolve_pooling(requested: str, model_path: str, decoder_only: bool = False) -> str:
    """``auto``: the model's own pooling (the last token on a decoder-only model, the first token where
    its sentence-transformers config pools the CLS token alone), else mean."""
    if requested != "auto":
        return requested
    if decoder_only:
        return "last"
    config = Path(model_path) / "1_Pooling" / "config.json"
    if config.is_file():
        modes = json.loads(config.read_text())
        if modes.get("pooling_mode_cls_token") and not modes.get("pooling_mode_mean_tokens"):
            return "first"
    return "mean"


def pooled(states: torch.Tensor, mask: torch.Tensor | None, pooling: str) -> np.ndarray:
    """[batch, tokens, hidden] states (or one row's [tokens, hidden], unpadded) → [rows, hidden] features."""
    return _pool(states, mask, pooling).cpu().numpy()


def _pool(states: torch.Tensor, mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """``pooled`` on the states' device."""
    if states.dim() == 2:
        states = states[None]
    states = states.float()
    if pooling == "first":
        return states[:, 0]
    if pooling == "last":  # rows are padded on the right: the last real token is at length - 1
        last = states.shape[1] - 1 if mask is None else mask.sum(1).long() - 1
        return states[torch.arange(states.shape[0], device=states.device), last]
    weights = torch.ones(states.shape[:2], device=states.device) if mask is None else mask.to(states).float()
    summed = (states * weights[..., None]).sum(1)
    return summed / weights.sum(1, keepdim=True)


def validation_features(prefix: PrefixStates, batches: list[Batch], pooling: str) -> tuple[np.ndarray, np.ndarray]:
    """Features and labels of the validation rows, batch by batch (the order of the cached states)."""
    features = np.concatenate([pooled(s, b.attention_mask, pooling) for s, b in zip(prefix.states, batches)])
    labels = torch.cat([b.labels for b in batches]).cpu().numpy()
    return features, labels


def train_features(row_states: tuple[torch.Tensor, ...], pooling: str) -> np.ndarray:
    """Features of the train subset, in its order (each row's states are its own, unpadded): pooled on
    the device, copied to the host once."""
    return torch.cat([_pool(s, None, pooling) for s in row_states]).cpu().numpy()


@dataclass(frozen=True)
class ProbeFit:
    c: float  # the chosen inverse regularisation strength
    predictor: Any  # the refit scikit-learn pipeline (scaler + linear model)
    trainable_params: int  # the linear model's coefficients and intercepts


def select_and_fit(
    features: np.ndarray,
    labels: np.ndarray,
    regression: bool,
    metric: str,
    folds: int,
    cs: int,
    seed: int,
    label_names: tuple[str, ...] = (),
) -> ProbeFit:
    """Choose C by cross-validation on these (train) rows alone and refit on all of them (``label_names``:
    class id -> the label as the files write it, for the error of too few rows of a class)."""
    from scipy.linalg import LinAlgWarning
    from sklearn.metrics import make_scorer
    from sklearn.model_selection import GridSearchCV

    grid = np.logspace(-4, 4, cs)
    estimator, parameter, values = _estimator(regression, grid)
    search = GridSearchCV(
        estimator,
        {parameter: values},
        cv=_folds(labels, regression, folds, seed, label_names),
        scoring=make_scorer(lambda y, p: metric_value(metric, y, p)),
        refit=True,
    )
    with warnings.catch_warnings():
        # the weakest penalties of the grid on collinear features (a small model's states): scipy says
        # "ill-conditioned matrix" for each (five lines a regression probe printed); cross-validation judges them
        warnings.filterwarnings("ignore", category=LinAlgWarning)
        search.fit(features, labels)
    c = float(grid[search.best_index_])  # GridSearchCV keeps the first best: the smallest C of a tie
    model = search.best_estimator_[-1]
    params = int(model.coef_.size + np.size(model.intercept_))
    return ProbeFit(c=c, predictor=search.best_estimator_, trainable_params=params)


def _estimator(regression: bool, grid: np.ndarray):
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if regression:  # ridge's alpha is a penalty weight: alpha = 1 / C keeps "larger C, weaker penalty"
        return make_pipeline(StandardScaler(), Ridge()), "ridge__alpha", 1.0 / grid
    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000)), "logisticregression__C", grid


def _folds(labels: np.ndarray, regression: bool, folds: int, seed: int, label_names: tuple[str, ...] = ()):
    from sklearn.model_selection import KFold, StratifiedKFold

    if regression:
        if len(labels) < MIN_FOLD_ROWS:
            raise ProbeError(
                f"the probe needs at least {MIN_FOLD_ROWS} train rows to cross-validate, got {len(labels)}"
            )
        return KFold(min(folds, len(labels)), shuffle=True, random_state=seed)
    classes, counts = np.unique(labels, return_counts=True)
    if len(classes) < 2 or counts.min() < MIN_FOLD_ROWS:
        named = [repr(label_names[c]) if c < len(label_names) else f"class {c}" for c in classes]
        found = ", ".join(f"{name}: {n}" for name, n in zip(named, counts))
        raise ProbeError(
            f"the probe cross-validates on the train subset and needs at least {MIN_FOLD_ROWS} rows of each of "
            f"at least 2 classes there ({found}): a larger train size, or methods without probe for this data"
        )
    return StratifiedKFold(min(folds, int(counts.min())), shuffle=True, random_state=seed)


def validation_loss(
    fit: ProbeFit, features: np.ndarray, labels: np.ndarray, regression: bool, num_labels: int
) -> float:
    """Mean cross-entropy of the predicted probabilities (classification) or squared error, as training reports."""
    from sklearn.metrics import log_loss, mean_squared_error

    if regression:
        return float(mean_squared_error(labels, fit.predictor.predict(features)))
    probabilities = fit.predictor.predict_proba(features)
    classes = fit.predictor[-1].classes_  # a train subset may lack a class the validation set has
    full = np.zeros((len(features), num_labels))
    full[:, classes] = probabilities
    # float32 features give float32 probabilities, whose sums miss 1 by more than log_loss's float64
    # tolerance (it warns, then renormalises itself): renormalised here in float64, quietly.
    full /= full.sum(axis=1, keepdims=True)
    return float(log_loss(labels, full, labels=list(range(num_labels))))  # log_loss clips zeros itself
