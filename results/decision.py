"""The decision: per sweep, dataset and train size, how many layers can be frozen — one sentence each,
the same honest rule in every mode (results/settle.py).

Each frozen depth is compared with full fine-tuning (k = 0) on the seeds where both trained, and full
fine-tuning with the constant baseline, with one-sided bounds that hold simultaneously over the group's
claims and over every look the sweep took (a fixed grid: one, once complete; a settle sweep: its
budget's); how often each collapses is counted and bounded beside it. Advice is the most-frozen depth
shown within the tolerance of full fine-tuning when it trains, with its collapse count. There is none
from fewer than 3 trained pairs, from a bound of zero width, or where full fine-tuning is not shown to
beat the constant baseline by more than the tolerance; what stays undecided is said, with the seeds it
had and, where the spread so far allows, the budget that would decide it.
"""

from __future__ import annotations

import math

import pandas as pd

from freezesweep.results.query import BASELINE, SCORE, freeze_rows
from freezesweep.results.settle import (
    LEARNED,
    NOTHING_LEARNED,
    UNDECIDED,
    WITHIN,
    WORSE,
    Comparison,
    GroupDecision,
    QUALITY_SHARE,
    SettleRule,
    FINAL,
    decide as decide_group,
    seeds_to_decide,
)
from freezesweep.results.stats import GROUP, TOLERANCE, largest_k_retaining

DECISION_COLUMNS = [
    *GROUP,
    "metric",
    "baseline_seeds",
    "learned",
    "frozen_layers",
    "pairs",
    "score_0",
    "score_k",
    "mean_diff",
    "ci_low",
    "ci_high",
    "collapsed",
    "collapse_upper",
    "confidence",
    "looks",
    "within",
    "worse",
    "undecided",
    "decided_at_seeds",
    "params_saved_pct",
    "time_saved_pct",
    "mem_saved_pct",
    "k_retaining_90",
    "sentence",
]


def decide(
    rows: pd.DataFrame,
    retained: pd.DataFrame,
    costs: pd.DataFrame,
    tolerance: float = TOLERANCE,
    planned_ks: dict[str, set[int]] | None = None,
    rules: dict[str, tuple[SettleRule, int, int]] | None = None,
    planned_seeds: dict[str, set[int]] | None = None,
) -> pd.DataFrame:
    """One row per (sweep, dataset, train size) that has ok rows. ``planned_ks``: the frozen layers of each
    sweep's grid, when known ("k = 0 is not in the grid" or "has not finished"); ``rules``: per sweep,
    its settle rule, looks and comparisons (default: ``tolerance``, 95 %, one look, the arms in the rows:
    a fixed grid); ``planned_seeds``: a fixed grid's seeds, when known — it is looked at once, when every
    planned cell of the group is in (a look at part of it would be one its intervals were not shared by)."""
    layers = freeze_rows(rows)
    retaining = largest_k_retaining(retained).set_index(GROUP)["k_retaining_90"]
    many_sweeps = rows["sweep"].nunique() > 1
    records = []
    for key, group in layers.groupby(GROUP):
        if not (group["status"] == "ok").any():
            continue  # nothing finished: the completeness section says what failed
        rule, looks, comparisons = (rules or {}).get(key[0], (SettleRule(tolerance=tolerance), 1, None))
        decision = decide_group(_arms(group), rule, looks, comparisons)
        record = _record(key, group, decision, rule, looks, costs)
        if key[0] in (rules or {}) and decision.advice is None:  # a settle sweep: what budget would decide it
            record["decided_at_seeds"] = _budget_to_decide(decision, rule, looks)
        running = _running(group, (planned_ks or {}).get(key[0]), (planned_seeds or {}).get(key[0]))
        if key[0] not in (rules or {}) and running:
            records.append(
                {
                    **{c: record[c] for c in (*GROUP, "metric", "baseline_seeds", "confidence", "looks")},
                    "sentence": _prefix(key, many_sweeps) + running,
                }
            )
            continue
        record["k_retaining_90"] = retaining.get(key) if decision.learned.decision == LEARNED else None
        record["sentence"] = _prefix(key, many_sweeps) + sentence(
            record, decision, rule, (planned_ks or {}).get(key[0])
        )
        records.append(record)
    return pd.DataFrame(records, columns=DECISION_COLUMNS)


