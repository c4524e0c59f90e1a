"""What a settle sweep's rows are counted against (status, the report's completeness): the cells it ran
and its next round, never the budget's seeds of an arm decided early."""

import pandas as pd

from freezesweep.orchestrator.checks import load_spec
from freezesweep.orchestrator.plan import arm_of, build_grid, settle_scope, sweep_arms
from freezesweep.results.settle import FULL
from freezesweep.orchestrator.sweeps import resolve_here


def _rows(cells, scores: dict[int, list[float]]) -> pd.DataFrame:
    """ok rows for seeds 0..2 of each depth, with the given scores per depth."""
    picked = [c for c in cells if c.seed < 3]
    return pd.DataFrame(
        {
            "trial_id": [c.trial_id for c in picked],
            "status": "ok",
            "best_val_score": [scores[c.frozen_layers][c.seed] for c in picked],
            "baseline_score": 0.5,
        }
    )


def test_an_arm_decided_early_has_no_missing_cells(write_spec):
    spec = load_spec(
        write_spec(
            "scoped",
            train_sizes=[24],
            seeds=[],
            settle={"tolerance": 0.01, "initial_seeds": 3, "max_seeds": 5, "seeds_per_round": 1},
        ),
        semantic=False,
    )
    sweep = resolve_here(spec)
    cells = build_grid(sweep)
    assert len(cells) == 10  # 2 depths × the budget's 5 seeds
    settled = _rows(cells, {0: [0.90, 0.91, 0.92], 2: [0.60, 0.62, 0.61]})  # k=2 clearly worse: decided
    assert sorted(c.trial_id for c in settle_scope(sweep, cells, settled)) == sorted(settled["trial_id"])
    close = _rows(cells, {0: [0.90, 0.91, 0.92], 2: [0.905, 0.88, 0.93]})  # undecided: seed 3 is next
    scope = settle_scope(sweep, cells, close)
    assert sorted(c.seed for c in scope) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_the_arms_read_from_the_spec_are_the_grids_arms(write_spec):
    """The report walks the same sequence and counts the same Holm family as the rounds did (orchestrator/
    plan.py, the arms of a group's cells), read from the spec's variants: LoRA ranks and the probe too."""
    spec = load_spec(
        write_spec(
            "methods",
            methods=["freeze", "lora", "probe"],
            frozen_layers=[0, 1, "all"],
            lora_ranks=[2, 8],
            seeds=[],
            settle={"max_seeds": 3},
        ),
        semantic=False,
    )
    sweep = resolve_here(spec)
    group = [c for c in build_grid(sweep) if c.train_size == spec.train_sizes[0]]
    [arms] = sweep_arms(sweep).values()
    assert set(arms) == {arm_of(c) for c in group} - {FULL}
    assert sorted(arms) == ["freeze k=1", "freeze k=2", "lora r=2", "lora r=8", "probe"]
