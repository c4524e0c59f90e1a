"""The statistics behind the report: paired contrasts against full fine-tuning, retained quality,
costs and their frontier, and the decision "how many layers can I freeze for my data size".

Seeds are paired: a trial's RNG seed derives from (seed, split_seed, dataset, model) only, so the runs
of one seed at different k share head init and batch order. score_k − score_0 per seed cancels that
seed's luck, and its CI is narrower than the unpaired one; every contrast here is matched on seed
within (sweep, dataset, train size). k = -1 freezes the embeddings only, 0 nothing (full fine-tuning,
the baseline), k ≥ 1 the embeddings and the first k layers.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd

from freezesweep.results.query import BASELINE, SCORE, cell_means, ok_rows, paired_by_seed
from freezesweep.results.settle import variant_label

CONFIDENCE = 0.95
TOLERANCE = 0.01  # how much of the selected metric below full fine-tuning still counts as "as good"
RETAINED_TARGET = 0.9  # the paper's "90 % of the quality"
BOOTSTRAP_RESAMPLES = 9999
BOOTSTRAP_SEED = 0  # fixed: the same rows give the same report
GROUP = ["sweep", "dataset", "train_size"]  # one decision each
COSTS = ["trainable_params", "train_time_s", "peak_mem_mb"]
SAVED = {"trainable_params": "params_saved_pct", "train_time_s": "time_saved_pct", "peak_mem_mb": "mem_saved_pct"}
NAN = float("nan")


def freeze_depth(k: int) -> float:
    """How much of the model k freezes, for ordering and plotting: 0 (nothing) < -1 (embeddings,
    drawn as half a layer) < 1 < 2 < …"""
    return 0.5 if k == -1 else float(k)


def largest_k(ks) -> int | None:
    ks = list(ks)
    return max(ks, key=freeze_depth) if ks else None


# --- percentages as printed: never more than was shown --------------------------------------------
def confidence_pct(confidence: float) -> str:
    """A confidence in %, never above what it is: exact where up to 3 decimals say it (97.25, 99.875),
    else rounded down to one (≈ 0.97497 is 97.4 %: rounding to the nearest printed a spent last look's 97.5 %)."""
    pct = 100 * confidence
    for digits in range(4):
        if abs(round(pct, digits) - pct) < 1e-9:
            return f"{round(pct, digits):.{digits}f}"
    return f"{math.floor(pct * 10) / 10:.1f}"


def upper_pct(rate: float) -> str:
    """An upper bound of a rate in whole %, rounded up (to the nearest could print less than the bound)."""
    return f"{math.ceil(100 * rate - 1e-9):.0f}"


def lower_pct(rate: float) -> str:
    """A lower bound of a rate in whole %, rounded down."""
    return f"{math.floor(100 * rate + 1e-9):.0f}"


# --- intervals ----------------------------------------------------------------------------------
def mean_interval(values) -> tuple[float, float, float]:
    """Mean and its Student-t CI. Seeds are few, so t, not a normal or a bootstrap, which would be
    far too narrow with 2–5 values; fewer than two values give no interval."""
    from scipy import stats  # deferred: the spec (and so every trial worker) imports this module

    values = np.asarray(values, dtype=float)
    mean = float(values.mean()) if len(values) else NAN
    if len(values) < 2:
        return mean, NAN, NAN
    sem = float(stats.sem(values))
    if sem == 0:
        return mean, mean, mean
    low, high = stats.t.interval(CONFIDENCE, len(values) - 1, loc=mean, scale=sem)
    return mean, float(low), float(high)


def welch_interval(a, b) -> tuple[float, float]:
    """CI of mean(a) − mean(b) as if the runs were independent (Welch): the unpaired comparison."""
    from scipy import stats

    if min(len(a), len(b)) < 2:
        return NAN, NAN
    with warnings.catch_warnings():  # identical values: scipy warns and returns nan, which we keep
        warnings.simplefilter("ignore", RuntimeWarning)
        ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(CONFIDENCE)
    return float(ci.low), float(ci.high)


# --- paired contrasts ---------------------------------------------------------------------------
def paired_contrasts(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (sweep, dataset, train size, k ≠ 0): score_k − score_0 matched on seed, its mean and CI, the
    unpaired CI over the same runs, and how much narrower the paired one is."""
    pairs = paired_by_seed(rows)
    pairs = pairs[pairs["frozen_layers"] != 0]
    records = [_contrast(key, cell) for key, cell in pairs.groupby([*GROUP, "frozen_layers"])]
    columns = [
        *GROUP,
        "frozen_layers",
        "pairs",
        "score_k",
        "score_0",
        "mean_diff",
        "ci_low",
        "ci_high",
        "unpaired_ci_low",
        "unpaired_ci_high",
        "narrower_pct",
    ]
    return pd.DataFrame(records, columns=columns)


def _contrast(key: tuple, cell: pd.DataFrame) -> dict:
    score_k, score_0 = cell[SCORE].to_numpy(), cell[SCORE + "_base"].to_numpy()
    mean, low, high = mean_interval(score_k - score_0)
    unpaired_low, unpaired_high = welch_interval(score_k, score_0)
    unpaired_width = unpaired_high - unpaired_low
    narrower = 100 * (1 - (high - low) / unpaired_width) if unpaired_width > 0 else NAN
    return dict(
        zip([*GROUP, "frozen_layers"], key),
        pairs=len(cell),
        score_k=score_k.mean(),
        score_0=score_0.mean(),
        mean_diff=mean,
        ci_low=low,
        ci_high=high,
        unpaired_ci_low=unpaired_low,
        unpaired_ci_high=unpaired_high,
        narrower_pct=narrower,
    )


# --- retained quality ---------------------------------------------------------------------------
def retained_ratio(score_k, score_0, baseline: float, axis: int = -1):
    """(score_k − baseline) / (score_0 − baseline) on the means: the share of full fine-tuning's gain
    over a constant answer (the majority class, or the mean score for regression) that k keeps."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.mean(score_k, axis=axis) - baseline) / (np.mean(score_0, axis=axis) - baseline)


def retained_quality(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (sweep, dataset, train size, k ≠ 0): retained quality over the paired seeds with a
    bootstrap CI (seeds resampled as pairs)."""
    pairs = paired_by_seed(rows)
    pairs = pairs[pairs["frozen_layers"] != 0]
    records = []
    for key, cell in pairs.groupby([*GROUP, "frozen_layers"]):
        score_k, score_0 = cell[SCORE].to_numpy(), cell[SCORE + "_base"].to_numpy()
        baseline = float(cell[BASELINE].mean())
        low, high = _bootstrap_retained(score_k, score_0, baseline)
        records.append(
            dict(
                zip([*GROUP, "frozen_layers"], key),
                pairs=len(cell),
                baseline=baseline,
                retained=float(retained_ratio(score_k, score_0, baseline)),
                ci_low=low,
                ci_high=high,
            )
        )
    columns = [*GROUP, "frozen_layers", "pairs", "baseline", "retained", "ci_low", "ci_high"]
    return pd.DataFrame(records, columns=columns)


def _bootstrap_retained(score_k: np.ndarray, score_0: np.ndarray, baseline: float) -> tuple[float, float]:
    from scipy import stats

    if len(score_k) < 2:
        return NAN, NAN
    with warnings.catch_warnings():  # all-equal seeds: a degenerate (zero-width) interval is the answer
        warnings.simplefilter("ignore")
        # percentile, not the default BCa: BCa's jackknife is unstable with a handful of seeds
        result = stats.bootstrap(
            (score_k, score_0),
            lambda k, z, axis=-1: retained_ratio(k, z, baseline, axis),
            paired=True,
            vectorized=True,
            method="percentile",
            confidence_level=CONFIDENCE,
            n_resamples=BOOTSTRAP_RESAMPLES,
            rng=np.random.default_rng(BOOTSTRAP_SEED),
        )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def largest_k_retaining(retained: pd.DataFrame, target: float = RETAINED_TARGET) -> pd.DataFrame:
    """Per (sweep, dataset, train size): the largest k whose retained quality is ≥ target."""
    keeps = retained[retained["retained"] >= target]
    best = keeps.groupby(GROUP)["frozen_layers"].agg(largest_k)
    return best.rename("k_retaining_90").reset_index()


# --- costs --------------------------------------------------------------------------------------
def costs(rows: pd.DataFrame) -> pd.DataFrame:
    """Per cell: mean selected metric and cost over seeds, each cost's saving against k = 0 of the same
    (sweep, dataset, train size) in %, and whether the cell is on the metric-vs-train-time frontier."""
    table = cell_means(rows, [SCORE, *COSTS])
    base = table[table["frozen_layers"] == 0].set_index(GROUP)[COSTS]
    aligned = base.reindex(pd.MultiIndex.from_frame(table[GROUP]))
    for cost, saved in SAVED.items():
        table[saved] = 100 * (1 - table[cost].to_numpy() / aligned[cost].to_numpy())
    table["on_frontier"] = False
    for _, cell in table.groupby(GROUP):
        table.loc[cell.index, "on_frontier"] = _on_frontier(cell)
    return table


def _on_frontier(cell: pd.DataFrame) -> pd.Series:
    """Pareto frontier: no other k is at least as fast and more accurate."""
    ordered = cell.sort_values(["train_time_s", SCORE], ascending=[True, False])
    best_before = ordered[SCORE].cummax().shift(fill_value=-math.inf)
    return (ordered[SCORE] > best_before).reindex(cell.index)


# --- methods side by side -----------------------------------------------------------------------
METHOD_COSTS = ["trainable_params", "wall_time_s", "peak_mem_mb"]
METHOD_ORDER = {"freeze": 0, "lora": 1, "probe": 2}


def method_comparison(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (sweep, dataset, train size), every method variant (each frozen-layers value, each LoRA
    rank, the probe): the mean selected metric over seeds with its Student-t 95 % CI, and mean costs
    (wall time: a cell's whole cost, cache fills included). ``best_in_method``: the method's best variant there."""
    ok = ok_rows(rows)
    columns = [*GROUP, "method", "variant", "seeds", "score", "ci_low", "ci_high", *METHOD_COSTS, "best_in_method"]
    if ok.empty:
        return pd.DataFrame(columns=columns)
    ranks = ok["lora_rank"] if "lora_rank" in ok else [None] * len(ok)  # rows from before LoRA existed
    ok = ok.assign(variant=[variant_label(m, k, r) for m, k, r in zip(ok["method"], ok["frozen_layers"], ranks)])
    records = []
    for key, cell in ok.groupby([*GROUP, "method", "variant"], sort=False):
        mean, low, high = mean_interval(cell[SCORE])
        first = cell.iloc[0]  # within a method: by frozen depth, or by rank
        depth = freeze_depth(first["frozen_layers"]) if key[-2] == "freeze" else first.get("lora_rank")
        records.append(
            dict(
                zip([*GROUP, "method", "variant"], key),
                seeds=len(cell),
                score=mean,
                ci_low=low,
                ci_high=high,
                **{c: float(cell[c].mean()) for c in METHOD_COSTS},
                _method=METHOD_ORDER.get(key[-2], len(METHOD_ORDER)),
                _depth=0 if pd.isna(depth) else depth,
            )
        )
    table = pd.DataFrame(records)
    table["best_in_method"] = table["score"] == table.groupby([*GROUP, "method"])["score"].transform("max")
    return table.sort_values([*GROUP, "_method", "_depth"], ignore_index=True)[columns]
