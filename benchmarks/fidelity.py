"""Does a sweep mean what the reference study's did? Runs any subset of the reference grid as a real
sweep and prints, per cell, our mean/median/std/min/max of best validation accuracy beside the
study's published appendix row, flagging cells whose mean lies outside the study's min–max.

    python benchmarks/fidelity.py [--model roberta-base] [--datasets glue/sst2 glue/cola]
        [--train-sizes 50 200] [--frozen-layers -1 0 2 4] [--seeds 0 1 2] [--store ./sweeps] [--name N]
        [--epochs E] [--max-eval-examples M]   # shorter than the reference protocol: a quick look only

The published rows (roberta-base, 5 seeds) ship beside this file (`reference/`); a cell the study did
not run (e.g. the default k = L/2 = 6) says "no reference cell". For any other model (e.g. the offline
MiniLM-L6, 6 layers) the cells are not comparable number for number: the study's rows are not shown
beside them, and its qualitative findings are checked instead: more data helps; everything frozen stays near
the majority baseline at small n; freezing half of the layers costs little. The sweep is resumable:
run the same command again after an interruption and only the missing cells run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

REFERENCE = Path(__file__).resolve().parent / "reference" / "roberta_base_blog.csv"
KEYS = ["dataset", "train_size", "frozen_layers"]
NEAR_MAJORITY = 0.05  # "near majority": within 5 accuracy points of always predicting the majority class
HALF_FROZEN_COST = 0.03  # "costs little": at most 3 points below full fine-tuning


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2")
    parser.add_argument("--datasets", nargs="+", default=["glue/sst2"])
    parser.add_argument("--train-sizes", nargs="+", type=int, default=[50, 200])
    parser.add_argument("--frozen-layers", nargs="+", type=int, default=None, help="default: -1 0 L/2 L")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--gpus-per-trial", type=float, default=0.0)
    parser.add_argument("--cpus-per-trial", type=float, default=1.0)
    parser.add_argument("--store", default="./sweeps")
    parser.add_argument("--name", default=None, help="sweep name (default: fidelity-<model>)")
    parser.add_argument("--epochs", type=float, default=None, help="default: the reference protocol's")
    parser.add_argument(
        "--max-eval-examples", type=int, default=None, help="validation rows per evaluation (default: all)"
    )
    return parser.parse_args()


def run_sweep(args: argparse.Namespace, layers: int) -> pd.DataFrame:
    """The ok rows of this subset of the grid (a sweep of that name may hold more cells)."""
    from freezesweep.orchestrator.plan import build_grid
    from freezesweep.orchestrator.sweeps import resolve_here
    from freezesweep.orchestrator.launch import launch
    from freezesweep.orchestrator.checks import validate
    from freezesweep.results.store import ResultStore

    name = args.name or "fidelity-" + args.model.rsplit("/", 1)[-1]
    spec = validate(
        {
            "name": name,
            "model": args.model,
            "datasets": args.datasets,
            "train_sizes": args.train_sizes,
            "frozen_layers": args.frozen_layers or [-1, 0, layers // 2, layers],
            "seeds": args.seeds,
            # accuracy, as the study reported it (not CoLA's official Matthews); the rest: the reference defaults
            "training": {
                "precision": args.precision,
                "select_metric": "accuracy",
                **({"epochs": args.epochs} if args.epochs is not None else {}),
                **({"max_eval_examples": args.max_eval_examples} if args.max_eval_examples is not None else {}),
            },
            "resources": {"gpus_per_trial": args.gpus_per_trial, "cpus_per_trial": args.cpus_per_trial},
            "store": args.store,
        },
        "fidelity benchmark",
    )
    summary = launch(spec)
    print(f"sweep {name}: {summary.total} cells, {summary.already_ok} already done, ran {summary.ran}")
    cells = {c.trial_id for c in build_grid(resolve_here(spec))}
    rows = ResultStore(args.store, name).read()
    return rows[(rows["status"] == "ok") & rows["trial_id"].isin(cells)]


def beside_reference(ours: pd.DataFrame) -> pd.DataFrame:
    """Our per-cell statistics joined with the published ones; ``outside`` flags a mean outside the
    study's min–max, ``has_reference`` a cell the study ran."""
    reference = pd.read_csv(REFERENCE).rename(columns=lambda c: c if c in KEYS else f"ref_{c}")
    table = ours.merge(reference, on=KEYS, how="left")
    table["has_reference"] = table["ref_mean"].notna()
    table["outside"] = table["has_reference"] & (
        (table["mean"] < table["ref_min"]) | (table["mean"] > table["ref_max"])
    )
    return table


