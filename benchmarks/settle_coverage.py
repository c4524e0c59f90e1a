"""Settle mode's intervals under its own stopping, on results drawn like the reference study's.

For each (dataset, train size) group of the reference study (benchmarks/reference/roberta_base_blog.csv:
per-cell mean and spread of best accuracy over 5 seeds, roberta-base on SST-2 and CoLA), per-seed scores
are drawn with those means and spreads, paired across frozen depths with correlation --rho (a seed's
luck shared by every depth: the same head init and batch order), and run through settle mode's rounds
(results/settle.py) until the group is answered (nothing learned; or learned, every arm decided) or the
budget is spent. Printed:

- coverage: how often every interval of a group at its stop holds the true difference (arm − full
  fine-tuning, and full fine-tuning − the majority baseline) at once, against the nominal level;
- trials: settle mode's against the fixed grid at --max-seeds for every arm, and how often the fixed
  grid (its intervals taken once) reaches the same decisions (whether anything is learned; and where it
  is, each arm's decision).

--draws normal | skewed | clipped: normal draws; a right-skewed (gamma) luck of the same spread; normal
draws clipped to the majority baseline below (a run that learns nothing stays at the majority class).

    python benchmarks/settle_coverage.py [--rho 0.5] [--simulations 200] [--max-seeds 10] [--tolerance 0.01]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from freezesweep.results.settle import FULL, LEARNED, UNDECIDED, SettleRule, decide, next_round

REFERENCE = Path(__file__).resolve().parent / "reference" / "roberta_base_blog.csv"
COLUMNS = ["arm", "seed", "score", "baseline_score", "status"]
BASELINES = {"glue/sst2": 0.509, "glue/cola": 0.691}


def luck(rng: np.random.Generator, size: int, draws: str) -> np.ndarray:
    """Standardised draws (mean 0, sd 1) of one seed's luck."""
    if draws == "skewed":
        shape = 2.0
        return (rng.gamma(shape, 1.0, size) - shape) / np.sqrt(shape)
    return rng.standard_normal(size)


def simulate_group(cells: pd.DataFrame, baseline: float, rule: SettleRule, rho: float, draws: str,
                   rng: np.random.Generator) -> dict:
    """One group's settle run on drawn scores: its decisions, trials, and whether its intervals cover."""
    means = dict(zip(_arms(cells), cells["mean"]))
    spreads = dict(zip(_arms(cells), cells["std"].clip(lower=1e-3)))
    arms = [a for a in means if a != FULL]
    shared = luck(rng, rule.max_seeds, draws)  # per seed: what every depth of that seed shares
    own = {arm: luck(rng, rule.max_seeds, draws) for arm in means}
    score = {arm: means[arm] + spreads[arm] * (np.sqrt(rho) * shared + np.sqrt(1 - rho) * own[arm]) for arm in means}
    if draws == "clipped":
        score = {arm: np.maximum(values, baseline) for arm, values in score.items()}
    rows, seeds_done = [], {}
    while True:
        decision = decide(pd.DataFrame(rows, columns=COLUMNS), rule, comparisons=len(means))
        wanted = next_round(decision, rule, arms, seeds_done)
        if not wanted:
            break
        rows += [(arm, seed, float(score[arm][seed]), baseline, "ok") for arm, seed in wanted]
        for arm, seed in wanted:
            seeds_done.setdefault(arm, set()).add(seed)
    truth = {arm: _true_mean(means, spreads, arm, baseline, draws) for arm in means}
    covered = all(c.low <= truth[c.arm] - truth[FULL] <= c.high for c in decision.arms if not np.isnan(c.low))
    covered &= np.isnan(decision.learned.low) or decision.learned.low <= truth[FULL] - baseline <= decision.learned.high
    fixed = decide(pd.DataFrame([(arm, s, float(score[arm][s]), baseline, "ok") for arm in means
                                 for s in range(rule.max_seeds)],
                                columns=COLUMNS), rule, looks=1)
    return {"trials": len(rows), "fixed_trials": len(means) * rule.max_seeds, "covered": covered,
            "answered": _answered(decision, arms),
            "same": _decisions(decision) == _decisions(fixed)}


def _true_mean(means, spreads, arm, baseline, draws) -> float:
    """The population mean the draws have (clipping at the baseline moves it: estimated by a large draw)."""
    if draws != "clipped":
        return means[arm]
    z = np.random.default_rng(0).standard_normal(400_000)
    return float(np.maximum(means[arm] + spreads[arm] * z, baseline).mean())


def _answered(decision, arms: list[str]) -> bool:
    """Nothing learned, or learned with every arm decided: the group's question has its answer."""
    if decision.learned.decision != LEARNED:
        return decision.learned.decision != UNDECIDED
    return len(decision.arms) == len(arms) and all(c.decision != UNDECIDED for c in decision.arms)


def _decisions(decision) -> tuple:
    """What the user is told: whether anything is learned, and only then each arm's decision (a group
    that learns nothing gets no freezing advice, whatever its arms' intervals say)."""
    if decision.learned.decision != LEARNED:
        return (decision.learned.decision,)
    return decision.learned.decision, tuple((c.arm, c.decision) for c in decision.arms)


def _arms(cells: pd.DataFrame) -> list[str]:
    return [f"freeze k={int(k)}" for k in cells["frozen_layers"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rho", type=float, default=0.5, help="pairing correlation of a seed's luck across depths")
    parser.add_argument("--simulations", type=int, default=200)
    parser.add_argument("--max-seeds", type=int, default=10)
    parser.add_argument("--initial-seeds", type=int, default=3)
    parser.add_argument("--seeds-per-round", type=int, default=2)
    parser.add_argument("--tolerance", type=float, default=0.01)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--together", action="store_true",
                        help="every arm from the first round (settle.learned_first: false)")
    parser.add_argument("--draws", choices=["normal", "skewed", "clipped"], default="normal")
    args = parser.parse_args()
    rule = SettleRule(args.tolerance, args.confidence, args.initial_seeds, args.max_seeds, args.seeds_per_round,
                      learned_first=not args.together)
    reference = pd.read_csv(REFERENCE)
    rng = np.random.default_rng(0)
    results = pd.DataFrame([
        {"dataset": dataset, "train_size": n, **simulate_group(cells, BASELINES[dataset], rule, args.rho, args.draws, rng)}
        for _ in range(args.simulations) for (dataset, n), cells in reference.groupby(["dataset", "train_size"])])
    print(f"{args.simulations} simulations × {results.groupby(['dataset', 'train_size']).ngroups} groups, rho "
          f"{args.rho}, {args.draws} draws, tolerance {args.tolerance}, budget {args.max_seeds} seeds "
          f"({rule.looks} looks), {'learned first' if rule.learned_first else 'every arm from the first round'}")
    print(f"coverage (every interval of a group at its stop): {results['covered'].mean():.3f} "
          f"(nominal {args.confidence})")
    print(f"trials: settle {results['trials'].sum():,} against the fixed grid's {results['fixed_trials'].sum():,} "
          f"({100 * results['trials'].sum() / results['fixed_trials'].sum():.0f} %); groups answered "
          f"{results['answered'].mean():.1%}; the fixed grid reaches the same decisions in "
          f"{results['same'].mean():.1%} of the groups")
    table = results.groupby(["dataset", "train_size"]).agg(coverage=("covered", "mean"), trials=("trials", "mean"),
                                                            fixed=("fixed_trials", "mean"), same=("same", "mean"))
    print(table.round(3).to_string())


if __name__ == "__main__":
    main()
