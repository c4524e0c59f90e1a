"""Deciding, with confidence that holds however often the rows are looked at, which arms of a group are
as good as full fine-tuning when they train, how often they do not, and which seeds to run next.

A group is (sweep, dataset, train size) — with several models, per model. An arm is a frozen depth, a
LoRA rank or the probe; each is compared with full fine-tuning (``freeze k=0``) on paired seeds (the
same seed shares head initialisation and batch order: trials/config.py), and full fine-tuning with
the constant baseline (the majority class, the mean score), which says whether anything is learned at all.

Two claims per arm, because fine-tuning's seeds are not normal: a seed either trains, or it collapses
(its best evaluation comes at most COLLAPSE_SHARE of the way from the constant baseline's score on the rows
it was evaluated on to a perfect score: the constant predictor and its near misses) or diverges
(Mosbach et al. 2021, "On the Stability of Fine-tuning BERT"; Dodge et al. 2020). So quality is decided
on the seeds where both sides trained (a Student-t bound of the mean paired difference: "within the
tolerance of full fine-tuning when it trains"), and stability is counted on every seed looked at, with
an exact Clopper–Pearson upper bound on each arm's collapse rate.

Every printed claim of a group holds at once with probability ≥ ``confidence`` (family-wise), whatever
the arms' dependence (they share the k = 0 runs) and whenever the sweep stops. α = 1 − confidence is
spent where the advice needs it (docs/settle.md argues each step, with its source):

- **Looks, paid unevenly.** Each claim has a p-value at its current look (its seed count on the
  schedule); divided by that look's weight (``SettleRule.look_weights``: most on the last look, the
  earlier ones O'Brien–Fleming-like, rising with their seeds) it is a valid p-value whenever the sweep
  stops — Bonferroni over the looks, valid whatever their correlation (repeated confidence intervals,
  Jennison & Turnbull 1989) — so every procedure below holds a claim's p-value to its level times its
  look's weight (its bar). At the schedule's last look every claim of a t statistic spends what
  Bonferroni left unspent on nested looks (``last_look_level``: simulated for the counts each look saw,
  at the level the claim is tested at).
- **Serial gatekeeping and a fixed sequence** (WITHIN_SHARE of α). "Learned" (full fine-tuning's gain
  over the constant baseline, when it trains, is above the tolerance) is tested first; only once it
  holds are the frozen depths tested, "within the tolerance", one after the other from the least frozen
  to the most frozen, each at the full share, stopping at the first not shown within (Maurer, Hothorn &
  Lehmacher 1995; Westfall & Krishen 2001; Dmitrienko & Tamhane 2007). The advice — the last depth
  shown within before the stop — needs no split across depths; the deeper ones are "not tested". It
  has the largest share: it is the answer.
- **Holm** (HOLM_SHARE) for the claims that are not sequential: "worse" for every arm, "within" for LoRA
  ranks and the probe; and (NOTHING_SHARE) over full fine-tuning's pair of "nothing learned" claims (its
  gain shown below the tolerance, or its collapse rate shown above 1/2). Holm 1979: step-down
  Bonferroni, valid under any dependence. An arm is "worse" when it is more than the tolerance below full
  fine-tuning when it trains (the pairs where both trained, the bound "within" uses) or in mean (over the
  seeds where full fine-tuning trained, the arm's collapses at their scores: what can call a mostly
  collapsing arm worse): one claim, tested by both bounds, each at its share of the claim's level
  (WORSE_SHARES: a weighted Bonferroni test). A claim is held at each step to its least bar at that step's
  level or any larger (``holm``: a spent last look's bar is simulated, so not always monotone in it).
- **Collapse bounds** (STABILITY_SHARE): one exact upper bound per arm, Bonferroni across arms — bounds
  compatible with Holm are no narrower where a bound is reported for every arm (Strassburger & Bretz 2008).

Every look is paid for: a comparison is looked at only at seed counts on its schedule; a failed seed's
gap waits for its re-run (the look sees the seeds of the last count reached). A rule that changes on a
sweep with rows is refused (orchestrator/checks.py): its past looks were paid at the old level. No
decision from fewer than MIN_PAIRS trained pairs or from a bound of zero width (identical differences:
their spread is not known, not zero), and no freezing advice where nothing is learned.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

MIN_PAIRS = 3
FULL = "freeze k=0"  # the arm every other is compared with
WITHIN, WORSE, UNDECIDED, NOT_TESTED = "within", "worse", "undecided", "not tested"
LEARNED, NOTHING_LEARNED = "learned", "nothing learned"
COLUMNS = ["arm", "seed", "score", "baseline_score", "status", "collapsed"]  # collapsed: optional (derived)
FINAL = ("ok", "diverged")  # a seed with one of these is looked at; others (failed, oom) run again
STUCK = ": it runs no more seeds"  # how a depth's why ends where open_arms stops at it (settle mode's words)
COLLAPSE_ATOL = 1e-9  # a score this near its constant baseline is the constant predictor's
# A seed collapsed where its best score came at most this share of the way from the constant baseline's score to
# a perfect one (every metric here tops out at 1): the constant predictor, and its near misses. Mosbach et al.
# 2021 count a run failed at the majority baseline; the reference study's table has the near misses too (SST-2
# n = 50, k = 8: median 0.511; n = 100, k = 12: up to 0.535, where trained seeds reach 0.7-0.9). Counted as
# trained, one such seed breaks the normal bound of "within when it trains" (an audit's simulation: a false
# "within" in 33-60 % of sweeps where 5-10 % of an arm's seeds missed by a few rows). trials/run.py's rule is this one.
COLLAPSE_SHARE = 0.1
# shares of α (the module docstring): the sequence of "within" (learned first), Holm over "worse" and the
# other methods' "within", "nothing learned" (Holm over its two claims), the collapse bounds; where the grid
# has LoRA ranks or the probe, OTHERS_SHARE moves from the sequence's share to Holm's, for their "within"
WITHIN_SHARE, HOLM_SHARE, NOTHING_SHARE, STABILITY_SHARE = 0.55, 0.1, 0.3, 0.05
OTHERS_SHARE = 0.1
# "Worse" (when it trains, or in mean) is shown where either bound clears its share of the claim's level. The
# mean's t bound alone is conservative under the left skew of the arm's collapses (an audit: its size 0-0.0002
# where Holm's first step charged 0.00083): of arms 0.06 below full fine-tuning when they train with a tenth of
# their seeds collapsing, 10-seed grids showed 33 % worse; a tenth of the level on the trained pairs' bound
# (exact under the t bound's own assumption) shows 87 %, for under a point of the reference cells' "worse" and
# 3 where arms collapse on 7 of 10 seeds (the mean's bound decides those); 0.2-0.8 of the level cost 0.4-36
# points there (benchmarks/settle_coverage.py; docs/settle.md, "Measured").
WORSE_SHARES = {"worse when trained": 0.1, "worse in mean": 0.9}
LAST_LOOK = 0.7  # the last look's weight; the earlier ones share the rest (SettleRule.look_weights)
OBF_Z = 2.0  # the earlier looks' shape: O'Brien–Fleming's boundary z·sqrt(n_last / n) (docs/settle.md)


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

    @property
    def look_weights(self) -> tuple[float, ...]:
        """Each look's share of a claim's α (they sum to 1): LAST_LOOK to the last, so that a sweep run to
        its budget pays little more than a fixed grid; the rest to the earlier looks in the proportions of
        O'Brien–Fleming's one-sided boundary z·sqrt(n_last / n) (few seeds: a small share)."""
        return look_weights(self.schedule)

    def levels(self, arms: Collection[str]) -> Levels:
        """The one-sided levels of a group whose grid has these arms (full fine-tuning aside)."""
        arms = set(arms) - {FULL}
        alpha = 1 - self.confidence
        others = sum(1 for a in arms if not is_freeze(a))
        to_others = OTHERS_SHARE * alpha if others else 0.0
        return Levels(
            within=WITHIN_SHARE * alpha - to_others,
            holm=HOLM_SHARE * alpha + to_others,
            holm_family=len(arms) + others,  # "worse" of every arm, "within" of each other method's
            nothing=NOTHING_SHARE * alpha,
            stability=STABILITY_SHARE * alpha / (len(arms) + 1),
        )


def look_weights(schedule: Sequence[int]) -> tuple[float, ...]:
    """Bonferroni weights over a schedule's looks: LAST_LOOK on the last, the rest O'Brien–Fleming-shaped."""
    from scipy import special

    if len(schedule) == 1:
        return (1.0,)
    tails = [float(special.ndtr(-OBF_Z * math.sqrt(schedule[-1] / n))) for n in schedule[:-1]]
    return (*((1 - LAST_LOOK) * t / sum(tails) for t in tails), LAST_LOOK)


@dataclass(frozen=True)
class Levels:
    """A group's one-sided levels before the looks' weights: each claim of the "within" sequence (learned
    first), Holm's over "worse" and the other methods' "within" (and how many claims it holds), the pair of
    "nothing learned" claims', each collapse bound's."""

    within: float
    holm: float
    holm_family: int
    nothing: float
    stability: float


@dataclass(frozen=True)
class Comparison:
    arm: str  # e.g. "freeze k=3", "lora r=8", "probe"; "learned" for full fine-tuning against the baseline
    pairs: int  # seeds where both sides trained: the quality bound's
    mean: float  # mean paired difference over them (arm − full fine-tuning; full fine-tuning − baseline)
    low: float  # its one-sided bounds, each at ``level`` (NaN: none yet)
    high: float
    # within / worse / undecided / not tested; for full fine-tuning against the baseline: nothing learned,
    # learned, undecided
    decision: str
    why: str = ""  # why undecided or not tested, or why nothing learned
    seeds: int = 0  # seeds looked at (trained or not): the collapse count's denominator
    collapsed: int = 0  # of them, where the arm (full fine-tuning, for "learned") collapsed or diverged
    diverged: int = 0  # of those, the diverged ones (a sentence counts them apart from the constant predictor's)
    collapse_upper: float = math.nan  # exact one-sided upper bound of its collapse rate, at its level
    collapse_lower: float = math.nan  # the lower one (full fine-tuning's only: nothing learned)
    score: float = math.nan  # the arm's mean score over the trained pairs (full fine-tuning: over its trained seeds)
    reference: float = math.nan  # full fine-tuning's over the same pairs (the baseline's, for "learned")
    mean_all: float = math.nan  # the mean paired difference where full fine-tuning trained, the arm's collapses in
    high_all: float = math.nan  # its upper bound at its share of Holm's level for "worse"
    high_worse: float = math.nan  # the trained pairs' upper bound at theirs ("worse" where either is below −tolerance)
    pairs_all: int = 0  # the differences ``mean_all`` is over (seeds where full fine-tuning trained)
    level_all: float = math.nan  # the one-sided level ``high_all`` was computed at
    level: float = math.nan  # the one-sided level its quality bounds were computed at (this look's)
    clears: bool = False  # its own "within" bound clears the boundary (a claim once its sequence reaches it)
    clears_worse: bool = False  # one of its own "worse" bounds does (high_worse or high_all below −tolerance)

    def nearness(self, tolerance: float) -> float:
        """How near deciding it is: its mean's distance from the boundary (−tolerance) in half-widths of
        its interval. Near 1, a little more data decides it; near 0, the truth sits on the boundary."""
        if math.isnan(self.low):
            return 0.0
        half = (self.high - self.low) / 2
        return abs(self.mean + tolerance) / half if half > 0 else 0.0


_NONE = Comparison("", 0, math.nan, math.nan, math.nan, UNDECIDED)  # an arm with no rows yet


@dataclass(frozen=True)
class GroupDecision:
    learned: Comparison
    arms: tuple[Comparison, ...]  # the arms with rows, in the sequence's order (least frozen first)
    seeds: int  # seeds of full fine-tuning so far (an arm's own pairs: Comparison.pairs)
    advice: str | None = None  # the last depth shown within before the sequence stopped (None: no advice)
    excluded: dict[str, int] = field(default_factory=dict)  # status -> rows left out (failed, diverged, …)
    levels: Levels | None = None
    stopped_at: str | None = None  # the depth the "within" sequence stopped at (None: it passed every depth)


# --- the data of one comparison ------------------------------------------------------------------
@dataclass(frozen=True)
class _Seeds:
    """One arm's final rows by seed: its score where it trained (NaN where it collapsed or diverged), its
    score as looked at (a diverged seed at its baseline), and its constant baseline."""

    trained: dict[int, float]
    every: dict[int, float]
    baseline: dict[int, float]
    diverged: set[int] = field(default_factory=set)


def _by_arm(group: pd.DataFrame) -> dict[str, _Seeds]:
    final = group[group["status"].isin(FINAL)]
    ok = (final["status"] == "ok").to_numpy()
    score, base = final["score"].to_numpy(dtype=float), final["baseline_score"].to_numpy(dtype=float)
    recorded = final["collapsed"].astype("boolean").fillna(False).to_numpy(dtype=bool)
    trained = ok & ~recorded & ~(score - base <= collapse_margin(base))
    looked = np.where(ok, score, base)  # diverged: no better than the constant predictor
    out: dict[str, _Seeds] = {}
    for arm, seed, t, s, e, b in zip(final["arm"], final["seed"], trained, score, looked, base):
        seeds = out.setdefault(arm, _Seeds({}, {}, {}))
        seeds.trained[int(seed)] = s if t else math.nan
        seeds.every[int(seed)] = e
        seeds.baseline[int(seed)] = b
    for arm, seed in zip(final["arm"][~ok], final["seed"][~ok]):
        out[arm].diverged.add(int(seed))
    return out


def collapse_margin(baseline):
    """How far above its constant baseline a best score must be to count as trained: more than COLLAPSE_SHARE
    of the way to a perfect score (at a perfect baseline nothing is above it: every score there collapsed)."""
    return np.maximum(COLLAPSE_SHARE * (1.0 - np.asarray(baseline, dtype=float)), COLLAPSE_ATOL)


def trained_seeds(group: pd.DataFrame) -> dict[str, tuple[int, int, float]]:
    """Per arm, over its final seeds: how many trained (neither collapsed nor diverged), how many there are,
    and the trained ones' mean score. Observations, no claim: where full fine-tuning did not learn, the
    sentence names the arms that trained all the same (a walk-through's frozen depths at 0.85+ read
    "nothing learned at this size")."""
    out = {}
    for arm, seeds in _by_arm(group.reindex(columns=COLUMNS)).items():
        scores = [v for v in seeds.trained.values() if not math.isnan(v)]
        out[arm] = (len(scores), len(seeds.trained), float(np.mean(scores)) if scores else math.nan)
    return out


def _looked(seeds: Collection[int], schedule: tuple[int, ...] | None) -> tuple[list[int], int]:
    """The seeds a look sees and its index on the schedule: seeds 0, 1, … without a gap (a failed seed's
    gap waits for its re-run: a look at n seeds is always at the same n seeds), as many as the last count
    of the schedule reached. Index −1: no look yet."""
    if schedule is None:
        return sorted(seeds), 0
    present = set(seeds)
    ordered = list(itertools.takewhile(present.__contains__, itertools.count()))
    reached = [i for i, n in enumerate(schedule) if n <= len(ordered)]
    return (ordered[: schedule[reached[-1]]], reached[-1]) if reached else ([], -1)


# --- the statistics -------------------------------------------------------------------------------
def _t_bounds(diffs: np.ndarray, level: float) -> tuple[float, float, float]:
    """The mean and its one-sided lower and upper Student-t bounds, each at 1 − level."""
    from scipy import special

    mean = float(diffs.mean()) if len(diffs) else math.nan
    if len(diffs) < 2 or not level > 0:
        return mean, math.nan, math.nan
    half = float(special.stdtrit(len(diffs) - 1, 1 - level) * diffs.std(ddof=1) / math.sqrt(len(diffs)))
    return mean, mean - half, mean + half


def _t_pvalue(diffs: np.ndarray, boundary: float, above: bool) -> float:
    """One-sided p-value that the mean is above (``above``) or below ``boundary``; 1 where nothing can be
    claimed (fewer than MIN_PAIRS, or identical differences: their spread is unknown)."""
    from scipy import special

    if len(diffs) < MIN_PAIRS:
        return 1.0
    spread = diffs.std(ddof=1)
    if not spread > COLLAPSE_ATOL:  # equal up to rounding: scores differ in the last bits only
        return 1.0
    t = (diffs.mean() - boundary) / (spread / math.sqrt(len(diffs)))
    return float(special.stdtr(len(diffs) - 1, -t if above else t))


def collapse_bounds(collapsed: int, seeds: int, alpha: float) -> tuple[float, float]:
    """Exact (Clopper–Pearson) one-sided lower and upper bounds of a collapse rate, each at 1 − alpha."""
    from scipy import special

    if seeds == 0:
        return 0.0, 1.0
    lower = 0.0 if collapsed == 0 else float(special.betaincinv(collapsed, seeds - collapsed + 1, alpha))
    upper = 1.0 if collapsed == seeds else float(special.betaincinv(collapsed + 1, seeds - collapsed, 1 - alpha))
    return lower, upper


def _most_collapse_pvalue(collapsed: int, seeds: int) -> float:
    """Exact p-value that more than half the seeds collapse: P(X ≥ collapsed | seeds, 1/2)."""
    from scipy import special

    return 1.0 if collapsed == 0 else float(special.bdtrc(collapsed - 1, seeds, 0.5))


def holm(
    pvalues: Mapping[str, float],
    alpha: float,
    family: int,
    weight: Callable[[str, float], float] = lambda claim, level: 1.0,
    tests: Mapping[str, Mapping[str, float]] | None = None,
) -> tuple[set[str], dict[str, float]]:
    """Holm's step-down over a family of ``family`` claims (those without data: p = 1): the claims shown,
    and the one-sided level each test's p-value was held to (a claim not shown: at the step that stopped;
    Holm 1979). ``tests``: a claim tested by several p-values (claim -> {test: its share}), shown where one
    clears its share of the step's level (a weighted Bonferroni test of the claim); any other p-value is a
    claim of its own. ``weight(test, level)``: the share of a level a test is held to (its look's, or at a
    last look more: ``last_look_level``). A test is held to the least of its bars at this step's level and
    every larger one of the ladder, so that a claim shown at one level is shown at every larger one: the
    step-down is valid for tests nested so, each of its size (closed testing with Bonferroni intersections;
    Marcus, Peritz & Gabriel 1976)."""
    claims = {name: dict(shares) for name, shares in (tests or {}).items()}
    grouped = [test for shares in claims.values() for test in shares]
    claims.update({name: {name: 1.0} for name in pvalues if name not in grouped})
    problems = [
        f"claim {name!r}: its tests' shares must be positive and sum to at most 1"
        for name, shares in claims.items()
        if not (min(shares.values(), default=0) > 0 and sum(shares.values()) <= 1 + 1e-12)
    ]
    problems += [f"test {t!r} is in more than one claim" for t, n in sorted(Counter(grouped).items()) if n > 1]
    problems += [f"a family of {family} claims cannot hold {len(claims)}"] if family < len(claims) else []
    if problems:
        raise ValueError("; ".join(problems))
    ladder = [alpha / (family - step) for step in range(family)]

    def bars_of(test: str, share: float) -> list[float]:  # a bar that is not a number shows nothing
        own = [share * a * weight(test, share * a) for a in ladder]
        return list(itertools.accumulate(reversed([b if math.isfinite(b) else 0.0 for b in own]), min))[::-1]

    bars = {test: bars_of(test, share) for shares in claims.values() for test, share in shares.items()}

    def ratio(claim: str, step: int) -> float:  # at most 1: shown at this step
        return min(pvalues.get(t, 1.0) / bars[t][step] if bars[t][step] > 0 else math.inf for t in claims[claim])

    shown: set[str] = set()
    held: dict[str, float] = {}
    rest = list(claims)
    for step in range(len(rest)):
        name = min(rest, key=lambda c: ratio(c, step))
        if not ratio(name, step) <= 1:
            held.update({t: bars[t][step] for c in rest for t in claims[c]})
            return shown, held
        held.update({t: bars[t][step] for t in claims[name]})
        shown.add(name)
        rest.remove(name)
    return shown, held


def interval(diffs: np.ndarray, level: float) -> tuple[float, float, float]:
    """Mean and two-sided Student-t interval at ``level``; NaN bounds from fewer than two values.
    (A one-sided bound at 1 − a is the two-sided interval's at 1 − 2a.)"""
    return _t_bounds(np.asarray(diffs, dtype=float), (1 - level) / 2)


# --- one group's decisions ------------------------------------------------------------------------
@dataclass(frozen=True)
class _Look:
    """What one comparison's current look sees: its seeds, its weight, the trained differences, every
    seed's difference (collapses at their scores), and the means beside them."""

    seeds: list[int]
    weight: float  # this look's share of the claim's α (0: no look yet)
    diffs: np.ndarray
    all_diffs: np.ndarray
    collapsed: int
    score: float
    reference: float
    counts: tuple[int, ...] = ()  # the trained differences at each look of the schedule so far (nested)
    last: bool = False  # this look is the schedule's last of several
    all_counts: tuple[int, ...] = ()  # the same for ``all_diffs``
    diverged: int = 0  # of ``collapsed``, the seeds that diverged


def _counts(trained: list[int], schedule, look: int) -> tuple[bool, tuple[int, ...]]:
    """(whether ``look`` is the schedule's last of several, the trained seeds below each look's count)."""
    if schedule is None or look < 0:
        return False, (len(trained),)
    return look == len(schedule) - 1, tuple(sum(1 for s in trained if s < n) for n in schedule[: look + 1])


def _gain_look(full: _Seeds | None, schedule, weights) -> _Look:
    seeds, look = _looked(full.trained if full else (), schedule)
    trained = [s for s in seeds if not math.isnan(full.trained[s])]
    mine = np.array([full.trained[s] for s in trained]) if trained else np.array([])
    base = np.array([full.baseline[s] for s in trained]) if trained else np.array([])
    last, counts = _counts(trained, schedule, look)
    return _Look(
        seeds,
        weights[look] if look >= 0 else 0.0,
        mine - base,
        np.array([]),
        len(seeds) - len(trained),
        float(mine.mean()) if trained else math.nan,
        float(base.mean()) if trained else math.nan,
        counts,
        last,
        diverged=sum(1 for s in seeds if s in full.diverged) if full else 0,
    )


def _pair_look(arm: _Seeds, full: _Seeds | None, schedule, weights) -> _Look:
    seeds, look = _looked(arm.trained.keys() & (full.trained.keys() if full else set()), schedule)
    both = [s for s in seeds if not (math.isnan(arm.trained[s]) or math.isnan(full.trained[s]))]
    mine = np.array([arm.trained[s] for s in both])
    theirs = np.array([full.trained[s] for s in both])
    # "worse in mean" on the seeds where full fine-tuning trained, the arm's collapses at their scores: those skew
    # the differences left (its upper bound conservative); full fine-tuning's would skew them right (a
    # rare large positive difference: the bound liberal, a false "worse" in 34.5 % of simulated 10-seed
    # grids with 10 % of its seeds collapsing: benchmarks/settle_coverage.py, full-collapse).
    where_full = [s for s in seeds if not math.isnan(full.trained[s])]
    every = np.array([arm.every[s] - full.trained[s] for s in where_full])
    last, counts = _counts(both, schedule, look)
    return _Look(
        seeds,
        weights[look] if look >= 0 else 0.0,
        mine - theirs,
        every,
        sum(1 for s in seeds if math.isnan(arm.trained[s])),
        float(mine.mean()) if both else math.nan,
        float(theirs.mean()) if both else math.nan,
        counts,
        last,
        _counts(where_full, schedule, look)[1],
        sum(1 for s in seeds if s in arm.diverged),
    )


SIMULATED_PATHS = 200_000
# Monte Carlo standard errors of the simulated part kept unspent: with 3 a diff review found a level (0.005,
# the default schedule) that this seed's paths spent to 0.999 of itself on 10,000,000 fresh ones (SE 0.0045)
MARGIN_SE = 4
_SIMULATION_SEED = 20261127  # fixed: a group's decision never changes between two reads


@functools.lru_cache(maxsize=64)  # 1.6 MB a schedule (float32): collapses make a report's counts vary
def _simulated_looks(
    counts: tuple[int, ...], weights: tuple[float, ...], chunk: int = 20_000
) -> tuple[np.ndarray, np.ndarray]:
    """Per simulated path (nested standard normal samples at the boundary, a fixed seed): the least level at
    which an earlier look crosses its Bonferroni bar (its p-value over its weight), and the last look's t
    statistic. Drawn ``chunk`` paths at a time (memory stays a few MB whatever the budget) and kept for the
    few schedules a report meets: every level of Holm's ladder reads the same paths."""
    from scipy import special

    rng = np.random.default_rng(_SIMULATION_SEED)  # the same draws for a given numpy
    early, last = [], []
    for start in range(0, SIMULATED_PATHS, chunk):
        draws = rng.standard_normal((min(chunk, SIMULATED_PATHS - start), counts[-1]))
        total, squares = np.cumsum(draws, axis=1), np.cumsum(draws**2, axis=1)
        crossed_at = np.full(len(draws), np.inf)
        for n, w in zip(counts[:-1], weights):
            if n >= MIN_PAIRS:
                crossed_at = np.minimum(crossed_at, special.stdtr(n - 1, -t_of_prefix(total, squares, n)) / w)
        early.append(crossed_at.astype(np.float32))
        last.append(t_of_prefix(total, squares, counts[-1]).astype(np.float32))
    return np.concatenate(early), np.concatenate(last)


def t_of_prefix(total: np.ndarray, squares: np.ndarray, n: int) -> np.ndarray:
    """Each path's one-sided t statistic (against 0) of its first n draws, from their running sums."""
    mean = total[:, n - 1] / n
    return mean / np.sqrt(np.maximum(squares[:, n - 1] - n * mean**2, 1e-300) / (n - 1) / n)


@functools.lru_cache(maxsize=1024)
def last_look_level(counts: tuple[int, ...], level: float, weights: tuple[float, ...]) -> float:
    """The one-sided level of a claim's last look that, beside its earlier looks at ``level`` × their
    weights, spends ``level`` (never less than ``level`` × the last weight: Bonferroni's). Bonferroni over
    nested looks leaves about a fifth of it unspent (at the boundary, 3/5/7/9/10 seeds: 0.0176 of 0.0225).
    The looks' t statistics are of nested samples (``counts``: the claim's differences at each look), so
    under the boundary with normal differences — the t bound's own assumption — their joint law depends on
    the counts alone: simulated (SIMULATED_PATHS paths, a fixed seed), the last look's critical value is
    the least at which crossing at any look has probability ``level`` with MARGIN_SE Monte Carlo standard
    errors to spare (a group-sequential boundary: Jennison & Turnbull 2000, ch. 7, by simulation)."""
    from scipy import special

    bonferroni = level * weights[len(counts) - 1]
    if len(counts) < 2 or counts[-1] < MIN_PAIRS:
        return bonferroni
    early, last = _simulated_looks(counts, weights)
    crossed = np.sort(last[early <= level])  # the last look's statistics where an earlier look crossed
    # P(any look crosses) = P(the last one's t ≥ c), exact, + P(an earlier one crossed and t < c), simulated:
    # the simulated part is about a fifth of the level, its Monte Carlo error less than half the whole's
    # (the exact marginal as a control variate). Between two crossed paths' statistics that part is
    # constant (j paths below): the least c of each stretch whose sum, with MARGIN_SE standard errors, fits.
    below = np.arange(len(crossed) + 1) / SIMULATED_PATHS
    room = level - below - MARGIN_SE * np.sqrt(np.maximum(below, 1 / SIMULATED_PATHS) / SIMULATED_PATHS)
    with np.errstate(invalid="ignore"):
        needed = np.where(room > 0, special.stdtrit(counts[-1] - 1, 1 - np.clip(room, 0, 1)), np.inf)
    lowest = np.maximum(needed, np.concatenate([[-np.inf], crossed]))
    fits = lowest <= np.concatenate([crossed, [np.inf]])
    if not fits.any():
        return bonferroni
    return max(bonferroni, float(special.stdtr(counts[-1] - 1, -lowest[fits].min())))


@dataclass(frozen=True)
class _Claims:
    """A group's claims at their current looks: each one's p-value there, and the share of a level it is
    held to (``weight``)."""

    p: dict[str, float]
    looks: dict[str, tuple[_Look, tuple[int, ...]]]  # the claim's look, and its statistic's nested sample sizes
    weights: tuple[float, ...]  # the schedule's look weights

    def weight(self, name: str, level: float) -> float:
        """Its look's weight; at the schedule's last look, for a t statistic, what the earlier looks left
        unspent too (``last_look_level``: the collapse count's claim keeps Bonferroni's)."""
        look, counts = self.looks[name]
        if not (look.last and counts):
            return look.weight
        return last_look_level(counts, level, self.weights) / level

    def holds(self, name: str, level: float) -> bool:
        bar = level * self.weight(name, level)
        return bar > 0 and self.p[name] <= bar


def _claims(gain: _Look, looks: Mapping[str, _Look], tolerance: float, weights: Sequence[float]) -> _Claims:
    """Every claim at its look: "learned", "nothing: gain", "nothing: collapse", "within: ARM", "worse when
    trained: ARM", "worse in mean: ARM"."""
    p = {
        "learned": _t_pvalue(gain.diffs, tolerance, above=True),
        "nothing: gain": _t_pvalue(gain.diffs, tolerance, above=False),
        "nothing: collapse": _most_collapse_pvalue(gain.collapsed, len(gain.seeds)),
    }
    on: dict[str, tuple[_Look, tuple[int, ...]]] = {
        "learned": (gain, gain.counts),
        "nothing: gain": (gain, gain.counts),
        "nothing: collapse": (gain, ()),
    }
    for arm, look in looks.items():
        p[f"within: {arm}"] = _t_pvalue(look.diffs, -tolerance, above=True)
        p[f"worse when trained: {arm}"] = _t_pvalue(look.diffs, -tolerance, above=False)
        p[f"worse in mean: {arm}"] = _t_pvalue(look.all_diffs, -tolerance, above=False)
        on[f"within: {arm}"] = on[f"worse when trained: {arm}"] = (look, look.counts)
        on[f"worse in mean: {arm}"] = (look, look.all_counts)
    return _Claims(p, on, tuple(weights))


def decide(
    group: pd.DataFrame, rule: SettleRule, looks: int | None = None, arms: Collection[str] = ()
) -> GroupDecision:
    """One group's decisions from its rows (columns: arm, seed, score, baseline_score, status; optional
    collapsed, else a score at its baseline is a collapse). ``looks``: 1 for a fixed grid, read once and
    whole (default: the rule's schedule); ``arms``: the grid's arms, those without rows yet included —
    a sequence cannot pass a depth that has not run, and Holm's family counts every other method's claims."""
    group = group.reindex(columns=COLUMNS)  # also no rows yet
    excluded = group[group["status"] != "ok"]["status"].value_counts().to_dict()
    by_arm = _by_arm(group)
    grid = sorted((set(arms) | set(by_arm)) - {FULL}, key=order)
    levels = rule.levels(grid)
    schedule = rule.schedule if (looks or rule.looks) > 1 else None  # a fixed grid is read once, whole
    weights = rule.look_weights if schedule else (1.0,)
    gain = _gain_look(by_arm.get(FULL), schedule, weights)
    pairs = {arm: _pair_look(by_arm[arm], by_arm.get(FULL), schedule, weights) for arm in grid if arm in by_arm}
    p = _claims(gain, pairs, rule.tolerance, weights)
    shown, at = _holm_claims(p, levels)
    learned = _learned(gain, p, shown, at, levels)
    depths = [a for a in grid if is_freeze(a)]
    within, stopped_at = _sequence(["learned", *depths], p, levels.within)
    if learned.decision != LEARNED:
        within, stopped_at = set(), None  # the gatekeeper: no depth is tested before "learned" holds
    shown |= {f"within: {a}" for a in within}
    compared = tuple(
        _arm(arm, pairs[arm], p, shown, at, levels, _state(arm, learned, shown, stopped_at, depths))
        for arm in grid
        if arm in pairs
    )
    compared = tuple(_stuck_why(c, levels, rule.tolerance) for c in compared)
    advice = [c.arm for c in compared if c.decision == WITHIN and is_freeze(c.arm)]
    seeds = len(by_arm[FULL].trained) if FULL in by_arm else 0
    return GroupDecision(learned, compared, seeds, advice[-1] if advice else None, excluded, levels, stopped_at)


def _sequence(in_order: Sequence[str], p: _Claims, level: float) -> tuple[set[str], str | None]:
    """The fixed sequence (Maurer, Hothorn & Lehmacher 1995): "learned" first (the gatekeeper), then each
    depth's "within", each at the full ``level``, up to the first not shown — the depths shown, and the one
    it stopped at (None: it passed them all)."""
    shown: set[str] = set()
    for arm in in_order:
        claim = "learned" if arm == "learned" else f"within: {arm}"
        if claim not in p.p or not p.holds(claim, level):
            return shown - {"learned"}, arm
        shown.add(arm)
    return shown - {"learned"}, None


def _holm_claims(p: _Claims, levels: Levels) -> tuple[set[str], dict[str, float]]:
    """Holm's step-down over the pair of "nothing learned" claims, and over "worse" of every arm (each tested
    by two bounds: WORSE_SHARES) with the other methods' "within" (LoRA ranks, the probe): the claims shown,
    and the one-sided level each test's p-value was held to."""
    nothing = {k: v for k, v in p.p.items() if k.startswith("nothing")}
    rest = {
        k: v for k, v in p.p.items() if k.startswith("worse") or (k.startswith("within") and not is_freeze(_arm_of(k)))
    }
    worse = {f"worse: {_arm_of(k)}" for k in rest if k.startswith("worse")}
    tests = {claim: {f"{t}: {_arm_of(claim)}": share for t, share in WORSE_SHARES.items()} for claim in worse}
    shown_nothing, at_nothing = holm(nothing, levels.nothing, 2, p.weight)
    shown_rest, at_rest = holm(rest, levels.holm, max(levels.holm_family, 1), p.weight, tests)
    return shown_nothing | shown_rest, {**at_nothing, **at_rest}


def _arm_of(claim: str) -> str:
    return claim.split(": ", 1)[1]


def _state(
    arm: str, learned: Comparison, shown: set[str], stopped_at: str | None, depths: list[str]
) -> tuple[str, str]:
    """An arm's decision before "worse": within, undecided (where the sequence stopped, or an other
    method not shown within) or not tested (deeper than the stop, or before "learned" holds)."""
    if f"within: {arm}" in shown and learned.decision == LEARNED:
        return WITHIN, ""
    if learned.decision != LEARNED:
        return NOT_TESTED, "full fine-tuning is not shown to learn"
    if is_freeze(arm) and stopped_at is not None and depths.index(arm) > depths.index(stopped_at):
        return NOT_TESTED, f"the sequence stopped at {stopped_at}"
    return UNDECIDED, ""


def _learned(gain: _Look, p: _Claims, shown: set[str], at: Mapping[str, float], levels: Levels) -> Comparison:
    level = levels.within * p.weight("learned", levels.within)
    mean, low, _ = _t_bounds(gain.diffs, level)
    _, _, high = _t_bounds(gain.diffs, at["nothing: gain"])
    lower, _ = collapse_bounds(gain.collapsed, len(gain.seeds), at["nothing: collapse"])
    _, upper = collapse_bounds(gain.collapsed, len(gain.seeds), levels.stability * gain.weight)
    if "nothing: collapse" in shown:  # shown: it collapses on most seeds (every seed at the baseline is such a fact)
        decision, why = NOTHING_LEARNED, "full fine-tuning collapses on most seeds"
    elif p.holds("learned", levels.within):
        decision, why = LEARNED, ""
    elif "nothing: gain" in shown:
        decision, why = NOTHING_LEARNED, "its gain when it trains is below the tolerance"
    else:
        decision, why = UNDECIDED, _open_why(gain, "trained seeds")
    return Comparison(
        "learned",
        len(gain.diffs),
        mean,
        low,
        high,
        decision,
        why,
        seeds=len(gain.seeds),
        collapsed=gain.collapsed,
        diverged=gain.diverged,
        collapse_upper=upper,
        collapse_lower=lower,
        score=gain.score,
        reference=gain.reference,
        level=level,
        clears=decision == LEARNED,
    )


def _arm(
    arm: str,
    look: _Look,
    p: _Claims,
    shown: set[str],
    at: Mapping[str, float],
    levels: Levels,
    state: tuple[str, str],
) -> Comparison:
    within, trained, in_mean = f"within: {arm}", f"worse when trained: {arm}", f"worse in mean: {arm}"
    within_level = levels.within * p.weight(within, levels.within) if is_freeze(arm) else at[within]
    mean, low, high = _t_bounds(look.diffs, within_level)
    high_worse = _t_bounds(look.diffs, at[trained])[2]
    mean_all, _, high_all = _t_bounds(look.all_diffs, at[in_mean])
    _, upper = collapse_bounds(look.collapsed, len(look.seeds), levels.stability * look.weight)
    decision, why = state
    if decision != WITHIN and f"worse: {arm}" in shown:  # when it trains, or in mean where full fine-tuning trained
        decision, why = WORSE, ""
    elif decision == UNDECIDED and not why:
        why = _open_why(look)
    return Comparison(
        arm,
        len(look.diffs),
        mean,
        low,
        high,
        decision,
        why,
        seeds=len(look.seeds),
        collapsed=look.collapsed,
        diverged=look.diverged,
        collapse_upper=upper,
        score=look.score,
        reference=look.reference,
        mean_all=mean_all,
        high_all=high_all,
        high_worse=high_worse,
        pairs_all=len(look.all_diffs),
        level_all=at[in_mean],
        level=within_level,
        clears=within_level > 0 and p.p[within] <= within_level,
        clears_worse=any(at[c] > 0 and p.p[c] <= at[c] for c in (trained, in_mean)),
    )


def _open_why(look: _Look, seeds: str = "seeds where both sides trained") -> str:
    if look.weight == 0:
        return "no look yet"
    if len(look.diffs) < MIN_PAIRS:
        return f"fewer than {MIN_PAIRS} {seeds}"
    if not look.diffs.std(ddof=1) > COLLAPSE_ATOL:
        return (
            "identical differences: every seed gave the same one, so its spread is unknown (more seeds, or more "
            "evaluation rows, max_eval_examples, would show one)"
        )
    return "the bounds straddle the boundary"


def is_freeze(arm: str) -> bool:
    return arm.startswith("freeze")


def _depth(arm: str) -> float:
    """How much a freeze arm freezes: k = -1 (embeddings only) sits between 0 and 1."""
    k = int(arm.split("=", 1)[1])
    return 0.5 if k == -1 else float(k)


def order(arm: str) -> tuple:
    """The sequence's order: frozen depths from the least frozen, then the other methods by name."""
    return (0, _depth(arm), arm) if is_freeze(arm) else (1, 0.0, arm)


def variant_label(method: str, frozen_layers, lora_rank) -> str:
    """A method with its own axis value, an arm: "freeze k=2", "lora r=8", "probe"."""
    if method == "freeze":
        return f"freeze k={int(frozen_layers)}"
    if method == "lora":
        return f"lora r={int(lora_rank)}"
    return method


def arm_labels(rows: pd.DataFrame) -> list[str]:
    """Each row's arm by ``variant_label``; rows from before methods (no ``method``, or null) are the
    freeze rows they are, and a missing axis column is null."""
    absent = pd.Series(None, index=rows.index, dtype=object)
    method = rows["method"].fillna("freeze") if "method" in rows else absent.fillna("freeze")
    depth, rank = (rows[c] if c in rows else absent for c in ("frozen_layers", "lora_rank"))
    return [variant_label(m, k, r) for m, k, r in zip(method, depth, rank)]


# --- what to run next, and what would decide it ---------------------------------------------------
def open_arms(decision: GroupDecision, arms: Collection[str], tolerance: float) -> list[str]:
    """The grid's arms (full fine-tuning aside) whose seeds could still change the advice: along the
    "within" sequence, every depth whose own bound does not clear yet, up to the first one that is worse
    by its own bound or hopeless (``_hopeless``): it runs no more seeds, so the sequence never passes it
    and the depths behind it are not tested; the other methods while undecided. Nothing where nothing is
    learned. Which seeds run is no claim: only the claims' levels are paid for (their looks), so this
    may stop early on an estimate."""
    if decision.learned.decision == NOTHING_LEARNED:
        return []
    compared = {c.arm: c for c in decision.arms}
    out = [a for a in arms if not is_freeze(a) and compared.get(a, _NONE).decision not in (WITHIN, WORSE)]
    for arm in sorted((a for a in set(arms) - {FULL} if is_freeze(a)), key=order):
        c = compared.get(arm, _NONE)
        if c.clears:
            continue
        if c.clears_worse or _hopeless(c, decision.levels, tolerance):
            break  # stuck here: no more seeds for it or the depths behind it
        out.append(arm)
    return sorted(out, key=order)


def _stuck_why(c: Comparison, levels: Levels, tolerance: float) -> Comparison:
    """An undecided depth that runs no more seeds (``open_arms``) says so, with why."""
    if c.decision != UNDECIDED or not is_freeze(c.arm):
        return c  # one that clears "worse" is worse (its bound is Holm's held level): never undecided
    if _hopeless(c, levels, tolerance):
        return dataclasses.replace(c, why=f"its seeds so far put it well below −{tolerance:g} when it trains{STUCK}")
    return c


def _hopeless(c: Comparison, levels: Levels, tolerance: float) -> bool:
    """Not within when it trains, by its upper bound at the level of a last look (the least it will be
    asked): more of its seeds would almost surely not move it above −tolerance."""
    from scipy import special

    if c.pairs < MIN_PAIRS or not c.level > 0 or math.isnan(c.low):
        return False
    spread = (c.mean - c.low) / special.stdtrit(c.pairs - 1, 1 - c.level)  # the standard error
    return c.mean + special.stdtrit(c.pairs - 1, 1 - levels.within * LAST_LOOK) * spread < -tolerance


def next_round(
    decision: GroupDecision, rule: SettleRule, arms: list[str], seeds_done: Mapping[str, Collection[int]]
) -> list[tuple[str, int]]:
    """The (arm, seed) cells the next round runs for this group (``arms``: the group's arms in the grid,
    full fine-tuning aside; ``seeds_done``: per arm, full fine-tuning included, the seeds it has a row
    for). Nothing when the group is settled (nothing learned, or no arm left that could change the
    answer: ``open_arms``) or at its budget. Each arm moves along one schedule of seed counts —
    ``initial_seeds``, then ``seeds_per_round`` more per round, never past ``max_seeds`` — so no
    comparison is looked at more often than its look weights allow, whatever the order.

    Learned first (``rule.learned_first``): while it is open whether full fine-tuning beats the constant
    baseline, only full fine-tuning runs; an arm is worth nothing to a group that learns nothing. Once it
    has learned, each open arm catches up on full fine-tuning's seeds (no new full fine-tuning trial),
    those nearest deciding first (``Comparison.nearness``: the order the cells are queued in); full
    fine-tuning runs a new seed only when an arm's pair needs it."""
    if decision.learned.decision == NOTHING_LEARNED:
        return []  # settled: no advice at this size
    full_done = set(seeds_done.get(FULL, ()))
    learned = decision.learned.decision == LEARNED
    full_asked = [] if learned else _next_seeds(full_done, rule)
    if not learned and not full_asked:
        return []  # whether it learns is open at the budget: no arm could be advised
    if not learned and rule.learned_first:
        return [(FULL, s) for s in full_asked]  # that question first
    compared = {c.arm: c for c in decision.arms}
    nearest = sorted(
        open_arms(decision, arms, rule.tolerance),
        key=lambda a: -compared[a].nearness(rule.tolerance) if a in compared else 0.0,
    )
    arm_cells = [(arm, s) for arm in nearest for s in _next_seeds(set(seeds_done.get(arm, ())), rule)]
    full_seeds = sorted(set(full_asked) | ({s for _, s in arm_cells} - full_done))  # every pair needs it
    return [*((FULL, s) for s in full_seeds), *arm_cells]


def _next_seeds(done: set[int], rule: SettleRule) -> list[int]:
    """An arm's next seeds on the schedule: up to the initial seeds, else seeds_per_round more (at most
    max_seeds in all), the lowest seeds it has not run."""
    on_schedule = rule.initial_seeds if len(done) < rule.initial_seeds else len(done) + rule.seeds_per_round
    target = min(rule.max_seeds, on_schedule)
    return list(itertools.islice((s for s in itertools.count() if s not in done), max(0, target - len(done))))


def seeds_to_decide(c: Comparison, rule: SettleRule, levels: Levels, most: int = 100) -> int | None:
    """The smallest budget (max_seeds of a new sweep, its looks and claims paid anew) whose last look would
    decide ``c`` if its means, their spreads and its share of trained seeds stayed as they are: what to ask
    ``freezesweep plan`` to price. The claims that could decide it are those its means point to: "within"
    and "learned" at the sequence's level; "worse" (its trained pairs' mean and, for an arm, its mean with
    its collapses: either bound shows it, each at its share), "nothing learned" and the other methods'
    claims at Holm's first step (the most they could be asked to pass); each at Bonferroni's share of the
    new budget's last look (less than it will be tested at: ``last_look_level``, so the budget errs larger).
    None: undecidable so (its means on the boundary, fewer than MIN_PAIRS differences to estimate a
    spread from) or above ``most``."""
    from scipy import special

    if c.seeds == 0:
        return None
    boundary = rule.tolerance if c.arm == "learned" else -rule.tolerance
    first_step = levels.holm / max(levels.holm_family, 1)  # Holm's first step
    if c.arm == "learned":
        base = levels.within if c.mean > boundary else levels.nothing / 2  # learned / nothing learned (Holm's first)
    elif is_freeze(c.arm) and c.mean > boundary:
        base = levels.within  # within: the sequence's level
    elif c.mean > boundary:
        base = first_step  # another method's within
    else:
        base = WORSE_SHARES["worse when trained"] * first_step
    candidates = []
    if c.pairs >= MIN_PAIRS and not math.isnan(c.low) and c.level > 0:
        spread = (c.mean - c.low) / special.stdtrit(c.pairs - 1, 1 - c.level) * math.sqrt(c.pairs)
        candidates.append((c.mean, spread, c.pairs, base))
    if c.arm != "learned" and c.pairs_all >= MIN_PAIRS and c.level_all > 0 and c.mean_all < boundary:
        spread_all = (c.high_all - c.mean_all) / special.stdtrit(c.pairs_all - 1, 1 - c.level_all)
        candidates.append(
            (c.mean_all, spread_all * math.sqrt(c.pairs_all), c.pairs_all, WORSE_SHARES["worse in mean"] * first_step)
        )
    budgets = [_budget(abs(m - boundary), sd, n / c.seeds, b, rule, most) for m, sd, n, b in candidates]
    return min((b for b in budgets if b is not None), default=None)


def _budget(gap: float, spread: float, share: float, base: float, rule: SettleRule, most: int) -> int | None:
    """The smallest budget whose last look's one-sided bound, at ``base`` × its look weight, clears ``gap``
    with this ``spread`` (a difference's standard deviation) over ``share`` of its seeds."""
    from scipy import special

    if not spread > 0 or gap == 0 or math.isnan(gap):
        return None
    for budget in range(max(rule.max_seeds, rule.initial_seeds) + 1, most + 1):
        n = budget * share
        # Bonferroni's last look, not last_look_level: simulating each candidate budget made a report of 100
        # open groups 7× slower (a diff review), for a budget about a tenth smaller; an estimate either way
        level = base * dataclasses.replace(rule, max_seeds=budget).look_weights[-1]
        if n >= 2 and special.stdtrit(n - 1, 1 - level) * spread / math.sqrt(n) < gap:
            return budget
    return None
