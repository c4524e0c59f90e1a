"""results/settle.py: decisions that hold however often they are looked at, on recorded sequences whose
answers are computed here by hand, and never a decision the data cannot support.

The levels by hand (confidence 0.95, α = 0.05): the "within" sequence (learned first) 0.55 α = 0.0275 per
claim, Holm over "worse" 0.1 α = 0.005, "nothing learned" Holm over its two claims at 0.3 α = 0.015,
collapse bounds 0.05 α / (arms + 1); each times its look's weight (a fixed grid: 1)."""

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from freezesweep.results.settle import (
    FULL,
    LAST_LOOK,
    LEARNED,
    NOT_TESTED,
    NOTHING_LEARNED,
    UNDECIDED,
    WITHIN,
    WORSE,
    SettleRule,
    decide,
    holm,
    interval,
    look_weights,
    next_round,
    open_arms,
    seeds_to_decide,
)

RULE = SettleRule(tolerance=0.01, confidence=0.95, initial_seeds=3, max_seeds=9, seeds_per_round=2)
ALPHA = 0.05
WITHIN_LEVEL, WORSE_LEVEL, NOTHING_LEVEL = 0.55 * ALPHA, 0.1 * ALPHA, 0.3 * ALPHA
FULL_SCORES = [0.80, 0.82, 0.78, 0.81, 0.79]


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


def _shifted(diffs: list[float]) -> list[float]:
    return [f + d for f, d in zip(FULL_SCORES, diffs)]


def _lower(diffs, level: float) -> float:
    diffs = np.asarray(diffs)
    return diffs.mean() - stats.t.ppf(1 - level, len(diffs) - 1) * diffs.std(ddof=1) / math.sqrt(len(diffs))


def test_the_looks_of_a_budget_and_their_weights():
    """Bonferroni over the looks with uneven weights: most on the last look, the earlier ones rising."""
    assert RULE.looks == 1 + math.ceil((9 - 3) / 2) == 4 and SettleRule(initial_seeds=3, max_seeds=3).looks == 1
    weights = RULE.look_weights
    assert sum(weights) == pytest.approx(1) and weights[-1] == LAST_LOOK
    assert list(weights) == sorted(weights) and weights[0] < 0.01  # three seeds can decide only the obvious
    assert look_weights((10,)) == (1.0,)  # a fixed grid pays nothing for looks
    # the earlier looks in the proportions of O'Brien–Fleming's boundary z·sqrt(n_last / n), z = 2
    tails = [stats.norm.sf(2 * math.sqrt(9 / n)) for n in (3, 5, 7)]
    assert weights[:3] == pytest.approx([(1 - LAST_LOOK) * t / sum(tails) for t in tails])


def test_a_sequence_stopped_by_its_first_undecided_depth_decides_as_computed_by_hand():
    """k = −1 within; k = 2 straddles the boundary, so the sequence stops there: k = 4, within by its own
    bound, is not tested (its estimate is kept), and the advice is k = −1. "Worse" is Holm's over the four
    depths: k = 6 at its first step, 0.1 α / 4, its trained pairs' bound at 1/10 of it, its mean's at 9/10.
    One look: each at its full level."""
    diffs = {
        "freeze k=-1": [0.002, -0.001, 0.003, 0.000, 0.001],
        "freeze k=2": [0.01, -0.03, 0.02, -0.02, 0.0],
        "freeze k=4": [0.002, -0.001, 0.003, 0.000, 0.001],
        "freeze k=6": [-0.30, -0.28, -0.29, -0.31, -0.30],
    }
    result = decide(_rows({FULL: FULL_SCORES, **{a: _shifted(d) for a, d in diffs.items()}}, 0.4), RULE, looks=1)
    arms = {c.arm: c for c in result.arms}
    assert [c.arm for c in result.arms] == list(diffs)  # the sequence's order: the least frozen first
    assert arms["freeze k=-1"].low == pytest.approx(_lower(diffs["freeze k=-1"], WITHIN_LEVEL))
    assert arms["freeze k=-1"].low > -0.01 and arms["freeze k=-1"].decision == WITHIN
    assert _lower(diffs["freeze k=2"], WITHIN_LEVEL) < -0.01 < -_lower(-np.array(diffs["freeze k=2"]), WORSE_LEVEL / 3)
    assert arms["freeze k=2"].decision == UNDECIDED and "straddle" in arms["freeze k=2"].why
    k4 = arms["freeze k=4"]
    assert k4.clears and k4.decision == NOT_TESTED and "stopped at freeze k=2" in k4.why
    assert k4.mean == pytest.approx(0.001)  # its estimate, reported beside "not tested"
    k6 = arms["freeze k=6"]
    assert k6.decision == WORSE
    assert k6.high_worse == pytest.approx(-_lower(-np.array(diffs["freeze k=6"]), 0.1 * WORSE_LEVEL / 4))
    assert k6.high_all == pytest.approx(-_lower(-np.array(diffs["freeze k=6"]), 0.9 * WORSE_LEVEL / 4))
    assert (result.advice, result.stopped_at) == ("freeze k=-1", "freeze k=2")
    # more seeds go to k = 2 only: k = 4 already clears, k = 6 is shown worse
    assert open_arms(result, list(diffs), RULE.tolerance) == ["freeze k=2"]


