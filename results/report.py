"""``freezesweep report``: one or more sweeps' stores → ``index.html`` (self-contained: figures are
inline PNGs, no external URL) and ``report.md`` (the same tables, figures beside it under ``figures/``).

The decision comes first, then the reference study's figure, the heatmap, retained quality, paired
contrasts, cost, completeness and the appendix. Only complete rows are read (the store writes them
atomically), so a report can be rebuilt at any time, also while a sweep runs; what is missing is said.
"""

from __future__ import annotations

import base64
import html
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from freezesweep.results import figures
from freezesweep.results.decision import decide
from freezesweep.results.settle import COLLAPSE_SHARE, LEARNED, SettleRule, variant_label
from freezesweep.results.query import CELL_KEYS, freeze_rows, read_rows, summary, whole_split_rows, with_methods
from freezesweep.results.reprs import short_repr
from freezesweep.results.stats import (
    GROUP,
    TOLERANCE,
    confidence_pct,
    costs,
    largest_k_retaining,
    method_comparison,
    paired_contrasts,
    retained_quality,
    upper_pct,
)
from freezesweep.results.store import ResultStore


@dataclass
class SweepRows:
    """A sweep's rows, and (when its spec is known) its status table: done / failed / missing per axis
    value, from ``results.query.status_table``."""

    name: str
    rows: pd.DataFrame
    status: pd.DataFrame | None = None
    # a settle sweep's rule, its looks and each model's arms (results.settle.decide; None: a fixed grid)
    rule: tuple[SettleRule, int, Mapping[str, tuple[str, ...]]] | None = None
    tolerance: float | None = None  # the question it asked (its spec's, fixed before its rows); None: the report's
    left_out: int = 0  # stored rows no cell of its grid now (an axis value removed or respelled): not read

    @classmethod
    def from_store(
        cls,
        store: ResultStore,
        status: pd.DataFrame | None = None,
        rule: tuple[SettleRule, int, Mapping[str, tuple[str, ...]]] | None = None,
        tolerance: float | None = None,
    ) -> "SweepRows":
        rows = read_rows(store)
        rows["sweep"] = store.sweep  # the folder names the sweep, whatever a row says
        return cls(store.sweep, rows, status, rule, tolerance)


@dataclass
class Section:
    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[pd.DataFrame] = field(default_factory=list)
    figure: str | None = None  # a key of Report.figures
    notes: list[str] = field(default_factory=list)  # read after the tables: how to read them
    headers: dict[str, str] = field(default_factory=lambda: HEADERS)  # each column's heading in words


@dataclass
class Report:
    decisions: pd.DataFrame
    contrasts: pd.DataFrame
    retained: pd.DataFrame
    costs: pd.DataFrame
    appendix: pd.DataFrame
    completeness: list[str]  # a line per sweep: complete, or what is failed and missing
    sections: list[Section]
    figures: dict[str, bytes]
    methods: pd.DataFrame | None = None  # the methods side by side (None: the rows are freeze rows only)
    # per sweep, its ok rows scored on a sample against a whole-split baseline (results.query.whole_split_rows)
    whole_split: pd.Series = field(default_factory=lambda: pd.Series(dtype="int64"))

    __repr__ = short_repr  # a notebook prints it: table shapes and figure names, not their PNG bytes

    def __str__(self) -> str:
        """The answer as the report's first lines say it: a sentence per group, then what is missing."""
        return "\n".join([*self.decisions["sentence"], *self.completeness])


