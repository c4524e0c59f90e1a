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


def test_plan_counts_a_settled_sweep_against_what_it_ran(write_spec):
    """Before: `plan` of a settled sweep said "the next round runs 0: settled" over a table of the budget's
    seeds never needed, "missing" (`status` counted them right)."""
    from freezesweep.orchestrator import api
    from freezesweep.orchestrator.rows import result_row
    from freezesweep.results.store import ResultStore
    from freezesweep.trials.config import TrialResult

    settle = {"tolerance": 0.01, "initial_seeds": 3, "max_seeds": 5, "seeds_per_round": 1}
    path = write_spec("settled", train_sizes=[24], seeds=[], settle=settle)
    spec = load_spec(path, semantic=False)
    cells = build_grid(resolve_here(spec))
    store = ResultStore(spec.store, "settled")
    store.write_spec(spec.to_yaml())
    scores = {0: [0.90, 0.91, 0.92], 2: [0.60, 0.62, 0.61]}  # k=2 clearly worse: decided at the first look
    for cell in cells:
        if cell.seed < 3:
            score = scores[cell.frozen_layers][cell.seed]
            result = TrialResult(trial_id=cell.trial_id, config=cell, status="ok", wall_time_s=1.0)
            row = result_row("settled", result) | {"best_val_score": score, "baseline_score": 0.5}
            store.write_row(row)
    planned = api.plan(path)
    total = planned.status[planned.status["axis"] == "total"].iloc[0]
    assert (len(planned.cells), len(planned.pending)) == (10, 0)  # the budget; nothing left to run
    assert (int(total["done"]), int(total["missing"])) == (6, 0)
