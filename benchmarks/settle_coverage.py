"""Settle mode's wrong decisions under its own stopping, on seeds drawn the way fine-tuning's fall.

Each scenario is a family of groups (one full fine-tuning arm, its frozen arms and the constant
baseline); each group is run through settle mode's rounds (results/settle.py: decide / next_round) until
it is answered or its budget is spent, and the same draws are decided by fixed grids. Counted per group:

- wrong: any claim the truth contradicts, in the claim's own words (family-wise); the nominal bound is
  1 − confidence. Today's rule claims means; the rule with collapses claims "within" and "learned" when a
  seed trains (the mean paired difference of trained seeds), "worse" when it trains or in mean where full
  fine-tuning trains (the arm's collapses in; rules before 2026-11-29 only the latter, and before it over every
  seed), and bounds each arm's collapse rate;
- false within: an arm said within the tolerance that is not (in the rule's own words); "within, mean
  worse": said within while its mean with collapses is below −tolerance (what "when it trains" excludes,
  and the collapse count says);
- answered: nothing learned, or learned with every arm decided; trials: the share of the budget's grid;
- worse shown: of the arms worse than full fine-tuning by more than the tolerance when they train or in mean
  where it trains (the truth), the share shown worse (a rate over every such arm of every group).

Scenarios (--scenarios, default all):
  reference    five values per reference cell (benchmarks/reference/roberta_base_blog.csv) matching its
               min, median, max, mean and std, resampled per seed, paired across depths (--rho: a seed's
               draw shared by every depth); a value at the majority baseline is a collapse
  normal       normal draws with each reference cell's mean and spread
  collapse     the same, each seed of every arm falling to the baseline with probability --collapse-p
  full-collapse 6 arms 0.04 below full fine-tuning when they train, full fine-tuning collapsing on 10 % of
               seeds (every seed: 0.005 below; where full fine-tuning trains: 0.04 below)
  collapse-6   6 arms 0.01 above full fine-tuning when they train, each seed collapsing 0.3 to the
               baseline with probability 0.1 (mean: 0.02 below)
  near-collapse 6 arms 0.003 below full fine-tuning when they train, each seed falling a few rows off the
               baseline (0.511-0.535 against 0.509) with probability 0.1: by a rule that counts those seeds
               as trained, each arm's trained mean is 0.036 below
  worse-collapse 6 arms 0.06 below full fine-tuning when they train, each seed collapsing to the baseline
               with probability 0.1 (an audit's: the collapse's left skew hid "worse" from the mean's bound)
  mostly-collapse 6 arms 0.02 below full fine-tuning when they train, collapsing with probability 0.7
  ties         every trial the constant predictor (every score exactly the baseline)
  boundary-6   6 arms exactly at −tolerance in mean (normal), full fine-tuning far above the baseline
  boundary-24  the same with 24 arms
  nothing-0    full fine-tuning's gain exactly 0 in mean (normal), 6 arms
  nothing-tol  full fine-tuning's gain exactly the tolerance, 6 arms
  non-monotone k = 2 and k = 6 at full fine-tuning's mean, k = 4 3 tolerances below, k = 8 far below (quality
               not monotone in k: the sequence stops at k = 4 and must still be right)

Rules: settle mode (this checkout's), and with --before REV today's rule (results/settle.py at git REV)
the same way; fixed grids of the budget's seeds and of settle mode's trials (rounded to whole seeds per
arm), each decided once by the same rule.

    python benchmarks/settle_coverage.py [--groups 400] [--tolerances 0.01 0.02 0.05] [--before 37044ef]
        [--scenarios reference ties] [--jobs 2]

Each scenario runs at least --groups groups (a 5 % rate needs about 400: its Monte Carlo standard error is
then 1.1 points); --jobs runs the scenarios in that many processes at once.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import inspect
import math
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from freezesweep.results import settle as current

REFERENCE = Path(__file__).resolve().parent / "reference" / "roberta_base_blog.csv"
BASELINES = {"glue/sst2": 0.509, "glue/cola": 0.691}
FULL = current.FULL


@dataclass(frozen=True)
class Truth:
    """What the claims are about: per arm (full fine-tuning included) the collapse rate, the mean score
    when it trains, the mean paired difference to full fine-tuning when both train, and with collapses."""

    collapse: dict[str, float]
    trained_diff: dict[str, float]  # arm − full fine-tuning, both trained; FULL: its gain over the baseline
    mean_diff: dict[str, float]  # arm − full fine-tuning with collapses; FULL: its mean gain
    worse_diff: dict[str, float]  # arm with its collapses − full fine-tuning where it trains ("worse" now)


@dataclass(frozen=True)
class World:
    arms: list[str]  # full fine-tuning first
    baseline: float
    truth: object  # (rule module) -> Truth: the claims' words say which seeds trained, and rules differ
    draw: object  # (rng, seeds) -> {arm: scores}


def trained_by(module):
    """The seeds a rule counts as trained: above its collapse margin (results/settle.py collapse_margin: a
    tenth of the way to a perfect score), or, in rules before it, any seed not exactly at the baseline."""
    margin = getattr(module, "collapse_margin", None)
    if margin is None:
        return lambda values, base: ~np.isclose(values, base, atol=1e-9)
    return lambda values, base: values - base > margin(base)


def sampled_truth(arms: list[str], baseline: float, scores: dict, trained) -> Truth:
    """The truth of a world whose draws fall near its baseline, where a rule's margin splits its normal
    seeds: each quantity of Truth over a large draw (400,000 seeds: its error ~1e-4 at a spread of 0.02)."""
    ok = {a: trained(scores[a], baseline) for a in arms}
    full, full_ok = scores[FULL], ok[FULL]
    collapse = {a: 1 - float(ok[a].mean()) for a in arms}
    trained_diff = {FULL: float(full[full_ok].mean() - baseline) if full_ok.any() else 0.0}
    mean_diff, worse_diff = {FULL: float(full.mean() - baseline)}, {}
    for arm in arms[1:]:
        diff, both = scores[arm] - full, full_ok & ok[arm]
        trained_diff[arm] = float(diff[both].mean()) if both.any() else 0.0
        mean_diff[arm] = float(diff.mean())
        worse_diff[arm] = float(diff[full_ok].mean()) if full_ok.any() else 0.0
    return Truth(collapse, trained_diff, mean_diff, worse_diff)


def normal_world(
    means: dict[str, float],
    spreads: dict[str, float],
    baseline: float,
    rho: float,
    collapse: dict[str, float] | None = None,
    near: tuple[float, float] | None = None,
) -> World:
    """Normal luck paired across arms (correlation rho); a seed collapses to the baseline with its arm's
    probability (with ``near``, to a score drawn uniformly between the two: a few rows off the baseline)."""
    collapse = collapse or {arm: 0.0 for arm in means}
    arms = [FULL, *sorted(a for a in means if a != FULL)]

    def draw(rng, seeds):
        shared = rng.standard_normal(seeds)
        scores = {}
        for arm in arms:
            luck = np.sqrt(rho) * shared + np.sqrt(1 - rho) * rng.standard_normal(seeds)
            values = means[arm] + spreads[arm] * luck
            fallen = baseline if near is None else rng.uniform(*near, seeds)
            scores[arm] = np.where(rng.random(seeds) < collapse[arm], fallen, values)
        return scores

    with_collapse = {a: (1 - collapse[a]) * means[a] + collapse[a] * baseline for a in arms}
    exact = Truth(
        dict(collapse),
        {a: means[a] - (baseline if a == FULL else means[FULL]) for a in arms},
        {a: with_collapse[a] - (baseline if a == FULL else with_collapse[FULL]) for a in arms},
        {a: with_collapse[a] - means[FULL] for a in arms},  # collapses drawn apart from full fine-tuning's
    )

    @functools.cache
    def truth(module) -> Truth:
        trained = trained_by(module)
        if near is None and all(trained(np.array([means[a] - 6 * spreads[a]]), baseline)[0] for a in arms):
            return exact  # no normal seed near the margin: only the drawn collapses fall below it
        return sampled_truth(arms, baseline, draw(np.random.default_rng(0), 400_000), trained)

    return World(arms, baseline, truth, draw)


def five_values(cell: pd.Series) -> np.ndarray:
    """Five values with the cell's min, median, max, mean and (sample) std; the two free ones solved
    from the sum and the sum of squares, clipped to their order."""
    low, mid, high, mean, std = cell["min"], cell["median"], cell["max"], cell["mean"], cell["std"]
    total = 5 * mean - low - mid - high
    squares = 4 * std**2 + 5 * mean**2 - low**2 - mid**2 - high**2
    spread = np.sqrt(max(0.0, 2 * squares - total**2))
    second, fourth = np.clip((total - spread) / 2, low, mid), np.clip((total + spread) / 2, mid, high)
    return np.array([low, second, mid, fourth, high])


def reference_world(cells: pd.DataFrame, baseline: float, rho: float) -> World:
    """Seeds resampled from each cell's five values, paired: with probability rho every depth takes the
    seed's shared rank, else its own."""
    values = {f"freeze k={int(k)}": five_values(c) for k, (_, c) in zip(cells["frozen_layers"], cells.iterrows())}
    arms = [FULL, *sorted(a for a in values if a != FULL)]

    def draw(rng, seeds):
        shared = rng.integers(0, 5, seeds)
        return {arm: values[arm][np.where(rng.random(seeds) < rho, shared, rng.integers(0, 5, seeds))] for arm in arms}

    weights = rho * np.eye(5) / 5 + (1 - rho) / 25  # joint law of (full's rank, the arm's rank)

    @functools.cache
    def truth(module) -> Truth:
        return _reference_truth(values, arms, baseline, weights, trained_by(module))

    return World(arms, baseline, truth, draw)


