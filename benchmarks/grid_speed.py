"""The whole grid, side by side: the reference study's loop (HF Trainer, ``hf_baseline.py``) against
freezesweep, same cells, same machine, one invocation.

    python benchmarks/grid_speed.py                       # the CPU grid: real SST-2, MiniLM-L6, 16 cells
    python benchmarks/grid_speed.py --train-cache         # + the opt-in training cache, its accuracy effect
    python benchmarks/grid_speed.py --engine local --skip-baseline --arrays 8 --singles-too   # arrays beside singles
    python benchmarks/grid_speed.py --engine local --skip-baseline --arrays 8 --unpacked-too  # packed slots beside padded
    python benchmarks/grid_speed.py --engine local --workers 4 --device cuda ...   # no Ray (the GPU check)

Prints the wall time of each side, the ratio, trials per hour, per-trial fixed overhead (a trial's
wall time outside its training steps and evaluations), and every cell's best validation accuracy on
both sides with the largest difference and the difference of the means. Nothing is hard-coded.

The baseline runs one trial at a time with every core, in the precision a user of this machine would
set (``--baseline-precision user``: the reference's fp16 on a GPU; fp32 on a CPU, where the Trainer
refuses fp16) or in freezesweep's own (``same``). freezesweep runs a real sweep: through the embedded
Ray (``--engine ray``) or through plain worker processes (``--engine local``, where Ray is absent).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python benchmarks/…` from a checkout

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=MINILM)
    parser.add_argument("--model-init", choices=["pretrained", "random"], default="pretrained")
    parser.add_argument("--datasets", nargs="+", default=["glue/sst2"])
    parser.add_argument("--train-sizes", nargs="+", type=int, default=[50, 200])
    parser.add_argument("--frozen-layers", nargs="+", type=int, default=None, help="default: -1 … L")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--epochs", type=float, default=10.0)
    parser.add_argument("--max-eval-examples", type=int, default=None, help="default: the full validation set")
    parser.add_argument("--eval-batch-size", type=int, default=None, help="freezesweep's (default: its own)")
    parser.add_argument("--data-dir", default=os.environ.get("FREEZESWEEP_DATA_DIR"))
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--baseline-precision", choices=["user", "same"], default="user")
    parser.add_argument("--skip-baseline", action="store_true", help="freezesweep only (e.g. a packing study)")
    parser.add_argument("--train-cache", action="store_true", help="also run with the opt-in training cache")
    parser.add_argument(
        "--cuda-graphs", action="store_true", help="freezesweep's training steps as CUDA graphs (trials/graphs.py)"
    )
    parser.add_argument(
        "--arrays",
        type=int,
        default=0,
        help="the freezesweep side as trial arrays of up to this many cells, forced on (trials/array.py; "
        "a sweep's auto runs them on GPUs only); 0: single trials (the Ray engine: the sweep's default)",
    )
    parser.add_argument(
        "--singles-too", action="store_true", help="with --arrays, the single trials too, side by side in one run"
    )
    parser.add_argument(
        "--unpacked-too",
        action="store_true",
        help="with --arrays, the arrays again with packing off (slots padded to one shape), side by side in one run",
    )
    parser.add_argument("--engine", choices=["ray", "local"], default="ray")
    parser.add_argument("--workers", type=int, default=None, help="local engine: trials at once (default: CPUs)")
    parser.add_argument("--gpus-per-trial", type=float, default=None, help="ray engine (default: 0 on CPU, 0.25)")
    parser.add_argument("--out", default=None, help="write every cell's numbers here as JSON")
    args = parser.parse_args(argv)
    if not args.data_dir:
        parser.error("--data-dir (or FREEZESWEEP_DATA_DIR) must name the local GLUE Parquet folder")
    if args.arrays and args.engine != "local":
        parser.error("--arrays runs through the local engine (--engine local)")
    return args


def grid(args: argparse.Namespace, train_cache: bool = False) -> list:
    """The cells, with the precision freezesweep resolves for the device. Plain TrialConfigs: the
    local engine needs neither Ray nor the orchestrator's spec validation."""
    from freezesweep.trials.config import TrialConfig
    from freezesweep.trials.model import load_model_config
    from freezesweep.trials.precision import auto_precision

    layers = load_model_config(args.model).num_hidden_layers
    extra = {"train_cache": True} if train_cache else {}
    if args.eval_batch_size:
        extra["eval_batch_size"] = args.eval_batch_size
    if args.cuda_graphs:
        extra["cuda_graphs"] = True
    return [
        TrialConfig(
            dataset=dataset,
            train_size=n,
            frozen_layers=k,
            seed=seed,
            model=args.model,
            split_seed=0,
            epochs=args.epochs,
            model_init=args.model_init,
            max_eval_examples=args.max_eval_examples,
            precision=auto_precision(args.device),
            data_dir=str(Path(args.data_dir).resolve()),
            **extra,
        )
        for dataset in args.datasets
        for n in args.train_sizes
        for k in (args.frozen_layers or range(-1, layers + 1))
        for seed in args.seeds
    ]


