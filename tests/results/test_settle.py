"""results/settle.py: decisions that hold however often they are looked at, on recorded sequences whose
answers are computed here by hand, and never a decision the data cannot support."""

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from freezesweep.results.settle import (
    FULL,
    LEARNED,
    NOTHING_LEARNED,
    UNDECIDED,
    WITHIN,
    WORSE,
    SettleRule,
    decide,
    interval,
    next_round,
)

RULE = SettleRule(tolerance=0.01, confidence=0.95, initial_seeds=3, max_seeds=9, seeds_per_round=2)


def _rows(scores: dict[str, list[float]], baseline: float = 0.5, status: dict | None = None) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "arm": arm,
                "seed": seed,
                "score": score,
                "baseline_score": baseline,
                "status": (status or {}).get((arm, seed), "ok"),
            }
            for arm, values in scores.items()
            for seed, score in enumerate(values)
        ]
    )


def test_the_looks_of_a_budget():
    assert RULE.looks == 1 + math.ceil((9 - 3) / 2) == 4
    assert SettleRule(initial_seeds=3, max_seeds=3).looks == 1


def test_identical_paired_differences_and_full_fine_tuning_at_the_baseline_give_no_advice():
    """The demo's n = 50: both seeds' differences equal (a zero-width t interval) and full fine-tuning at
    the majority class. Before: "freeze the embeddings and the first 6 layers (95 % CI +0.004 to +0.004)"."""
    degenerate = decide(
        _rows({FULL: [0.516, 0.516, 0.516], "freeze k=6": [0.520, 0.520, 0.520]}, baseline=0.509), RULE, looks=1
    )
    [k6] = degenerate.arms
    assert k6.decision == UNDECIDED and "spread is unknown" in k6.why and degenerate.advice is None
    at_baseline = decide(
        _rows({FULL: [0.5115, 0.5110, 0.5118, 0.5112], "freeze k=6": [0.5095, 0.512, 0.5097, 0.511]}, baseline=0.509),
        RULE,
        looks=1,
    )
    assert at_baseline.learned.decision == NOTHING_LEARNED and at_baseline.advice is None
    assert next_round(at_baseline, RULE, ["freeze k=6"], {FULL: set(range(4)), "freeze k=6": set(range(4))}) == []
    few = decide(_rows({FULL: [0.8, 0.9], "freeze k=3": [0.79, 0.91]}), RULE, looks=1)
    assert few.arms[0].decision == UNDECIDED and "fewer than 3" in few.arms[0].why and few.advice is None


def test_a_recorded_sequence_decides_as_computed_by_hand():
    """Three arms, four looks, two comparisons beside the learned check: each bound one-sided, at
    1 - 0.5 × 0.05 / (4 looks × 3 comparisons) (the quality share of α), a Student-t one of the paired differences."""
    full = [0.80, 0.82, 0.78, 0.81, 0.79]
    scores = {
        FULL: full,
        "freeze k=2": [f + d for f, d in zip(full, [0.002, -0.001, 0.003, 0.000, 0.001])],
        "freeze k=6": [f - d for f, d in zip(full, [0.30, 0.28, 0.29, 0.31, 0.30])],
    }
    result = decide(_rows(scores, baseline=0.4), RULE)  # (0.5: k = 6's seeds 0 and 3 would be collapses)
    for arm, share in (("freeze k=2", 0.5), ("freeze k=6", 0.2)):  # k = 6: "worse", over every seed
        diffs = np.array(scores[arm]) - np.array(full)
        half = stats.t.ppf(1 - share * 0.05 / (4 * 3), 4) * diffs.std(ddof=1) / math.sqrt(5)
        mine = next(c for c in result.arms if c.arm == arm)
        assert (mine.low if arm == "freeze k=2" else mine.high_all) == pytest.approx(
            diffs.mean() - half if arm == "freeze k=2" else diffs.mean() + half
        )
    k2, k6 = (next(c for c in result.arms if c.arm == a) for a in ("freeze k=2", "freeze k=6"))
    assert k2.low > -0.01 and k2.decision == WITHIN  # by hand: mean 0.001, half-width ≈ 0.0050
    assert k6.high_all < -0.01 and k6.decision == WORSE
    assert result.learned.decision == LEARNED and result.advice == "freeze k=2"
    assert next_round(result, RULE, ["freeze k=2", "freeze k=6"], {arm: set(range(5)) for arm in scores}) == []


