"""Questions asked of a sweep's store: SQL (DuckDB), the summary table, per-axis status."""

from __future__ import annotations

from collections import Counter

import duckdb
import pandas as pd

from results.store import ResultStore

SUMMARY_KEYS = ["dataset", "train_size", "frozen_layers"]


def sql(store: ResultStore, query: str = "SELECT * FROM results") -> pd.DataFrame:
    """Run SQL over the store; the rows are the table ``results``."""
    con = duckdb.connect()
    con.register("results", store.read_table())
    return con.execute(query).df()


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per dataset × train size × frozen layers over ok rows: n and mean, median, std, min, max of the
    best validation accuracy (the layout of the reference study's appendix), with the majority."""
    ok = df[df["status"] == "ok"]
    if ok.empty:
        return pd.DataFrame(columns=SUMMARY_KEYS + ["n", "mean", "median", "std", "min", "max", "majority"])
    grouped = ok.groupby(SUMMARY_KEYS)
    table = grouped["best_val_accuracy"].agg(["count", "mean", "median", "std", "min", "max"])
    table = table.rename(columns={"count": "n"})
    table["majority"] = grouped["majority_baseline"].first()
    return table.reset_index().sort_values(SUMMARY_KEYS, ignore_index=True)


STATUS_AXES = ("dataset", "train_size", "frozen_layers", "seed")
OUTCOMES = ("done", "failed", "missing")


def status_table(cells: list, statuses: dict[str, str]) -> pd.DataFrame:
    """done / failed / missing counts per value of each axis (in the spec's order) and in total."""
    counts: dict[tuple[str, str], Counter] = {}
    for cfg in cells:
        state = statuses.get(cfg.trial_id)
        outcome = "done" if state == "ok" else "missing" if state is None else "failed"
        for key in [(axis, str(getattr(cfg, axis))) for axis in STATUS_AXES] + [("total", "")]:
            counts.setdefault(key, Counter())[outcome] += 1
    order = STATUS_AXES + ("total",)
    keys = sorted(counts, key=lambda key: order.index(key[0]))  # stable: grid order within an axis
    return pd.DataFrame([{"axis": a, "value": v, **{o: counts[a, v][o] for o in OUTCOMES}} for a, v in keys],
                        columns=["axis", "value", *OUTCOMES])