def sweep_spec(cells: list, args: argparse.Namespace):
    """The same cells as a sweep spec (the Ray engine launches it); its grid must be ``cells``."""
    from freezesweep.orchestrator.plan import build_grid
    from freezesweep.orchestrator.sweeps import resolve_here
    from freezesweep.orchestrator.checks import validate

    first = cells[0]
    gpus = args.gpus_per_trial if args.gpus_per_trial is not None else (0.25 if args.device == "cuda" else 0.0)
    spec = validate(
        {
            "name": f"grid-speed-{int(time.time() * 1000)}",
            "model": first.model,
            "datasets": list(dict.fromkeys(c.dataset for c in cells)),
            "train_sizes": list(dict.fromkeys(c.train_size for c in cells)),
            "frozen_layers": list(dict.fromkeys(c.frozen_layers for c in cells)),
            "seeds": list(dict.fromkeys(c.seed for c in cells)),
            "training": {
                "epochs": first.epochs,
                "model_init": first.model_init,
                "precision": first.precision,
                "eval_batch_size": first.eval_batch_size,
                "max_eval_examples": first.max_eval_examples,
                **({"train_cache": True} if getattr(first, "train_cache", False) else {}),
                **({"cuda_graphs": True} if first.cuda_graphs else {}),
                **({"trial_array": first.trial_array} if getattr(first, "trial_array", None) is not None else {}),
            },
            "resources": {"gpus_per_trial": gpus, "cpus_per_trial": 1, "array_width": args.arrays or 8},
            "data_dir": first.data_dir,
            "store": tempfile.mkdtemp(prefix="grid-speed-"),
        },
        "grid speed benchmark",
    )
    assert [c.trial_id for c in build_grid(resolve_here(spec))] == [c.trial_id for c in cells], (
        "spec and cells disagree"
    )
    return spec


# --- the baseline ----------------------------------------------------------------------------------
def run_baseline(cells, precision: str) -> tuple[float, dict]:
    from benchmarks.hf_baseline import run_baseline_trial

    started, rows = time.perf_counter(), {}
    for i, cell in enumerate(cells, 1):
        result = run_baseline_trial(cell, precision)
        rows[cell.trial_id] = {
            "accuracy": result.best_val_accuracy,
            "wall_time_s": result.wall_time_s,
            "overhead_s": result.wall_time_s - result.train_time_s - result.eval_time_s,
            "checkpoint_time_s": result.checkpoint_time_s,
            "train_time_s": result.train_time_s,
            "eval_time_s": result.eval_time_s,
        }
        print(
            f"  baseline {i}/{len(cells)} n={cell.train_size} k={cell.frozen_layers}: "
            f"{result.best_val_accuracy:.4f} in {result.wall_time_s:.1f} s",
            flush=True,
        )
    return time.perf_counter() - started, rows


# --- freezesweep -----------------------------------------------------------------------------------
def run_freezesweep(cells, args) -> tuple[float, dict]:
    spec = sweep_spec(cells, args) if args.engine == "ray" else None
    started = time.perf_counter()
    results = _through_ray(spec) if spec is not None else _through_processes(cells, args)
    wall = time.perf_counter() - started
    rows = {
        r["trial_id"]: {
            "accuracy": r["best_val_accuracy"],
            "wall_time_s": r["wall_time_s"],
            # fixed cost: outside training, evaluation and filling the caches (compute)
            "overhead_s": r["wall_time_s"] - r["train_time_s"] - r["eval_time_s"] - (r.get("cache_fill_time_s") or 0.0),
            "peak_mem_mb": r["peak_mem_mb"],
            "train_time_s": r["train_time_s"],
            "eval_time_s": r["eval_time_s"],
            "cache_fill_time_s": r.get("cache_fill_time_s") or 0.0,
        }
        for r in results
        if r["status"] == "ok"
    }
    if args.arrays:
        arrayed = sum("trial_array" in (r.get("optimisations") or ()) for r in results)
        print(f"  {arrayed} of {len(results)} rows ran in trial arrays (the others stepped aside, or failed)")
    failed = [r for r in results if r["status"] != "ok"]
    if failed:
        print(f"  {len(failed)} freezesweep trials failed, first: {failed[0].get('error')}")
    return wall, rows