def _reference_truth(values: dict, arms: list[str], baseline: float, weights: np.ndarray, rule) -> Truth:
    trained = {arm: rule(values[arm], baseline) for arm in arms}
    collapse = {arm: 1 - trained[arm].mean() for arm in arms}
    trained_diff, mean_diff, worse_diff = {}, {}, {}
    full = values[FULL]
    trained_diff[FULL] = full[trained[FULL]].mean() - baseline if trained[FULL].any() else 0.0
    mean_diff[FULL] = full.mean() - baseline
    for arm in arms[1:]:
        both = weights * np.outer(trained[FULL], trained[arm])
        diff = values[arm][None, :] - full[:, None]
        trained_diff[arm] = float((both * diff).sum() / both.sum()) if both.sum() else 0.0
        mean_diff[arm] = float(values[arm].mean() - full.mean())
        where_full = weights * trained[FULL][:, None]
        worse_diff[arm] = float((where_full * diff).sum() / where_full.sum()) if where_full.sum() else 0.0
    return Truth(collapse, trained_diff, mean_diff, worse_diff)


def scenario_worlds(name: str, reference: pd.DataFrame, args) -> list[World]:
    groups = list(reference.groupby(["dataset", "train_size"]))
    cells = {key: (dict(zip(_arms(c), c["mean"])), dict(zip(_arms(c), c["std"]))) for key, c in groups}
    tol = args.tolerance
    synthetic = {FULL: 0.85}
    if name == "reference":
        return [reference_world(c, BASELINES[d], args.rho) for (d, _), c in groups]
    if name in ("normal", "collapse"):
        p = args.collapse_p if name == "collapse" else 0.0
        return [normal_world(m, s, BASELINES[d], args.rho, {a: p for a in m}) for (d, _), (m, s) in cells.items()]
    if name == "full-collapse":  # full fine-tuning collapses on 10 % of seeds: a right skew in "every seed"
        means = {FULL: 0.85, **{f"freeze k={k}": 0.81 for k in range(1, 7)}}
        collapse = {FULL: 0.1, **{a: 0.0 for a in means if a != FULL}}
        return [normal_world(means, dict.fromkeys(means, 0.01), 0.5, args.rho, collapse)]
    if name == "collapse-6":
        means = {FULL: 0.85, **{f"freeze k={k}": 0.86 for k in range(1, 7)}}
        collapse = {FULL: 0.0, **{a: 0.1 for a in means if a != FULL}}
        return [normal_world(means, dict.fromkeys(means, 0.01), 0.56, args.rho, collapse)]
    if name == "near-collapse":  # an audit's: a rule that misses a near miss claims "within" for an arm far below
        means = {FULL: 0.88, **{f"freeze k={k}": 0.877 for k in range(1, 7)}}
        collapse = {FULL: 0.0, **{a: 0.1 for a in means if a != FULL}}
        return [normal_world(means, dict.fromkeys(means, 0.01), 0.509, args.rho, collapse, near=(0.511, 0.535))]
    if name in ("worse-collapse", "mostly-collapse"):
        below, p = (0.06, 0.1) if name == "worse-collapse" else (0.02, 0.7)
        means = {FULL: 0.85, **{f"freeze k={k}": 0.85 - below for k in range(1, 7)}}
        collapse = {FULL: 0.0, **{a: p for a in means if a != FULL}}
        return [normal_world(means, dict.fromkeys(means, 0.02), 0.509, args.rho, collapse)]
    if name == "ties":
        means = {FULL: 0.509, **{f"freeze k={k}": 0.509 for k in (2, 4, 8)}}
        return [normal_world(means, dict.fromkeys(means, 0.02), 0.509, args.rho, dict.fromkeys(means, 1.0))]
    if name.startswith("boundary-"):
        means = {**synthetic, **{f"freeze k={k}": 0.85 - tol for k in range(1, int(name.split("-")[1]) + 1)}}
        return [normal_world(means, dict.fromkeys(means, 0.02), 0.5, args.rho)]
    if name == "non-monotone":  # k = 4 worse, k = 6 within: the sequence must stop at k = 4 and still be right
        means = {FULL: 0.85, "freeze k=2": 0.85, "freeze k=4": 0.85 - 3 * tol, "freeze k=6": 0.85, "freeze k=8": 0.7}
        return [normal_world(means, dict.fromkeys(means, 0.01), 0.5, args.rho)]
    if name.startswith("nothing-"):
        gain = 0.0 if name == "nothing-0" else tol
        means = {FULL: 0.5 + gain, **{f"freeze k={k}": 0.5 + gain for k in range(1, 7)}}
        return [normal_world(means, dict.fromkeys(means, 0.02), 0.5, args.rho)]
    raise ValueError(f"unknown scenario {name!r}")


