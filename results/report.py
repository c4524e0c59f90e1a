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
from freezesweep.results.settle import LEARNED, SettleRule
from freezesweep.results.query import CELL_KEYS, freeze_rows, read_rows, summary, whole_split_rows, with_methods
from freezesweep.results.stats import (
    GROUP,
    TOLERANCE,
    costs,
    largest_k_retaining,
    method_comparison,
    paired_contrasts,
    retained_quality,
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

    @classmethod
    def from_store(
        cls,
        store: ResultStore,
        status: pd.DataFrame | None = None,
        rule: tuple[SettleRule, int, Mapping[str, tuple[str, ...]]] | None = None,
    ) -> "SweepRows":
        rows = read_rows(store)
        rows["sweep"] = store.sweep  # the folder names the sweep, whatever a row says
        return cls(store.sweep, rows, status, rule)


@dataclass
class Section:
    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[pd.DataFrame] = field(default_factory=list)
    figure: str | None = None  # a key of Report.figures


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


def build_report(sweeps: list[SweepRows], tolerance: float = TOLERANCE) -> Report:
    """The layer analysis reads the freeze rows; the methods comparison reads every row. A sweep of
    several models is analysed per model (its rows are labelled "sweep · model")."""
    rows = _all_rows(sweeps)
    layers = freeze_rows(rows)
    contrasts, retained, cost = paired_contrasts(layers), retained_quality(layers), costs(layers)
    decisions = _decide(sweeps, rows, layers, retained, cost, tolerance)
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
    return report


def decisions(sweeps: list[SweepRows], tolerance: float = TOLERANCE) -> pd.DataFrame:
    """The report's decision table alone (results/decision.py), without its figures and other tables."""
    rows = _all_rows(sweeps)
    layers = freeze_rows(rows)
    return _decide(sweeps, rows, layers, retained_quality(layers), costs(layers), tolerance)


def _all_rows(sweeps: list[SweepRows]) -> pd.DataFrame:
    return per_model(with_methods(pd.concat([s.rows for s in sweeps], ignore_index=True)))


def _decide(
    sweeps: list[SweepRows],
    rows: pd.DataFrame,
    layers: pd.DataFrame,
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
    return decide(layers, retained, cost, tolerance, planned, rules, seeds)


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
        _decision_section(report, tolerance, many),
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


def _decision_section(report: Report, tolerance: float, many: bool) -> Section:
    intro = (
        f"Per dataset and train size, one answer: the largest k shown to be within the tolerance (−{tolerance:g} "
        "unless the sweep's settle section says otherwise) of full fine-tuning (k = 0) in the selected metric when "
        "it trains, with how many of its seeds collapsed to the constant predictor (collapsed) and an exact bound "
        "on how often that happens (collapse_upper), and what freezing it saves against k = 0. How it is decided "
        "(results/settle.py, the settle-mode page): first, full fine-tuning must be shown to beat the constant "
        "baseline by more than the tolerance (learned); only then are the frozen depths tested, one at a time "
        "from the least frozen to the most frozen, each at the full level, and the sequence stops at the first "
        "depth not shown within — the advice is the last depth shown within before it, the deeper ones are not "
        "tested (their estimates are given). 'Worse' and 'nothing learned' are Holm's step-down claims; every "
        "look a settle sweep took is paid for, most of the error on its last look. Every claim of a group holds "
        "together at the stated confidence (family-wise). No advice from fewer than 3 trained pairs or from "
        "identical differences. Where something is open, decided_at_seeds is the budget that would decide it if "
        "the spread stays as it is. The sections below are its evidence."
    )
    table = report.decisions[[c for c in DECISION_SHOWN if c in report.decisions]]
    lines = [*report.decisions["sentence"], *_whole_split_lines(report.whole_split)]
    return Section("The decision", [intro, *lines], [_shown(table, many)])


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
        "Retained quality (score_k − baseline) / (score_0 − baseline) on the paired seeds' means, with a "
        "bootstrap 95 % CI (seeds resampled as pairs)."
    )
    return Section("Retained quality", [intro, *lines], [_shown(report.retained, many)], "retained")


def _contrast_section(report: Report, tolerance: float, many: bool) -> Section:
    c = report.contrasts.dropna(subset=["narrower_pct"])
    how_much = _narrower_line(c["narrower_pct"]) if len(c) else "Too few paired seeds to compare CIs."
    intro = (
        f"score_k − score_0 per seed (seeds are paired: same head init and batch order), its mean and Student-t "
        f"95 % CI; the shaded band is ±{tolerance:g}."
    )
    return Section(
        "Paired contrasts against full fine-tuning", [intro, how_much], [_shown(report.contrasts, many)], "contrasts"
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
        line + f" (median over {len(narrower_pct)} contrasts; narrower_pct per contrast from "
        f"{narrower_pct.min():.0f} to {narrower_pct.max():.0f}, negative where pairing widens it)."
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
        f"{missing} missing (not run yet, or running now){apart}; the statistics above use the {done} done cells."
    )


def _where(record, many: bool) -> str:
    place = f"{record['dataset']}, n = {record['train_size']}"
    return f"{record['sweep']} · {place}" if many else place


def _shown(table: pd.DataFrame, many: bool) -> pd.DataFrame:
    """One sweep: its name in every row is noise."""
    return table if many or "sweep" not in table else table.drop(columns=["sweep"])


# --- rendering ------------------------------------------------------------------------------------
def format_table(table: pd.DataFrame) -> pd.DataFrame:
    """Cells as strings, with the precision each unit deserves; missing values as '–'."""
    shown = table.copy()
    for column in shown.columns:
        fmt = _format_for(column, shown[column])
        if fmt:
            shown[column] = shown[column].map(lambda v, f=fmt: "–" if pd.isna(v) else f.format(v))
    return shown.fillna("–").astype(str)


def _format_for(column: str, values: pd.Series) -> str | None:
    if column.endswith("_pct"):
        return "{:.1f}"
    if column.endswith("_s"):
        return "{:.1f}"
    if column.endswith("_mb") or column.endswith("params"):
        return "{:,.0f}"
    if column in ("frozen_layers", "k_retaining_90", "lora_rank", "pairs", "looks", "baseline_seeds"):
        return "{:.0f}"  # nullable: pandas holds them as floats once a None joins
    if values.dtype.kind == "f":
        return "{:.4f}"
    return None


def render_markdown(title: str, report: Report) -> str:
    parts = [f"# {title}"]
    for section in report.sections:
        parts.append(f"## {section.title}")
        parts += section.paragraphs
        parts += [
            format_table(t).to_markdown(index=False, stralign="right", disable_numparse=True) for t in section.tables
        ]
        if section.figure in report.figures:
            parts.append(f"![{section.title}](figures/{section.figure}.png)")
    return "\n\n".join(parts) + "\n"


# Wide tables scroll inside their own box (never the page) and their headers wrap at underscores' words.
STYLE = """body{font-family:sans-serif;max-width:1400px;margin:1em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:13px;margin:0.5em 0 1em}td,th{border:1px solid #ccc;padding:2px 6px;
text-align:right}th{background:#f0f0f0;max-width:7em;overflow-wrap:anywhere}img{max-width:100%;display:block;margin:0.5em 0}
.table{overflow-x:auto;max-width:100%}.decision p{font-size:15px;background:#eef6ee;padding:4px 8px}"""


def render_html(title: str, report: Report) -> str:
    body = [f"<h1>{html.escape(title)}</h1>"]
    for i, section in enumerate(report.sections):
        body.append(f'<section class="{"decision" if i == 0 else "part"}"><h2>{html.escape(section.title)}</h2>')
        body += [f"<p>{html.escape(p)}</p>" for p in section.paragraphs]
        body += [
            f'<div class="table">{format_table(t).to_html(index=False, border=0, escape=True)}</div>'
            for t in section.tables
        ]
        if section.figure in report.figures:
            data = base64.b64encode(report.figures[section.figure]).decode()
            body.append(f'<img alt="{html.escape(section.title)}" src="data:image/png;base64,{data}">')
        body.append("</section>")
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n"
    )
