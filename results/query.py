"""Questions asked of a sweep's store: SQL (DuckDB), the summary table, per-axis status, and the
per-cell aggregates the report builds on. One place aggregates rows: ``summary``, ``query``,
``status`` and ``report`` all read and group through the functions here.

Every row names the metric that picked its best evaluation (``select_metric``) and holds its value
there (``best_val_score``) and the constant baseline's (``baseline_score``); that is what summaries
and the report show. Rows stored before these columns existed picked by accuracy: they read as such.

The baseline and the collapse test describe the rows the scores were computed on (``baseline_rows``).
Rows stored before that column computed the baseline on the whole validation split: where they were
scored on a ``max_eval_examples`` sample they read as ``WHOLE_SPLIT``, and a seed of theirs that answered
one class may be stored ``collapsed = false`` (``whole_split_rows`` counts them; the report names them).
"""

from __future__ import annotations

import duckdb
import pandas as pd

from freezesweep.results.store import EVALUATED_ROWS, METRICS, WHOLE_SPLIT, ResultStore

SUMMARY_KEYS = ["dataset", "model", "method", "train_size", "frozen_layers", "lora_rank"]
# Shown only where they tell rows apart (_SHOWN_WHEN): a one-model freeze sweep's summary is dataset × n × k.
OPTIONAL_KEYS = ("model", "method", "lora_rank")
CELL_KEYS = ["sweep", "dataset", "train_size", "frozen_layers"]  # a freeze cell across sweeps (the report)
METHOD_AXES = ("frozen_layers", "lora_rank")  # each method's own axis: null on other methods' rows
SUMMARY_STATS = ["n", "mean", "median", "std", "min", "max"]
SCORE, BASELINE = "best_val_score", "baseline_score"  # the selected metric's, in every row
# What the report reads: not the curves or train indices, which dominate a row's size.
REPORT_COLUMNS = [
    "sweep",
    "trial_id",
    "dataset",
    "model",
    "train_size",
    "frozen_layers",
    "seed",
    "method",
    "lora_rank",
    "status",
    "select_metric",
    SCORE,
    BASELINE,
    "collapsed",
    "baseline_rows",
    "best_val_accuracy",
    "majority_baseline",
    "trainable_params",
    "total_params",
    "train_time_s",
    "eval_time_s",
    "wall_time_s",
    "peak_mem_mb",
    "precision",
    "device",
    "node",
    "error",
]
# What summary reads: every metric at the best evaluation and of the baseline, no curves.
SUMMARY_COLUMNS = list(
    dict.fromkeys(REPORT_COLUMNS + [f"{kind}_{m}" for kind in ("best_val", "baseline") for m in METRICS])
)
# Rows stored before select_metric existed: their selected metric was accuracy (column ← legacy column).
LEGACY_METRIC = "accuracy"
_LEGACY = {
    SCORE: "best_val_accuracy",
    "final_val_score": "final_val_accuracy",
    BASELINE: "majority_baseline",
    "baseline_accuracy": "majority_baseline",
}


# A row stored before baseline_rows existed (null there, but with a baseline) computed its baseline on the whole
# validation split: the rows it was scored on unless max_eval_examples drew fewer (n_eval = max_eval_examples:
# a sample, or a split of exactly that many rows; n_eval below it: the whole, smaller split). SQL over the
# stored columns, for the view and for read_rows.
_MAX_EVAL = "json_extract(config, '$.max_eval_examples')::BIGINT"
_BASELINE_ROWS = f"""CASE WHEN baseline_rows IS NOT NULL OR coalesce(baseline_score, majority_baseline) IS NULL
    THEN baseline_rows
    WHEN {_MAX_EVAL} IS NULL OR n_eval < {_MAX_EVAL} THEN '{EVALUATED_ROWS}'
    ELSE '{WHOLE_SPLIT}' END"""
_BASELINE_ROWS_READS = ["baseline_rows", "baseline_score", "majority_baseline", "n_eval", "config"]


def sql(store: ResultStore, query: str = "SELECT * FROM results") -> pd.DataFrame:
    """Run SQL over the store; the rows are the table ``results`` (old rows read as picked by accuracy)."""
    return connect(store).execute(query).df()