def test_the_next_round_goes_to_undecided_arms_nearest_the_boundary_first():
    full = [0.80, 0.82, 0.78]
    scores = {
        FULL: full,
        "freeze k=2": [f + d for f, d in zip(full, [0.01, -0.03, 0.02])],  # undecided, near the boundary
        "freeze k=4": [f + d for f, d in zip(full, [0.05, -0.09, 0.02])],  # undecided, wide
        "freeze k=6": [f - 0.3 + d for f, d in zip(full, [0.001, -0.001, 0.0])],
    }  # worse: settled
    decision = decide(_rows(scores), RULE)
    assert [c.decision for c in decision.arms] == [UNDECIDED, UNDECIDED, WORSE]
    done = {arm: {0, 1, 2} for arm in scores}
    cells = next_round(decision, RULE, ["freeze k=2", "freeze k=4", "freeze k=6"], done)
    assert cells == [(FULL, 3), (FULL, 4), ("freeze k=2", 3), ("freeze k=2", 4), ("freeze k=4", 3), ("freeze k=4", 4)]
    together = dataclasses.replace(RULE, learned_first=False)
    first = next_round(decide(_rows({}), together), together, ["freeze k=2", "freeze k=6"], {})
    assert sorted(set(seed for _, seed in first)) == [0, 1, 2] and len(first) == 9  # initial seeds for all arms
    at_budget = decide(
        _rows(
            {
                FULL: [0.8, 0.82, 0.78, 0.8, 0.81, 0.79, 0.8, 0.8, 0.82],
                "freeze k=2": [0.8, 0.85, 0.7, 0.8, 0.86, 0.72, 0.8, 0.8, 0.9],
            }
        ),
        RULE,
    )
    assert next_round(at_budget, RULE, ["freeze k=2"], {FULL: set(range(9)), "freeze k=2": set(range(9))}) == []


def test_learned_first_runs_the_arms_only_once_full_fine_tuning_beats_the_baseline():
    """The real run's n = 50 spent 15 of its 21 trials on the arms of a group that learned nothing."""
    arms = ["freeze k=2", "freeze k=6"]
    assert next_round(decide(_rows({}), RULE), RULE, arms, {}) == [(FULL, 0), (FULL, 1), (FULL, 2)]
    open_question = decide(_rows({FULL: [0.52, 0.60, 0.50]}), RULE, comparisons=3)  # a gain, or none?
    assert open_question.learned.decision == UNDECIDED
    assert next_round(open_question, RULE, arms, {FULL: {0, 1, 2}}) == [(FULL, 3), (FULL, 4)]  # full fine-tuning only
    nothing = decide(_rows({FULL: [0.510, 0.5095, 0.511, 0.510]}, baseline=0.509), RULE, comparisons=3)
    assert nothing.learned.decision == NOTHING_LEARNED and next_round(nothing, RULE, arms, {FULL: {0, 1, 2, 3}}) == []
    learned = decide(_rows({FULL: [0.80, 0.82, 0.78, 0.81, 0.79]}), RULE, comparisons=3)
    assert learned.learned.decision == LEARNED
    # the arms catch up on full fine-tuning's seeds, their initial ones first: no new full fine-tuning trial
    assert next_round(learned, RULE, arms, {FULL: set(range(5))}) == [(arm, s) for arm in arms for s in (0, 1, 2)]
    at_budget = decide(_rows({FULL: [0.52, 0.60, 0.50, 0.55, 0.49, 0.58, 0.51, 0.56, 0.50]}), RULE, comparisons=3)
    assert at_budget.learned.decision == UNDECIDED
    assert next_round(at_budget, RULE, arms, {FULL: set(range(9))}) == []  # no advice can come of the arms


def test_the_confidence_is_shared_by_the_grids_arms_before_they_have_rows():
    """Learned first: full fine-tuning runs alone at first; its interval must be the one it has beside the
    arms (1 − α / (looks × comparisons)), not take the whole confidence."""
    full = [0.80, 0.82, 0.78, 0.81]
    alone = decide(_rows({FULL: full}), RULE, comparisons=3).learned
    beside = decide(_rows({FULL: full, "freeze k=2": full, "freeze k=6": full}), RULE).learned
    assert (alone.low, alone.high) == pytest.approx((beside.low, beside.high))
    assert decide(_rows({FULL: full}), RULE).learned.high < alone.high  # the rows' arms alone: narrower


def test_failed_and_diverged_rows_are_left_out_and_counted():
    scores = {FULL: [0.80, 0.82, 0.78, 0.81], "freeze k=2": [0.80, 0.82, 0.78, float("nan")]}
    result = decide(_rows(scores, status={("freeze k=2", 3): "diverged"}), RULE)
    assert result.arms[0].pairs == 3 and result.excluded == {"diverged": 1}


def test_the_interval_is_student_t():
    mean, low, high = interval(np.array([1.0, 2.0, 3.0]), 0.95)
    assert mean == 2.0 and (low, high) == pytest.approx(stats.t.interval(0.95, 2, loc=2, scale=stats.sem([1, 2, 3])))
    assert math.isnan(interval(np.array([1.0]), 0.95)[1])