def test_the_gatekeeper_holds_the_depths_back_until_learned_holds():
    """Full fine-tuning's gain is not shown above the tolerance: no depth is tested, however clear its own
    bound, and only full fine-tuning runs next (learned first)."""
    unsure = [0.56, 0.95, 0.56, 0.90, 0.57]  # every seed trained (above 0.55, the collapse margin), widely spread
    close = [s + d for s, d in zip(unsure, [0.001, 0.0, 0.002, 0.001, 0.0015])]
    result = decide(_rows({FULL: unsure, "freeze k=2": close}), RULE, looks=1)
    assert result.learned.decision == UNDECIDED and result.advice is None
    [k2] = result.arms
    assert k2.clears and k2.decision == NOT_TESTED and "not shown to learn" in k2.why
    assert next_round(result, RULE, ["freeze k=2"], {FULL: set(range(5)), "freeze k=2": set(range(5))}) == [
        (FULL, 5),
        (FULL, 6),
    ]


def test_holm_steps_down_where_bonferroni_would_stop():
    """Holm 1979 by hand: levels α/6, α/5, α/4 in the order of the p-values; the second claim passes at
    α/5 where Bonferroni's α/6 would refuse it; the third fails and stops the procedure."""
    shown, levels = holm({"a": 0.0001, "b": 0.0009, "c": 0.02, "d": 0.0005}, 0.005, 6)
    assert shown == {"a", "d", "b"}
    assert levels == pytest.approx({"a": 0.005 / 6, "d": 0.005 / 5, "b": 0.005 / 4, "c": 0.005 / 3})
    assert 0.0009 > 0.005 / 6  # Bonferroni over the six would not have shown b
    none, stopped = holm({"a": 0.01, "b": 0.02}, 0.005, 4)
    assert none == set() and stopped == pytest.approx({"a": 0.005 / 4, "b": 0.005 / 4})


def test_a_claim_tested_by_two_bounds_is_shown_where_one_clears_its_share():
    """Holm 1979 over claims, one of them ("w") tested by two p-values at 4/5 and 1/5 of its step's level (a
    weighted Bonferroni test): at the first step of three (0.005 / 3) w's first test fails its 4/5 and its
    second clears its 1/5; then "a" at 0.005 / 2. Each test is held to its share of the step's level."""
    tests = {"w": {"w1": 0.8, "w2": 0.2}}
    shown, held = holm({"w1": 0.002, "w2": 0.0003, "a": 0.0024}, 0.005, 3, tests=tests)
    assert shown == {"w", "a"} and held == pytest.approx({"w1": 0.8 * 0.005 / 3, "w2": 0.2 * 0.005 / 3, "a": 0.0025})
    neither, held = holm({"w1": 0.002, "w2": 0.0004, "a": 0.0024}, 0.005, 3, tests=tests)
    assert neither == set() and held["w2"] == pytest.approx(0.2 * 0.005 / 3)  # 0.0004 > 0.00033: stops there
    with pytest.raises(ValueError, match="a family of 1 claims cannot hold 2"):
        holm({"w1": 0.001, "w2": 0.9, "a": 0.9}, 0.05, 1, tests=tests)
    with pytest.raises(ValueError, match="'v'.*sum to at most 1.*'w1' is in more than one claim"):
        holm({"w1": 0.001}, 0.05, 3, tests={**tests, "v": {"w1": 0.5, "v2": 0.6}})


def test_worse_when_it_trains_is_shown_through_a_collapse_and_in_mean_where_it_mostly_collapses():
    """Ten seeds, one look. k = 2 is 0.06 below full fine-tuning when it trains and collapses once: its
    collapse (−0.36) widens the mean's bound past −0.01 (alone, as before 2026-11-29, it was undecided), the
    trained pairs' bound does not. k = 4 collapses on 8 of 10: two trained pairs say nothing, the mean says
    worse."""
    full = [0.85, 0.87, 0.86, 0.84, 0.88, 0.85, 0.86, 0.87, 0.84, 0.86]
    shift = [0.01, -0.01, 0.0, 0.005, -0.005, 0.01, -0.01, 0.0, 0.005, -0.005]
    k2 = [f - 0.06 + d for f, d in zip(full, shift)]
    k2[3] = 0.5  # a collapse, at the baseline
    k4 = [0.5] * 8 + [full[8] - 0.02, full[9] - 0.02]
    scores = {FULL: full, "freeze k=2": k2, "freeze k=4": k4}
    arms = {c.arm: c for c in decide(_rows(scores, baseline=0.5), RULE, looks=1).arms}
    assert arms["freeze k=2"].decision == WORSE
    assert arms["freeze k=2"].high_all > -0.01 > arms["freeze k=2"].high_worse
    assert -_lower(-np.array([a - f for a, f in zip(k2, full)]), WORSE_LEVEL / 2) > -0.01  # the mean's at the whole
    assert arms["freeze k=4"].decision == WORSE
    assert arms["freeze k=4"].pairs == 2 and arms["freeze k=4"].high_all < -0.01