def run_settle(world: World, rule, module, scores: dict) -> tuple[object, int]:
    """Settle mode's rounds on the drawn scores: its decision at the stop and the trials it ran."""
    rows, done = [], {}
    arms = world.arms[1:]
    while True:
        decision = module.decide(
            pd.DataFrame(rows, columns=["arm", "seed", "score", "baseline_score", "status"]),
            rule,
            **_grid(module, world),
        )
        wanted = module.next_round(decision, rule, arms, done)
        if not wanted:
            return decision, len(rows)
        rows += [(arm, seed, float(scores[arm][seed]), world.baseline, "ok") for arm, seed in wanted]
        for arm, seed in wanted:
            done.setdefault(arm, set()).add(seed)


def run_fixed(world: World, rule, module, scores: dict, seeds: int):
    rows = [(arm, s, float(scores[arm][s]), world.baseline, "ok") for arm in world.arms for s in range(seeds)]
    return module.decide(
        pd.DataFrame(rows, columns=["arm", "seed", "score", "baseline_score", "status"]),
        rule,
        looks=1,
        **_grid(module, world),
    )


def _grid(module, world: World) -> dict:
    """The grid's arms as the rule takes them: their labels (this rule), or their count (rules before it)."""
    if "arms" in inspect.signature(module.decide).parameters:
        return {"arms": world.arms}
    return {"comparisons": len(world.arms)}