def build_report(sweeps: list[SweepRows], tolerance: float = TOLERANCE) -> Report:
    """The layer analysis reads the freeze rows; the decisions and the methods comparison read every row. A sweep of
    several models is analysed per model (its rows are labelled "sweep · model")."""
    rows = _all_rows(sweeps)
    layers = freeze_rows(rows)
    contrasts, retained, cost = paired_contrasts(layers), retained_quality(layers), costs(layers)
    decisions = _decide(sweeps, rows, retained, cost, tolerance)
    # no retained quality where nothing is (shown to be) learned: a ratio of two gains near zero
    learned = decisions.loc[decisions["learned"] == LEARNED, GROUP]
    retained = retained.merge(learned, on=GROUP)
    appendix = summary(layers, CELL_KEYS)
    methods = method_comparison(rows) if (rows["method"] != "freeze").any() else None
    figs = _figures(layers, appendix, retained, contrasts, cost, tolerance)
    if methods is not None and not methods.empty:
        figs["methods"] = figures.methods_plot(methods)
    completeness = [_completeness_line(s) for s in sweeps]
    report = Report(
        decisions, contrasts, retained, cost, appendix, completeness, [], figs, methods, whole_split_rows(rows)
    )
    # several sweeps, or one of several models: every table and sentence names its "sweep · model"
    report.sections = _sections(report, sweeps, tolerance, many=rows["sweep"].nunique() > 1)
    # what the report printed keeps those labels; its tables as the caller reads them name both apart
    for table in ("decisions", "contrasts", "retained", "costs", "appendix", "methods"):
        if getattr(report, table) is not None:  # methods: None where the rows are freeze rows only
            setattr(report, table, named(getattr(report, table), rows))
    return report


def decisions(sweeps: list[SweepRows], tolerance: float = TOLERANCE) -> pd.DataFrame:
    """The report's decision table alone (results/decision.py), without its figures and other tables: each
    group's sweep by its name and its model (``named``)."""
    rows = _all_rows(sweeps)
    layers = freeze_rows(rows)
    return named(_decide(sweeps, rows, retained_quality(layers), costs(layers), tolerance), rows)


def _all_rows(sweeps: list[SweepRows]) -> pd.DataFrame:
    return per_model(with_methods(pd.concat([s.rows for s in sweeps], ignore_index=True)))


def _decide(
    sweeps: list[SweepRows],
    rows: pd.DataFrame,
    retained: pd.DataFrame,
    cost: pd.DataFrame,
    tolerance: float,
) -> pd.DataFrame:
    """Each sweep's grid (its planned frozen layers) and settle rule, by the label its rows carry."""
    planned = {s.name: {int(v) for v in _axis(s.status, "frozen_layers")} for s in sweeps if s.status is not None}
    planned.update(
        {label: planned[sweep] for label, sweep in zip(rows["sweep"], rows["sweep_name"]) if sweep in planned}
    )
    rules = {label: s.rule for s in sweeps if s.rule for label in rows.loc[rows["sweep_name"] == s.name, "sweep"]}
    # a fixed grid's planned seeds: a group still running is not decided as if complete (one look)
    seeds = {s.name: {int(v) for v in _axis(s.status, "seed")} for s in sweeps if s.status is not None and not s.rule}
    seeds.update({label: seeds[sweep] for label, sweep in zip(rows["sweep"], rows["sweep_name"]) if sweep in seeds})
    asked = {s.name: s.tolerance for s in sweeps if s.tolerance is not None}  # each fixed grid's own question
    asked.update({label: asked[sweep] for label, sweep in zip(rows["sweep"], rows["sweep_name"]) if sweep in asked})
    others = {s.name: _other_arms(s.status) for s in sweeps if s.status is not None}  # LoRA ranks, the probe
    others.update({label: others[sweep] for label, sweep in zip(rows["sweep"], rows["sweep_name"]) if sweep in others})
    # every method's rows: LoRA ranks and the probe are the group's claims too, as its rounds decided them
    return decide(rows, retained, cost, tolerance, planned, rules, seeds, asked, others)


def _other_arms(status: pd.DataFrame) -> set[str]:
    """A grid's arms of the other methods, from its status table: "lora r=8", "probe"."""
    methods = set(_axis(status, "method"))
    lora = {variant_label("lora", None, r) for r in _axis(status, "lora_rank")} if "lora" in methods else set()
    return lora | ({variant_label("probe", None, None)} if "probe" in methods else set())