def test_other_methods_and_worse_are_decided_by_holm_over_their_claims():
    """LoRA ranks and the probe are not on the sequence of depths: their "within" claims join every arm's
    "worse" in Holm's family, with 0.1 α moved to it from the sequence's share (0.45 α left for it)."""
    lora = [0.002, -0.001, 0.003, 0.000, 0.001]
    probe = [-0.30, -0.28, -0.29, -0.31, -0.30]
    scores = {FULL: FULL_SCORES, "lora r=8": _shifted(lora), "probe": _shifted(probe), "freeze k=2": _shifted(lora)}
    result = decide(_rows(scores, 0.4), RULE, looks=1)
    arms = {c.arm: c for c in result.arms}
    assert result.levels.within == pytest.approx(0.45 * ALPHA) and result.levels.holm == pytest.approx(0.2 * ALPHA)

    def p(diffs, above):  # by hand: the one-sided t p-value against −tolerance
        t_stat = (np.mean(diffs) + 0.01) / stats.sem(diffs)
        return stats.t.sf(t_stat, 4) if above else stats.t.cdf(t_stat, 4)

    claims = {
        "within lora": p(lora, True),
        "within probe": p(probe, True),
        "worse lora": p(lora, False),
        "worse probe": p(probe, False),
        "worse k=2": p(lora, False),
    }
    worse = {f"worse {a}": {f"worse {a}": 0.9, f"trained {a}": 0.1} for a in ("lora", "probe", "k=2")}
    claims |= {f"trained {a}": claims[f"worse {a}"] for a in ("lora", "probe", "k=2")}  # no collapse: the same
    shown, _ = holm(claims, 0.2 * ALPHA, 5, tests=worse)
    assert shown == {"within lora", "worse probe"}
    assert arms["lora r=8"].decision == WITHIN and arms["probe"].decision == WORSE
    assert result.advice == "freeze k=2"  # advice comes from the depths only


def test_learneds_bound_does_not_depend_on_how_many_arms_the_grid_has():
    """The gatekeeper is tested at the sequence's full level: before, its interval was shared by every
    comparison of the grid (1 − 0.5 α / (looks × comparisons))."""
    alone = decide(_rows({FULL: FULL_SCORES}), RULE, arms=["freeze k=2"]).learned
    wide = decide(_rows({FULL: FULL_SCORES}), RULE, arms=[f"freeze k={k}" for k in range(1, 13)]).learned
    assert (alone.low, alone.high) == (wide.low, wide.high)
    gains = np.array(FULL_SCORES) - 0.5
    assert alone.low == pytest.approx(_lower(gains, WITHIN_LEVEL * RULE.look_weights[1]))  # 5 seeds: look 2


def test_identical_paired_differences_and_full_fine_tuning_at_the_baseline_give_no_advice():
    """The demo's n = 50 before: identical differences (a zero-width t interval); full fine-tuning at the
    majority class. No claim from either."""
    degenerate = decide(_rows({FULL: FULL_SCORES, "freeze k=6": [s + 0.004 for s in FULL_SCORES]}), RULE, looks=1)
    [k6] = degenerate.arms
    assert k6.decision == UNDECIDED and "spread is unknown" in k6.why and degenerate.advice is None
    # just above a baseline near the top: trained (above the collapse margin, 0.002 here), a gain below 0.01
    at_baseline = decide(
        _rows({FULL: [0.9856, 0.9851, 0.9859, 0.9853], "freeze k=6": [0.9836, 0.9861, 0.9838, 0.9851]}, baseline=0.98),
        RULE,
        looks=1,
    )
    assert at_baseline.learned.decision == NOTHING_LEARNED and at_baseline.advice is None
    assert next_round(at_baseline, RULE, ["freeze k=6"], {FULL: set(range(4)), "freeze k=6": set(range(4))}) == []
    few = decide(_rows({FULL: FULL_SCORES[:2], "freeze k=3": [0.79, 0.83]}, 0.4), RULE, looks=1)
    assert few.learned.decision == UNDECIDED and "fewer than 3" in few.learned.why and few.advice is None


