"""Questions asked of a sweep's store: SQL (DuckDB), the summary table, per-axis status."""

from __future__ import annotations

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


def status_table(cells: list, statuses: dict[str, str]) -> pd.DataFrame:
    """done / failed / missing counts per value of each axis (and in total)."""
    rows = []
    for cfg in cells:
        state = statuses.get(cfg.trial_id)
        outcome = "done" if state == "ok" else "missing" if state is None else "failed"
        for axis in ("dataset", "train_size", "frozen_layers", "seed"):
            rows.append({"axis": axis, "value": str(getattr(cfg, axis)), "outcome": outcome})
        rows.append({"axis": "total", "value": "", "outcome": outcome})
    if not rows:
        return pd.DataFrame(columns=["axis", "value", "done", "failed", "missing"])
    table = pd.crosstab([pd.Series([r["axis"] for r in rows], name="axis"),
                         pd.Series([r["value"] for r in rows], name="value")],
                        pd.Series([r["outcome"] for r in rows], name="outcome"))
    for column in ("done", "failed", "missing"):
        if column not in table:
            table[column] = 0
    order = {"dataset": 0, "train_size": 1, "frozen_layers": 2, "seed": 3, "total": 4}
    table = table[["done", "failed", "missing"]].reset_index()
    table["_o"] = table["axis"].map(order)
    table["_v"] = pd.to_numeric(table["value"], errors="coerce")
    return table.sort_values(["_o", "_v", "value"]).drop(columns=["_o", "_v"]).reset_index(drop=True)