def _running(group: pd.DataFrame, ks: set[int] | None, seeds: set[int] | None) -> str:
    """Why a fixed grid's group is not looked at yet ("": every planned cell has its outcome)."""
    if not ks or not seeds:
        return ""
    final = set(
        zip(group.loc[group["status"].isin(FINAL), "frozen_layers"], group.loc[group["status"].isin(FINAL), "seed"])
    )
    planned = {(k, s) for k in ks for s in seeds}
    if planned <= final:
        return ""
    return (
        f"the grid is still running here ({len(planned & final)} of {len(planned)} cells in): a fixed grid is "
        "decided once, when all its cells are in (a look at part of it would be one more look than its "
        "confidence was shared by)."
    )


def _arms(group: pd.DataFrame) -> pd.DataFrame:
    """A group's freeze rows as settle mode reads them: arm, seed, score, baseline_score, status."""
    return pd.DataFrame(
        {
            "arm": [f"freeze k={int(k)}" for k in group["frozen_layers"]],
            "seed": group["seed"],
            "score": group[SCORE],
            "baseline_score": group[BASELINE],
            "status": group["status"],
            "collapsed": group["collapsed"] if "collapsed" in group else None,
        }
    )


def _record(
    key: tuple, group: pd.DataFrame, decision: GroupDecision, rule: SettleRule, looks: int, costs: pd.DataFrame
) -> dict:
    ok = group[group["status"] == "ok"]
    record = dict(
        zip(GROUP, key),
        metric=ok["select_metric"].iloc[0] if len(ok) else None,
        baseline_seeds=int((ok["frozen_layers"] == 0).sum()),
        learned=decision.learned.decision,
        confidence=rule.confidence,
        looks=looks,
        **{
            name: ", ".join(_k(c.arm) for c in decision.arms if c.decision == state)
            for name, state in (("within", WITHIN), ("worse", WORSE), ("undecided", UNDECIDED))
        },
    )
    chosen = next((c for c in decision.arms if c.arm == decision.advice), None)
    if chosen is None:
        return record
    k = int(chosen.arm.split("=")[1])
    # the sentence pairs paired numbers only: both means over the seeds where both trained
    record.update(
        frozen_layers=k,
        pairs=int(chosen.pairs),
        score_0=chosen.reference,
        score_k=chosen.score,
        mean_diff=chosen.mean,
        ci_low=chosen.low,
        ci_high=chosen.high,
        collapsed=f"{chosen.collapsed}/{chosen.seeds}",
        collapse_upper=chosen.collapse_upper,
    )
    cell = (*key, k)  # a tuple first: mypy takes (*key, k) inside [] for 3.11's star index
    cost = costs.set_index([*GROUP, "frozen_layers"]).loc[cell]
    for column in ["params_saved_pct", "time_saved_pct", "mem_saved_pct"]:
        record[column] = float(cost[column])
    return record


def _budget_to_decide(decision: GroupDecision, rule: SettleRule, looks: int) -> int | None:
    """The seeds per arm that would decide what is open, if the means and spreads stay as they are
    (None: no such budget up to 100 seeds, or nothing open)."""
    if decision.learned.decision == NOTHING_LEARNED:
        return None
    open_ones = (
        [decision.learned]
        if decision.learned.decision != LEARNED
        else [c for c in decision.arms if c.decision == UNDECIDED]
    )
    comparisons = round(QUALITY_SHARE * (1 - rule.confidence) / (looks * decision.alphas.quality))
    needed = [seeds_to_decide(c, rule, comparisons) for c in open_ones]
    return None if not needed or None in needed else max(needed)


def _k(arm: str) -> str:
    return arm.replace("freeze ", "")


def _prefix(key: tuple, many_sweeps: bool) -> str:
    sweep, dataset, train_size = key
    return f"{sweep} · {dataset}, n = {train_size}: " if many_sweeps else f"{dataset}, n = {train_size}: "


