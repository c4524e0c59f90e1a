"""The report's figures, as PNG bytes (matplotlib, Agg: no display needed). One panel per
(sweep, dataset), one colour per train size; the x axis is how much is frozen (see ``freeze_depth``:
the embeddings-only run sits half a layer right of full fine-tuning)."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # before pyplot: reports are built on headless machines
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from freezesweep.results.query import BASELINE, SCORE, ok_rows  # noqa: E402
from freezesweep.results.stats import RETAINED_TARGET, freeze_depth  # noqa: E402

PANEL_IN = (4.2, 3.2)  # one panel's width and height, inches
DPI = 90


def to_png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _panels(keys: list[tuple], ncols: int | None = None):
    """A figure with one panel per key (rows of ``ncols``), and key → axes."""
    ncols = ncols or min(len(keys), 3) or 1
    nrows = max(1, -(-len(keys) // ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(PANEL_IN[0] * ncols, PANEL_IN[1] * nrows), squeeze=False)
    for extra in axes.flat[len(keys) :]:
        extra.set_visible(False)
    return fig, dict(zip(keys, axes.flat))


def _colours(train_sizes) -> dict[int, tuple]:
    palette = plt.get_cmap("viridis")
    sizes = sorted(set(train_sizes))
    return {n: palette(i / max(1, len(sizes) - 1) * 0.85) for i, n in enumerate(sizes)}


def _k_axis(ax, ks) -> None:
    ks = sorted(set(ks), key=freeze_depth)
    ax.set_xticks([freeze_depth(k) for k in ks], [_k_label(k) for k in ks])
    ax.set_xlabel("frozen layers k")


def _k_label(k: int) -> str:
    return "\nemb" if k == -1 else str(k)  # a line lower: "emb" sits half a layer from "0"


def _title(ax, sweep: str, dataset: str, many_sweeps: bool) -> None:
    ax.set_title(f"{sweep}: {dataset}" if many_sweeps else dataset, fontsize=10)


def _metric_of(names: pd.Series) -> str:
    """The selected metric's name for a panel's label (one per dataset; old rows: accuracy)."""
    return " / ".join(sorted(names.dropna().unique())) or "score"


def accuracy_vs_frozen(rows: pd.DataFrame) -> bytes:
    """The reference study's figure: every run a dot, the mean over seeds a line, the baseline dashed
    (the selected metric of the majority class, or of the mean score for regression)."""
    ok = ok_rows(rows)
    keys = sorted(ok.groupby(["sweep", "dataset"]).groups)
    fig, axes = _panels(keys)
    colours, many = _colours(ok["train_size"]), ok["sweep"].nunique() > 1
    jitter = np.random.default_rng(0)  # dots of equal k spread a little so seeds stay visible
    for (sweep, dataset), ax in axes.items():
        panel = ok[(ok["sweep"] == sweep) & (ok["dataset"] == dataset)]
        for n, runs in panel.groupby("train_size"):
            x = runs["frozen_layers"].map(freeze_depth)
            ax.scatter(x + jitter.uniform(-0.08, 0.08, len(x)), runs[SCORE], s=14, alpha=0.6, color=colours[n])
            means = runs.groupby("frozen_layers")[SCORE].mean()
            order = sorted(means.index, key=freeze_depth)
            ax.plot([freeze_depth(k) for k in order], means[order], color=colours[n], label=f"n = {n}")
        ax.axhline(panel[BASELINE].mean(), color="grey", linestyle="--", label="constant baseline")
        _k_axis(ax, panel["frozen_layers"])
        ax.set_ylabel(f"best validation {_metric_of(panel['select_metric'])}")
        _title(ax, sweep, dataset, many)
        ax.legend(fontsize=8)
    return to_png(fig)


def accuracy_heatmap(appendix: pd.DataFrame) -> bytes:
    """Mean selected metric over train size × frozen layers, a panel per (sweep, dataset); blank = no run."""
    keys = sorted(appendix.groupby(["sweep", "dataset"]).groups)
    fig, axes = _panels(keys)
    many = appendix["sweep"].nunique() > 1
    for (sweep, dataset), ax in axes.items():
        panel = appendix[(appendix["sweep"] == sweep) & (appendix["dataset"] == dataset)]
        grid = panel.pivot(index="train_size", columns="frozen_layers", values="mean")
        grid = grid[sorted(grid.columns, key=freeze_depth)]
        image = ax.imshow(grid.to_numpy(dtype=float), cmap="viridis", aspect="auto", origin="lower")
        for (i, j), value in np.ndenumerate(grid.to_numpy(dtype=float)):
            if not np.isnan(value):
                light = image.norm(value) > 0.6  # viridis turns yellow: dark text there
                ax.text(j, i, f"{value:.3f}", ha="center", va="center", fontsize=8, color="black" if light else "white")
        ax.set_xticks(range(len(grid.columns)), ["emb" if k == -1 else str(k) for k in grid.columns])  # evenly spaced
        ax.set_yticks(range(len(grid.index)), [str(n) for n in grid.index])
        ax.set_xlabel("frozen layers k")
        ax.set_ylabel("train size n")
        _title(ax, sweep, dataset, many)
        fig.colorbar(image, ax=ax, label=f"mean {_metric_of(panel['metric'])}")
    return to_png(fig)


def interval_plot(table: pd.DataFrame, value: str, ylabel: str, reference: float, band: float | None) -> bytes:
    """A statistic with its CI against k, per train size: retained quality (reference 90 %) or the
    paired difference (reference 0, the tolerance band shaded)."""
    keys = sorted(table.groupby(["sweep", "dataset"]).groups)
    fig, axes = _panels(keys)
    colours, many = _colours(table["train_size"]), table["sweep"].nunique() > 1
    for (sweep, dataset), ax in axes.items():
        panel = table[(table["sweep"] == sweep) & (table["dataset"] == dataset)]
        for offset, (n, cell) in enumerate(panel.groupby("train_size")):
            cell = cell.sort_values("frozen_layers", key=lambda ks: ks.map(freeze_depth))
            x = cell["frozen_layers"].map(freeze_depth) + 0.06 * offset
            below, above = (cell[value] - cell["ci_low"]).clip(lower=0), (cell["ci_high"] - cell[value]).clip(lower=0)
            ax.errorbar(
                x,
                cell[value],
                yerr=[below.fillna(0), above.fillna(0)],
                marker="o",
                capsize=3,
                color=colours[n],
                label=f"n = {n}",
            )
        ax.axhline(reference, color="grey", linestyle="--")
        if band is not None:
            ax.axhspan(reference - band, reference + band, color="grey", alpha=0.15, label=f"±{band:g}")
        _k_axis(ax, panel["frozen_layers"])
        ax.set_ylabel(ylabel)
        _title(ax, sweep, dataset, many)
        ax.legend(fontsize=8)
    return to_png(fig)


def retained_plot(retained: pd.DataFrame) -> bytes:
    return interval_plot(retained, "retained", "retained quality (bootstrap 95 % CI)", RETAINED_TARGET, None)


def contrast_plot(contrasts: pd.DataFrame, tolerance: float) -> bytes:
    return interval_plot(contrasts, "mean_diff", "score_k − score_0, paired (95 % CI)", 0.0, tolerance)


COST_PANELS = [
    ("trainable_params", "trainable parameters"),
    ("train_time_s", "train time (s)"),
    ("peak_mem_mb", "peak memory (MiB)"),
]


def cost_plot(costs: pd.DataFrame) -> bytes:
    return to_png(cost_figure(costs))


def cost_figure(costs: pd.DataFrame):
    """Per (sweep, dataset) a row: each cost against k, then the selected metric against train time with the
    frontier (the cells no other k beats on both) drawn as a line. Constrained layout: each panel's y-label
    and tick labels (parameters run to eight digits) get their own room instead of the neighbour's."""
    keys = sorted(costs.groupby(["sweep", "dataset"]).groups)
    fig, axes = plt.subplots(
        len(keys), 4, figsize=(PANEL_IN[0] * 4, PANEL_IN[1] * len(keys)), squeeze=False, layout="constrained"
    )
    colours, many = _colours(costs["train_size"]), costs["sweep"].nunique() > 1
    for row, (sweep, dataset) in zip(axes, keys):
        panel = costs[(costs["sweep"] == sweep) & (costs["dataset"] == dataset)]
        for n, cell in panel.groupby("train_size"):
            cell = cell.sort_values("frozen_layers", key=lambda ks: ks.map(freeze_depth))
            for ax, (column, label) in zip(row, COST_PANELS):
                ax.plot(
                    cell["frozen_layers"].map(freeze_depth),
                    cell[column],
                    marker="o",
                    color=colours[n],
                    label=f"n = {n}",
                )
                ax.set_ylabel(label)
            _frontier(row[3], cell, colours[n], n)
        for ax in row[:3]:
            _k_axis(ax, panel["frozen_layers"])
            _title(ax, sweep, dataset, many)
        row[0].legend(fontsize=8)
        _title(row[3], sweep, dataset, many)
    return fig


