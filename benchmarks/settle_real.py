"""Settle mode on real trials, beside the fixed grid at its budget: the same decisions, at what share of
the trials? (issue 22, 4b)

Two launches of one sweep on the real model and data: first in settle mode (rounds of seeds only where a
comparison is undecided, results/settle.py), timed, its decisions taken as the rule takes them (one-sided
bounds valid over every look the budget allows, on the seeds that trained; "collapsed": seeds at the
constant baseline or diverged, of those looked at; "worse bound": the lesser of the two upper bounds that
decide "worse", over the pairs where both trained and in mean with the arm's collapses, each at its share
of Holm's level); then the same sweep as a fixed grid of ``max_seeds`` seeds for
every arm, which reuses the settle run's trials (the same cells: ids are content hashes) and runs the
rest, its decisions taken once at the end (one look). Prints both side by side per (train size, arm)
with the trials each needed.

    python benchmarks/settle_real.py [--train-sizes 50 200] [--frozen-layers 0 2 4 6]
        [--max-seeds 12] [--tolerance 0.02] [--together] [--store ./sweeps] [--name settle-real]

The defaults are the reference protocol (full SST-2 validation set, 10 epochs, lr 5e-5, batch 16,
evaluation every half epoch) on the offline MiniLM-L6, two trials at once on a 2-core CPU; the run is
resumable (run it again after an interruption).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from freezesweep.orchestrator.checks import validate
from freezesweep.orchestrator.launch import launch
from freezesweep.orchestrator.plan import build_grid
from freezesweep.orchestrator.spec import SpecError
from freezesweep.orchestrator.sweeps import resolve_here
from freezesweep.results.settle import FULL, NOTHING_LEARNED, UNDECIDED, SettleRule, decide, variant_label
from freezesweep.results.store import ResultStore

MOOT = "moot: nothing learned"
KEEP = ["arm", "seed", "score", "baseline_score", "status"]
COLUMNS = [
    "trial_id",
    "method",
    "frozen_layers",
    "lora_rank",
    "train_size",
    "seed",
    "status",
    "best_val_score",
    "baseline_score",
]  # not the curves


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2")
    parser.add_argument("--dataset", default="glue/sst2")
    parser.add_argument("--train-sizes", nargs="+", type=int, default=[50, 200])
    parser.add_argument("--frozen-layers", nargs="+", type=int, default=[0, 2, 4, 6])
    parser.add_argument("--tolerance", type=float, default=0.02)
    parser.add_argument("--initial-seeds", type=int, default=3)
    parser.add_argument("--max-seeds", type=int, default=12)
    parser.add_argument("--seeds-per-round", type=int, default=1)
    parser.add_argument(
        "--together", action="store_true", help="every arm from the first round (settle.learned_first: false)"
    )
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--cpus-per-trial", type=float, default=1.0)
    parser.add_argument("--store", default="./sweeps")
    parser.add_argument("--name", default="settle-real")
    return parser.parse_args()


def spec_of(args: argparse.Namespace, settle: bool):
    """The sweep in settle mode, or the fixed grid of max_seeds seeds: the same cells either way."""
    raw = {
        "name": args.name,
        "model": args.model,
        "datasets": [args.dataset],
        "train_sizes": args.train_sizes,
        "frozen_layers": args.frozen_layers,
        "training": {"precision": args.precision},
        "resources": {"gpus_per_trial": 0, "cpus_per_trial": args.cpus_per_trial},
        "store": args.store,
    }
    if settle:
        raw["settle"] = {
            "tolerance": args.tolerance,
            "initial_seeds": args.initial_seeds,
            "max_seeds": args.max_seeds,
            "seeds_per_round": args.seeds_per_round,
            "learned_first": not args.together,
        }
    else:
        raw["seeds"] = list(range(args.max_seeds))
    return validate(raw, "settle_real benchmark")


def arms_of(spec, store: ResultStore) -> pd.DataFrame:
    """The sweep's rows of this grid in results/settle.py's terms (arm, seed, score, …) with train_size."""
    ids = {c.trial_id for c in build_grid(resolve_here(spec))}
    rows = store.read_table(columns=COLUMNS).to_pandas()
    rows = rows[rows["trial_id"].isin(ids)]
    arm = [variant_label(m, k, r) for m, k, r in zip(rows["method"], rows["frozen_layers"], rows["lora_rank"])]
    return rows.assign(arm=arm, score=rows["best_val_score"])[["train_size", *KEEP]]


def decisions(rows: pd.DataFrame, rule: SettleRule, looks: int | None, arms: list[str]) -> pd.DataFrame:
    """Per (train size, arm): the decision, its paired seeds and interval, and the trials the arm ran. An
    arm of a group that learns nothing is moot: no freezing advice whatever its interval says (learned
    first runs none of them)."""
    table = []
    for size, group in rows.groupby("train_size"):
        decision = decide(group[KEEP], rule, looks, arms)
        trials = group["arm"].value_counts()
        moot = decision.learned.decision == NOTHING_LEARNED
        for c in (decision.learned, *decision.arms):
            arm = FULL if c.arm == "learned" else c.arm  # full fine-tuning against the baseline
            table.append(
                {
                    "train_size": size,
                    "arm": c.arm,
                    "decision": MOOT if moot and arm != FULL else c.decision,
                    "pairs": c.pairs,
                    "interval": f"[{c.low:+.3f}, {c.high:+.3f}]",
                    "collapsed": f"{c.collapsed}/{c.seeds}",
                    "worse bound": "—" if c.arm == "learned" else f"{np.fmin(c.high_worse, c.high_all):+.3f}",
                    "trials": int(trials.get(arm, 0)),
                    "advice": decision.advice or "none",
                }
            )
    return pd.DataFrame(table)


def side_by_side(settle: pd.DataFrame, fixed: pd.DataFrame) -> pd.DataFrame:
    """Both runs' decisions per (train size, arm); an arm settle mode never ran is moot where its group
    learned nothing, else "not run" (whether it learns was not shown at the budget)."""
    side = fixed.merge(settle, on=["train_size", "arm"], how="left", suffixes=(" fixed", " settle"))
    learned = settle[settle["arm"] == "learned"].set_index("train_size")["decision"]
    never = side["decision settle"].isna()
    side.loc[never, ["pairs settle", "trials settle"]] = 0
    side.loc[never, ["interval settle", "collapsed settle", "worse bound settle", "advice settle"]] = [
        "—",
        "—",
        "—",
        "none",
    ]
    side.loc[never, "decision settle"] = [
        MOOT if learned[n] == NOTHING_LEARNED else f"not run (learned: {learned[n]})"
        for n in side.loc[never, "train_size"]
    ]
    side = side.astype({"pairs settle": int, "trials settle": int})
    side = side[
        [
            "train_size",
            "arm",
            *(c for c in side.columns if c.endswith(" settle")),
            *(c for c in side.columns if c.endswith(" fixed")),
        ]
    ]
    return side.assign(same=side["decision settle"] == side["decision fixed"])


def main() -> None:
    args = parse_args()
    store = ResultStore(args.store, args.name)
    try:
        settle_spec, fixed_spec = spec_of(args, settle=True), spec_of(args, settle=False)
        started = time.perf_counter()
        launch(settle_spec)
        settle_s = time.perf_counter() - started
        settle_rows = arms_of(settle_spec, store)
        started = time.perf_counter()
        launch(fixed_spec)
        fixed_extra_s = time.perf_counter() - started
    except SpecError as exc:
        raise SystemExit(f"error: {exc}") from None
    rule = settle_spec.settle.rule()
    arms = [variant_label("freeze", k, None) for k in args.frozen_layers]
    settle = decisions(settle_rows, rule, None, arms)
    fixed_rows = arms_of(fixed_spec, store)
    fixed = decisions(fixed_rows, rule, 1, arms)  # a fixed grid is looked at once
    side = side_by_side(settle, fixed)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 20)
    print(
        f"\n{args.model} on {args.dataset}, tolerance {rule.tolerance}, confidence {rule.confidence}, "
        f"{rule.initial_seeds} initial seeds, +{rule.seeds_per_round} per round, max {rule.max_seeds} "
        f"(settle: {rule.looks} looks; fixed grid: one look at {rule.max_seeds} seeds)\n"
    )
    print(side.to_string(index=False))
    n_settle, n_fixed = len(settle_rows), len(fixed_rows)
    undecided = side[side["decision settle"] == UNDECIDED]
    advice = side.groupby("train_size")[["advice settle", "advice fixed"]].first()
    print(
        f"\ntrials: settle {n_settle}, fixed grid {n_fixed} ({n_settle / n_fixed:.0%}); "
        f"same decisions: {int(side['same'].sum())}/{len(side)}; undecided in settle mode: {len(undecided)}; "
        f"same advice: {int((advice['advice settle'] == advice['advice fixed']).sum())}/{len(advice)} train sizes"
    )
    print(f"wall: settle run {settle_s / 60:.1f} min, the fixed grid's other trials {fixed_extra_s / 60:.1f} min")


if __name__ == "__main__":
    main()