def connect(store: ResultStore) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection whose view ``results`` is the store's rows (old rows read as picked by accuracy)."""
    con = duckdb.connect()
    con.register("stored", store.scan())
    legacy = "select_metric IS NULL"
    filled = [f"CASE WHEN {legacy} THEN {old} ELSE {new} END AS {new}" for new, old in _LEGACY.items()]
    filled.append(f"coalesce(select_metric, '{LEGACY_METRIC}') AS select_metric")
    filled.append(f"{_BASELINE_ROWS} AS baseline_rows")
    con.execute(f"CREATE VIEW results AS SELECT * REPLACE ({', '.join(filled)}) FROM stored")
    return con


def with_selected_metric(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with the selected-metric columns filled in for rows stored before they existed."""
    if "select_metric" in df and df["select_metric"].notna().all():
        return df  # nothing old in it (already filled, or all new rows)
    df = df.copy()
    if "select_metric" not in df:
        df["select_metric"] = None
    legacy = df["select_metric"].isna()
    df.loc[legacy, "select_metric"] = LEGACY_METRIC
    for new, old in _LEGACY.items():
        if old in df:
            current = df[new] if new in df else pd.Series(float("nan"), index=df.index)
            df[new] = current.where(~legacy, df[old])
    return df


def read_rows(store: ResultStore, columns: list[str] | None = REPORT_COLUMNS) -> pd.DataFrame:
    """The sweep's rows as a DataFrame (only ``columns``; None: all of them)."""
    return with_baseline_rows(with_methods(with_selected_metric(store.read_table(columns=columns).to_pandas())), store)


def with_baseline_rows(df: pd.DataFrame, store: ResultStore) -> pd.DataFrame:
    """``df`` with ``baseline_rows`` filled in for rows stored before it: the store's config and n_eval of
    those rows are read only when there are some (a store written since reads nothing more)."""
    if (
        not {"baseline_rows", "trial_id", BASELINE} <= set(df)
        or not (df["baseline_rows"].isna() & df[BASELINE].notna()).any()
    ):
        return df
    with duckdb.connect() as con:
        con.register("stored", store.read_table(columns=["trial_id", *_BASELINE_ROWS_READS]))
        filled = con.execute(f"SELECT trial_id, {_BASELINE_ROWS} AS baseline_rows FROM stored").df()
    return df.assign(baseline_rows=df["trial_id"].map(filled.set_index("trial_id")["baseline_rows"]))


def whole_split_rows(df: pd.DataFrame) -> pd.Series:
    """Per sweep, its ok rows scored on a sample whose baseline came from the whole validation split (rows
    stored before ``baseline_rows``): a collapse among them may be stored as a trained seed."""
    if "baseline_rows" not in df:
        return pd.Series(dtype="int64")
    ok = ok_rows(df)
    return ok[ok["baseline_rows"] == WHOLE_SPLIT].groupby("sweep").size()


def with_methods(df: pd.DataFrame) -> pd.DataFrame:
    """Method axes as nullable integers (null where the axis does not apply, not a float NaN), and
    rows stored before the method column existed as the freeze rows they are."""
    df = df.copy()
    df["method"] = df["method"].fillna("freeze") if "method" in df else "freeze"
    for axis in METHOD_AXES:
        if axis in df:
            df[axis] = df[axis].astype("Int64")
    return df


def freeze_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of the freeze method, its frozen_layers as plain integers (what the layer analysis reads)."""
    freeze = df[df["method"].fillna("freeze") == "freeze"] if "method" in df else df
    return freeze.astype({"frozen_layers": "int64"})


def ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Finished trials only: failed and oom rows carry no metrics or cost."""
    return df[df["status"] == "ok"]


def summary(df: pd.DataFrame, keys: list[str] = SUMMARY_KEYS, metric: str | None = None) -> pd.DataFrame:
    """Per dataset × train size × frozen layers over ok rows: n and mean, median, std, min, max of the
    selected metric at the best evaluation (``metric``: another recorded one, at that same evaluation;
    the layout of the reference study's appendix), with the constant baseline's value."""
    if metric is not None and metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r} (known: {', '.join(METRICS)})")
    ok = with_methods(with_selected_metric(ok_rows(df)))
    keys = [k for k in keys if k in ok or k not in OPTIONAL_KEYS]  # rows from before an optional key existed
    if ok.empty:
        return pd.DataFrame(columns=_shown_keys(ok, keys) + ["metric"] + SUMMARY_STATS + ["baseline"])
    score, baseline = (SCORE, BASELINE) if metric is None else (f"best_val_{metric}", f"baseline_{metric}")
    if metric is not None and not _recorded(ok, score):  # a regression metric of a classifier, say
        recorded = [m for m in METRICS if _recorded(ok, f"best_val_{m}")]
        raise ValueError(f"metric {metric!r} is not recorded in these rows (they record {', '.join(recorded)})")
    ok = ok.assign(metric=ok["select_metric"] if metric is None else metric)
    grouped = ok.groupby(keys, dropna=False)  # a method's missing axis is a key value too
    table = grouped[score].agg(["count", "mean", "median", "std", "min", "max"]).rename(columns={"count": "n"})
    table.insert(0, "metric", grouped["metric"].first())
    table["baseline"] = grouped[baseline].first()
    table = table.reset_index().sort_values(keys, ignore_index=True, na_position="first")
    return table.drop(columns=[k for k in keys if k not in _shown_keys(ok, keys)])