def sentence(record: dict, decision: GroupDecision, rule: SettleRule, planned_ks: set[int] | None = None) -> str:
    """The decision in words (without the "dataset, n = …:" prefix)."""
    left_out = _left_out(decision.excluded)
    if record["baseline_seeds"] == 0:
        why = (
            "none in the store"
            if planned_ks is None
            else "none has finished yet"
            if 0 in planned_ks
            else "the sweep's grid has none"
        )
        return f"no full fine-tuning (k = 0) runs to compare with ({why}), so no decision{left_out}."
    gain, pct = decision.learned, f"{100 * rule.confidence:g} %"
    if gain.decision == NOTHING_LEARNED:
        if gain.pairs == 0 or "collapses" in gain.why:
            return (
                f"nothing learned at this size: full fine-tuning stayed at the constant predictor on {gain.collapsed} "
                f"of {gain.seeds} seeds (it does on at least {100 * gain.collapse_lower:.0f} % of seeds, {pct} "
                f"simultaneous); no freezing advice{left_out}."
            )
        return (
            f"nothing learned at this size: when it trains, full fine-tuning beats the constant baseline by "
            f"{gain.mean:+.3f} (at most {gain.high:+.3f}, {pct} simultaneous bound, {gain.pairs} seeds), not by "
            f"more than {rule.tolerance:g}{_collapses(gain, pct)}; no freezing advice{left_out}."
        )
    if gain.decision == UNDECIDED:
        return (
            f"not yet shown that full fine-tuning beats the constant baseline by more than {rule.tolerance:g} here "
            f"({gain.pairs} trained seed{'s' if gain.pairs != 1 else ''}: {gain.why}); no freezing advice — "
            f"{_add_seeds(record)}{left_out}."
        )
    rest = _others(record)
    if record.get("frozen_layers") is None:
        return (
            f"fine-tune every layer: no k is shown within {rule.tolerance:g} of full fine-tuning at "
            f"{_pairs(decision)} trained pairs{rest}; {_add_seeds(record)}{left_out}."
        )
    savings = [
        _change(record["params_saved_pct"], "fewer", "more", "trainable parameters"),
        _change(record["time_saved_pct"], "less", "more", "train time"),
        _change(record["mem_saved_pct"], "less", "more", "peak memory"),
    ]
    savings = [s for s in savings if s]
    saves = f"; it trains with {_join(savings)}" if savings else ""
    chosen = next(c for c in decision.arms if c.arm == decision.advice)
    return (
        f"freeze {_what(int(record['frozen_layers']))} — when it trains, {record['metric']} {record['score_k']:.3f} "
        f"vs {record['score_0']:.3f} with full fine-tuning on the same {record['pairs']} seeds, paired difference "
        f"{record['mean_diff']:+.3f} (at least {record['ci_low']:+.3f}, {pct} simultaneous bound), within the "
        f"{rule.tolerance:g} tolerance{_collapses(chosen, pct)}{saves}{rest}{left_out}."
    )


def _collapses(c: Comparison, pct: str) -> str:
    """Stability beside quality: the seeds that did not train, and the bound on how often that happens."""
    if not c.seeds:
        return ""
    return (
        f"; {c.collapsed} of {c.seeds} seeds collapsed to the constant predictor or diverged (at most "
        f"{100 * c.collapse_upper:.0f} % of seeds do, {pct} simultaneous)"
    )


def _add_seeds(record: dict) -> str:
    """What would decide it: a budget (plan prices it), or seeds in a new fixed grid."""
    budget = record.get("decided_at_seeds")
    if budget is None or pd.isna(budget):
        return "add seeds (a settle sweep runs as many as the question needs)"
    return (
        f"{int(budget)} seeds per arm would decide it if the spread stays as it is (a new settle sweep with "
        f"settle.max_seeds {int(budget)}: `freezesweep plan` prices it)"
    )


def _pairs(decision: GroupDecision) -> str:
    """The arms' paired seeds: one count, or the range (settle mode gives each arm its own)."""
    counts = sorted({c.pairs for c in decision.arms}) or [0]
    return f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"


def _others(record: dict) -> str:
    parts = [
        f"worse than full fine-tuning: {record['worse']}" if record["worse"] else "",
        f"undecided: {record['undecided']}" if record["undecided"] else "",
    ]
    parts = [p for p in parts if p]
    return f" ({'; '.join(parts)})" if parts else ""


def _left_out(excluded: dict[str, int]) -> str:
    if not excluded:
        return ""
    return " (left out: " + ", ".join(f"{n} {status}" for status, n in sorted(excluded.items())) + ")"


def _what(k: int) -> str:
    if k == -1:
        return "the embeddings only (k = -1)"
    return f"the embeddings and the first {k} layer{'s' if k != 1 else ''} (k = {k})"


def _change(pct: float, fewer: str, more: str, noun: str) -> str:
    if pct is None or math.isnan(pct):
        return ""  # not measured (e.g. peak memory on some devices): say nothing rather than 0 %
    return f"{abs(pct):.0f} % {fewer if pct >= 0 else more} {noun}"


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
