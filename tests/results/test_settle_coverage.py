"""benchmarks/settle_coverage.py: its draws reproduce the reference study's published cells and its
judge reads each claim in its own words (a wrong count that is wrong would make every figure wrong)."""

import argparse
import importlib.util
import sys

import numpy as np
import pandas as pd
import pytest

from tests.conftest import REPO


@pytest.fixture(scope="module")
def coverage():
    spec = importlib.util.spec_from_file_location("settle_coverage", REPO / "benchmarks" / "settle_coverage.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["settle_coverage"] = module
    spec.loader.exec_module(module)
    return module


def test_five_values_per_cell_match_the_published_statistics(coverage):
    cells = pd.read_csv(coverage.REFERENCE)
    for _, cell in cells.iterrows():
        values = coverage.five_values(cell)
        assert (values.min(), np.median(values), values.max()) == pytest.approx(
            (cell["min"], cell["median"], cell["max"])
        )
    sst2 = cells[
        (cells["dataset"] == "glue/sst2") & (cells["train_size"] == 100) & (cells["frozen_layers"] == 10)
    ].iloc[0]
    assert coverage.five_values(sst2)[0] == 0.509  # the collapsed seed: exactly the majority baseline
    fitted = [coverage.five_values(c) for _, c in cells.iterrows()]
    close = [
        abs(v.mean() - c["mean"]) < 2e-3 and abs(v.std(ddof=1) - c["std"]) < 2e-3
        for v, (_, c) in zip(fitted, cells.iterrows())
    ]
    assert np.mean(close) > 0.9  # the rest: the published figures' rounding leaves no exact five


def test_ties_settle_as_nothing_learned_and_a_collapsing_arm_is_judged_in_its_own_words(coverage):
    args = argparse.Namespace(rho=0.5, tolerance=0.01, collapse_p=0.1, max_seeds=10)
    [ties] = coverage.scenario_worlds("ties", pd.read_csv(coverage.REFERENCE), args)
    rule = coverage.current.SettleRule()
    decision, trials = coverage.run_settle(ties, rule, coverage.current, ties.draw(np.random.default_rng(0), 10))
    assert decision.learned.decision == "nothing learned" and trials == 10  # full fine-tuning's 10 seeds alone
    judged = coverage.judge(decision, ties.truth, 0.01)
    assert judged["answered"] and not judged["wrong"]
    [six] = coverage.scenario_worlds("collapse-6", pd.read_csv(coverage.REFERENCE), args)
    assert six.truth.trained_diff["freeze k=1"] == pytest.approx(0.01)
    assert six.truth.mean_diff["freeze k=1"] == pytest.approx(0.9 * 0.86 + 0.1 * 0.56 - 0.85)  # −0.02