def qualitative_checks(table: pd.DataFrame, layers: int) -> list[tuple[str, bool, str]]:
    """The study's findings, as (finding, holds, evidence) per dataset."""
    checks = []
    for dataset, cells in table.groupby("dataset"):
        mean = cells.set_index(["train_size", "frozen_layers"])["mean"]
        small, large = cells["train_size"].min(), cells["train_size"].max()
        majority = float(cells["baseline"].iloc[0])  # accuracy of the majority class
        ks = sorted(cells["frozen_layers"].unique())
        gains = {k: mean[large, k] - mean[small, k] for k in ks if (large, k) in mean and (small, k) in mean}
        if small < large:
            checks.append(
                (
                    f"{dataset}: more data helps (n={small} → {large}, every k except all frozen)",
                    all(g > 0 for k, g in gains.items() if k != layers),
                    ", ".join(f"k={k}: {g:+.3f}" for k, g in gains.items()),
                )
            )
        if (small, layers) in mean:
            gap = mean[small, layers] - majority
            checks.append(
                (
                    f"{dataset}: everything frozen (k={layers}) is near majority at n={small}",
                    gap <= NEAR_MAJORITY,
                    f"{mean[small, layers]:.3f} vs majority {majority:.3f} ({gap:+.3f})",
                )
            )
        if (large, 0) in mean and (large, layers // 2) in mean:
            cost = mean[large, 0] - mean[large, layers // 2]
            checks.append(
                (
                    f"{dataset}: freezing half (k={layers // 2}) costs little at n={large}",
                    cost <= HALF_FROZEN_COST,
                    f"{mean[large, layers // 2]:.3f} vs {mean[large, 0]:.3f} at k=0 (cost {cost:+.3f})",
                )
            )
    return checks


def main() -> None:
    args = parse_args()
    import transformers

    from freezesweep.orchestrator.spec import SpecError
    from freezesweep.results.query import summary
    from freezesweep.trials.data import DatasetError
    from freezesweep.trials.model import ModelError, load_model_config

    transformers.logging.set_verbosity_error()
    try:
        layers = load_model_config(args.model).num_hidden_layers
        rows = run_sweep(args, layers)
    except (SpecError, ModelError, DatasetError) as exc:
        raise SystemExit(f"error: {exc}") from None
    table = beside_reference(summary(rows))
    pd.set_option("display.width", 200)
    pd.set_option("display.max_rows", 200)
    precision = ", ".join(sorted(rows["precision"].unique()))
    ours = KEYS + ["n", "mean", "median", "std", "min", "max", "baseline"]
    if args.model.rsplit("/", 1)[-1] == "roberta-base":
        print(
            f"\n{args.model} ({layers} layers), {precision}; best validation accuracy over seeds, "
            "beside the reference study (roberta-base, 5 seeds):"
        )
        shown = table[ours + ["ref_mean", "ref_min", "ref_max", "outside"]].round(3).astype(object)
        shown.loc[~table["has_reference"], ["ref_mean", "ref_min", "ref_max", "outside"]] = "-"
        shown.loc[~table["has_reference"], "ref_mean"] = "no reference cell"
        print(shown.to_string(index=False))
        compared = int(table["has_reference"].sum())
        print(
            f"\n{int(table['outside'].sum())} of {compared} cells with a reference cell have a mean outside the "
            f"reference's min–max" + (f"; {len(table) - compared} cell(s) without one" if compared < len(table) else "")
        )
        return
    print(
        f"\n{args.model} ({layers} layers), {precision}; best validation accuracy over seeds. Not the reference "
        "study's model (roberta-base): its published cells are not comparable number for number and are not "
        f"shown beside these ({REFERENCE.relative_to(REFERENCE.parents[2])} holds them)."
    )
    print(table[ours].round(3).to_string(index=False))
    print("\nIts findings, checked qualitatively")
    for finding, holds, evidence in qualitative_checks(table, layers):
        print(f"  [{'PASS' if holds else 'FAIL'}] {finding}: {evidence}")


if __name__ == "__main__":
    main()
