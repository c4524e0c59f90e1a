"""Deciding, with confidence that holds however often the rows are looked at, which arms of a group are
as good as full fine-tuning when they train, how often they do not, and which seeds to run next.

A group is (sweep, dataset, train size) — with several models, per model. An arm is a frozen depth, a
LoRA rank or the probe; each is compared with full fine-tuning (``freeze k=0``) on paired seeds (the
same seed shares head initialisation and batch order: trials/config.py), and full fine-tuning with
the constant baseline (the majority class, the mean score), which says whether anything is learned at all.

Two claims per arm, because fine-tuning's seeds are not normal: a seed either trains, or it collapses
(its best evaluation scores exactly the constant baseline: it never left the constant predictor) or
diverges (Mosbach et al. 2021, "On the Stability of Fine-tuning BERT"; Dodge et al. 2020). A Student-t
interval over seeds with collapses among them covers far less often than it says (a collapse is rare
enough to be missing from the first looks, large enough to move the mean), and no rule can bound a
mean from ≤ 10 such seeds without an assumption. So:

- quality is decided on the seeds where both sides trained ("within the tolerance of full fine-tuning
  when it trains"): a Student-t bound of the mean paired difference;
- stability is counted on every seed looked at (``Comparison.collapsed``), with an exact one-sided
  Clopper–Pearson upper bound on the arm's collapse rate (``collapse_upper``). No assumption.

Every claim is one-sided — "within" needs only the lower bound above −tolerance, "worse" only the upper
bound below it, and a truth can contradict at most one of the two — and every claim holds with the others
at once, by Bonferroni's inequality over looks and claims (weighted; repeated confidence intervals:
Jennison & Turnbull 1989, JRSS-B 51:305–361), which needs no assumption on how the arms depend on each
other (they share the k = 0 runs) or on the looks' spacing. Of the error α = 1 − confidence, per look
(L: the most looks the budget allows, ``SettleRule.looks``; m: the group's comparisons, every arm of the
grid whether or not it has run yet, and full fine-tuning against the baseline):

- QUALITY_SHARE · α / (L · m) to each quality bound: "within" (the lower bound, on trained pairs), and for
  full fine-tuning "learned" and "nothing learned" (its gain's two bounds: at most one can be wrong);
- WORSE_SHARE · α / (L · m) to each arm's "worse": the upper bound of its mean paired difference over every
  seed looked at, collapses at their scores (an arm that mostly collapses is worse, though its trained
  pairs are too few to say how it does when it trains; left-skewed differences make this upper bound
  conservative, not liberal);
- STABILITY_SHARE · α / (L · m) to each collapse upper bound;
- NOTHING_SHARE · α / L to full fine-tuning's collapse lower bound (nothing learned: it collapses on
  most seeds; one claim, so 10 of 10 seeds at the baseline settle it within a budget of 10).

Every look is paid for: a comparison is looked at only at seed counts on its schedule (``SettleRule.
schedule``: initial_seeds, then seeds_per_round more, up to max_seeds). When a failed seed (run again
at the next launch) leaves it between two counts, the seeds beyond the last count it reached wait, so a
look sees the same seeds as the one before and is no new look. A rule that changes on a sweep with rows
is refused (orchestrator/checks.py): its past looks were paid at the old level.

"Learned" and "nothing learned" never overlap: full fine-tuning has learned when its gain over the
constant baseline, when it trains, is shown above the tolerance (its lower bound > tolerance); nothing is
learned when it is shown below it (upper bound < tolerance), or when it is shown to collapse on most
seeds (the lower bound of its collapse rate > 1/2: every seed at the baseline is such a fact, not an
unknown spread). No decision from fewer than MIN_PAIRS trained pairs or from a quality bound of zero
width (identical differences of trained seeds: their spread is not known, not zero), and no freezing
advice where nothing is learned.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

MIN_PAIRS = 3
FULL = "freeze k=0"  # the arm every other is compared with
WITHIN, WORSE, UNDECIDED = "within", "worse", "undecided"
LEARNED, NOTHING_LEARNED = "learned", "nothing learned"
COLUMNS = ["arm", "seed", "score", "baseline_score", "status", "collapsed"]  # collapsed: optional (derived)
FINAL = ("ok", "diverged")  # a seed with one of these is looked at; others (failed, oom) run again
COLLAPSE_ATOL = 1e-9  # a score this near its constant baseline is the constant predictor's
QUALITY_SHARE, WORSE_SHARE, STABILITY_SHARE, NOTHING_SHARE = 0.5, 0.2, 0.15, 0.15  # of α: see the docstring


@dataclass(frozen=True)
class SettleRule:
    tolerance: float = 0.01  # how much below full fine-tuning still counts as as good
    confidence: float = 0.95  # that every claim of a group holds, whenever the sweep stops
    initial_seeds: int = 3  # paired seeds every arm gets before the first look
    max_seeds: int = 10  # the budget: no arm gets more
    seeds_per_round: int = 2  # added to each undecided arm at each later look
    learned_first: bool = True  # arms wait until full fine-tuning is known to beat the baseline (next_round)

    @property
    def schedule(self) -> tuple[int, ...]:
        """The seed counts a comparison is looked at: initial_seeds, then seeds_per_round more, up to max_seeds."""
        counts = range(self.initial_seeds, self.max_seeds, self.seeds_per_round)
        return (*counts, self.max_seeds) if self.max_seeds >= self.initial_seeds else (self.max_seeds,)

    @property
    def looks(self) -> int:
        """The most looks a group can take: one per seed count of the schedule."""
        return len(self.schedule)

    def alphas(self, comparisons: int, looks: int | None = None) -> "Alphas":
        """Each one-sided claim's error at each look: α shared by every look and every claim."""
        alpha, looks = 1 - self.confidence, looks or self.looks
        each = alpha / (looks * comparisons)
        return Alphas(QUALITY_SHARE * each, WORSE_SHARE * each, STABILITY_SHARE * each, NOTHING_SHARE * alpha / looks)


