"""The decision's words, each valid on its own: a regression task's constant predictor, a fixed grid not
all in, and no budget estimated from fewer trained pairs than any claim needs."""

import html

import pandas as pd
import pytest

from freezesweep.results.report import SweepRows, build_report, decisions
from freezesweep.results.settle import MIN_PAIRS, SettleRule
from freezesweep.results.store import ResultStore
from tests.results.test_report import MAJORITY, _stored_fixed_grid, regression_row, row


def test_the_regression_metrics_are_the_trial_packages():
    """results/ keeps its own copy (it imports no trial code): the two must name the same metrics."""
    from freezesweep.results.decision import REGRESSION_METRICS
    from freezesweep.trials.metrics import REGRESSION_METRICS as TRIALS

    assert REGRESSION_METRICS == TRIALS


@pytest.mark.parametrize("seeds", [1, 3, 12])
def test_a_regression_seed_at_the_constant_predictor_gave_one_value_not_one_class(tmp_path, seeds):
    """A walk-through's STS-B: "the one seed of full fine-tuning predicted one class (the constant
    predictor)", a class a regression has none of. 12 seeds show nothing is learned (its own sentence)."""
    store = ResultStore(str(tmp_path), "s")
    for seed in range(seeds):
        for k in (0, 2):
            store.write_row(regression_row(k, seed, 0.0))
    (decision,) = build_report([SweepRows.from_store(store)]).decisions.to_dict("records")
    said = decision["sentence"]
    assert decision["metric"] == "pearson" and "class" not in said, said
    assert (
        "collapsed (answered one value everywhere, or scored at most 10 % of the way from the constant "
        "predictor's (the train mean's) score" in said
    )
    if seeds == 12:
        assert said.startswith("d, n = 100: full fine-tuning did not learn at this size: it collapsed (answered")


@pytest.mark.parametrize("above", [0.0, 0.04])
def test_a_classifier_at_or_near_the_constant_predictor_collapsed(tmp_path, above):
    """At the majority class's accuracy, or a few rows above it (an audit: such seeds counted as trained broke
    the "within" bound), a seed collapsed: the sentence says what that means."""
    store = ResultStore(str(tmp_path), "s")
    for k in (0, 2):
        store.write_row(row(k=k, seed=0, acc=MAJORITY + above))
    (decision,) = build_report([SweepRows.from_store(store)]).decisions.to_dict("records")
    assert (
        "the one seed of full fine-tuning collapsed (answered one class everywhere, or scored at most 10 % of the "
        "way from the constant predictor's "
        "score to a perfect one)" in decision["sentence"]
    )


def test_a_fixed_grid_not_all_in_is_not_said_to_be_running(tmp_path):
    """A walk-through: after an interrupted launch, nothing running, "the grid is still running here (2 of
    6 cells in)". Rows cannot tell the two apart: both are said, with what runs the rest."""
    from freezesweep.orchestrator import api
    from tests.results.test_report import ACC_100

    cells, store = _stored_fixed_grid(tmp_path, 3)
    for cfg in cells:
        if cfg.seed < 2:
            k, seed = cfg.frozen_layers, cfg.seed
            store.write_row(row(k=k, seed=seed, acc=ACC_100[k][seed], trial_id=cfg.trial_id))
    (sentence,) = api.decide("s", store=str(tmp_path)).frame["sentence"]
    assert sentence.startswith(
        "d, n = 100: the grid is not all in here yet (4 of 6 cells in: running now, or interrupted — "
        "`freezesweep resume` runs the rest): a fixed grid is decided once"
    ), sentence
    assert "still running" not in sentence


def _two_seed_store(tmp_path) -> ResultStore:
    """Full fine-tuning well above the constant baseline on 2 seeds: too few to claim it learns."""
    store = ResultStore(str(tmp_path), "s")
    for k, accs in {0: [0.80, 0.86], 2: [0.79, 0.86]}.items():
        for seed, acc in enumerate(accs):
            store.write_row(row(k=k, seed=seed, acc=acc, cost=(1000, 1.0, 10.0)))
    return store


def test_no_budget_is_estimated_from_two_trained_seeds_of_a_fixed_grid(tmp_path):
    """A walk-through: 2 seeds said "11 seeds per arm would decide it"; the settle sweep run at 11 needed
    more than 100. A spread from fewer than MIN_PAIRS pairs is no basis for a number."""
    (record,) = build_report([SweepRows.from_store(_two_seed_store(tmp_path))]).decisions.to_dict("records")
    assert record["learned"] == "undecided" and pd.isna(record["decided_at_seeds"])
    assert "seeds per arm would decide" not in record["sentence"]
    assert "these seeds cannot say how many would, too few trained" in record["sentence"], record["sentence"]