def test_the_next_round_goes_to_open_depths_nearest_deciding_first():
    scores = {
        FULL: FULL_SCORES[:3],
        "freeze k=2": _shifted([0.01, -0.03, 0.02]),  # undecided, near the boundary
        "freeze k=4": _shifted([0.05, -0.09, 0.02]),  # undecided, wide
        "freeze k=6": _shifted([-0.3, -0.28, -0.31]),
    }
    learned = decide(_rows({FULL: FULL_SCORES}, 0.4), RULE)
    assert learned.learned.decision == LEARNED
    decision = decide(_rows({**scores, FULL: FULL_SCORES}, 0.4), RULE)
    done = {arm: {0, 1, 2} for arm in scores} | {FULL: set(range(5))}
    cells = next_round(decision, RULE, ["freeze k=2", "freeze k=4", "freeze k=6"], done)
    assert cells == [("freeze k=2", 3), ("freeze k=2", 4), ("freeze k=4", 3), ("freeze k=4", 4)]
    assert [c.decision for c in decision.arms] == [UNDECIDED, NOT_TESTED, NOT_TESTED]  # k=6: no "worse" at 3 seeds
    together = dataclasses.replace(RULE, learned_first=False)
    first = next_round(decide(_rows({}), together), together, ["freeze k=2", "freeze k=6"], {})
    assert sorted(set(seed for _, seed in first)) == [0, 1, 2] and len(first) == 9  # initial seeds for all arms


def test_learned_first_runs_the_arms_only_once_full_fine_tuning_beats_the_baseline():
    """The real run's n = 50 spent 15 of its 21 trials on the arms of a group that learned nothing."""
    arms = ["freeze k=2", "freeze k=6"]
    assert next_round(decide(_rows({}), RULE, arms=arms), RULE, arms, {}) == [(FULL, 0), (FULL, 1), (FULL, 2)]
    open_question = decide(_rows({FULL: [0.56, 0.95, 0.57]}), RULE, arms=arms)  # a gain, or none?
    assert open_question.learned.decision == UNDECIDED
    assert next_round(open_question, RULE, arms, {FULL: {0, 1, 2}}) == [(FULL, 3), (FULL, 4)]  # full fine-tuning only
    nothing = decide(_rows({FULL: [0.9845, 0.9840, 0.9850]}, baseline=0.98), RULE, looks=1, arms=arms)
    assert nothing.learned.decision == NOTHING_LEARNED and next_round(nothing, RULE, arms, {FULL: {0, 1, 2}}) == []
    learned = decide(_rows({FULL: FULL_SCORES}), RULE, arms=arms)
    assert learned.learned.decision == LEARNED
    # the arms catch up on full fine-tuning's seeds, their initial ones first: no new full fine-tuning trial
    assert next_round(learned, RULE, arms, {FULL: set(range(5))}) == [(arm, s) for arm in arms for s in (0, 1, 2)]
    unsure = [0.555, 0.99, 0.56, 0.56, 0.557, 0.56, 0.556, 0.98, 0.555]  # all trained (above 0.55), two far above
    at_budget = decide(_rows({FULL: unsure}), RULE, arms=arms)
    assert at_budget.learned.decision == UNDECIDED
    assert next_round(at_budget, RULE, arms, {FULL: set(range(9))}) == []  # no advice can come of the arms


@pytest.mark.parametrize(
    ("near", "collapses"), [(0.509, True), (0.511, True), (0.535, True), (0.557, True), (0.56, False)]
)
def test_a_seed_a_few_rows_off_the_constant_predictor_collapsed(near, collapses):
    """An audit: SST-2 seeds at 0.511-0.535 (the majority's 0.509; the reference study has them) were trained
    seeds, rare far outliers in the "within when it trains" bound, which then claimed within for an arm whose
    trained mean was far below (33-60 % of simulated sweeps). Up to a tenth of the way to a perfect score (0.558
    here) a seed collapsed: counted beside the others, not paired; above it, it trained."""
    full = [0.880, 0.870, 0.890, 0.875, 0.885]
    arm = [full[0] - 0.002, full[1] - 0.004, near, full[3] - 0.003, full[4] - 0.0025]
    [k2] = decide(_rows({FULL: full, "freeze k=2": arm}, baseline=0.509), RULE, looks=1).arms
    assert (k2.collapsed, k2.pairs) == ((1, 4) if collapses else (0, 5))
    assert (k2.decision == WITHIN) is collapses  # paired, it is far below: no claim of within


def test_failed_and_diverged_rows_are_left_out_and_counted():
    scores = {FULL: FULL_SCORES[:4], "freeze k=2": FULL_SCORES[:3] + [float("nan")]}
    result = decide(_rows(scores, status={("freeze k=2", 3): "diverged"}), RULE, looks=1)
    assert result.arms[0].pairs == 3 and result.arms[0].collapsed == 1 and result.excluded == {"diverged": 1}


def test_the_interval_is_student_t():
    mean, low, high = interval(np.array([1.0, 2.0, 3.0]), 0.95)
    assert mean == 2.0 and (low, high) == pytest.approx(stats.t.interval(0.95, 2, loc=2, scale=stats.sem([1, 2, 3])))
    assert math.isnan(interval(np.array([1.0]), 0.95)[1])