@dataclass(frozen=True)
class Alphas:
    quality: float  # each quality bound's (one-sided)
    worse: float  # each arm's "worse" bound's (over every seed looked at)
    stability: float  # each collapse upper bound's
    nothing: float  # full fine-tuning's collapse lower bound's


@dataclass(frozen=True)
class Comparison:
    arm: str  # e.g. "freeze k=3", "lora r=8", "probe"; "learned" for full fine-tuning against the baseline
    pairs: int  # seeds where both sides trained: the quality bound's
    mean: float  # mean paired difference over them (arm − full fine-tuning; full fine-tuning − baseline)
    low: float  # its one-sided bounds, each at the claim level (NaN: none yet)
    high: float
    # within / worse / undecided; for full fine-tuning against the baseline: nothing learned, learned, undecided
    decision: str
    why: str = ""  # why undecided, or why nothing learned
    seeds: int = 0  # seeds looked at (trained or not): the collapse count's denominator
    collapsed: int = 0  # of them, where the arm (full fine-tuning, for "learned") collapsed or diverged
    collapse_upper: float = math.nan  # exact one-sided upper bound of its collapse rate, at the claim level
    collapse_lower: float = math.nan  # the lower one (full fine-tuning's only: nothing learned)
    score: float = math.nan  # the arm's mean score over the trained pairs (full fine-tuning: over its trained seeds)
    reference: float = math.nan  # full fine-tuning's over the same pairs (the baseline's, for "learned")
    mean_all: float = math.nan  # the mean paired difference over every seed looked at, collapses included
    high_all: float = math.nan  # its upper bound ("worse" when below −tolerance)

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
    alphas: Alphas | None = None  # each claim's error (a quality bound holds at 1 − alphas.quality)


def interval(diffs: np.ndarray, level: float) -> tuple[float, float, float]:
    """Mean and two-sided Student-t interval at ``level``; NaN bounds from fewer than two values.
    (A one-sided bound at 1 − a is the two-sided interval's at 1 − 2a.)"""
    from scipy import stats  # deferred on purpose: the spec's layer imports this module (SettleRule), scipy is slow

    diffs = np.asarray(diffs, dtype=float)
    mean = float(diffs.mean()) if len(diffs) else math.nan
    if len(diffs) < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(1 - (1 - level) / 2, len(diffs) - 1) * diffs.std(ddof=1) / math.sqrt(len(diffs)))
    return mean, mean - half, mean + half


def collapse_bounds(collapsed: int, seeds: int, alpha: float) -> tuple[float, float]:
    """Exact (Clopper–Pearson) one-sided lower and upper bounds of a collapse rate, each at 1 − alpha."""
    from scipy import stats

    if seeds == 0:
        return 0.0, 1.0
    lower = 0.0 if collapsed == 0 else float(stats.beta.ppf(alpha, collapsed, seeds - collapsed + 1))
    upper = 1.0 if collapsed == seeds else float(stats.beta.ppf(1 - alpha, collapsed + 1, seeds - collapsed))
    return lower, upper


