"""Questions asked of a sweep's store: SQL (DuckDB), the summary table, per-axis status, and the
per-cell aggregates the report builds on. One place aggregates rows: ``summary``, ``query``,
``status`` and ``report`` all read and group through the functions here."""

from __future__ import annotations

from collections import Counter

import duckdb
import pandas as pd

from results.store import ResultStore

SUMMARY_KEYS = ["dataset", "train_size", "frozen_layers"]
CELL_KEYS = ["sweep", *SUMMARY_KEYS]  # a cell across sweeps: the report compares sweeps side by side
SUMMARY_STATS = ["n", "mean", "median", "std", "min", "max"]
# What the report reads: not the curves or train indices, which dominate a row's size.
REPORT_COLUMNS = ["sweep", "trial_id", "dataset", "model", "train_size", "frozen_layers", "seed", "method",
                  "status", "best_val_accuracy", "majority_baseline", "trainable_params", "total_params",
                  "train_time_s", "eval_time_s", "wall_time_s", "peak_mem_mb", "precision", "device", "node",
                  "error"]


def sql(store: ResultStore, query: str = "SELECT * FROM results") -> pd.DataFrame:
    """Run SQL over the store; the rows are the table ``results``."""
    con = duckdb.connect()
    con.register("results", store.read_table())
    return con.execute(query).df()


def read_rows(store: ResultStore, columns: list[str] | None = REPORT_COLUMNS) -> pd.DataFrame:
    """The sweep's rows as a DataFrame (only ``columns``; None: all of them)."""
    return store.read_table(columns=columns).to_pandas()


def ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Finished trials only: failed and oom rows carry no accuracy or cost."""
    return df[df["status"] == "ok"]


def summary(df: pd.DataFrame, keys: list[str] = SUMMARY_KEYS) -> pd.DataFrame:
    """Per dataset × train size × frozen layers over ok rows: n and mean, median, std, min, max of the
    best validation accuracy (the layout of the reference study's appendix), with the majority."""
    ok = ok_rows(df)
    if ok.empty:
        return pd.DataFrame(columns=keys + SUMMARY_STATS + ["majority"])
    grouped = ok.groupby(keys)
    table = grouped["best_val_accuracy"].agg(["count", "mean", "median", "std", "min", "max"])
    table = table.rename(columns={"count": "n"})
    table["majority"] = grouped["majority_baseline"].first()
    return table.reset_index().sort_values(keys, ignore_index=True)


def cell_means(df: pd.DataFrame, columns: list[str], keys: list[str] = CELL_KEYS) -> pd.DataFrame:
    """Mean over seeds of ``columns`` per cell (ok rows), with ``seeds``: how many rows it averages."""
    ok = ok_rows(df)
    grouped = ok.groupby(keys)
    table = grouped[columns].mean()
    table.insert(0, "seeds", grouped.size())
    return table.reset_index().sort_values(keys, ignore_index=True)


def paired_by_seed(df: pd.DataFrame, baseline_k: int = 0) -> pd.DataFrame:
    """Each ok row beside the baseline row (k = ``baseline_k``) of the same sweep, dataset, train size
    and seed: seeds are paired, so the two runs share head init and batch order. Columns: the row's
    own plus ``<column>_base`` for accuracy and cost; cells without a baseline row drop out."""
    ok = ok_rows(df)
    base = ok[ok["frozen_layers"] == baseline_k]
    paired_columns = ["best_val_accuracy", "trainable_params", "train_time_s", "peak_mem_mb"]
    base = base[["sweep", "dataset", "train_size", "seed", *paired_columns]]
    return ok.merge(base, on=["sweep", "dataset", "train_size", "seed"], suffixes=("", "_base"))


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