def _recorded(rows: pd.DataFrame, column: str) -> bool:
    return column in rows and bool(rows[column].notna().any())


_SHOWN_WHEN = {
    "model": lambda column: column.nunique() > 1,  # more than one model
    "method": lambda column: (column != "freeze").any(),  # a method beyond freezing
    "lora_rank": lambda column: column.notna().any(),
}  # LoRA rows


def _shown_keys(ok: pd.DataFrame, keys: list[str]) -> list[str]:
    """``keys`` without the optional ones that tell none of these rows apart."""
    return [k for k in keys if k not in OPTIONAL_KEYS or (k in ok and _SHOWN_WHEN[k](ok[k]))]


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
    own plus ``<column>_base`` for the selected metric and cost; cells without a baseline row drop out."""
    ok = ok_rows(df)
    base = ok[ok["frozen_layers"] == baseline_k]
    paired_columns = [SCORE, "trainable_params", "train_time_s", "peak_mem_mb"]
    base = base[["sweep", "dataset", "train_size", "seed", *paired_columns]]
    return ok.merge(base, on=["sweep", "dataset", "train_size", "seed"], suffixes=("", "_base"))


# Where rows ran. A node is a Ray node id: two nodes on one host are two nodes. Rows stored before
# node ids existed name only their host (``node``): they count as one node per host. A row without a node
# id on a host that rows with node ids name is none of its own (``_placed``).
NODE_COLUMNS = ["node_id", "node_ip", "hostname", "node", "gpu_uuid", "gpu_mps", "status"]


REASON_CHARS = 200  # of an error's first line, where one line says why (the row's ``error`` has it whole)


def first_line(error: str | None) -> str:
    """Why a trial failed, in a line: its error's first (``DatasetError: …``), cut at ``REASON_CHARS``."""
    first = (error or "").strip().split("\n", 1)[0]
    return first if len(first) <= REASON_CHARS else first[: REASON_CHARS - 1] + "…"


def failure_reasons(rows: pd.DataFrame, limit: int = 5) -> pd.DataFrame:
    """Why the cells that are failed now (their last row failed or ran out of memory) failed: each
    error's ``first_line`` with how many cells it stopped, the most first, at most ``limit``."""
    last = rows.drop_duplicates("trial_id", keep="last")
    failed = last[last["status"].isin(["failed", "oom"])]
    reasons = failed["error"].map(lambda error: first_line(error) or "(no error recorded)")
    return reasons.value_counts().head(limit).rename_axis("error").reset_index(name="cells")


def placement(df: pd.DataFrame) -> pd.DataFrame:
    """Per node: its IP and host, the rows it ran (ok and not), the distinct GPUs they used and whether
    CUDA MPS served them (``mps``: on, off, or empty where no row says: CPU rows, rows from before)."""
    columns = ["node", "node_ip", "hostname", "rows", "ok", "gpus", "mps"]
    if df.empty:
        return pd.DataFrame(columns=columns)
    df = _placed(df.assign(hostname=df["hostname"].fillna(df["node"]), ok=df["status"] == "ok"))
    grouped = df.groupby("node", sort=True)
    table = pd.DataFrame(
        {
            "node_ip": grouped["node_ip"].first(),
            "hostname": grouped["hostname"].first(),
            "rows": grouped.size(),
            "ok": grouped["ok"].sum(),
            "gpus": grouped["gpu_uuid"].nunique(),
            "mps": grouped["gpu_mps"].agg(_mps) if "gpu_mps" in df else "",
        }
    )
    return table.reset_index()[columns]