def decide(
    group: pd.DataFrame, rule: SettleRule, looks: int | None = None, comparisons: int | None = None
) -> GroupDecision:
    """One group's decisions from its rows (columns: arm, seed, score, baseline_score, status; optional
    collapsed, else a score at its baseline is a collapse). ``looks``: how many looks the claims must
    survive (default: the rule's; 1 for a fixed grid, whose rows are then read whole); ``comparisons``:
    how many the confidence is shared by — the grid's arms, full fine-tuning's check against the baseline
    among them (default: those with rows). Learned first runs full fine-tuning alone at first: its claims
    must not take the whole confidence because the arms have no rows yet."""
    group = group.reindex(columns=COLUMNS)  # also no rows yet
    excluded = group[group["status"] != "ok"]["status"].value_counts().to_dict()
    final = group[group["status"].isin(FINAL)]
    trained = final[(final["status"] == "ok") & ~_collapsed(final)]
    scores = trained.pivot(index="seed", columns="arm", values="score") if len(trained) else pd.DataFrame()
    as_scored = final.assign(
        score=final["score"].where(final["status"] == "ok", final["baseline_score"])
    )  # diverged: no better
    every = as_scored.pivot(index="seed", columns="arm", values="score") if len(final) else pd.DataFrame()
    seen = {arm: set(s) for arm, s in final.groupby("arm")["seed"]} if len(final) else {}
    arms = [a for a in seen if a != FULL]
    looks = looks or rule.looks
    alphas = rule.alphas(max(comparisons or 0, len(arms) + 1), looks)
    schedule = rule.schedule if looks > 1 else None  # a fixed grid is read once, whole
    baseline = final.groupby("seed")["baseline_score"].first()
    learned = _learned(_looked(seen.get(FULL, set()), schedule), scores, baseline, alphas, rule.tolerance)
    compared = tuple(
        _arm(arm, _looked(seen[arm] & seen.get(FULL, set()), schedule), scores, every, alphas, rule.tolerance)
        for arm in sorted(arms)
    )
    within = [c.arm for c in compared if c.decision == WITHIN and c.arm.startswith("freeze")]
    advice = max(within, key=_depth) if within and learned.decision == LEARNED else None
    return GroupDecision(learned, compared, len(seen.get(FULL, ())), advice, excluded, alphas)


def _collapsed(rows: pd.DataFrame) -> pd.Series:
    """A row's collapse: recorded, else a score exactly at its constant baseline; a diverged row did not train either."""
    at_baseline = (rows["score"] - rows["baseline_score"]).abs() <= COLLAPSE_ATOL
    recorded = rows["collapsed"].astype("boolean").fillna(False).astype(bool)
    return recorded | at_baseline | (rows["status"] != "ok")


def _looked(seeds: set[int], schedule: tuple[int, ...] | None) -> list[int]:
    """The seeds a look sees: the lowest ones, as many as the last count of the schedule reached (a
    failed seed's gap waits for its re-run instead of making a look off the schedule)."""
    ordered = sorted(seeds)
    if schedule is None:
        return ordered
    reached = max((n for n in schedule if n <= len(ordered)), default=0)
    return ordered[:reached]


def _learned(
    seeds: list[int], scores: pd.DataFrame, baseline: pd.Series, alphas: Alphas, tolerance: float
) -> Comparison:
    full = scores[FULL].reindex(seeds).dropna() if FULL in scores else pd.Series(dtype=float)
    diffs = (full - baseline.reindex(full.index)).to_numpy()
    collapsed = len(seeds) - len(full)
    lower, _ = collapse_bounds(collapsed, len(seeds), alphas.nothing)
    _, upper = collapse_bounds(collapsed, len(seeds), alphas.stability)
    mean, low, high = _bounds(diffs, alphas.quality)
    facts: dict[str, Any] = dict(
        seeds=len(seeds),
        collapsed=collapsed,
        collapse_upper=upper,
        collapse_lower=lower,
        score=float(full.mean()) if len(full) else math.nan,
        reference=float(baseline.reindex(full.index).mean()) if len(full) else math.nan,
    )
    if lower > 0.5:  # shown: it collapses on most seeds (every seed at the baseline is such a fact)
        return Comparison(
            "learned",
            len(diffs),
            mean,
            low,
            high,
            NOTHING_LEARNED,
            "full fine-tuning collapses to the constant predictor on most seeds",
            **facts,
        )
    decision, why = _quality(diffs, low, high, learned=True, tolerance=tolerance)
    return Comparison("learned", len(diffs), mean, low, high, decision, why, **facts)