def test_the_arms_seeds_follow_the_schedule_and_full_fine_tuning_runs_what_their_pairs_need():
    arms = ["freeze k=2", "freeze k=4"]
    full = [0.80, 0.82, 0.78, 0.81, 0.79, 0.80, 0.82, 0.78, 0.81]
    at_max = decide(_rows({FULL: full}), RULE, comparisons=3)  # learned at the budget, no arm run yet
    assert next_round(at_max, RULE, arms, {FULL: set(range(9))}) == [(arm, s) for arm in arms for s in (0, 1, 2)]
    uneven = decide(
        _rows({FULL: full[:5], "freeze k=2": [0.80, 0.85, 0.70], "freeze k=4": [0.80, 0.79, 0.83, 0.75, 0.9]}), RULE
    )
    cells = next_round(uneven, RULE, arms, {FULL: set(range(5)), "freeze k=2": {0, 1, 2}, "freeze k=4": set(range(5))})
    assert sorted(cells) == sorted(
        [(FULL, 5), (FULL, 6), ("freeze k=2", 3), ("freeze k=2", 4), ("freeze k=4", 5), ("freeze k=4", 6)]
    )  # k=2's seeds 3, 4 pair with stored ones
    diverged = decide(_rows({FULL: full[:3] + [float("nan")]}, status={(FULL, 3): "diverged"}), RULE, comparisons=3)
    assert (FULL, 3) not in next_round(diverged, RULE, arms, {FULL: {0, 1, 2, 3}})  # a final row: not run again


def test_a_learned_check_that_reopens_sends_seeds_to_full_fine_tuning_only():
    """The intervals hold at every look, not only the first that decides: a later look may straddle again."""
    reopened = decide(_rows({FULL: [0.52, 0.60, 0.50, 0.51, 0.58], "freeze k=2": [0.52, 0.61, 0.50]}), RULE)
    assert reopened.learned.decision == UNDECIDED
    assert next_round(reopened, RULE, ["freeze k=2"], {FULL: set(range(5)), "freeze k=2": {0, 1, 2}}) == [
        (FULL, 5),
        (FULL, 6),
    ]
    together = dataclasses.replace(RULE, learned_first=False)  # every arm from the first round: both run
    assert next_round(reopened, together, ["freeze k=2"], {FULL: set(range(5)), "freeze k=2": {0, 1, 2}}) == [
        (FULL, 5),
        (FULL, 6),
        ("freeze k=2", 3),
        ("freeze k=2", 4),
    ]
    at_budget = decide(_rows({FULL: [0.52, 0.60, 0.50, 0.55, 0.49, 0.58, 0.51, 0.56, 0.50]}), together, comparisons=2)
    assert next_round(at_budget, together, ["freeze k=2"], {FULL: set(range(9)), "freeze k=2": {0, 1, 2}}) == []


def test_collapsed_seeds_are_counted_with_an_exact_bound_and_left_out_of_quality():
    """The issue's arm: 0.01 above full fine-tuning when it trains, one seed of five collapsed to the
    baseline (0.3 below). Before: one Student-t interval over all five — a mean 0.05 below, its spread
    the collapse's — and no word of the collapse."""
    full = [0.80, 0.82, 0.78, 0.81, 0.79]
    arm = [0.811, 0.829, 0.791, 0.5, 0.801]  # seed 3: exactly the baseline, the constant predictor
    result = decide(_rows({FULL: full, "freeze k=2": arm}, baseline=0.5), RULE, comparisons=3)
    [k2] = result.arms
    alphas = RULE.alphas(3)
    diffs = np.array([0.011, 0.009, 0.011, 0.011])
    half = stats.t.ppf(1 - alphas.quality, 3) * diffs.std(ddof=1) / 2
    assert (k2.pairs, k2.seeds, k2.collapsed) == (4, 5, 1)
    assert k2.low == pytest.approx(diffs.mean() - half) and k2.decision == WITHIN
    assert k2.collapse_upper == pytest.approx(stats.beta.ppf(1 - alphas.stability, 2, 4))  # Clopper–Pearson, 1 of 5
    assert (k2.score, k2.reference) == pytest.approx(
        (np.mean([0.811, 0.829, 0.791, 0.801]), np.mean([0.8, 0.82, 0.78, 0.79]))
    )
    recorded = _rows({FULL: full, "freeze k=2": [0.811, 0.829, 0.791, 0.6, 0.801]}, baseline=0.5)
    recorded["collapsed"] = (recorded["arm"] == "freeze k=2") & (recorded["seed"] == 3)  # one class predicted
    assert decide(recorded, RULE, comparisons=3).arms[0].collapsed == 1