def test_the_arms_seeds_follow_the_schedule_and_full_fine_tuning_runs_what_their_pairs_need():
    arms = ["freeze k=2", "freeze k=4"]
    full = FULL_SCORES + [0.80, 0.82, 0.78, 0.81]
    at_max = decide(_rows({FULL: full}), RULE, arms=arms)  # learned at the budget, no arm run yet
    assert next_round(at_max, RULE, arms, {FULL: set(range(9))}) == [(arm, s) for arm in arms for s in (0, 1, 2)]
    uneven = decide(
        _rows({FULL: full[:5], "freeze k=2": [0.80, 0.85, 0.70], "freeze k=4": [0.80, 0.79, 0.83, 0.75, 0.9]}), RULE
    )
    cells = next_round(uneven, RULE, arms, {FULL: set(range(5)), "freeze k=2": {0, 1, 2}, "freeze k=4": set(range(5))})
    assert sorted(cells) == sorted(
        [(FULL, 5), (FULL, 6), ("freeze k=2", 3), ("freeze k=2", 4), ("freeze k=4", 5), ("freeze k=4", 6)]
    )  # k=2's seeds 3, 4 pair with stored ones
    diverged = decide(_rows({FULL: full[:3] + [float("nan")]}, status={(FULL, 3): "diverged"}), RULE, arms=arms)
    assert (FULL, 3) not in next_round(diverged, RULE, arms, {FULL: {0, 1, 2, 3}})  # a final row: not run again


def test_a_learned_check_that_reopens_sends_seeds_to_full_fine_tuning_only():
    """The bounds hold at every look, not only the first that decides: a later look may straddle again."""
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


def test_collapsed_seeds_are_counted_with_an_exact_bound_and_left_out_of_quality():
    """An arm 0.01 above full fine-tuning when it trains, one seed of five collapsed to the baseline."""
    arm = [0.811, 0.829, 0.791, 0.5, 0.801]  # seed 3: exactly the baseline, the constant predictor
    result = decide(_rows({FULL: FULL_SCORES, "freeze k=2": arm}, baseline=0.5), RULE)
    [k2] = result.arms
    weight = RULE.look_weights[1]  # five seeds: the second look
    diffs = np.array([0.011, 0.009, 0.011, 0.011])
    assert (k2.pairs, k2.seeds, k2.collapsed) == (4, 5, 1)
    assert k2.low == pytest.approx(_lower(diffs, WITHIN_LEVEL * weight)) and k2.decision == WITHIN
    stability = 0.05 * ALPHA / 2 * weight  # one arm and full fine-tuning share it
    assert k2.collapse_upper == pytest.approx(stats.beta.ppf(1 - stability, 2, 4))  # Clopper–Pearson, 1 of 5
    assert (k2.score, k2.reference) == pytest.approx(
        (np.mean([0.811, 0.829, 0.791, 0.801]), np.mean([0.8, 0.82, 0.78, 0.79]))
    )
    recorded = _rows({FULL: FULL_SCORES, "freeze k=2": [0.811, 0.829, 0.791, 0.6, 0.801]}, baseline=0.5)
    recorded["collapsed"] = (recorded["arm"] == "freeze k=2") & (recorded["seed"] == 3)  # one class predicted
    assert decide(recorded, RULE).arms[0].collapsed == 1


def test_every_seed_at_the_baseline_is_nothing_learned_once_its_collapse_rate_is_shown_above_half():
    """Nine of nine at the baseline is not yet enough at the fourth look's small weight; ten of ten at the
    last look is: Holm's first step of the two "nothing learned" claims, 0.15 α × 0.7."""
    ten = SettleRule(max_seeds=10)  # 3, 5, 7, 9, 10: five looks
    three = decide(_rows({FULL: [0.509] * 3}, baseline=0.509), ten)
    assert three.learned.decision == UNDECIDED and three.learned.collapsed == 3
    assert next_round(three, ten, ["freeze k=2"], {FULL: {0, 1, 2}}) == [(FULL, 3), (FULL, 4)]  # full fine-tuning only
    nine = decide(_rows({FULL: [0.509] * 9}, baseline=0.509), ten)
    assert nine.learned.decision == UNDECIDED and 0.5**9 > NOTHING_LEVEL / 2 * ten.look_weights[3]
    all_ten = decide(_rows({FULL: [0.509] * 10}, baseline=0.509), ten)
    assert all_ten.learned.collapse_lower == pytest.approx((NOTHING_LEVEL / 2 * LAST_LOOK) ** (1 / 10))
    assert all_ten.learned.decision == NOTHING_LEARNED and "collapses" in all_ten.learned.why
    assert next_round(all_ten, ten, ["freeze k=2"], {FULL: set(range(10))}) == []


