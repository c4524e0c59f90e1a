"""Settle mode's rounds: one Tune run a round against one run that feeds each group's next cells as its
rows come in (orchestrator/settle_feed.py), side by side in one run, on the same grid.

The trial sleeps in proportion to its train size (``--s-per-row`` seconds a row: a real trial's time grows
with its steps), then reports what benchmarks/scale.py's instant trial reports, with a score of its cell
(freezing costs more at some sizes than at others, seeds spread): some arms are decided after a few
seeds, others run to the budget (``max_seeds``), so the groups' rounds differ and the cells the two ways
ran are compared. Each trial process still imports the trial's code, as a real one does (what a new Tune
run pays again for every slot). Under rounds, a round waits for its slowest group.

    python benchmarks/settle_rounds.py [--train-sizes 24 48 96 192] [--s-per-row 0.01] [--max-seeds 6]

Prints each way's wall time from the launch's start (Ray already up) to its end, its Tune runs, the cells
it ran (the same in both: checked), the trial processes it started (each pays the imports), and the ratio.
Exits 1 where the two ran different cells.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import instant_row, make_inputs  # noqa: E402  (the instant trial's row and the tiny inputs)

SECONDS_PER_ROW_ENV = "SETTLE_ROUNDS_S_PER_ROW"  # read by the trial in Ray's workers (they inherit the env)
PROCESSES_ENV = "SETTLE_ROUNDS_PROCESSES"  # a folder where each trial process leaves a file named by its pid


def sleeping_trainable(config: dict, cells: dict, shipment=None, earlier=None, width=None) -> None:
    """A single trial (trial arrays are off): a sleep as long as its train size says, then the instant
    trial's report with the cell's score (``cell_score``) over a constant baseline of 0.5."""
    import dataclasses

    from freezesweep.orchestrator.tune_adapter import ray_placement, report_result, trial_config_from_ray

    cfg = trial_config_from_ray(config, cells)
    (Path(os.environ[PROCESSES_ENV]) / str(os.getpid())).touch()
    time.sleep(float(os.environ[SECONDS_PER_ROW_ENV]) * cfg.train_size)
    placement, score = ray_placement(), cell_score(cfg)
    row = dataclasses.replace(
        instant_row(cfg, placement),
        best_val_accuracy=score,
        best_val_score=score,
        best_val_metrics={"accuracy": score},
        baseline_score=0.5,
        baseline_metrics={"accuracy": 0.5},
        collapsed=False,
    )
    report_result(row, cfg, placement)


def cell_score(cfg) -> float:
    """0.85 less what freezing costs at this size (the smallest sizes little, the largest much), and a
    seed's spread of 0.002: the same every run. The spread is drawn from the cell's axes, not its
    trial_id, which hashes the model's folder (a new temporary one each run): with it, whether an arm was
    decided at its first look changed from run to run."""
    import random

    cost_per_layer = 0.002 * (cfg.train_size // 24) ** 2
    spread = random.Random(f"{cfg.train_size}-{cfg.frozen_layers}-{cfg.seed}").gauss(0, 0.002)
    return 0.85 - cost_per_layer * cfg.frozen_layers + spread


def write_spec(folder: Path, name: str, model: str, data: str, args: argparse.Namespace) -> Path:
    spec = {
        "name": name,
        "model": model,
        "datasets": [data],
        "train_sizes": args.train_sizes,
        "frozen_layers": [0, 1, 2],
        "seeds": [],
        # learned_first off: every arm from the first round
        "settle": {"tolerance": 0.01, "initial_seeds": 3, "max_seeds": args.max_seeds, "learned_first": False},
        "training": {"precision": "fp32", "epochs": 1, "trial_array": False},
        "resources": {"cpus_per_trial": 1},
        "store": str(folder / "store"),
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def measure(path: Path, feed: bool, session) -> dict:
    from freezesweep.orchestrator import launch as launching
    from freezesweep.orchestrator.checks import load_spec
    from freezesweep.results.query import read_rows
    from freezesweep.results.store import ResultStore

    runs = []
    run_tune = launching.run_tune

    def counted(*args, **kwargs):
        runs.append(1)
        return run_tune(*args, **kwargs)

    launching.run_tune = counted
    processes = Path(os.environ[PROCESSES_ENV])
    before = set(processes.iterdir())  # the other way's: Tune stops its trial processes when its run ends
    try:
        spec = load_spec(path)
        started = time.perf_counter()
        summary = launching.run(
            launching.resolve_for_launch(spec, session),
            session,
            show_progress=False,
            trainable=sleeping_trainable,
            feed=feed,
        )
        wall_s = time.perf_counter() - started
    finally:
        launching.run_tune = run_tune
    rows = read_rows(ResultStore(spec.store, spec.name), columns=["train_size", "frozen_layers", "seed", "status"])
    cells = sorted(zip(rows["train_size"], rows["frozen_layers"], rows["seed"]))
    assert summary.ran == len(rows) and set(rows["status"]) == {"ok"}, (summary, rows["status"].value_counts())
    return {
        "wall_s": wall_s,
        "tune_runs": len(runs),
        "cells": cells,
        "processes": len(set(processes.iterdir()) - before),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-sizes", type=int, nargs="+", default=[24, 48, 96, 192])
    parser.add_argument("--s-per-row", type=float, default=0.01, help="the trial's sleep per training row")
    parser.add_argument("--max-seeds", type=int, default=6)
    args = parser.parse_args()
    os.environ[SECONDS_PER_ROW_ENV] = str(args.s_per_row)
    from freezesweep.orchestrator.ray_session import RaySession

    folder = Path(tempfile.mkdtemp(prefix="freezesweep-settle-rounds-"))
    model, data = make_inputs(folder)
    (folder / "pids").mkdir()
    os.environ[PROCESSES_ENV] = str(folder / "pids")  # before Ray starts: its workers inherit the env it had
    session = RaySession(num_cpus=2)  # started once, before either launch: the launches are timed, not Ray's start
    session.connect()
    measured = {}
    for feed in (True, False):  # the fed run first: the first launch of a Ray session pays any first time
        measured[feed] = measure(write_spec(folder, "fed" if feed else "rounds", model, data, args), feed, session)
        m = measured[feed]
        print(
            f"{'one run, fed' if feed else 'a run a round':>14}: {m['wall_s']:6.1f} s, {m['tune_runs']} Tune run(s), "
            f"{len(m['cells'])} cells, {m['processes']} trial processes",
            flush=True,
        )
    if measured[False]["cells"] != measured[True]["cells"]:
        sys.exit("the two ways ran different cells")
    print(
        f"the same {len(measured[True]['cells'])} cells; wall time a run a round / one run fed: "
        f"{measured[False]['wall_s'] / measured[True]['wall_s']:.2f}"
    )


if __name__ == "__main__":
    main()
