"""Deciding, with confidence that holds however often the rows are looked at, which arms of a group are
as good as full fine-tuning, and which seeds to run next to settle the rest.

A group is (sweep, dataset, train size) — with several models, per model. An arm is a frozen depth, a
LoRA rank or the probe; each is compared with full fine-tuning (``freeze k=0``) on paired seeds (the
same seed shares head initialisation and batch order: trials/config.py), and full fine-tuning with the
constant baseline (the majority class, the mean score), which says whether anything is learned at all.

The intervals are repeated confidence intervals (Jennison & Turnbull 1989, "Interim analyses: the
repeated confidence interval approach", JRSS-B 51:305–361; Group Sequential Methods, 2000, ch. 9) made
simultaneous by the Bonferroni inequality over every look a sweep may take and every comparison of its
group: at each look, a Student-t interval of the mean paired difference at level 1 − α / (L · m), where
L is the most looks the budget allows (``SettleRule.looks``) and m the group's comparisons (every arm
of the grid, whether or not it has run yet, and full fine-tuning against the baseline). Each comparison
is looked at only at seed counts on one schedule (initial_seeds, then seeds_per_round more, up to
max_seeds: at most L of them), whichever order the rounds take them in (learned first: next_round) —
as long as its rows are ok: a seed that failed (run again at the next launch) or diverged (left out)
moves its comparisons' pair counts off the schedule, a look or more beyond L for them.
Whatever the stopping rule — stopping a contrast as soon as it looks decided, looking after every
round — all of them hold at once with probability ≥ 1 − α for normal paired differences, so each
decision does too, and the multiplicity across arms is controlled with no assumption on how the arms
depend on each other (they share the k = 0 runs). Bonferroni over looks is more conservative than
Pocock's or O'Brien–Fleming's boundaries but needs no assumption on the looks' spacing;
benchmarks/settle_coverage.py measures the coverage on data drawn like the reference study's, skewed
and clipped draws included.

Honest by construction: no decision from fewer than MIN_PAIRS paired seeds or from an interval of zero
width (identical differences: their spread is not known, not zero), and no freezing advice for a group
where full fine-tuning does not beat the constant baseline (nothing learned at this size).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

MIN_PAIRS = 3
FULL = "freeze k=0"  # the arm every other is compared with
WITHIN, WORSE, UNDECIDED = "within", "worse", "undecided"
LEARNED, NOTHING_LEARNED = "learned", "nothing learned"


@dataclass(frozen=True)
class SettleRule:
    tolerance: float = 0.01  # how much below full fine-tuning still counts as as good
    confidence: float = 0.95  # that every decision of a group holds, whenever the sweep stops
    initial_seeds: int = 3  # paired seeds every arm gets before the first look
    max_seeds: int = 10  # the budget: no arm gets more
    seeds_per_round: int = 2  # added to each undecided arm at each later look
    learned_first: bool = True  # arms wait until full fine-tuning is known to beat the baseline (next_round)

    @property
    def looks(self) -> int:
        """The most looks a group can take: the first, then one per round until max_seeds."""
        return 1 + math.ceil(max(0, self.max_seeds - self.initial_seeds) / self.seeds_per_round)


FIXED_GRID = None  # a fixed grid is looked at once: decide(..., looks=1)


@dataclass(frozen=True)
class Comparison:
    arm: str  # e.g. "freeze k=3", "lora r=8", "probe"; "learned" for full fine-tuning against the baseline
    pairs: int
    mean: float  # mean paired difference (arm − full fine-tuning; full fine-tuning − baseline)
    low: float  # the simultaneous interval (NaN: none yet)
    high: float
    # within / worse / undecided; for full fine-tuning against the baseline: nothing learned (its gain's
    # interval lies below the tolerance), learned (above 0), undecided
    decision: str
    why: str = ""  # why undecided: too few seeds, zero width, straddles the boundary

    def nearness(self, tolerance: float) -> float:
        """How near deciding it is: its mean's distance from the boundary (−tolerance) in half-widths of
        its interval. Near 1, a little more data decides it; near 0, the truth sits on the boundary."""
        if math.isnan(self.low):
            return 0.0
        half = (self.high - self.low) / 2
        return abs(self.mean + tolerance) / half if half > 0 else 0.0


@dataclass(frozen=True)
class GroupDecision:
    learned: Comparison
    arms: tuple[Comparison, ...]
    seeds: int  # seeds of full fine-tuning so far (an arm's own pairs: Comparison.pairs)
    advice: str | None = None  # the most-frozen arm within the tolerance (None: no advice)
    excluded: dict[str, int] = field(default_factory=dict)  # status -> rows left out (failed, diverged, …)


def interval(diffs: np.ndarray, level: float) -> tuple[float, float, float]:
    """Mean and Student-t interval at ``level``; NaN bounds from fewer than two values."""
    from scipy import stats  # deferred on purpose: the spec's layer imports this module (SettleRule), scipy is slow

    diffs = np.asarray(diffs, dtype=float)
    mean = float(diffs.mean()) if len(diffs) else math.nan
    if len(diffs) < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(1 - (1 - level) / 2, len(diffs) - 1) * diffs.std(ddof=1) / math.sqrt(len(diffs)))
    return mean, mean - half, mean + half


def decide(group: pd.DataFrame, rule: SettleRule, looks: int | None = None, comparisons: int | None = None
           ) -> GroupDecision:
    """One group's decisions from its rows (columns: arm, seed, score, baseline_score, status).
    ``looks``: how many looks the intervals must survive (default: the rule's; 1 for a fixed grid);
    ``comparisons``: how many the confidence is shared by — the grid's arms, full fine-tuning's check
    against the baseline among them (default: those with rows). Learned first runs full fine-tuning
    alone at first: its interval must not take the whole confidence because the arms have no rows yet."""
    group = group.reindex(columns=["arm", "seed", "score", "baseline_score", "status"])  # also no rows yet
    ok = group[group["status"] == "ok"]
    excluded = group[group["status"] != "ok"]["status"].value_counts().to_dict()
    scores = ok.pivot(index="seed", columns="arm", values="score") if len(ok) else pd.DataFrame()
    arms = [a for a in scores.columns if a != FULL]
    level = 1 - (1 - rule.confidence) / ((looks or rule.looks) * max(comparisons or 0, len(arms) + 1))
    full = scores[FULL].dropna() if FULL in scores else pd.Series(dtype=float)
    baseline = ok.groupby("seed")["baseline_score"].first().reindex(full.index)
    learned = _compare("learned", (full - baseline).to_numpy(), level, rule.tolerance, learned=True)
    compared = tuple(_compare(arm, (scores[arm] - full).dropna().to_numpy(), level, rule.tolerance) for arm in arms)
    within = [c.arm for c in compared if c.decision == WITHIN and c.arm.startswith("freeze")]
    advice = max(within, key=_depth) if within and learned.decision == LEARNED else None
    return GroupDecision(learned, compared, len(full), advice, excluded)


def _compare(arm: str, diffs: np.ndarray, level: float, tolerance: float, learned: bool = False) -> Comparison:
    mean, low, high = interval(diffs, level)
    if len(diffs) < MIN_PAIRS:
        return Comparison(arm, len(diffs), mean, low, high, UNDECIDED, f"fewer than {MIN_PAIRS} paired seeds")
    if high - low <= 0:
        return Comparison(arm, len(diffs), mean, low, high, UNDECIDED, "identical differences: their spread is unknown")
    if learned:  # full fine-tuning against the constant baseline: no gain worth the tolerance, or a gain
        decision = NOTHING_LEARNED if high < tolerance else LEARNED if low > 0 else UNDECIDED
    else:  # an arm against full fine-tuning: no worse than the tolerance, or worse
        decision = WITHIN if low > -tolerance else WORSE if high < -tolerance else UNDECIDED
    return Comparison(arm, len(diffs), mean, low, high, decision,
                      "" if decision != UNDECIDED else "the interval straddles the boundary")


def variant_label(method: str, frozen_layers, lora_rank) -> str:
    """A method with its own axis value, an arm: "freeze k=2", "lora r=8", "probe"."""
    if method == "freeze":
        return f"freeze k={int(frozen_layers)}"
    if method == "lora":
        return f"lora r={int(lora_rank)}"
    return method


def _depth(arm: str) -> float:
    """How much a freeze arm freezes: k = -1 (embeddings only) sits between 0 and 1."""
    k = int(arm.split("=", 1)[1])
    return 0.5 if k == -1 else float(k)


def next_round(decision: GroupDecision, rule: SettleRule, arms: list[str],
               seeds_done: Mapping[str, Collection[int]]) -> list[tuple[str, int]]:
    """The (arm, seed) cells the next round runs for this group (``arms``: the group's arms in the grid,
    full fine-tuning aside; ``seeds_done``: per arm, full fine-tuning included, the seeds it has a row
    for). Nothing when the group is settled (nothing learned, or every arm of the grid decided) or at
    its budget. Each arm moves along one schedule of seed counts — ``initial_seeds``, then
    ``seeds_per_round`` more per round, never past ``max_seeds`` — so no comparison is looked at more
    often than ``rule.looks`` allows, whatever the order.

    Learned first (``rule.learned_first``): while it is open whether full fine-tuning beats the constant
    baseline, only full fine-tuning runs; an arm is worth nothing to a group that learns nothing (the
    real run's n = 50: 15 of its 21 trials were arms of such a group). Once it has learned, each
    undecided arm catches up on full fine-tuning's seeds (no new full fine-tuning trial), those nearest
    deciding first (``Comparison.nearness``: the order the cells are queued in); full fine-tuning runs a
    new seed only when an arm's pair needs it."""
    if decision.learned.decision == NOTHING_LEARNED:
        return []  # settled: no advice at this size (an arm with no row yet is not in decision.arms)
    full_done = set(seeds_done.get(FULL, ()))
    learned = decision.learned.decision == LEARNED
    full_asked = [] if learned else _next_seeds(full_done, rule)
    if not learned and not full_asked:
        return []  # whether it learns is open at the budget: no arm could be advised
    if not learned and rule.learned_first:
        return [(FULL, s) for s in full_asked]  # that question first
    compared = {c.arm: c for c in decision.arms}
    open_arms = sorted((a for a in arms if a not in compared or compared[a].decision == UNDECIDED),
                       key=lambda a: -compared[a].nearness(rule.tolerance) if a in compared else 0.0)
    arm_cells = [(arm, s) for arm in open_arms for s in _next_seeds(set(seeds_done.get(arm, ())), rule)]
    full_seeds = sorted(set(full_asked) | ({s for _, s in arm_cells} - full_done))  # every pair needs it
    return [*((FULL, s) for s in full_seeds), *arm_cells]


def _next_seeds(done: set[int], rule: SettleRule) -> list[int]:
    """An arm's next seeds on the schedule: up to the initial seeds, else seeds_per_round more (at most
    max_seeds in all), the lowest seeds it has not run."""
    on_schedule = rule.initial_seeds if len(done) < rule.initial_seeds else len(done) + rule.seeds_per_round
    target = min(rule.max_seeds, on_schedule)
    return list(itertools.islice((s for s in itertools.count() if s not in done), max(0, target - len(done))))
