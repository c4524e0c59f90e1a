"""The store at scale: `status`, `summary`, `query` and `report` on stores of 1k, 10k and 100k rows, each
command timed in a fresh process with its peak RSS, as a user runs them (the command's own high-water mark,
``VmHWM`` in its /proc/self/status as it exits: what GNU time reports, without the parent's peak that a
forked child's ``ru_maxrss`` starts from).

A store of N rows is what a launch leaves: the sweep's resolved spec and N rows of realistic size (a
20-point learning curve, the train indices) for the grid's cells, in compacted parts of 5,000 rows (as
compaction writes them between rounds) plus the last 1,000 as single-row files compacted by the store's
own ``compact``, timed too.

An uncompacted store (``--singles``): N single-row files and no part, as a store from before compaction
or one whose rounds never finished leaves them; ``status`` and then ``compact`` timed on it, each in a
fresh process with its peak RSS, then ``status`` again on the compacted store.

    python benchmarks/scale_store.py [--rows 1000 10000 100000] [--singles 20000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from freezesweep.orchestrator.plan import ResolvedSweep, build_grid
from freezesweep.orchestrator.rows import result_row
from freezesweep.orchestrator.spec import SweepSpec
from freezesweep.results.store import PART_PREFIX, SCHEMA, ResultStore
from freezesweep.trials.config import EvalPoint, TrialResult

PART_ROWS, SINGLE_ROWS = 5000, 1000
COMMANDS = {
    "status": [],
    "summary": [],
    "query": ["--sql", "SELECT count(*) AS n, avg(best_val_score) FROM results"],
    "report": ["--out", "{out}"],
}


def sweep_of(rows: int, store: str) -> ResolvedSweep:
    """A stored-looking resolved sweep of ``rows`` cells: 2 datasets × 5 sizes × 4 depths × seeds."""
    spec = SweepSpec.model_validate(
        {
            "name": f"rows-{rows}",
            "model": "m",
            "datasets": ["glue/sst2", "glue/cola"],
            "train_sizes": [50, 100, 200, 500, 1000],
            "frozen_layers": [-1, 0, 2, 4],
            "seeds": list(range(rows // 40)),
            "store": store,
            "training": {"precision": "bf16", "select_metric": {"glue/sst2": "accuracy", "glue/cola": "accuracy"}},
        }
    )
    return ResolvedSweep(spec)


def fake_row(sweep: str, cell, rng: int) -> dict:
    score = 0.5 + (hash((cell.trial_id, rng)) % 400) / 1000
    curve = tuple(
        EvalPoint(step=5 * i, epoch=i / 2, accuracy=score - 0.01 * (20 - i) / 20, loss=0.7 - i / 100)
        for i in range(1, 21)
    )
    result = TrialResult(
        trial_id=cell.trial_id,
        config=cell,
        status="ok",
        select_metric="accuracy",
        best_val_accuracy=score,
        best_val_score=score,
        baseline_score=0.509,
        majority_baseline=0.509,
        best_step=50,
        best_epoch=5.0,
        final_val_accuracy=score,
        final_val_score=score,
        best_val_metrics={"accuracy": score},
        baseline_metrics={"accuracy": 0.509},
        eval_curve=curve,
        train_loss_curve=tuple((5 * i, 0.5) for i in range(1, 21)),
        trainable_params=1000,
        total_params=2000,
        train_time_s=30.0,
        eval_time_s=5.0,
        wall_time_s=40.0,
        peak_mem_mb=900.0,
        train_indices=tuple(range(cell.train_size)),
        n_train=cell.train_size,
        n_eval=872,
        precision="bf16",
        device="cpu",
        placement={"hostname": "h", "node_id": "n"},
    )
    return result_row(sweep, result)


def build_store(rows: int, root: Path) -> tuple[ResultStore, float]:
    """Parts of PART_ROWS written as compaction writes them, then the last rows through write_row and
    the store's own compact (timed)."""
    sweep = sweep_of(rows, str(root))
    store = ResultStore(str(root), sweep.name)
    store.write_spec(sweep.spec.to_yaml())
    cells = build_grid(sweep)[:rows]
    singles = min(SINGLE_ROWS, rows)
    parted = cells[: rows - singles]
    os.makedirs(store.results_dir, exist_ok=True)
    for start in range(0, len(parted), PART_ROWS):
        batch = [fake_row(sweep.name, c, start) for c in parted[start : start + PART_ROWS]]
        pq.write_table(
            pa.Table.from_pylist(batch, schema=SCHEMA), f"{store.results_dir}/{PART_PREFIX}{start:08d}.parquet"
        )
    for cell in cells[rows - singles :]:
        store.write_row(fake_row(sweep.name, cell, 0))
    started = time.perf_counter()
    store.compact()
    return store, time.perf_counter() - started