def test_every_seed_at_the_baseline_is_nothing_learned_once_its_collapse_rate_is_shown_above_half():
    """Before: identical differences (every trial the constant predictor) were an unknown spread, never
    decided: the sweep ran its whole budget and ended with no answer."""
    three = decide(_rows({FULL: [0.509] * 3}, baseline=0.509), RULE, comparisons=3)
    assert three.learned.decision == UNDECIDED and three.learned.collapsed == 3
    assert next_round(three, RULE, ["freeze k=2"], {FULL: {0, 1, 2}}) == [(FULL, 3), (FULL, 4)]  # full fine-tuning only
    ten = SettleRule(max_seeds=10)  # 3, 5, 7, 9, 10: five looks
    nine = decide(_rows({FULL: [0.509] * 9}, baseline=0.509), ten, comparisons=3)
    assert nine.learned.decision == UNDECIDED and nine.learned.collapse_lower < 0.5
    all_ten = decide(_rows({FULL: [0.509] * 10}, baseline=0.509), ten, comparisons=3)
    assert all_ten.learned.collapse_lower > 0.5  # exact: (α_nothing)^(1/10) with α_nothing = 0.15 × 0.05 / 5
    assert all_ten.learned.collapse_lower == pytest.approx((0.15 * 0.05 / 5) ** (1 / 10))
    assert all_ten.learned.decision == NOTHING_LEARNED and "collapses" in all_ten.learned.why
    assert next_round(all_ten, ten, ["freeze k=2"], {FULL: set(range(10))}) == []


def test_learned_and_nothing_learned_never_overlap():
    """One boundary, the tolerance: learned is a gain shown above it, nothing learned one shown below it.
    Before: learned was any gain above 0, so a gain shown between 0 and the tolerance was both."""
    small_gain = decide(_rows({FULL: [0.505, 0.510, 0.508, 0.512, 0.505]}, baseline=0.5), RULE, looks=1)
    g = small_gain.learned
    assert 0 < g.low and g.high > 0.01 and g.decision == UNDECIDED  # before: learned
    inside = decide(_rows({FULL: [0.5040, 0.5042, 0.5041, 0.5043, 0.5040]}, baseline=0.5), RULE, looks=1)
    assert 0 < inside.learned.low and inside.learned.high < 0.01 and inside.learned.decision == NOTHING_LEARNED
    above = decide(_rows({FULL: [0.60, 0.61, 0.62, 0.60, 0.61]}, baseline=0.5), RULE, looks=1)
    assert above.learned.low > 0.01 and above.learned.decision == LEARNED


def test_a_failed_seed_keeps_the_looks_on_the_schedule():
    """Seeds 0–4 of the arm with seed 3 failed: its four pairs are no count of the schedule (3, 5, 7, 9);
    the look sees the three of the last one it reached, as before, until seed 3 is run again. Before:
    decided at 4 pairs, a look beyond the L its confidence was shared by."""
    full = [0.80, 0.82, 0.78, 0.81, 0.79]
    arm = [0.80, 0.83, 0.77, 0.0, 0.795]
    failed = decide(_rows({FULL: full, "freeze k=2": arm}, status={("freeze k=2", 3): "failed"}), RULE)
    first_three = decide(_rows({FULL: full[:3], "freeze k=2": arm[:3]}), RULE)
    assert failed.arms[0].seeds == 3 and failed.arms[0].pairs == 3
    assert (failed.arms[0].low, failed.arms[0].high) == (first_three.arms[0].low, first_three.arms[0].high)
    assert failed.excluded == {"failed": 1}
    assert RULE.schedule == (3, 5, 7, 9) and SettleRule(max_seeds=10).schedule == (3, 5, 7, 9, 10)
    assert decide(_rows({FULL: full, "freeze k=2": arm[:3] + [0.805, 0.795]}), RULE).arms[0].seeds == 5  # on it


def test_within_is_a_one_sided_bound_as_wide_as_the_two_sided_interval_before():
    """The one-sided gain pays for the collapse bounds and the "worse" claim over every seed: "within"
    keeps exactly the power it had."""
    full = [0.80, 0.82, 0.78, 0.81, 0.79]
    arm = [0.795, 0.822, 0.775, 0.808, 0.788]
    k2 = decide(_rows({FULL: full, "freeze k=2": arm}), RULE).arms[0]
    diffs = np.array(arm) - np.array(full)
    before = stats.t.ppf(1 - 0.05 / (4 * 2) / 2, 4) * diffs.std(ddof=1) / math.sqrt(5)  # two-sided, α / (L m)
    assert diffs.mean() - k2.low == pytest.approx(before)  # one-sided at 0.5 α / (L m): what "within" had, no less
