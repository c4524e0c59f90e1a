"""Orchestration at scale: freezesweep's driver with real Ray Tune and an instant trial, so that only
orchestration is measured (as Ray's own Tune scalability benchmark does: doc/source/tune/tutorials/
tune-scalability.rst). Benchmark-only: the instant trial trains nothing; it reports what a real one
reports, its 20 evaluations (the protocol's: 10 epochs, every half epoch) and a result of the size a
real one has (a 20-point curve, the train indices), and the driver stores it as a row.

For each grid size (--cells, default 1k, 10k, 100k), without and with trial arrays (trials/array.py:
the 4 depths of a train size and seed as one Ray trial, which reports its first member's evaluations
and its members' rows, over at one step, in one report, as a real array does; the rows land as one
file):
- planning: the spec validated, resolved and expanded, and the cells still to run picked (in process);
- a launch in a child process (the driver): time from its start to the first stored row, driver CPU
  per cell (the driver process's CPU time, all its threads, between the first and the last row it
  stored, per row) and its peak RSS (VmHWM, peak_rss_mb). Grids above --full-max run only their first --sample cells
  (the driver stops as Ctrl-C stops it): per-cell cost does not need the whole grid to show whether it
  grows with the grid, the quadratic launch it replaces paid it from the first trial.

    python benchmarks/scale.py [--cells 1000 10000 100000] [--full-max 10000] [--sample 2500] [--arrays both]
    python benchmarks/scale.py --cells 105000 --plan-others 0 7 21   # `plan` beside other sweeps, no Ray

``--plan-others K …``: instead, ``fs.plan`` (the dry run: the work left priced by the store's other sweeps'
rows of the same kinds) of each grid into a store holding K tiny sweeps of the same model and data, each
with its 4 ok rows, for each K: the plan's time must grow with cells + sweeps, not with cells × sweeps.
    SCALE_EVALUATIONS=0 python benchmarks/scale.py …   # rows only, as measured before 2026-11-26
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
TRAIN_SIZES = [24, 48, 96, 120, 200]
FROZEN_LAYERS = [-1, 0, 1, 2]
EVALUATIONS_ENV = "SCALE_EVALUATIONS"  # read by the instant trial in Ray's workers (they inherit the driver's env)


# --- the instant trial (runs in Ray's workers) ----------------------------------------------------
def instant_trainable(config: dict, cells: dict, shipment=None, earlier=None, width=None) -> None:
    """A trial that trains nothing: what a real trial of this cell reports, at once: its evaluations
    (a single trial's all; an array's, its first member's, as ``array_trainable`` reports them), then
    its row (a trial array's members, over at one step: one report). ``SCALE_EVALUATIONS=0``: rows only,
    as this benchmark measured before 2026-11-26."""
    import json

    from freezesweep.orchestrator.tune_adapter import (
        ray_placement,
        report_evaluation,
        report_result,
        report_results,
        trial_configs_from_ray,
    )

    cfgs, placement = trial_configs_from_ray(config, cells), ray_placement()
    rows = [instant_row(cfg, placement) for cfg in cfgs]
    if os.environ.get(EVALUATIONS_ENV, "1") != "0":
        placed = json.dumps(placement)
        for point in rows[0].eval_curve:
            report_evaluation(point, placed)
    if len(rows) == 1:
        report_result(rows[0], cfgs[0], placement)
    else:
        report_results(rows, {cfg.trial_id: cfg for cfg in cfgs}, placement)


def instant_row(cfg, placement: dict):
    from freezesweep.trials.config import EvalPoint, TrialResult

    # the protocol's 20 evaluations (10 epochs, every half epoch)
    curve = tuple(EvalPoint(step=2 * i, epoch=i / 2, accuracy=0.5 + i / 100, loss=0.7 - i / 100) for i in range(1, 21))
    return TrialResult(
        trial_id=cfg.trial_id,
        config=cfg,
        status="ok",
        select_metric=cfg.select_metric,
        best_val_accuracy=0.7,
        best_val_score=0.7,
        best_step=40,
        best_epoch=10.0,
        best_val_metrics={"accuracy": 0.7},
        eval_curve=curve,
        train_indices=tuple(range(cfg.train_size)),
        n_train=cfg.train_size,
        n_eval=60,
        wall_time_s=0.0,
        precision=cfg.precision,
        device="cpu",
        placement=placement,
    )


# --- fixtures: a tiny model and a toy dataset ------------------------------------------------------
def make_inputs(folder: Path) -> tuple[str, str]:
    """A 2-layer random BERT (MiniLM's tokenizer) and a 240-row CSV task."""
    import pandas as pd
    from transformers import AutoModel, BertConfig

    from freezesweep.trials.model import load_tokenizer

    tokenizer = load_tokenizer("sentence-transformers/all-MiniLM-L6-v2")
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    model = folder / "model"
    AutoModel.from_config(config).save_pretrained(model)
    tokenizer.save_pretrained(model)
    rng = random.Random(0)
    data = folder / "data"
    data.mkdir()
    for split, n in (("train", 240), ("validation", 60)):
        labels = [rng.randint(0, 1) for _ in range(n)]
        pd.DataFrame(
            {"sentence": [f"row {i} is {'good' if y else 'bad'}" for i, y in enumerate(labels)], "label": labels}
        ).to_csv(data / f"{split}.csv", index=False)
    return str(model), str(data)


def write_spec(
    folder: Path, cells: int, model: str, data: str, trials_per_round: int | None = None, arrays: bool = False
) -> Path:
    per_seed = len(TRAIN_SIZES) * len(FROZEN_LAYERS)
    name = f"scale-{cells}" + ("-arrays" if arrays else "")
    spec = {
        "name": name,
        "model": model,
        "datasets": [data],
        "train_sizes": TRAIN_SIZES,
        "frozen_layers": FROZEN_LAYERS,
        "seeds": list(range(cells // per_seed)),
        # arrays: the 4 depths of a (train size, seed) as one Ray trial (trials/array.py), forced on (CPU)
        "training": {"precision": "fp32", "epochs": 1, "trial_array": arrays},
        "resources": {"cpus_per_trial": 0.5, **({"trials_per_round": trials_per_round} if trials_per_round else {})},
        "store": str(folder / "store"),
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


# --- measurements ----------------------------------------------------------------------------------
def measure_planning(path: Path) -> dict:
    """Validation, resolution and the grid, in process (what a launch does before Ray)."""
    from freezesweep.orchestrator.checks import load_spec
    from freezesweep.orchestrator.plan import build_grid, with_resources
    from freezesweep.orchestrator.sweeps import resolve_here

    started = time.perf_counter()
    spec = load_spec(path)
    validated = time.perf_counter()
    sweep = resolve_here(spec)
    cells = build_grid(sweep)
    pending = [with_resources(c, sweep) for c in cells]
    done = time.perf_counter()
    return {"cells": len(cells), "validate_s": validated - started, "plan_s": done - started, "pending": len(pending)}


def measure_plan_with_others(folder: Path, cells: int, model: str, data: str, others: list[int]) -> None:
    """``fs.plan`` of the grid into a store holding each count of tiny other sweeps (same model and data,
    another split_seed: the same kinds under the same protocol, so each prices the plan's cells)."""
    import freezesweep as fs
    from freezesweep.orchestrator.checks import load_spec
    from freezesweep.orchestrator.plan import build_grid
    from freezesweep.orchestrator.rows import result_row
    from freezesweep.orchestrator.sweeps import resolve_here
    from freezesweep.results.store import ResultStore
    from freezesweep.trials.config import TrialResult

    folder.mkdir(exist_ok=True)
    path, store = write_spec(folder, cells, model, data), str(folder / "store")
    fs.plan(path)  # imports and the data's first read, paid once, out of the timings
    made = 0
    for count in sorted(others):
        for i in range(made, count):
            spec = yaml.safe_load(write_spec(folder, 20, model, data).read_text())
            spec.update(name=f"tiny-{i}", train_sizes=[24], frozen_layers=[0, 1], seeds=[0, 1], split_seed=100 + i)
            (folder / f"tiny-{i}.yaml").write_text(yaml.safe_dump(spec))
            sweep = resolve_here(load_spec(folder / f"tiny-{i}.yaml"))
            ResultStore(store, sweep.name).write_spec(sweep.spec.to_yaml())
            for cell in build_grid(sweep):
                row = TrialResult(trial_id=cell.trial_id, config=cell, status="ok", wall_time_s=10.0)
                ResultStore(store, sweep.name).write_row(result_row(sweep.name, row))
        made = max(made, count)
        started = time.perf_counter()
        planned = fs.plan(path)
        print(
            f"plan of {len(planned.cells):,} cells beside {count} other sweep(s): {time.perf_counter() - started:.1f} s "
            f"(priced by {len(planned.priced_from)} of them)",
            flush=True,
        )


def peak_rss_mb() -> float:
    """This process's peak RSS: VmHWM in /proc/self/status, which starts afresh at exec. (getrusage's
    ru_maxrss does not: a child carries over the peak of the parent that forked it, here one that loaded
    torch; it is the fallback where there is no /proc.)"""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def drive(path: Path, out: Path, stop_after: int | None) -> None:
    """The child: one launch with the instant trial, measured from its own start."""
    started_wall = time.perf_counter()
    from freezesweep.orchestrator import launch as launching
    from freezesweep.orchestrator.checks import load_spec
    from freezesweep.orchestrator.ray_session import RaySession

    marks: list[tuple[float, float]] = []  # (wall, driver CPU) at each stored row

    class CountingRowWriter(launching.RowWriter):
        def write_all(self, results, attempts, oom_retry=False):
            rows = super().write_all(results, attempts, oom_retry)
            marks.extend([(time.perf_counter(), time.process_time())] * len(results))
            if stop_after and len(marks) >= stop_after:  # again for rows that land while it stops
                os.kill(os.getpid(), signal.SIGINT)  # Tune stops as on Ctrl-C
            return rows

    launching.RowWriter = CountingRowWriter
    session = RaySession(num_cpus=2)
    summary = launching.run(
        launching.resolve_for_launch(load_spec(path), session),
        session,
        show_progress=False,
        trainable=instant_trainable,
    )
    end = min(len(marks), stop_after or len(marks))  # the rows before the stop was asked for
    (first_wall, first_cpu), (last_wall, last_cpu) = marks[0], marks[end - 1]
    rows = end
    out.write_text(
        json.dumps(
            {
                "rows": rows,
                "ran": summary.ran,
                "first_row_s": first_wall - started_wall,
                "driver_cpu_ms_per_trial": 1000 * (last_cpu - first_cpu) / max(1, rows - 1),
                "wall_ms_per_trial": 1000 * (last_wall - first_wall) / max(1, rows - 1),
                "driver_peak_rss_mb": peak_rss_mb(),
            }
        )
    )


def main() -> None:
    args = parse_args()
    if args.driver:
        drive(Path(args.driver), Path(args.out), args.stop_after)
        return
    folder = Path(tempfile.mkdtemp(prefix="freezesweep-scale-"))
    model, data = make_inputs(folder)
    if args.plan_others:
        for cells in args.cells:
            measure_plan_with_others(folder / f"plan-{cells}", cells, model, data, args.plan_others)
        return
    print(
        f"{'cells':>8} {'arrays':>6} {'validate s':>10} {'plan s':>7} {'cells run':>9} {'first row s':>11} "
        f"{'driver CPU ms/cell':>18} {'wall ms/cell':>12} {'driver RSS MB':>13}"
    )
    for cells in args.cells:
        measured = {}
        for arrays in {"both": (False, True), "off": (False,), "on": (True,)}[args.arrays]:
            measured[arrays] = measure(folder, cells, model, data, args, arrays)
        if len(measured) == 2 and None not in measured.values():
            ratio = measured[False]["driver_cpu_ms_per_trial"] / measured[True]["driver_cpu_ms_per_trial"]
            print(f"{cells:>8} driver CPU per cell without arrays / with arrays of {len(FROZEN_LAYERS)}: {ratio:.2f}")


def measure(folder: Path, cells: int, model: str, data: str, args: argparse.Namespace, arrays: bool) -> dict | None:
    """One grid size through a driver of its own; prints its line, returns its numbers (None: it failed)."""
    path = write_spec(folder, cells, model, data, args.trials_per_round, arrays)
    planning = measure_planning(path)
    out = folder / f"driver-{path.stem}.json"
    stop = args.sample if cells > args.full_max else None
    command = [sys.executable, __file__, "--driver", str(path), "--out", str(out)] + (
        ["--stop-after", str(stop)] if stop else []
    )
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    if not out.exists():
        print(f"{cells}: the driver failed: {done.stderr[-3000:]}", file=sys.stderr)
        return None
    d = json.loads(out.read_text())
    print(
        f"{planning['cells']:>8} {'on' if arrays else 'off':>6} {planning['validate_s']:>10.2f} "
        f"{planning['plan_s']:>7.2f} {d['rows']:>9} {d['first_row_s']:>11.1f} {d['driver_cpu_ms_per_trial']:>18.2f} "
        f"{d['wall_ms_per_trial']:>12.2f} {d['driver_peak_rss_mb']:>13.0f}",
        flush=True,
    )
    return d


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--full-max", type=int, default=10_000, help="larger grids run only --sample trials")
    parser.add_argument(
        "--sample", type=int, default=2500, help="mid-round (rounds of 1,000 Ray trials), where Tune stops at once"
    )
    parser.add_argument(
        "--trials-per-round", type=int, help="the spec's resources.trials_per_round (default: its default)"
    )
    parser.add_argument(
        "--arrays", choices=["both", "off", "on"], default="both", help="each grid without and with trial arrays"
    )
    parser.add_argument(
        "--plan-others", type=int, nargs="+", help="instead: `plan` beside this many tiny other sweeps (no Ray)"
    )
    parser.add_argument("--driver", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--stop-after", type=int, help=argparse.SUPPRESS)
    return parser.parse_args()


if __name__ == "__main__":
    main()