def _arm(
    arm: str, seeds: list[int], scores: pd.DataFrame, every: pd.DataFrame, alphas: Alphas, tolerance: float
) -> Comparison:
    mine = scores[arm].reindex(seeds) if arm in scores else pd.Series(math.nan, index=seeds)
    full = scores[FULL].reindex(seeds) if FULL in scores else pd.Series(math.nan, index=seeds)
    both = mine.notna() & full.notna()
    diffs = (mine[both] - full[both]).to_numpy()
    _, upper = collapse_bounds(int(mine.isna().sum()), len(seeds), alphas.stability)
    mean, low, high = _bounds(diffs, alphas.quality)
    all_diffs = (
        (every[arm].reindex(seeds) - every[FULL].reindex(seeds)).dropna().to_numpy() if FULL in every else np.array([])
    )
    mean_all, low_all, high_all = _bounds(all_diffs, alphas.worse)
    decision, why = _quality(diffs, low, high, learned=False, tolerance=tolerance)
    if decision != WITHIN:  # worse: over every seed looked at, collapses included
        worse, _ = _quality(all_diffs, low_all, high_all, learned=False, tolerance=tolerance)
        decision, why = (WORSE, "") if worse == WORSE else (UNDECIDED, why)
    return Comparison(
        arm,
        len(diffs),
        mean,
        low,
        high,
        decision,
        why,
        seeds=len(seeds),
        collapsed=int(mine.isna().sum()),
        collapse_upper=upper,
        mean_all=mean_all,
        high_all=high_all,
        score=float(mine[both].mean()) if both.any() else math.nan,
        reference=float(full[both].mean()) if both.any() else math.nan,
    )


def _bounds(diffs: np.ndarray, alpha: float) -> tuple[float, float, float]:
    """The mean and its one-sided lower and upper Student-t bounds, each at 1 − alpha."""
    return interval(diffs, 1 - 2 * alpha)


def _quality(diffs: np.ndarray, low: float, high: float, learned: bool, tolerance: float) -> tuple[str, str]:
    if len(diffs) < MIN_PAIRS:
        return UNDECIDED, f"fewer than {MIN_PAIRS} seeds where both sides trained"
    if high - low <= 0:
        return UNDECIDED, "identical differences: their spread is unknown"
    boundary = tolerance if learned else -tolerance  # one boundary: the two claims cannot overlap
    if low > boundary:
        return (LEARNED if learned else WITHIN), ""
    if high < boundary:
        return (NOTHING_LEARNED if learned else WORSE), (
            "its gain when it trains is below the tolerance" if learned else ""
        )
    return UNDECIDED, "the bounds straddle the boundary"


def seeds_to_decide(c: Comparison, rule: SettleRule, comparisons: int, most: int = 100) -> int | None:
    """The smallest budget (max_seeds of a new sweep, its looks and claims paid anew) whose last look would
    decide ``c`` if its mean, its spread and its share of trained seeds stayed as they are: what to ask
    ``freezesweep plan`` to price. None: undecidable so (its mean on the boundary, too few pairs) or above ``most``."""
    from scipy import stats

    if c.pairs < 2 or math.isnan(c.low) or c.seeds == 0:
        return None
    spread = (c.mean - c.low) / stats.t.ppf(1 - rule.alphas(comparisons).quality, c.pairs - 1) * math.sqrt(c.pairs)
    gap = abs(c.mean - (rule.tolerance if c.arm == "learned" else -rule.tolerance))
    if spread <= 0 or gap == 0:
        return None
    for budget in range(max(rule.max_seeds, rule.initial_seeds) + 1, most + 1):
        trained = budget * c.pairs / c.seeds
        alpha = dataclasses.replace(rule, max_seeds=budget).alphas(comparisons).quality
        if trained >= 2 and stats.t.ppf(1 - alpha, trained - 1) * spread / math.sqrt(trained) < gap:
            return budget
    return None


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


def next_round(
    decision: GroupDecision, rule: SettleRule, arms: list[str], seeds_done: Mapping[str, Collection[int]]
) -> list[tuple[str, int]]:
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
    open_arms = sorted(
        (a for a in arms if a not in compared or compared[a].decision == UNDECIDED),
        key=lambda a: -compared[a].nearness(rule.tolerance) if a in compared else 0.0,
    )
    arm_cells = [(arm, s) for arm in open_arms for s in _next_seeds(set(seeds_done.get(arm, ())), rule)]
    full_seeds = sorted(set(full_asked) | ({s for _, s in arm_cells} - full_done))  # every pair needs it
    return [*((FULL, s) for s in full_seeds), *arm_cells]


def _next_seeds(done: set[int], rule: SettleRule) -> list[int]:
    """An arm's next seeds on the schedule: up to the initial seeds, else seeds_per_round more (at most
    max_seeds in all), the lowest seeds it has not run."""
    on_schedule = rule.initial_seeds if len(done) < rule.initial_seeds else len(done) + rule.seeds_per_round
    target = min(rule.max_seeds, on_schedule)
    return list(itertools.islice((s for s in itertools.count() if s not in done), max(0, target - len(done))))