def judge(decision, truth: Truth, tolerance: float, arms: list[str], module=current) -> dict:
    """Each claim against the truth, in its own words: a rule with collapse counts (Comparison.
    collapse_upper) claims quality when trained and collapse bounds; today's claims means. "Worse": when it
    trains or in mean where full fine-tuning trains (a rule with Comparison.high_worse), from 2682cfd on only
    the latter, over every seed before it."""
    stable = hasattr(decision.learned, "collapse_upper")
    worse_truth = truth.worse_diff if _worse_where_full_trains(module) else truth.mean_diff
    diffs = truth.trained_diff if stable else truth.mean_diff
    truly_worse = [a for a in arms if diffs[a] < -tolerance or worse_truth[a] < -tolerance]
    learned, wrong = decision.learned, False
    if learned.decision == current.LEARNED:
        wrong |= diffs[FULL] <= (tolerance if stable else 0.0)
    elif learned.decision == current.NOTHING_LEARNED:
        by_collapse = stable and "collapses" in learned.why
        wrong |= truth.collapse[FULL] <= 0.5 if by_collapse else diffs[FULL] > tolerance
    false_within = mean_worse = False
    for c in decision.arms:
        if c.decision == current.WITHIN:
            false_within |= diffs[c.arm] < -tolerance
            mean_worse |= truth.mean_diff[c.arm] < -tolerance
        elif c.decision == current.WORSE and hasattr(c, "high_worse"):  # when it trains, or in mean
            wrong |= diffs[c.arm] >= -tolerance and worse_truth[c.arm] >= -tolerance
        elif c.decision == current.WORSE:  # with the arm's collapses (the rule's words)
            wrong |= worse_truth[c.arm] >= -tolerance
        if stable and c.seeds:
            wrong |= truth.collapse[c.arm] > c.collapse_upper
    if stable and learned.seeds:
        wrong |= truth.collapse[FULL] > learned.collapse_upper
    return {
        "wrong": wrong or false_within,
        "false_within": false_within,
        "within_mean_worse": mean_worse,
        "answered": _answered(decision, arms, tolerance),
        "worse_arms": len(truly_worse),
        "worse_shown": sum(c.decision == current.WORSE for c in decision.arms if c.arm in truly_worse),
    }