def _through_ray(spec) -> list[dict]:
    import ray

    from freezesweep.orchestrator.launch import launch
    from freezesweep.results.store import ResultStore

    launch(spec, show_progress=False)
    ray.shutdown()
    return ResultStore(spec.store, spec.name).read().to_dict("records")


def _through_processes(cells, args) -> list[dict]:
    """Without Ray: N worker processes, each running trials (or arrays) one after another (a worker
    keeps its tokenizer, token cache and evaluation cache warm, as a Ray actor does), the longest
    first so that none starts last; a line per finished trial, so a run cut short still says how far
    it got."""
    import multiprocessing

    workers = args.workers or os.cpu_count() or 1
    threads = max(1, (os.cpu_count() or 1) // workers)  # as Ray's cpus_per_trial would: no oversubscription
    from freezesweep.trials.array import group_cells

    cells = [replace(c, device=args.device, num_threads=threads) for c in cells]
    units = sorted(group_cells(cells, args.arrays or 1), key=_work, reverse=True)  # the longest first
    rows, started = [], time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for done in as_completed([pool.submit(_one_unit, unit) for unit in units]):
            unit = done.result()
            rows += unit
            done_s = time.perf_counter() - started
            print(f"  [{len(rows):>5}/{len(cells)}] trials done at {done_s:7.1f} s: {_said(unit)}", flush=True)
    return rows


def _said(rows: list[dict]) -> str:
    """A finished unit in a few words: its cells, its slowest member's wall time, what it ran with (an
    array: what any member did, in order of first use)."""
    config = rows[0]["config"]
    sizes = ",".join(dict.fromkeys(str(r["config"]["train_size"]) for r in rows))  # slots: every train size
    cells = f"{config['dataset']} n={sizes} k=" + ",".join(str(r["config"]["frozen_layers"]) for r in rows)
    wall = max(r.get("wall_time_s") or 0.0 for r in rows)
    statuses = collections.Counter(r["status"] for r in rows)  # an array's members can end differently
    said = ", ".join(f"{n} {s}" if len(rows) > 1 else s for s, n in statuses.items())
    used = dict.fromkeys(name for r in rows for name in r.get("optimisations") or ())
    return f"{cells} in {wall:.1f} s ({said}; {', '.join(used) or '-'})"


def _work(unit) -> float:
    return sum(c.train_size * c.epochs for c in unit)


def _one_unit(cells) -> list[dict]:
    """One cell, or one trial array's members (trials/array.py ``run_array_or_oom``: out of GPU memory,
    it runs again at half its width, down to single trials whose row is then ``oom``)."""
    from freezesweep.trials.array import run_array_or_oom
    from freezesweep.trials.run import failed_result

    try:
        results = run_array_or_oom(cells)
    except Exception as exc:  # a failure is a row, not a crash of the benchmark
        results = [failed_result(cell, exc) for cell in cells]
    return [result.to_dict() for result in results]


# --- the comparison --------------------------------------------------------------------------------
def where_the_time_went(rows: dict) -> str:
    """The trials' seconds summed over rows (an array member's are its shares of the array's): training,
    evaluation, filling the caches, and the rest (building, loading, checks)."""
    parts = {name: sum(r.get(f"{name}_time_s") or 0.0 for r in rows.values()) for name in ("train", "eval")}
    parts["cache fill"] = sum(r.get("cache_fill_time_s") or 0.0 for r in rows.values())
    parts["other"] = sum(r["overhead_s"] for r in rows.values())
    total = sum(parts.values()) or math.nan
    return "trial seconds " + ", ".join(f"{name} {s:.1f} ({s / total:.0%})" for name, s in parts.items())


def report(cells, sides: dict[str, tuple[float, dict]], reference: str) -> None:
    base_wall, base_rows = sides[reference]
    print(f"\n{'side':<28}{'wall s':>9}{'ratio':>8}{'trials/h':>10}{'overhead s (median)':>20}{'mean acc':>10}")
    for name, (wall, rows) in sides.items():
        overhead = statistics.median(r["overhead_s"] for r in rows.values()) if rows else math.nan
        mean_acc = statistics.mean(r["accuracy"] for r in rows.values()) if rows else math.nan
        print(
            f"{name:<28}{wall:9.1f}{base_wall / wall:8.2f}{len(rows) / wall * 3600:10.0f}{overhead:20.2f}"
            f"{mean_acc:10.4f}"
        )
    names = list(sides)
    print(
        "\nbest validation accuracy per cell\n"
        + f"{'dataset':<12}{'n':>5}{'k':>4}{'seed':>5}"
        + "".join(f"{n[:20]:>22}" for n in names)
    )
    for cell in cells:
        accs = [sides[n][1].get(cell.trial_id, {}).get("accuracy", math.nan) for n in names]
        print(
            f"{cell.dataset:<12}{cell.train_size:>5}{cell.frozen_layers:>4}{cell.seed:>5}"
            + "".join(f"{a:22.4f}" for a in accs)
        )
    for name, (_, rows) in sides.items():
        peaks = [r["peak_mem_mb"] for r in rows.values() if r.get("peak_mem_mb")]
        if peaks:
            print(f"{name}: peak memory per trial {statistics.mean(peaks):.0f} MB mean, {max(peaks):.0f} MB max")
    for name, (_, rows) in sides.items():
        print(f"{name}: {where_the_time_went(rows)}")
    for name in names:
        if name == reference:
            continue
        diffs = [sides[name][1][c]["accuracy"] - base_rows[c]["accuracy"] for c in base_rows if c in sides[name][1]]
        if diffs:
            print(
                f"{name} − {reference}: largest |difference| {max(map(abs, diffs)):.4f}, "
                f"difference of the means {statistics.mean(diffs):+.4f} over {len(diffs)} cells"
            )


def no_cuda_here(device: str) -> None:
    """``--device cuda`` where torch has no CUDA device: one line and a non-zero exit, not torch's assertion."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            f"error: --device cuda, but torch {torch.__version__} finds no CUDA device here: "
            "run it on a GPU machine, or with --device cpu"
        )


def main(argv=None) -> None:
    import torch

    args = parse_args(argv)
    no_cuda_here(args.device)
    cells = grid(args)
    precision = cells[0].precision
    baseline_precision = (
        precision if args.baseline_precision == "same" else ("fp16" if args.device == "cuda" else "fp32")
    )
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"{os.cpu_count()} CPU cores"
    print(
        f"{len(cells)} cells of {args.model} on {', '.join(args.datasets)}, {device}; freezesweep in {precision}, "
        f"baseline in {baseline_precision}",
        flush=True,
    )
    sides: dict[str, tuple[float, dict]] = {}
    if not args.skip_baseline:
        sides["HF Trainer (reference)"] = run_baseline(cells, baseline_precision)
    # The same cells (a machine switch: the same ids) as single trials and as trial arrays.
    if not args.arrays or args.singles_too:
        singles = [replace(c, trial_array=False) for c in cells] if args.arrays else cells
        sides["freezesweep"] = run_freezesweep(singles, args)
    if args.arrays:
        sides["freezesweep+trial arrays"] = run_freezesweep([replace(c, trial_array=True) for c in cells], args)
    if args.arrays and args.unpacked_too:
        unpacked = [replace(c, trial_array=True, pack_training=False) for c in cells]
        sides["freezesweep+arrays unpacked"] = run_freezesweep(unpacked, args)
    if args.train_cache:
        cached_cells = grid(args, train_cache=True)
        wall, rows = run_freezesweep(cached_cells, args)
        by_cell = {(c.dataset, c.train_size, c.frozen_layers, c.seed): c.trial_id for c in cells}
        sides["freezesweep+train cache"] = (
            wall,
            {
                by_cell[(c.dataset, c.train_size, c.frozen_layers, c.seed)]: rows[c.trial_id]
                for c in cached_cells
                if c.trial_id in rows
            },
        )
    report(cells, sides, next(iter(sides)))
    if args.out:
        Path(args.out).write_text(json.dumps({n: {"wall_s": w, "cells": r} for n, (w, r) in sides.items()}, indent=1))


if __name__ == "__main__":
    from freezesweep.trials.data import DatasetError
    from freezesweep.trials.model import ModelError

    try:
        main()
    except (DatasetError, ModelError) as exc:  # what the user can fix: one line, not a traceback
        raise SystemExit(f"error: {exc}") from None