def build_uncompacted(rows: int, root: Path) -> ResultStore:
    """``rows`` single-row files written as a launch writes them (``write_row``), never compacted."""
    sweep = sweep_of(rows, str(root))
    store = ResultStore(str(root), sweep.name)
    store.write_spec(sweep.spec.to_yaml())
    for cell in build_grid(sweep)[:rows]:
        store.write_row(fake_row(sweep.name, cell, 0))
    return store


def uncompacted(cli: list[str], rows: int, root: Path) -> None:
    """status, compact, status again on a store of ``rows`` single-row files."""
    store = build_uncompacted(rows, root)
    args = [store.sweep, "--store", str(root)]
    figures = [timed(cli + ["status", *args]), timed(cli + ["compact", *args]), timed(cli + ["status", *args])]
    print(f"{rows:>8} " + " ".join(f"{wall:>10.2f} {rss:>10.0f}" for wall, rss in figures), flush=True)


# Runs `python -m MODULE ARGS…` in this process and, as it exits (sys.exit included), writes its own peak
# RSS in kB to the file named first: VmHWM, the high-water mark of this process's memory, which starts
# afresh at exec. (A child's ru_maxrss does not: Linux carries the forking parent's peak over into it.)
PEAK_WRAPPER = """
import atexit, runpy, sys
peak_file, module = sys.argv[1], sys.argv[2]
def write_peak():
    with open("/proc/self/status") as status:
        kb = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    with open(peak_file, "w") as out:
        out.write(kb)
atexit.register(write_peak)
sys.argv = sys.argv[2:]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def timed(command: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of ``python -m command[0] command[1:]`` in a fresh process: the
    child's own VmHWM as it exits (PEAK_WRAPPER). Where there is no /proc, ``os.wait4``'s ru_maxrss, which
    is at least this process's own peak (so only an upper bound)."""
    with tempfile.TemporaryFile() as errors, tempfile.TemporaryDirectory() as folder:
        peak_file = Path(folder) / "peak_kb"
        proc = Path("/proc/self/status").is_file()
        argv = (
            [sys.executable, "-c", PEAK_WRAPPER, str(peak_file), *command] if proc else [sys.executable, "-m", *command]
        )
        started = time.perf_counter()
        child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        if child.returncode != 0:
            errors.seek(0)
            raise RuntimeError(f"{command}: {errors.read().decode(errors='replace')[-2000:]}")
        kb = int(peak_file.read_text()) if proc else usage.ru_maxrss  # both in kB on Linux
    return wall, kb / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--rows",
        type=int,
        nargs="*",
        default=[1000, 10_000, 100_000],
        help="stores of this many rows, mostly compacted (none: skip)",
    )
    parser.add_argument(
        "--singles",
        type=int,
        nargs="*",
        default=[20_000],
        help="uncompacted stores of this many single-row files (none: skip)",
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="freezesweep-store-scale-"))
    cli = ["freezesweep.orchestrator.cli"]  # a module, run by timed() in a fresh Python
    if args.rows:
        print(
            f"{'rows':>8} {'files':>6} {'MB':>6} {'compact s':>9} "
            + " ".join(f"{name + ' s':>10} {name + ' MB':>10}" for name in COMMANDS),
            flush=True,
        )
    for rows in args.rows:
        store, compact_s = build_store(rows, root / str(rows))
        files = store.row_files()
        size_mb = sum(Path(f).stat().st_size for f in files) / 2**20
        cells = []
        for name, extra in COMMANDS.items():
            out = str(root / f"report-{rows}")
            wall, rss = timed(
                cli + [name, store.sweep, "--store", str(root / str(rows))] + [e.format(out=out) for e in extra]
            )
            cells.append(f"{wall:>10.2f} {rss:>10.0f}")
        print(f"{rows:>8} {len(files):>6} {size_mb:>6.0f} {compact_s:>9.2f} " + " ".join(cells), flush=True)
    if args.singles:
        print(
            f"\n{'singles':>8} "
            + " ".join(f"{name + ' s':>10} {name + ' MB':>10}" for name in ("status", "compact", "then status")),
            flush=True,
        )
    for rows in args.singles:
        uncompacted(cli, rows, root / f"singles-{rows}")


if __name__ == "__main__":
    main()