def _frontier(ax, cell: pd.DataFrame, colour, n: int) -> None:
    ax.scatter(cell["train_time_s"], cell[SCORE], color=colour, s=18)
    for _, point in cell.iterrows():
        ax.annotate(
            f"k={point['frozen_layers']}",
            (point["train_time_s"], point[SCORE]),
            fontsize=7,
            xytext=(3, 3),
            textcoords="offset points",
        )
    front = cell[cell["on_frontier"]].sort_values("train_time_s")
    ax.plot(front["train_time_s"], front[SCORE], color=colour, label=f"n = {n} frontier")
    ax.set_xlabel("train time (s)")
    ax.set_ylabel("mean best score (selected metric)")
    ax.legend(fontsize=8)


METHOD_COLOURS = {"freeze": "tab:blue", "lora": "tab:orange", "probe": "tab:green"}
SIZE_MARKERS = "osD^vP*X"


def methods_plot(table: pd.DataFrame) -> bytes:
    """Methods on one accuracy-versus-cost chart per (sweep, dataset): each variant's mean selected
    metric against its mean wall time per trial (log scale), a colour per method, a marker per train size."""
    keys = sorted(table.groupby(["sweep", "dataset"]).groups)
    fig, axes = _panels(keys)
    many = table["sweep"].nunique() > 1
    markers = {n: SIZE_MARKERS[i % len(SIZE_MARKERS)] for i, n in enumerate(sorted(table["train_size"].unique()))}
    for (sweep, dataset), ax in axes.items():
        panel = table[(table["sweep"] == sweep) & (table["dataset"] == dataset)]
        for (method, n), points in panel.groupby(["method", "train_size"]):
            ax.scatter(
                points["wall_time_s"],
                points["score"],
                color=METHOD_COLOURS.get(method, "tab:gray"),
                marker=markers[n],
                s=28,
                label=f"{method}, n = {n}",
            )
            best = points[points["best_in_method"]]
            for _, point in best.iterrows():
                ax.annotate(
                    point["variant"],
                    (point["wall_time_s"], point["score"]),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
        ax.set_xscale("log")
        ax.set_xlabel("wall time per trial (s, log)")
        ax.set_ylabel("mean best score (selected metric)")
        ax.legend(fontsize=7)
        _title(ax, sweep, dataset, many)
    return to_png(fig)