def test_learned_and_nothing_learned_never_overlap():
    """One boundary, the tolerance: learned is a gain shown above it, nothing learned one shown below it."""
    # a baseline near the top: gains of 0.004-0.012 are trained seeds (above the collapse margin, 0.002)
    small_gain = decide(_rows({FULL: [0.985, 0.990, 0.988, 0.992, 0.985]}, baseline=0.98), RULE, looks=1)
    assert small_gain.learned.low > 0 and small_gain.learned.decision == UNDECIDED
    inside = decide(_rows({FULL: [0.9840, 0.9842, 0.9841, 0.9843, 0.9840]}, baseline=0.98), RULE, looks=1)
    assert 0 < inside.learned.low and inside.learned.high < 0.01 and inside.learned.decision == NOTHING_LEARNED
    above = decide(_rows({FULL: [0.60, 0.61, 0.62, 0.60, 0.61]}, baseline=0.5), RULE, looks=1)
    assert above.learned.low > 0.01 and above.learned.decision == LEARNED


def test_a_failed_seed_keeps_the_looks_on_the_schedule():
    """Seeds 0–4 of the arm with seed 3 failed: its four pairs are no count of the schedule (3, 5, 7, 9);
    the look sees the three of the last one it reached, until seed 3 is run again."""
    arm = [0.80, 0.83, 0.77, 0.0, 0.795]
    failed = decide(_rows({FULL: FULL_SCORES, "freeze k=2": arm}, status={("freeze k=2", 3): "failed"}), RULE)
    first_three = decide(_rows({FULL: FULL_SCORES[:3], "freeze k=2": arm[:3]}), RULE)
    assert failed.arms[0].seeds == 3 and failed.arms[0].pairs == 3
    assert (failed.arms[0].low, failed.arms[0].high) == (first_three.arms[0].low, first_three.arms[0].high)
    assert failed.excluded == {"failed": 1}
    assert RULE.schedule == (3, 5, 7, 9) and SettleRule(max_seeds=10).schedule == (3, 5, 7, 9, 10)
    assert decide(_rows({FULL: FULL_SCORES, "freeze k=2": arm[:3] + [0.805, 0.795]}), RULE).arms[0].seeds == 5


def test_the_last_looks_bound_is_narrower_than_the_rule_befores():
    """Before: 0.5 α / (L looks × m comparisons) at every look. Now a depth's last look costs 0.55 α × 0.7:
    with 7 arms and 5 looks, a t critical value of about 2.5 at 10 seeds instead of about 4.5."""
    rule = SettleRule(max_seeds=10)
    before = stats.t.ppf(1 - 0.5 * ALPHA / (5 * 8), 9)
    now = stats.t.ppf(1 - WITHIN_LEVEL * rule.look_weights[-1], 9)
    assert before > 4.4 and now < 2.6


def test_the_budget_that_would_decide_uses_the_new_last_looks_level():
    """seeds_to_decide prices a new budget at its own last look (0.55 α × 0.7 for "within")."""
    diffs = [0.002, -0.008, 0.005, -0.006, 0.001]
    result = decide(_rows({FULL: FULL_SCORES, "freeze k=2": _shifted(diffs)}, 0.4), RULE)
    [k2] = result.arms
    assert k2.decision == UNDECIDED
    budget = seeds_to_decide(k2, RULE, result.levels)
    spread, gap = np.std(diffs, ddof=1), np.mean(diffs) + 0.01
    level = WITHIN_LEVEL * dataclasses.replace(RULE, max_seeds=budget).look_weights[-1]
    assert stats.t.ppf(1 - level, budget - 1) * spread / math.sqrt(budget) < gap  # decides at the budget
    smaller = WITHIN_LEVEL * dataclasses.replace(RULE, max_seeds=budget - 1).look_weights[-1]
    assert budget - 1 <= RULE.max_seeds or stats.t.ppf(1 - smaller, budget - 2) * spread / math.sqrt(budget - 1) >= gap


def test_the_budget_for_an_arm_that_mostly_collapses_is_priced_by_its_mean_too():
    """Two of five seeds collapsed, the trained pairs 0.012 below on average: their bound alone would not
    show "worse" within 100 seeds; the mean with the collapses (−0.15, where full fine-tuning trained)
    would, at its share of Holm's first step (0.9), at the budget returned and not one seed before it."""
    full = [0.85, 0.87, 0.86, 0.84, 0.88]
    arm = [0.5, 0.5, full[2] - 0.012, full[3] - 0.003, full[4] - 0.02]
    result = decide(_rows({FULL: full, "freeze k=2": arm}), RULE)
    [k2] = result.arms
    assert k2.decision == UNDECIDED and (k2.pairs, k2.pairs_all, k2.collapsed) == (3, 5, 2)
    budget = seeds_to_decide(k2, RULE, result.levels)
    assert budget is not None and budget > RULE.max_seeds
    diffs = np.array(arm) - np.array(full)

    def clears(n: int) -> bool:  # every seed looked at (full fine-tuning trained on all 5): n differences
        level = 0.9 * result.levels.holm / result.levels.holm_family
        level *= dataclasses.replace(RULE, max_seeds=n).look_weights[-1]
        return stats.t.ppf(1 - level, n - 1) * diffs.std(ddof=1) / math.sqrt(n) < -0.01 - diffs.mean()

    assert clears(budget) and not clears(budget - 1)


