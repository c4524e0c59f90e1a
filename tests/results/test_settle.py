"""results/settle.py: decisions that hold however often they are looked at, on recorded sequences whose
answers are computed here by hand, and never a decision the data cannot support."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from results.settle import (FULL, LEARNED, NOTHING_LEARNED, UNDECIDED, WITHIN, WORSE, SettleRule, decide,
                            interval, next_round)

RULE = SettleRule(tolerance=0.01, confidence=0.95, initial_seeds=3, max_seeds=9, seeds_per_round=2)


def _rows(scores: dict[str, list[float]], baseline: float = 0.5, status: dict | None = None) -> pd.DataFrame:
    return pd.DataFrame([{"arm": arm, "seed": seed, "score": score, "baseline_score": baseline,
                          "status": (status or {}).get((arm, seed), "ok")}
                         for arm, values in scores.items() for seed, score in enumerate(values)])


def test_the_looks_of_a_budget():
    assert RULE.looks == 1 + math.ceil((9 - 3) / 2) == 4
    assert SettleRule(initial_seeds=3, max_seeds=3).looks == 1


def test_identical_paired_differences_and_full_fine_tuning_at_the_baseline_give_no_advice():
    """The demo's n = 50: both seeds' differences equal (a zero-width t interval) and full fine-tuning at
    the majority class. Before: "freeze the embeddings and the first 6 layers (95 % CI +0.004 to +0.004)"."""
    degenerate = decide(_rows({FULL: [0.516, 0.516, 0.516], "freeze k=6": [0.520, 0.520, 0.520]}, baseline=0.509),
                        RULE, looks=1)
    [k6] = degenerate.arms
    assert k6.decision == UNDECIDED and "spread is unknown" in k6.why and degenerate.advice is None
    at_baseline = decide(_rows({FULL: [0.512, 0.509, 0.515, 0.510], "freeze k=6": [0.509, 0.512, 0.509, 0.511]},
                               baseline=0.509), RULE, looks=1)
    assert at_baseline.learned.decision == NOTHING_LEARNED and at_baseline.settled and at_baseline.advice is None
    few = decide(_rows({FULL: [0.8, 0.9], "freeze k=3": [0.79, 0.91]}), RULE, looks=1)
    assert few.arms[0].decision == UNDECIDED and "fewer than 3" in few.arms[0].why and few.advice is None


def test_a_recorded_sequence_decides_as_computed_by_hand():
    """Three arms, four looks, two comparisons beside the learned check: each interval at
    1 - 0.05 / (4 looks × 3 comparisons), a Student-t one of the paired differences."""
    full = [0.80, 0.82, 0.78, 0.81, 0.79]
    scores = {FULL: full, "freeze k=2": [f + d for f, d in zip(full, [0.002, -0.001, 0.003, 0.000, 0.001])],
              "freeze k=6": [f - d for f, d in zip(full, [0.30, 0.28, 0.29, 0.31, 0.30])]}
    result = decide(_rows(scores), RULE)
    level = 1 - 0.05 / (4 * 3)
    for arm, sign in (("freeze k=2", 1), ("freeze k=6", -1)):
        diffs = np.array(scores[arm]) - np.array(full)
        half = stats.t.ppf(1 - (1 - level) / 2, 4) * diffs.std(ddof=1) / math.sqrt(5)
        mine = next(c for c in result.arms if c.arm == arm)
        assert (mine.low, mine.high) == pytest.approx((diffs.mean() - half, diffs.mean() + half))
    k2, k6 = (next(c for c in result.arms if c.arm == a) for a in ("freeze k=2", "freeze k=6"))
    assert k2.low > -0.01 and k2.decision == WITHIN  # by hand: mean 0.001, half-width ≈ 0.0050
    assert k6.high < -0.01 and k6.decision == WORSE
    assert result.learned.decision == LEARNED and result.settled and result.advice == "freeze k=2"


def test_the_next_round_goes_to_undecided_arms_nearest_the_boundary_first():
    full = [0.80, 0.82, 0.78]
    scores = {FULL: full,
              "freeze k=2": [f + d for f, d in zip(full, [0.01, -0.03, 0.02])],  # undecided, near the boundary
              "freeze k=4": [f + d for f, d in zip(full, [0.05, -0.09, 0.02])],  # undecided, wide
              "freeze k=6": [f - 0.3 + d for f, d in zip(full, [0.001, -0.001, 0.0])]}  # worse: settled
    decision = decide(_rows(scores), RULE)
    assert [c.decision for c in decision.arms] == [UNDECIDED, UNDECIDED, WORSE]
    cells = next_round(decision, RULE, ["freeze k=2", "freeze k=4", "freeze k=6"], seeds_done=[0, 1, 2])
    assert cells == [(FULL, 3), (FULL, 4), ("freeze k=2", 3), ("freeze k=2", 4), ("freeze k=4", 3), ("freeze k=4", 4)]
    first = next_round(decide(_rows({}), RULE), RULE, ["freeze k=2", "freeze k=6"], seeds_done=[])
    assert sorted(set(seed for _, seed in first)) == [0, 1, 2] and len(first) == 9  # initial seeds for all arms
    at_budget = decide(_rows({FULL: [0.8, 0.82, 0.78, 0.8, 0.81, 0.79, 0.8, 0.8, 0.82],
                              "freeze k=2": [0.8, 0.85, 0.7, 0.8, 0.86, 0.72, 0.8, 0.8, 0.9]}), RULE)
    assert next_round(at_budget, RULE, ["freeze k=2"], seeds_done=list(range(9))) == []


def test_failed_and_diverged_rows_are_left_out_and_counted():
    scores = {FULL: [0.80, 0.82, 0.78, 0.81], "freeze k=2": [0.80, 0.82, 0.78, float("nan")]}
    result = decide(_rows(scores, status={("freeze k=2", 3): "diverged"}), RULE)
    assert result.arms[0].pairs == 3 and result.excluded == {"diverged": 1}


def test_the_interval_is_student_t():
    mean, low, high = interval(np.array([1.0, 2.0, 3.0]), 0.95)
    assert mean == 2.0 and (low, high) == pytest.approx(stats.t.interval(0.95, 2, loc=2, scale=stats.sem([1, 2, 3])))
    assert math.isnan(interval(np.array([1.0]), 0.95)[1])