def test_no_budget_is_estimated_from_two_trained_seeds_of_a_settle_sweep(tmp_path):
    """Its budget spent at 2 seeds: it says why there is no number, not "more than 100 would be needed"."""
    rule = SettleRule(initial_seeds=2, max_seeds=2)
    rows = SweepRows.from_store(_two_seed_store(tmp_path), rule=(rule, rule.looks, {}))
    (record,) = decisions([rows]).to_dict("records")
    assert record["learned"] == "undecided" and pd.isna(record["decided_at_seeds"])
    said = record["sentence"]
    assert f"an estimate from fewer than {MIN_PAIRS} trained pairs (2 here) would be a guess" in said, said
    assert "more seeds than 100" not in said and "seeds per arm would decide" not in said


def test_no_budget_for_a_depth_with_two_trained_pairs(tmp_path):
    """Full fine-tuning learns on 3 seeds; the open depth trained on 2 of them (one failed): no number."""
    store = ResultStore(str(tmp_path), "s")
    for seed, (full, frozen) in enumerate([(0.80, 0.796), (0.85, 0.838), (0.90, None)]):
        store.write_row(row(k=0, seed=seed, acc=full, cost=(1000, 1.0, 10.0)))
        failed = {} if frozen else {"status": "failed", "error": "CUDA out of memory"}
        store.write_row(row(k=2, seed=seed, acc=frozen, cost=(500, 1.0, 10.0), **failed))
    (record,) = build_report([SweepRows.from_store(store)]).decisions.to_dict("records")
    assert record["learned"] == "learned" and record["undecided"] == "k=2", record
    assert pd.isna(record["decided_at_seeds"]) and "seeds per arm would decide" not in record["sentence"]


def _full_fine_tuning_failed(tmp_path, diverged: int, collapsed: int) -> ResultStore:
    """Full fine-tuning diverged on the first ``diverged`` seeds, at the constant predictor on the next
    ``collapsed``; k = 2 and k = 4 trained on every seed (0.850 + 0.002 × seed); one k = 4 cell failed."""
    store = ResultStore(str(tmp_path), "s")
    for seed in range(diverged + collapsed):
        gone = seed < diverged
        store.write_row(row(k=0, seed=seed, acc=None if gone else MAJORITY, status="diverged" if gone else "ok"))
        for k in (2, 4):
            store.write_row(row(k=k, seed=seed, acc=0.85 + 0.002 * seed))
    store.write_row(row(k=4, seed=diverged + collapsed, status="failed"))
    return store


def test_full_fine_tuning_that_did_not_learn_is_not_said_of_the_depths_that_did(tmp_path):
    """An audit: full fine-tuning diverged on 6 seeds and predicted one class on 4, k = 2 and k = 4 trained
    at 0.85+: "nothing learned at this size: full fine-tuning predicted one class (the constant predictor)
    on 10 of 10 seeds (…); no freezing advice (left out: 6 diverged)" — the depths learned, 6 of the 10
    predicted nothing, and the 6 were counted twice. The bound is of collapsing or diverging."""
    from freezesweep.results.report import render_html, render_markdown

    report = build_report([SweepRows.from_store(_full_fine_tuning_failed(tmp_path, 6, 4))])
    (decision,) = report.decisions.to_dict("records")
    assert decision["learned"] == "nothing learned" and decision["not_tested"] == "k=2, k=4"
    assert decision["sentence"] == (
        "d, n = 100: full fine-tuning did not learn at this size: it collapsed (answered one class everywhere, or "
        "scored at most 10 % of the way "
        "from the constant predictor's score to a perfect one) on 4 of 10 seeds and diverged on 6 (one or the other on at least 61 % of seeds, 95 % family-wise); no "
        "freezing advice, since freezing is judged against full fine-tuning (observed, not claimed: k=2 trained on "
        "10 of 10 seeds, accuracy 0.859 on them; k=4 trained on 10 of 10 seeds, accuracy 0.859 on them; left out: "
        "1 failed)."
    )
    # the report's pages say it as the frame does
    assert html.escape(decision["sentence"]) in render_html("r", report)
    assert decision["sentence"] in render_markdown("r", report)


def test_full_fine_tuning_with_every_seed_failed_counts_each_kind(tmp_path):
    """3 seeds cannot show it: the sentence before said all 3 "predicted one class", 2 of them diverged."""
    (decision,) = decisions([SweepRows.from_store(_full_fine_tuning_failed(tmp_path, 2, 1))]).to_dict("records")
    assert decision["sentence"].startswith(
        "d, n = 100: all 3 seeds of full fine-tuning collapsed or diverged (1 collapsed, answered one class everywhere, or "
        "scored at most 10 % of the "
        "way from the constant predictor's score to a perfect one; 2 diverged): nothing learned as far as they show, but 3 seeds cannot "
        "show it at 95 % family-wise"
    ), decision["sentence"]
    assert decision["sentence"].endswith("no freezing advice (left out: 1 failed).")