def test_a_gap_in_the_seeds_holds_the_look_at_the_count_before_it():
    """Seed 3 failed, seeds 0–2 and 4–5 in: five seeds, but not seeds 0–4; a look at 5 now and another
    at 5 once seed 3 is in would be two looks at one count (only one was paid for). It stays at 3."""
    arm = [0.80, 0.83, 0.77, 0.0, 0.795, 0.81]
    full = [*FULL_SCORES, 0.80]
    gap = decide(_rows({FULL: full, "freeze k=2": arm}, status={("freeze k=2", 3): "failed"}), RULE)
    first_three = decide(_rows({FULL: full[:3], "freeze k=2": arm[:3]}), RULE)
    assert (gap.arms[0].seeds, gap.arms[0].pairs) == (3, 3)
    assert (gap.arms[0].low, gap.arms[0].level) == (first_three.arms[0].low, first_three.arms[0].level)


def test_worse_is_claimed_over_the_seeds_where_full_fine_tuning_trained():
    """Full fine-tuning's collapse (seed 3, at the baseline) would put a large positive difference among
    the arm's: a right skew under which the t bound is liberal. "Worse" leaves that seed out; the arm's
    own collapses stay in at their scores (a left skew, under which the bound is conservative)."""
    full = [0.80, 0.82, 0.78, 0.5, 0.79, 0.81]
    arm = [0.76, 0.77, 0.75, 0.74, 0.74, 0.77]
    (k2,) = decide(_rows({FULL: full, "freeze k=2": arm}, baseline=0.5), RULE, looks=1).arms
    kept = [0, 1, 2, 4, 5]
    assert k2.mean_all == pytest.approx(np.mean([arm[s] - full[s] for s in kept]))
    assert k2.decision == WORSE  # with seed 3's +0.24 in, its mean would be −0.0 and its spread ten times wider
    collapsing = [0.76, 0.5, 0.75, 0.74, 0.74, 0.77]  # the arm's own collapse at seed 1: in, at its score
    (own,) = decide(_rows({FULL: full, "freeze k=2": collapsing}, baseline=0.5), RULE, looks=1).arms
    assert own.mean_all == pytest.approx(np.mean([collapsing[s] - full[s] for s in kept]))


def test_the_last_look_spends_what_the_earlier_looks_left():
    """Bonferroni over nested looks leaves about a fifth of the sequence's level unspent. At the schedule's
    last look a depth's "within" is tested at the level that spends it (simulated: ``last_look_level``),
    never below Bonferroni's: here a t between the two critical values is within only so."""
    from freezesweep.results.settle import last_look_level

    exact = last_look_level((3, 5, 7, 9), WITHIN_LEVEL, RULE.look_weights)
    bonferroni = WITHIN_LEVEL * RULE.look_weights[-1]
    assert bonferroni * 1.15 < exact < WITHIN_LEVEL
    between = (stats.t.ppf(1 - bonferroni, 8) + stats.t.ppf(1 - exact, 8)) / 2
    z = np.array([-1.5, -1.0, -0.5, 0.0, 0.0, 0.0, 0.5, 1.0, 1.5])
    diffs = -0.01 + between * 0.01 / 3 + 0.01 * (z - z.mean()) / z.std(ddof=1)  # t = between, sd 0.01
    full = np.array([0.80, 0.82, 0.78, 0.81, 0.79, 0.80, 0.83, 0.77, 0.80])
    (k2,) = decide(_rows({FULL: list(full), "freeze k=2": list(full + diffs)}, 0.4), RULE).arms
    assert k2.level == pytest.approx(exact) and k2.decision == WITHIN
    assert k2.low == pytest.approx(_lower(diffs, exact)) and _lower(diffs, bonferroni) < -0.01 < k2.low


def test_the_last_looks_level_keeps_the_claims_error_within_its_level():
    """Another seed's nested normal samples at the boundary: crossing at any look (the earlier ones at
    Bonferroni's levels, the last at the spent one) stays within the level, and near it — at the sequence's
    level and at Holm's, down to its first step over six claims (Bonferroni's: 0.78–0.84 of each)."""
    from freezesweep.results.settle import last_look_level

    counts, weights = (3, 5, 7, 9, 10), SettleRule(max_seeds=10).look_weights
    draws = np.random.default_rng(7).standard_normal((400_000, 10))
    for claim_level in (WITHIN_LEVEL, NOTHING_LEVEL / 2, WORSE_LEVEL, WORSE_LEVEL / 6):
        levels = [claim_level * w for w in weights[:-1]] + [last_look_level(counts, claim_level, weights)]
        crossed = np.zeros(len(draws), dtype=bool)
        for n, level in zip(counts, levels):
            sample = draws[:, :n]
            crossed |= sample.mean(1) / (sample.std(1, ddof=1) / math.sqrt(n)) >= stats.t.ppf(1 - level, n - 1)
        assert 0.9 * claim_level < crossed.mean() <= claim_level


