"""The decision: per sweep, dataset and train size, how many layers can be frozen — one sentence each,
the same honest rule in every mode (results/settle.py).

Each frozen depth is compared with full fine-tuning (k = 0) on paired seeds, and full fine-tuning with
the constant baseline, with intervals that hold simultaneously over the group's comparisons and over
every look the sweep took (a fixed grid: one; a settle sweep: its budget's). Advice is the most-frozen
depth shown within the tolerance of full fine-tuning. There is none from fewer than 3 paired seeds, from
an interval of zero width, or where full fine-tuning does not beat the constant baseline (nothing
learned at this size); what stays undecided is said, with the seeds it had.
"""

from __future__ import annotations

import math

import pandas as pd

from freezesweep.results.query import BASELINE, SCORE, freeze_rows
from freezesweep.results.settle import (LEARNED, NOTHING_LEARNED, UNDECIDED, WITHIN, WORSE, GroupDecision, SettleRule,
                            decide as decide_group)
from freezesweep.results.stats import GROUP, TOLERANCE, largest_k_retaining

DECISION_COLUMNS = [*GROUP, "metric", "baseline_seeds", "learned", "frozen_layers", "pairs", "score_0", "score_k",
                    "mean_diff", "ci_low", "ci_high", "confidence", "looks", "within", "worse", "undecided",
                    "params_saved_pct", "time_saved_pct", "mem_saved_pct", "k_retaining_90", "sentence"]


def decide(rows: pd.DataFrame, retained: pd.DataFrame, costs: pd.DataFrame, tolerance: float = TOLERANCE,
           planned_ks: dict[str, set[int]] | None = None,
           rules: dict[str, tuple[SettleRule, int, int]] | None = None
           ) -> pd.DataFrame:
    """One row per (sweep, dataset, train size) that has ok rows. ``planned_ks``: the frozen layers of each
    sweep's grid, when known ("k = 0 is not in the grid" or "has not finished"); ``rules``: per sweep,
    its settle rule, looks and comparisons (default: ``tolerance``, 95 %, one look, the arms in the rows:
    a fixed grid)."""
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
        record["k_retaining_90"] = retaining.get(key) if decision.learned.decision == LEARNED else None
        record["sentence"] = _prefix(key, many_sweeps) + sentence(record, decision, rule, (planned_ks or {}).get(key[0]))
        records.append(record)
    return pd.DataFrame(records, columns=DECISION_COLUMNS)


def _arms(group: pd.DataFrame) -> pd.DataFrame:
    """A group's freeze rows as settle mode reads them: arm, seed, score, baseline_score, status."""
    return pd.DataFrame({"arm": [f"freeze k={int(k)}" for k in group["frozen_layers"]], "seed": group["seed"],
                         "score": group[SCORE], "baseline_score": group[BASELINE], "status": group["status"]})


def _record(key: tuple, group: pd.DataFrame, decision: GroupDecision, rule: SettleRule, looks: int,
            costs: pd.DataFrame) -> dict:
    ok = group[group["status"] == "ok"]
    record = dict(zip(GROUP, key), metric=ok["select_metric"].iloc[0] if len(ok) else None,
                  baseline_seeds=int((ok["frozen_layers"] == 0).sum()), learned=decision.learned.decision,
                  confidence=rule.confidence, looks=looks,
                  **{name: ", ".join(_k(c.arm) for c in decision.arms if c.decision == state)
                     for name, state in (("within", WITHIN), ("worse", WORSE), ("undecided", UNDECIDED))})
    chosen = next((c for c in decision.arms if c.arm == decision.advice), None)
    if chosen is None:
        return record
    k = int(chosen.arm.split("=")[1])
    means = ok.groupby("frozen_layers")[SCORE].mean()
    record.update(frozen_layers=k, pairs=int(chosen.pairs), score_0=means.get(0), score_k=means.get(k), mean_diff=chosen.mean,
                  ci_low=chosen.low, ci_high=chosen.high)
    cost = costs.set_index([*GROUP, "frozen_layers"]).loc[(*key, k)]
    for column in ["params_saved_pct", "time_saved_pct", "mem_saved_pct"]:
        record[column] = float(cost[column])
    return record


def _k(arm: str) -> str:
    return arm.replace("freeze ", "")


def _prefix(key: tuple, many_sweeps: bool) -> str:
    sweep, dataset, train_size = key
    return f"{sweep} · {dataset}, n = {train_size}: " if many_sweeps else f"{dataset}, n = {train_size}: "


def sentence(record: dict, decision: GroupDecision, rule: SettleRule, planned_ks: set[int] | None = None) -> str:
    """The decision in words (without the "dataset, n = …:" prefix)."""
    left_out = _left_out(decision.excluded)
    if record["baseline_seeds"] == 0:
        why = ("none in the store" if planned_ks is None else
               "none has finished yet" if 0 in planned_ks else "the sweep's grid has none")
        return f"no full fine-tuning (k = 0) runs to compare with ({why}), so no decision{left_out}."
    gain = decision.learned
    level = f"{100 * rule.confidence:g} % simultaneous interval"
    if gain.decision == NOTHING_LEARNED:
        return (f"nothing learned at this size: full fine-tuning beats the constant baseline by {gain.mean:+.3f} "
                f"({level} {gain.low:+.3f} to {gain.high:+.3f}, {gain.pairs} seeds), not by more than "
                f"{rule.tolerance:g}; no freezing advice{left_out}.")
    if gain.decision == UNDECIDED:
        return (f"not yet shown that full fine-tuning learns anything here ({gain.pairs} seed"
                f"{'s' if gain.pairs != 1 else ''}: {gain.why}); no freezing advice — add seeds{left_out}.")
    rest = _others(record)
    if record.get("frozen_layers") is None:
        return (f"no k is shown within {rule.tolerance:g} of full fine-tuning at {_pairs(decision)} paired seeds"
                f"{rest}: fine-tune every layer, or add seeds (settle mode runs as many as the question needs)"
                f"{left_out}.")
    savings = [_change(record["params_saved_pct"], "fewer", "more", "trainable parameters"),
               _change(record["time_saved_pct"], "less", "more", "train time"),
               _change(record["mem_saved_pct"], "less", "more", "peak memory")]
    savings = [s for s in savings if s]
    saves = f"; it trains with {_join(savings)}" if savings else ""
    return (f"freeze {_what(int(record['frozen_layers']))} — {record['metric']} {record['score_k']:.3f} vs "
            f"{record['score_0']:.3f} with full fine-tuning, paired difference {record['mean_diff']:+.3f} ({level} "
            f"{record['ci_low']:+.3f} to {record['ci_high']:+.3f}, {record['pairs']} seeds), within the "
            f"{rule.tolerance:g} tolerance{saves}{rest}{left_out}.")


def _pairs(decision: GroupDecision) -> str:
    """The arms' paired seeds: one count, or the range (settle mode gives each arm its own)."""
    counts = sorted({c.pairs for c in decision.arms}) or [0]
    return f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"


def _others(record: dict) -> str:
    parts = [f"worse than full fine-tuning: {record['worse']}" if record["worse"] else "",
             f"undecided: {record['undecided']}" if record["undecided"] else ""]
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