def _worse_where_full_trains(module) -> bool:
    """Rules from 2682cfd on claim "worse" over the seeds where full fine-tuning trained (their docstring
    says so); the rules before, over every seed."""
    return module is current or "where full fine-tuning trained" in " ".join((module.__doc__ or "").split())


def _answered(decision, arms: list[str], tolerance: float) -> bool:
    """Nothing learned, or learned and no arm left whose seeds could change the advice (this rule:
    ``open_arms``: the depths behind one shown not within are never tested; rules before it: every arm
    decided)."""
    if decision.learned.decision != current.LEARNED:
        return decision.learned.decision != current.UNDECIDED
    if hasattr(decision, "stopped_at"):
        return not current.open_arms(decision, arms, tolerance)
    return all(c.decision != current.UNDECIDED for c in decision.arms)


def simulate(job: tuple) -> list[dict]:
    """One (tolerance, scenario): its groups (at least --groups of them: whole simulations of its worlds)
    through each rule's rounds and the fixed grids beside them."""
    tolerance, index, name, args = job
    args = argparse.Namespace(**{**vars(args), "tolerance": tolerance})
    worlds = scenario_worlds(name, pd.read_csv(REFERENCE), args)
    rules, rng, out = _rules(args), np.random.default_rng(index), []
    for _ in range(math.ceil(args.groups / len(worlds))):
        for world in worlds:
            budget = len(world.arms) * args.max_seeds
            scores = world.draw(rng, 4 * args.max_seeds)  # enough for any grid below
            for label, (module, rule) in rules.items():
                decision, trials = run_settle(world, rule, module, scores)
                runs = [(label, decision, trials / budget, module)]
                same = max(3, round(trials / len(world.arms)))
                for grid, seeds in (
                    ("fixed grid, same trials", same),
                    (f"fixed grid, {args.max_seeds} seeds", args.max_seeds),
                ):
                    fixed = run_fixed(world, rule, module, scores, seeds)
                    runs.append((f"{label}: {grid}", fixed, seeds * len(world.arms) / budget, module))
                out += [
                    {
                        "tolerance": tolerance,
                        "scenario": name,
                        "rule": rule_label,
                        "trials": share,
                        **judge(d, world.truth(rule_module), tolerance, world.arms[1:], rule_module),
                    }
                    for rule_label, d, share, rule_module in runs
                ]
    return out