def test_worse_at_the_last_look_spends_what_its_earlier_looks_left_too():
    """Holm's claims spend the last look as the sequence's do: one arm, so "worse" is Holm's only claim, at
    0.1 α, its mean's bound at 9/10 of it; a t between Bonferroni's critical value and the spent one is worse
    only so, and that bound is at the spent level; its trained pairs' (the same differences: no collapse) is
    at 1/10 of 0.1 α, a level too small for the simulation's margin to spend (Bonferroni's), and alone would
    not show it."""
    from freezesweep.results.settle import last_look_level

    spent = last_look_level((3, 5, 7, 9), 0.9 * WORSE_LEVEL, RULE.look_weights)
    bonferroni = 0.9 * WORSE_LEVEL * RULE.look_weights[-1]
    assert bonferroni * 1.03 < spent < 0.9 * WORSE_LEVEL
    between = (stats.t.ppf(1 - bonferroni, 8) + stats.t.ppf(1 - spent, 8)) / 2
    z = np.array([-1.5, -1.0, -0.5, 0.0, 0.0, 0.0, 0.5, 1.0, 1.5])
    diffs = -0.01 - between * 0.01 / 3 + 0.01 * (z - z.mean()) / z.std(ddof=1)  # t = −between, sd 0.01
    full = np.array([0.80, 0.82, 0.78, 0.81, 0.79, 0.80, 0.83, 0.77, 0.80])
    (k2,) = decide(_rows({FULL: list(full), "freeze k=2": list(full + diffs)}, 0.4), RULE).arms
    assert k2.decision == WORSE and k2.clears_worse
    assert k2.high_all == pytest.approx(-_lower(-diffs, spent)) and -_lower(-diffs, bonferroni) > -0.01 > k2.high_all
    tenth = last_look_level((3, 5, 7, 9), 0.1 * WORSE_LEVEL, RULE.look_weights)
    assert tenth == pytest.approx(0.1 * WORSE_LEVEL * RULE.look_weights[-1])
    assert k2.high_worse == pytest.approx(-_lower(-diffs, tenth)) and k2.high_worse > -0.01
    (fixed,) = decide(_rows({FULL: list(full), "freeze k=2": list(full + diffs)}, 0.4), RULE, looks=1).arms
    assert fixed.decision == WORSE  # one look, at the whole level: no looks to pay for


def test_holm_holds_a_claim_to_its_least_bar_at_this_level_or_any_larger():
    """A claim's bar (level × its weight at that level) may dip at a larger level (a simulated last look's
    Monte Carlo noise); the step-down holds it to the least bar from its step's level up, so that a claim
    shown at one level is shown at every larger one (the nesting Holm's validity rests on)."""
    dips = {0.005 / 2: 0.5, 0.005: 0.1}  # the weight at each level of a two-claim ladder

    shown, held = holm({"a": 0.0009, "b": 0.2}, 0.005, 2, lambda claim, level: dips[level])
    assert shown == set() and held["a"] == pytest.approx(0.0005)  # not 0.00125: the bar at 0.005 is lower
    shown, held = holm({"a": 0.0004, "b": 0.2}, 0.005, 2, lambda claim, level: dips[level])
    assert shown == {"a"} and held == pytest.approx({"a": 0.0005, "b": 0.0005})
    nan_below = holm({"a": 0.001, "b": 0.9}, 0.05, 2, lambda claim, level: math.nan if level < 0.05 else 1.0)
    assert nan_below[0] == set()  # a bar that is not a number shows nothing, not the larger level's bar
    with pytest.raises(ValueError, match="a family of 1 claims cannot hold 2"):
        holm({"a": 0.001, "b": 0.9}, 0.05, 1)


def test_learned_at_the_last_look_is_tested_at_the_spent_level_too():
    """ "Learned" is the sequence's first claim (the gatekeeper): at the schedule's last look it spends what
    its earlier looks left, as each depth's "within" does."""
    from freezesweep.results.settle import last_look_level

    full = [0.60, 0.62, 0.58, 0.61, 0.59, 0.60, 0.63, 0.57, 0.60]
    result = decide(_rows({FULL: full, "freeze k=2": full}, 0.4), RULE)
    assert result.learned.level == pytest.approx(last_look_level((3, 5, 7, 9), WITHIN_LEVEL, RULE.look_weights))
    early = decide(_rows({FULL: full[:7], "freeze k=2": full[:7]}, 0.4), RULE)  # the third look: Bonferroni's
    assert early.learned.level == pytest.approx(WITHIN_LEVEL * RULE.look_weights[2])