def named(table: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """A table of the analysis, its ``sweep`` the sweep's name and a ``model`` column beside it: the analysis
    groups by the label ``per_model`` gives ("sweep · model" where a sweep has several models), which a caller
    cannot compare with a sweep's name (a walk-through: ``decision.sweep == "fam"`` was False)."""
    if "sweep" not in table:
        return table
    labels = rows.groupby("sweep")[["sweep_name", "model"]].first()  # one model per label (first: its non-null)
    out = table.assign(sweep=table["sweep"].map(labels["sweep_name"]).fillna(table["sweep"]))
    if "model" not in out:
        out.insert(list(out.columns).index("sweep") + 1, "model", table["sweep"].map(labels["model"]))
    return out


def per_model(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows of a sweep with several models carry "sweep · model" as their sweep: every analysis
    groups by sweep, so each model gets its own decisions, panels and tables."""
    rows = rows.assign(sweep_name=rows["sweep"])
    several = rows.groupby("sweep")["model"].transform("nunique") > 1
    rows.loc[several, "sweep"] = rows.loc[several, "sweep"] + " · " + rows.loc[several, "model"]
    return rows


def _axis(status: pd.DataFrame, axis: str) -> list[str]:
    return status.loc[status["axis"] == axis, "value"].tolist()


def _figures(rows, appendix, retained, contrasts, cost, tolerance: float) -> dict[str, bytes]:
    if appendix.empty:  # nothing finished yet: the report is the completeness section alone
        return {}
    figs = {
        "accuracy": figures.accuracy_vs_frozen(rows),
        "heatmap": figures.accuracy_heatmap(appendix),
        "cost": figures.cost_plot(cost),
    }
    if not retained.empty:  # both need k = 0 and another k on the same seeds
        figs["retained"] = figures.retained_plot(retained)
        figs["contrasts"] = figures.contrast_plot(contrasts, tolerance)
    return figs


def write_report(sweeps: list[SweepRows], out_dir: str, tolerance: float = TOLERANCE) -> Report:
    """Build the report and write ``index.html``, ``report.md`` and ``figures/*.png`` under out_dir."""
    report = build_report(sweeps, tolerance)
    os.makedirs(os.path.join(out_dir, "figures"), exist_ok=True)
    for name, png in report.figures.items():
        _write(os.path.join(out_dir, "figures", f"{name}.png"), png)
    title = "freezesweep report: " + ", ".join(s.name for s in sweeps)
    _write(os.path.join(out_dir, "index.html"), render_html(title, report).encode())
    _write(os.path.join(out_dir, "report.md"), render_markdown(title, report).encode())
    return report


def _write(path: str, payload: bytes) -> None:
    """Atomic, so a browser refreshing a report that is being rebuilt never sees half a file."""
    with open(path + ".tmp", "wb") as f:
        f.write(payload)
    os.replace(path + ".tmp", path)


# --- sections -------------------------------------------------------------------------------------
def _sections(report: Report, sweeps: list[SweepRows], tolerance: float, many: bool) -> list[Section]:
    return [
        _decision_section(report, {tolerance if s.tolerance is None else s.tolerance for s in sweeps}, many),
        Section(
            "Selected metric against frozen layers",
            [
                "Each row's selected metric (accuracy unless the sweep chose another, e.g. CoLA's Matthews "
                "correlation): every run is a dot, the mean over seeds a line, the constant baseline (majority class, "
                "or mean score for regression) dashed."
            ],
            figure="accuracy",
        ),
        Section("Mean selected metric: train size × frozen layers", figure="heatmap"),
        _retained_section(report, many),
        _contrast_section(report, tolerance, many),
        _cost_section(report, many),
        *([_methods_section(report, many)] if report.methods is not None else []),
        _completeness_section(sweeps, report.completeness),
        Section(
            "Appendix: the selected metric at the best evaluation, per cell over seeds",
            [],
            [_shown(report.appendix, many)],
        ),
    ]


DECISION_SHOWN = [
    *GROUP,
    "learned",
    "frozen_layers",
    "pairs",
    "score_0",
    "score_k",
    "mean_diff",
    "ci_low",
    "collapsed",
    "collapse_upper",
    "within",
    "worse",
    "undecided",
    "not_tested",
    "params_saved_pct",
    "time_saved_pct",
    "mem_saved_pct",
    "decided_at_seeds",
]  # the answer's evidence; the rest (the other bound, looks, …) is in report.decisions


def _decision_section(report: Report, asked: set[float], many: bool) -> Section:
    """The answer first (a sentence per dataset and train size), its table, then how it was reached."""
    (one,) = asked if len(asked) == 1 else (None,)
    question = (
        f"−{one:g}, the question the sweep asked before its rows"
        if one is not None
        else "each sweep's own question, asked before its rows: each sentence says it"
    )
    how = (
        "How to read it: per dataset and train size, one answer: the largest k shown to be within the tolerance "
        f"({question}) of full fine-tuning (k = 0) in the "
        "selected metric when it trains (a Student-t bound over the seeds where both trained: it assumes their paired "
        "differences roughly normal), with how many of its seeds collapsed (answered one "
        "class everywhere, or scored at most "
        f"{COLLAPSE_SHARE * 100:g} % of the way from the constant predictor's score to a perfect one) or "
        "diverged (Collapsed seeds) and an exact bound on how often that happens (Collapse rate at most), and what "
        "freezing it saves against k = 0. How it is decided (results/settle.py, the settle-mode page): first, "
        "full fine-tuning must be shown to beat the constant baseline by more than the tolerance (learned); only "
        "then are the frozen depths tested, one at a time from the least frozen to the most frozen, each at the "
        "full level, and the sequence stops at the first depth not shown within — the advice is the last depth "
        "shown within before it, the deeper ones are not tested (their estimates are given). 'Worse' (more than "
        "the tolerance below full fine-tuning when it trains, or in mean with its collapses where full fine-tuning "
        "trained: one claim, shown by either bound) and 'nothing learned' are Holm's step-down claims; every look "
        "a settle sweep took is paid for, most of the "
        "error on its last look. Every claim of a group holds together at the stated confidence (family-wise); "
        "Difference at least is the advised depth's own one-sided bound, at the sequence's level, unadjusted for "
        "choosing that depth (the claim is 'within'). No advice "
        "from fewer than 3 trained pairs or from identical differences. Where something is open, Seeds to "
        "decide is the budget that would decide it if the spread stays as it is. The sections below describe "
        "the rows: their seeds and intervals are not the decision's (each section says which it reads). In fs.decide(…).frame and report.decisions, each column has the name index.html prints "
        "under its heading."
    )
    table = report.decisions[[c for c in DECISION_SHOWN if c in report.decisions]]
    return Section(
        "The decision",
        [*report.decisions["sentence"], *_whole_split_lines(report.whole_split)],
        [_shown(table, many)],
        notes=[how],
        headers=DECISION_HEADERS,
    )


def _whole_split_lines(whole_split: pd.Series) -> list[str]:
    """Rows whose collapse test compared a sample's score with the whole split's baseline (stored before
    baselines were measured on the evaluated rows): the one kind of collapse they can hide, named."""
    return [
        f"{sweep}: {n} ok row{'s were' if n != 1 else ' was'} scored on a max_eval_examples sample but stored "
        "with the whole validation split's constant baseline (rows written before the baseline was measured on "
        "the evaluated rows): a seed there that answered one class can be counted as trained (collapsed false). "
        "A new sweep of the same grid measures both on the same rows."
        for sweep, n in whole_split.items()
    ]


def _retained_section(report: Report, many: bool) -> Section:
    keeps = largest_k_retaining(report.retained)
    lines = [
        f"{_where(r, many)}: k = {int(r['k_retaining_90'])} is the largest whose mean keeps ≥ 90 % of full "
        "fine-tuning's gain — a point estimate, evidence for the decision above, not a second answer"
        for _, r in keeps.iterrows()
    ]
    intro = (
        "Retained quality (score at k − baseline) / (score at k = 0 − baseline) on the paired seeds' means, with a "
        f"bootstrap 95 % CI (seeds resampled as pairs). {_DESCRIPTIVE}"
    )
    table = [_shown(report.retained, many)]
    return Section("Retained quality", [intro, *lines], table, "retained", headers=DESCRIPTIVE_HEADERS)


def _contrast_section(report: Report, tolerance: float, many: bool) -> Section:
    c = report.contrasts.dropna(subset=["narrower_pct"])
    how_much = _narrower_line(c["narrower_pct"]) if len(c) else "Too few paired seeds to compare CIs."
    intro = (
        f"Score at k − score at k = 0 per seed (seeds are paired: same head init and batch order), its mean and Student-t "
        f"95 % CI; the shaded band is ±{tolerance:g}. {_DESCRIPTIVE} A depth's mean difference here can so differ "
        "from its decision's (a seed that collapsed pulls it down here, and is counted apart there)."
    )
    table = [_shown(report.contrasts, many)]
    return Section(
        "Paired contrasts against full fine-tuning", [intro, how_much], table, "contrasts", headers=DESCRIPTIVE_HEADERS
    )


# What the contrasts and retained quality read, said where a reader sees their numbers (an audit found one
# depth at −0.066 here and −0.023 in its decision, neither saying why): both are stats.py's, over ok rows
_DESCRIPTIVE = (
    "Descriptive, not the decision's numbers: every ok seed where both ran is in, a seed that collapsed at its "
    "score (diverged seeds are out), where the decision reads only the seeds where both "
    "trained; each interval is for its depth alone, unadjusted for the other depths, methods and looks, where "
    "the decision's claims are adjusted (family-wise)."
)


def _narrower_line(narrower_pct: pd.Series) -> str:
    median = narrower_pct.median()
    line = (
        f"Pairing makes the CI {abs(median):.0f} % {'narrower' if median >= 0 else 'wider'} than the unpaired "
        f"(Welch) CI over the same runs"
    )
    if len(narrower_pct) == 1:
        return line + "."
    return (
        line + f" (median over {len(narrower_pct)} contrasts; CI narrower by pairing per contrast from "
        f"{narrower_pct.min():.0f} % to {narrower_pct.max():.0f} %, negative where pairing widens it)."
    )


def _cost_section(report: Report, many: bool) -> Section:
    return Section(
        "Cost",
        [
            "Means over seeds; savings are against k = 0 of the same train size. The frontier: "
            "cells no other k beats on both the selected metric and train time."
        ],
        [_shown(report.costs, many)],
        "cost",
    )


def _methods_section(report: Report, many: bool) -> Section:
    table = report.methods
    intro = (
        "Freezing, LoRA and a logistic-regression probe on frozen features, on the same subsets and seeds: each "
        "variant's mean selected metric over seeds (Student-t 95 % CI) and mean cost per trial. Per train size, "
        "each method's best variant:"
    )
    lines = []
    for _, cell in table.groupby(GROUP):
        best = cell[cell["best_in_method"]].sort_values("score", ascending=False)
        lines.append(
            f"{_where(cell.iloc[0], many)}: "
            + "; ".join(
                f"{b['variant']} {b['score']:.3f}"
                + ("" if pd.isna(b["wall_time_s"]) else f" in {b['wall_time_s']:.0f} s")
                for _, b in best.iterrows()
            )
        )
    return Section("Methods side by side", [intro, *lines], [_shown(table, many)], "methods")


def _completeness_section(sweeps: list[SweepRows], lines: list[str]) -> Section:
    tables = []
    for s in sweeps:
        if s.status is not None:
            gaps = s.status[(s.status["failed"] > 0) | (s.status["missing"] > 0)]
            if len(gaps):
                tables.append(gaps.assign(sweep=s.name)[["sweep", *s.status.columns]])
        failed = s.rows[s.rows["status"] != "ok"]
        if len(failed):
            shown = [
                *GROUP,
                *(c for c in ("method", "frozen_layers", "lora_rank") if c in failed),
                "seed",
                "status",
                "error",
            ]
            tables.append(failed[shown].assign(error=failed["error"].fillna("").str.slice(0, 100)))
    return Section("Completeness", lines, tables)


def _completeness_line(s: SweepRows) -> str:
    return _grid_line(s) + _left_out(s.left_out)


def _left_out(rows: int) -> str:
    if not rows:
        return ""
    return (
        f" {rows} stored row{'s are' if rows > 1 else ' is'} no cell of its grid now (an axis value removed from "
        "the spec, or spelled otherwise) and left out of this report; `freezesweep query` reads every row."
    )


def _grid_line(s: SweepRows) -> str:
    ok = int((s.rows["status"] == "ok").sum())
    if s.status is None:
        return (
            f"{s.name}: {ok} ok rows, {len(s.rows) - ok} failed; the grid is unknown, so missing cells are not listed."
        )
    total = s.status[s.status["axis"] == "total"].iloc[0]
    done, failed, missing = int(total["done"]), int(total["failed"]), int(total["missing"])
    diverged = int(total.get("diverged", 0))
    apart = f"; {diverged} diverged (a non-finite loss: left out of every statistic, not run again)" if diverged else ""
    if failed == missing == 0:
        return (
            f"{s.name}: complete, {done} cells done{apart}."
            if diverged
            else f"{s.name}: complete, all {done} cells done."
        )
    return (
        f"{s.name}: INCOMPLETE — {done} of {done + diverged + failed + missing} cells done, {failed} failed, "
        f"{missing} missing (not run yet, or running now){apart}; the decisions and statistics use the {done} done cells."
    )


def _where(record, many: bool) -> str:
    place = f"{record['dataset']}, n = {record['train_size']}"
    return f"{record['sweep']} · {place}" if many else place


def _shown(table: pd.DataFrame, many: bool) -> pd.DataFrame:
    """One sweep: its name in every row is noise."""
    return table if many or "sweep" not in table else table.drop(columns=["sweep"])


# --- rendering ------------------------------------------------------------------------------------
NBSP, NBHY = "\u00a0", "\u2011"  # a space and a hyphen a browser never breaks a line at

# Each column as a reader is told it: words (the column's own name, which fs.decide, report.decisions and
# `freezesweep query` use, is the HTML heading's second line and title). A column not named here is
# headed by its name in words ("new_column" → "New column"), so a heading never is an identifier.
HEADERS: dict[str, str] = {
    "sweep": "Sweep",
    "dataset": "Dataset",
    "train_size": "Train size",
    "model": "Model",
    "method": "Method",
    "variant": "Variant",
    "metric": "Metric",
    "baseline_seeds": "Seeds at k = 0",
    "learned": "Full fine-tuning",
    "frozen_layers": "Frozen layers k",
    "lora_rank": "LoRA rank",
    "seed": "Seed",
    "seeds": "Seeds",
    "pairs": "Paired seeds",
    "n": "Runs",
    "score": "Mean score",
    "score_0": "Score at k = 0",
    "score_k": "Score at k",
    "mean_diff": "Mean difference",
    "ci_low": "CI low",
    "ci_high": "CI high",
    "unpaired_ci_low": "Unpaired CI low",
    "unpaired_ci_high": "Unpaired CI high",
    "narrower_pct": "CI narrower by pairing",
    "collapsed": "Collapsed seeds",
    "collapse_upper": "Collapse rate at most",
    "confidence": "Confidence",
    "looks": "Looks",
    "within": "Within tolerance",
    "worse": "Worse",
    "undecided": "Undecided",
    "not_tested": "Not tested",
    "decided_at_seeds": "Seeds to decide",
    "baseline": "Constant baseline",
    "retained": "Retained quality",
    "k_retaining_90": "Largest k keeping 90 %",
    "best_val_score": "Mean score",
    "trainable_params": "Trainable parameters",
    "train_time_s": "Train time",
    "wall_time_s": "Wall time",
    "peak_mem_mb": "Peak memory",
    "params_saved_pct": "Parameters saved",
    "time_saved_pct": "Train time saved",
    "mem_saved_pct": "Peak memory saved",
    "on_frontier": "On the frontier",
    "best_in_method": "Best of its method",
    "mean": "Mean",
    "median": "Median",
    "std": "Standard deviation",
    "min": "Min",
    "max": "Max",
    "status": "Status",
    "error": "Error",
    "axis": "Axis",
    "value": "Value",
    "done": "Done",
    "diverged": "Diverged",
    "failed": "Failed",
    "missing": "Missing",
    "sentence": "Decision",
}
# The descriptive sections' (contrasts, retained quality): their seeds, collapses in, and their intervals unadjusted.
DESCRIPTIVE_HEADERS = {
    **HEADERS,
    "pairs": "Paired ok seeds (collapses in)",
    "ci_low": "95 % CI low, unadjusted",
    "ci_high": "95 % CI high, unadjusted",
}
# The decision table's own words where a column means more there: the advice, and its bounds.
DECISION_HEADERS = {
    **HEADERS,
    "frozen_layers": "Freeze k",
    "ci_low": "Difference at least",
    "ci_high": "Difference at most",
}


def header(column: str, headers: dict[str, str] = HEADERS) -> str:
    return headers.get(column) or column.replace("_", " ").capitalize()


@dataclass(frozen=True)
class Shown:
    """A table as it is read: cells as text with their units, each column's heading in words, and which
    columns are numbers (right-aligned)."""

    cells: pd.DataFrame
    headers: list[str]
    numeric: list[bool]


def shown_table(table: pd.DataFrame, headers: dict[str, str] = HEADERS) -> Shown:
    numeric = [table[c].dtype.kind in "iuf" or c in _RIGHT for c in table.columns]
    return Shown(format_table(table), [header(c, headers) for c in table.columns], numeric)


def format_table(table: pd.DataFrame) -> pd.DataFrame:
    """Cells as strings, with the precision each unit deserves and the unit itself (%, s, MiB);
    missing values as '–'."""
    shown = table.copy()
    for column in shown.columns:
        fmt = _format_for(column, shown[column])
        if fmt:
            shown[column] = shown[column].map(lambda v, f=fmt: "–" if _missing(v) else f(v))
    return shown.fillna("–").astype(str)


def _missing(value) -> bool:
    return value is None or (not isinstance(value, str) and pd.isna(value))


# Counts held as floats once a None joins them (nullable): shown as integers.
_COUNTS = ("frozen_layers", "k_retaining_90", "lora_rank", "pairs", "looks", "baseline_seeds", "decided_at_seeds")
_RIGHT = (*_COUNTS, "collapsed")  # numbers held as text ("0/3"), right-aligned with the others


def _format_for(column: str, values: pd.Series):
    if column.endswith("_pct"):
        return lambda v: f"{v:.1f} %"
    if column == "collapse_upper":  # a bound on a share of seeds: as the sentence says it, rounded up
        return lambda v: f"{upper_pct(v)} %"
    if column == "confidence":  # as the sentence says it: never above what it is
        return lambda v: f"{confidence_pct(v)} %"
    if column.endswith("_s"):
        return lambda v: f"{v:,.1f} s"
    if column.endswith("_mb"):
        return lambda v: f"{v:,.0f} MiB"  # the store's _mb columns count 2**20 bytes (trials/run.py)
    if column.endswith("params"):
        return lambda v: f"{v:,.0f}"
    if column in _COUNTS:
        return lambda v: f"{v:.0f}"
    if values.dtype.kind == "b":
        return lambda v: "yes" if v else "no"
    if values.dtype.kind == "f":
        return lambda v: f"{v:.4f}"
    return None


def render_markdown(title: str, report: Report) -> str:
    parts = [f"# {title}"]
    for section in report.sections:
        parts.append(f"## {section.title}")
        parts += section.paragraphs
        parts += [_markdown_table(shown_table(t, section.headers)) for t in section.tables]
        parts += section.notes
        if section.figure in report.figures:
            parts.append(f"![{section.title}](figures/{section.figure}.png)")
    return "\n\n".join(parts) + "\n"


def _markdown_table(shown: Shown) -> str:
    cells = shown.cells.set_axis(shown.headers, axis=1)
    align = ["right" if n else "left" for n in shown.numeric]
    return cells.to_markdown(index=False, colalign=align, disable_numparse=True)


# Headings wrap between words only (never inside one: a column is as wide as its longest heading word);
# a column's own name, the second line, may wrap after its underscores. Numbers right, text left; wide
# tables scroll inside their own box, never the page.
STYLE = """body{font-family:sans-serif;max-width:1400px;margin:1em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:13px;margin:0.5em 0 1em}td,th{border:1px solid #ccc;padding:2px 6px}
th{background:#f0f0f0;vertical-align:bottom;text-align:left;font-weight:600;overflow-wrap:normal;word-break:normal}
th.num,td.num{text-align:right}td.num{white-space:nowrap}th .column{display:block;font:10px monospace;color:#777;font-weight:normal}
td{font-variant-numeric:tabular-nums}img{max-width:100%;display:block;margin:0.5em 0}
.table{overflow-x:auto;max-width:100%}.decision p.answer{font-size:15px;background:#eef6ee;padding:4px 8px}
p.note{color:#444;font-size:14px}"""


def render_html(title: str, report: Report) -> str:
    body = [f"<h1>{html.escape(title)}</h1>"]
    for i, section in enumerate(report.sections):
        lead = ' class="answer"' if i == 0 else ""  # the decision's sentences, the report's first lines
        body.append(f'<section class="{"decision" if i == 0 else "part"}"><h2>{html.escape(section.title)}</h2>')
        body += [f"<p{lead}>{html.escape(p)}</p>" for p in section.paragraphs]
        body += [_html_table(shown_table(t, section.headers), list(t.columns)) for t in section.tables]
        body += [f'<p class="note">{html.escape(p)}</p>' for p in section.notes]
        if section.figure in report.figures:
            data = base64.b64encode(report.figures[section.figure]).decode()
            body.append(f'<img alt="{html.escape(section.title)}" src="data:image/png;base64,{data}">')
        body.append("</section>")
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n"
    )


def _html_table(shown: Shown, columns: list[str]) -> str:
    def cls(numeric: bool) -> str:
        return ' class="num"' if numeric else ""

    heads = "".join(
        f'<th{cls(n)} title="column {html.escape(c)}"><span class="label">{html.escape(_held(h))}</span>'
        f'<span class="column">{"_<wbr>".join(map(html.escape, c.split("_")))}</span></th>'
        for c, h, n in zip(columns, shown.headers, shown.numeric)
    )
    rows = "".join(
        "<tr>" + "".join(f"<td{cls(n)}>{html.escape(v)}</td>" for v, n in zip(row, shown.numeric)) + "</tr>"
        for row in shown.cells.itertuples(index=False)
    )
    return f'<div class="table"><table><thead><tr>{heads}</tr></thead><tbody>{rows}</tbody></table></div>'


def _held(label: str) -> str:
    """A heading's phrases that must stay on one line: "k = 0", "90 %", "fine-tuning"."""
    return label.replace(" = ", f"{NBSP}={NBSP}").replace(" %", f"{NBSP}%").replace("-", NBHY)
