"""The decision: per sweep, dataset and train size, the largest k whose selected metric (each row's
``select_metric``: accuracy, Matthews, F1, Pearson, …) is not worse than full
fine-tuning beyond a tolerance with 95 % confidence, and what freezing it saves — one sentence each.

The rule: among k ≠ 0, the largest (by how much it freezes) whose paired mean difference
score_k − score_0 has a CI lower bound ≥ −tolerance. With few seeds the CI is wide, and then no k
qualifies: the sentence says so rather than guessing.
"""

from __future__ import annotations

import math

import pandas as pd

from results.query import ok_rows
from results.stats import GROUP, TOLERANCE, largest_k, largest_k_retaining

DECISION_COLUMNS = [*GROUP, "metric", "baseline_seeds", "frozen_layers", "score_0", "score_k", "mean_diff", "ci_low", "ci_high",
                    "params_saved_pct", "time_saved_pct", "mem_saved_pct", "k_retaining_90",
                    "sentence"]


def decide(rows: pd.DataFrame, contrasts: pd.DataFrame, retained: pd.DataFrame, costs: pd.DataFrame,
           tolerance: float = TOLERANCE, planned_ks: dict[str, set[int]] | None = None) -> pd.DataFrame:
    """One row per (sweep, dataset, train size) that has ok rows. ``planned_ks``: the frozen layers of
    each sweep's grid, when known, to tell "k = 0 is not in the grid" from "k = 0 has not finished"."""
    groups = ok_rows(rows).groupby(GROUP)
    retaining = largest_k_retaining(retained).set_index(GROUP)["k_retaining_90"]
    many_sweeps = rows["sweep"].nunique() > 1
    records = []
    for key, cell in groups:
        record = _decide_one(key, cell, contrasts, costs, tolerance)
        record["k_retaining_90"] = retaining.get(key)
        planned = (planned_ks or {}).get(key[0])
        record["sentence"] = _prefix(key, many_sweeps) + sentence(record, tolerance, planned)
        records.append(record)
    return pd.DataFrame(records, columns=DECISION_COLUMNS)


def _decide_one(key: tuple, cell: pd.DataFrame, contrasts: pd.DataFrame, costs: pd.DataFrame,
                tolerance: float) -> dict:
    record = dict(zip(GROUP, key), metric=cell["select_metric"].iloc[0],
                  baseline_seeds=int((cell["frozen_layers"] == 0).sum()))
    mine = contrasts[(contrasts[GROUP] == pd.Series(dict(zip(GROUP, key)))).all(axis=1)]
    record["max_pairs"] = int(mine["pairs"].max()) if len(mine) else 0
    qualifying = mine[mine["ci_low"] >= -tolerance]  # a nan bound (one seed) never qualifies
    k = largest_k(qualifying["frozen_layers"])
    record["frozen_layers"] = k
    if k is None:
        record["closest"] = mine.loc[mine["ci_low"].idxmax()] if mine["ci_low"].notna().any() else None
        return record
    chosen = qualifying[qualifying["frozen_layers"] == k].iloc[0]
    record.update(pairs=int(chosen["pairs"]), score_k=chosen["score_k"], score_0=chosen["score_0"],
                  mean_diff=chosen["mean_diff"], ci_low=chosen["ci_low"], ci_high=chosen["ci_high"])
    cost = costs.set_index([*GROUP, "frozen_layers"]).loc[(*key, k)]
    for column in ["params_saved_pct", "time_saved_pct", "mem_saved_pct"]:
        record[column] = float(cost[column])
    return record


def _prefix(key: tuple, many_sweeps: bool) -> str:
    sweep, dataset, train_size = key
    return f"{sweep} · {dataset}, n = {train_size}: " if many_sweeps else f"{dataset}, n = {train_size}: "


def sentence(record: dict, tolerance: float, planned_ks: set[int] | None = None) -> str:
    """The decision in words (without the "dataset, n = …:" prefix)."""
    if record["baseline_seeds"] == 0:
        why = ("none in the store" if planned_ks is None else
               "none has finished yet" if 0 in planned_ks else "the sweep's grid has none")
        return f"no full fine-tuning (k = 0) runs to compare with ({why}), so no decision."
    if record["frozen_layers"] is None:
        pairs = record["max_pairs"]
        few = "; a confidence interval needs at least 2" if pairs < 2 else ""
        return (f"no k can be shown to be within {tolerance:g} of full fine-tuning with 95 % confidence "
                f"({pairs} paired seed{'s' if pairs != 1 else ''}{few}){_closest(record.get('closest'))}: "
                f"fine-tune every layer, or add seeds.")
    savings = [_change(record["params_saved_pct"], "fewer", "more", "trainable parameters"),
               _change(record["time_saved_pct"], "less", "more", "train time"),
               _change(record["mem_saved_pct"], "less", "more", "peak memory")]
    savings = [s for s in savings if s]
    saves = f"; it trains with {_join(savings)}" if savings else ""
    return (f"freeze {_what(record['frozen_layers'])} — {record['metric']} {record['score_k']:.3f} vs {record['score_0']:.3f} "
            f"with full fine-tuning, paired difference {record['mean_diff']:+.3f} "
            f"(95 % CI {record['ci_low']:+.3f} to {record['ci_high']:+.3f}, {record['pairs']} seeds), within the "
            f"{tolerance:g} tolerance{saves}.")


def _closest(contrast: pd.Series | None) -> str:
    """The k nearest to qualifying (highest CI lower bound): what more seeds might confirm."""
    if contrast is None:
        return ""
    return (f"; the closest, k = {int(contrast['frozen_layers'])}, differs by {contrast['mean_diff']:+.3f} "
            f"(95 % CI {contrast['ci_low']:+.3f} to {contrast['ci_high']:+.3f})")


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