def _rules(args) -> dict:
    """This checkout's rule, and with --before the rule at that revision (its slow scipy calls swapped for
    this module's, which compute the same numbers)."""
    shape = (args.tolerance, args.confidence, args.initial_seeds, args.max_seeds, args.seeds_per_round)
    rules = {"settle": (current, current.SettleRule(*shape))}
    for rev in args.before:
        before = rule_before(rev)
        before.interval = current.interval
        if hasattr(before, "collapse_bounds"):
            before.collapse_bounds = current.collapse_bounds
        rules[f"settle@{rev}"] = (before, before.SettleRule(*shape))
    return rules


@functools.cache
def rule_before(rev: str):
    """results/settle.py as it was at git ``rev``, imported on its own."""
    source = subprocess.run(
        ["git", "show", f"{rev}:results/settle.py"],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent,
    ).stdout
    name = f"settle_{rev}"
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _arms(cells: pd.DataFrame) -> list[str]:
    return [f"freeze k={int(k)}" for k in cells["frozen_layers"]]


SCENARIOS = [
    "reference",
    "normal",
    "collapse",
    "collapse-6",
    "near-collapse",
    "full-collapse",
    "ties",
    "boundary-6",
    "boundary-24",
    "nothing-0",
    "nothing-tol",
    "non-monotone",
    "worse-collapse",  # last, as scenarios added later: a scenario's draws follow its place in the list
    "mostly-collapse",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rho", type=float, default=0.5, help="pairing: how much of a seed's luck every depth shares")
    parser.add_argument("--groups", type=int, default=400, help="at least this many groups per scenario")
    parser.add_argument("--max-seeds", type=int, default=10)
    parser.add_argument("--initial-seeds", type=int, default=3)
    parser.add_argument("--seeds-per-round", type=int, default=2)
    parser.add_argument("--tolerances", type=float, nargs="+", default=[0.01, 0.02, 0.05])
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--collapse-p", type=float, default=0.1)
    parser.add_argument("--before", nargs="*", default=[], help="also the rules at these git revisions")
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=SCENARIOS)
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="processes")
    args = parser.parse_args()
    jobs = [(tol, i, name, args) for tol in args.tolerances for i, name in enumerate(args.scenarios)]
    started = time.perf_counter()
    with multiprocessing.Pool(args.jobs) as pool:
        rows = [row for part in pool.imap(simulate, jobs) for row in part]
    table = (
        pd.DataFrame(rows)
        .groupby(["tolerance", "scenario", "rule"], sort=False)
        .agg(
            groups=("wrong", "size"),
            wrong=("wrong", "mean"),
            false_within=("false_within", "mean"),
            within_mean_worse=("within_mean_worse", "mean"),
            answered=("answered", "mean"),
            trials=("trials", "mean"),
            worse_arms=("worse_arms", "sum"),
            worse_shown=("worse_shown", "sum"),
        )
    )
    table["worse_shown"] = table.pop("worse_shown") / table.pop("worse_arms")  # NaN: no arm worse
    print(
        f"at least {args.groups} groups per scenario; confidence {args.confidence} (wrong must stay ≤ "
        f"{1 - args.confidence:.3f}; Monte Carlo error of a rate p: sqrt(p(1 − p) / groups), 0.011 at 0.05 and 400), "
        f"budget {args.max_seeds} seeds; collapse p {args.collapse_p}; rho {args.rho}; "
        f"{time.perf_counter() - started:.0f} s"
    )
    with pd.option_context("display.width", 200, "display.max_rows", 1000):
        print(table.round(3).to_string())


if __name__ == "__main__":
    main()