@pytest.mark.parametrize(
    ("confidence", "printed"),
    [
        (0.95, "95"),
        (0.9725, "97.25"),
        (0.9775, "97.75"),
        (1 - 0.00125, "99.875"),
        (0.974971, "97.4"),
        (1 - 0.0275 * 0.0889, "99.7"),
    ],
)
def test_a_confidence_is_never_printed_above_what_it_is(confidence, printed):
    """An audit: 97.25 % printed "97.2 %" and 97.75 % "97.7 %" (round-half-even on a float), and a spent
    last look's 0.97497 "97.5 %" (above it): exact where 3 decimals say it, else rounded down."""
    from freezesweep.results.stats import confidence_pct

    assert confidence_pct(confidence) == printed


def test_rate_bounds_are_rounded_outward():
    """An upper bound printed to the nearest % can say less than was shown (80.4 % as "at most 80 %")."""
    from freezesweep.results.stats import lower_pct, upper_pct

    assert (upper_pct(0.804), upper_pct(0.80), lower_pct(0.606), lower_pct(0.61)) == ("81", "80", "60", "61")


def _stopped_depth(tmp_path) -> ResultStore:
    """k = 2 within; k = 6 hopeless by its own bound (−0.05 ± 0.011 over 3 seeds), not worse by Holm's."""
    store = ResultStore(str(tmp_path), "s")
    x = 0.01117
    for k, accs in {0: [0.80, 0.85, 0.90], 2: [0.801, 0.851, 0.899], 6: [0.75 - x, 0.80, 0.85 + x]}.items():
        for seed, acc in enumerate(accs):
            store.write_row(row(k=k, seed=seed, acc=acc, cost=(1000, 1.0, 10.0)))
    return store


@pytest.mark.parametrize("settle", [False, True])
def test_a_depth_stopped_on_an_estimate_says_it_is_one_and_runs_seeds_only_in_settle_mode(tmp_path, settle):
    """An audit: "(undecided: k=6 (… when trained: its seeds so far put it well below −0.01 when it trains:
    it runs no more seeds))" beside the advice, at a level no claim pays for (false in about 1 % of fixed
    grids at the boundary), printed as a fact — and in a fixed grid, which was never going to run more."""
    from freezesweep.results.settle import SettleRule

    rule = SettleRule(max_seeds=3)  # a settle sweep at its one look: the same numbers as the fixed grid's
    rows = SweepRows.from_store(_stopped_depth(tmp_path), rule=(rule, rule.looks, {}) if settle else None)
    (decision,) = decisions([rows]).to_dict("records")
    assert decision["frozen_layers"] == 2 and decision["undecided"] == "k=6"
    runs = ": it runs no more seeds" if settle else ""
    assert (
        f"(undecided: k=6 (-0.050 when trained: its seeds so far put it well below −0.01 when it trains{runs}; an "
        "estimate, not a claim))"
    ) in decision["sentence"], decision["sentence"]
    assert settle or "runs no more seeds" not in decision["sentence"]


def test_advice_where_full_fine_tuning_collapsed_on_some_seeds_says_so(tmp_path):
    """A review: every trained seed beats the baseline by the collapse line, so "learned" holds once 3 seeds
    train, however many collapsed; the advice then gives full fine-tuning's own collapses beside its own."""
    store = ResultStore(str(tmp_path), "s")
    full = [0.51, 0.52, 0.53, 0.86, 0.51, 0.87, 0.52, 0.88, 0.51, 0.53]  # 7 of 10 a few rows off the 0.5 majority
    for seed, acc in enumerate(full):
        store.write_row(row(k=0, seed=seed, acc=acc))
        store.write_row(row(k=2, seed=seed, acc=acc - 0.002 + 0.001 * (seed % 3)))
    (decision,) = decisions([SweepRows.from_store(store)]).to_dict("records")
    assert decision["learned"] == "learned" and decision["frozen_layers"] == 2, decision["sentence"]
    assert "on the same 3 seeds" in decision["sentence"]
    assert "; full fine-tuning collapsed or diverged on 7 of 10 seeds (at most " in decision["sentence"]


def test_no_depth_within_where_full_fine_tuning_collapsed_on_some_seeds_says_so_too(tmp_path):
    """As beside advice: "fine-tune every layer" where full fine-tuning itself collapsed on 7 of 10 seeds."""
    store = ResultStore(str(tmp_path), "s")
    full = [0.51, 0.52, 0.53, 0.86, 0.51, 0.87, 0.52, 0.88, 0.51, 0.53]
    for seed, acc in enumerate(full):
        store.write_row(row(k=0, seed=seed, acc=acc))
        store.write_row(row(k=2, seed=seed, acc=acc - 0.1 + 0.01 * (seed % 3)))
    (decision,) = decisions([SweepRows.from_store(store)]).to_dict("records")
    said = decision["sentence"]
    assert decision["learned"] == "learned" and said.startswith("d, n = 100: fine-tune every layer"), said
    assert "; full fine-tuning collapsed or diverged on 7 of 10 seeds (at most " in said