def _placed(df: pd.DataFrame) -> pd.DataFrame:
    """The rows that name a node, each with it (``node``): its Ray node id, else for a row from before node
    ids existed its host's ("host X"). A row without a node id on a host other rows name a node of (a
    trial that failed before its worker said where it ran) is no node of its own: which of the host's
    nodes ran it is not recorded, so it is left out, as is a row naming neither where any node is known (a
    walk-through's one machine was said to be 2 nodes)."""
    identified = df["node_id"].notna()
    legacy = df["hostname"].notna() & ~df["hostname"].isin(df.loc[identified, "hostname"])
    node = df["node_id"].where(identified, "host " + df["hostname"].fillna("").astype(str))
    placed = identified | legacy
    if not placed.any():
        return df.assign(node="unknown")  # rows ran somewhere: one node at least, which no row names
    return df[placed].assign(node=node[placed])


def _mps(values: pd.Series) -> str:
    """A node's MPS as its GPU rows saw it: on, off, or both where it changed between trials."""
    seen = {bool(v) for v in values.dropna()}
    return {frozenset({True}): "on", frozenset({False}): "off", frozenset({True, False}): "on and off"}.get(
        frozenset(seen), ""
    )


def mps_summary(nodes: pd.DataFrame) -> str | None:
    """One line on MPS over ``placement``'s nodes, where any ran GPU rows that say (None elsewhere)."""
    said = nodes[nodes["mps"] != ""] if "mps" in nodes else nodes.iloc[0:0]
    if said.empty:
        return None
    on = int((said["mps"] == "on").sum())
    return f"CUDA MPS on at {on} of {len(said)} GPU node(s)" + (
        "" if on == len(said) else ": trials that share a GPU there take turns on it"
    )


STATUS_AXES = ("model", "dataset", "method", "train_size", "frozen_layers", "lora_rank", "seed")
OUTCOMES = ("done", "diverged", "failed", "missing")


def status_table(cells: list, statuses: dict[str, str]) -> pd.DataFrame:
    """done / diverged / failed / missing counts per value of each axis (in the spec's order) and in
    total. Diverged cells (a non-finite loss) are outcomes, counted apart: neither done nor failed."""
    if not cells:
        return pd.DataFrame(columns=["axis", "value", *OUTCOMES])
    state = pd.Series([statuses.get(cfg.trial_id) for cfg in cells], dtype=object)
    outcome = state.map({"ok": "done", "diverged": "diverged"}).fillna("failed").where(state.notna(), "missing")
    values = {a: pd.Series([getattr(cfg, a) for cfg in cells], dtype=object) for a in STATUS_AXES}
    axes = [a for a in STATUS_AXES if a not in ("model", "method") or values[a].nunique() > 1]
    parts = [_outcome_counts(values[a], outcome).assign(axis=a) for a in axes]
    total = pd.DataFrame([{"axis": "total", "value": "", **outcome.value_counts().to_dict()}])
    table = pd.concat([*parts, total], ignore_index=True).fillna({o: 0 for o in OUTCOMES})
    table = table[["axis", "value", *OUTCOMES]].astype({"value": str, **{o: int for o in OUTCOMES}})
    return table.rename_axis(columns=None)


def _outcome_counts(axis_values: pd.Series, outcome: pd.Series) -> pd.DataFrame:
    """One row per value of an axis, in grid order (first appearance), with its count of each outcome;
    an axis that does not apply to a cell's method (None) is not counted under it."""
    applies = axis_values.notna()
    frame = pd.DataFrame({"value": axis_values[applies].map(str), "outcome": outcome[applies]})
    counts = frame.groupby("value", sort=False)["outcome"].value_counts().unstack(fill_value=0)
    return counts.reindex(columns=list(OUTCOMES), fill_value=0).reset_index()


def collapse_long_axes(table: pd.DataFrame, max_values: int = 20) -> pd.DataFrame:
    """``status_table`` for a terminal: an axis of more than ``max_values`` values (2,500 seeds) keeps the
    first ``max_values`` values with a cell not done and sums all its other values into one row."""
    kept = []
    for axis, rows in table.groupby("axis", sort=False):
        if len(rows) <= max_values:
            kept.append(rows)
            continue
        unfinished = rows[rows["done"] < rows[list(OUTCOMES)].sum(axis=1)].head(max_values)
        rest = rows.drop(unfinished.index)
        label = f"{len(rest):,} other values" if len(unfinished) else f"all {len(rest):,} values"
        summed = {"axis": axis, "value": label, **{o: int(rest[o].sum()) for o in OUTCOMES}}
        kept += [unfinished, pd.DataFrame([summed])]
    return pd.concat(kept, ignore_index=True) if kept else table
