"""Grids of thousands of cells through real Ray Tune with an instant trial (benchmarks/scale.py's: no
training, so orchestration alone runs): every cell exactly once, also when the driver is killed inside
a round and between two rounds."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from freezesweep.orchestrator import tune_adapter
from freezesweep.orchestrator.checks import load_spec
from freezesweep.orchestrator.plan import build_grid
from freezesweep.orchestrator.ray_session import RaySession
from freezesweep.orchestrator.ray_storage import ray_storage
from freezesweep.orchestrator.sweeps import resolve_here
from freezesweep.results.store import ResultStore
from tests.conftest import REPO, count_rows, ray_sweeps, rows_by_id

DRIVER = [sys.executable, str(REPO / "benchmarks" / "scale.py"), "--driver"]


def _spec(write_spec, name: str, seeds: int, trials_per_round: int, key: str = "trials_per_round") -> Path:
    """2 sizes × 2 depths × ``seeds``; instant trials, four at a time on 2 cores."""
    return write_spec(
        name,
        seeds=list(range(seeds)),
        resources={"cpus_per_trial": 0.5, "max_failures": 0, key: trials_per_round},
    )


def _rows(path: Path) -> pd.DataFrame:
    spec = load_spec(path, semantic=False)
    rows = pd.read_parquet(Path(spec.store) / spec.name / "results", columns=["trial_id", "status"])
    assert not rows["trial_id"].duplicated().any(), "a cell has two rows"
    assert set(rows["trial_id"]) <= {c.trial_id for c in build_grid(resolve_here(spec))}
    assert (rows["status"] == "ok").all()
    return rows


def _drive(path: Path, tmp_path: Path, **env) -> subprocess.Popen:
    return subprocess.Popen(
        DRIVER + [str(path), "--out", str(tmp_path / "driver.json")],
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


@pytest.mark.slow
def test_five_thousand_cells_each_exactly_once(write_spec, tmp_path):
    path = _spec(write_spec, "five-thousand", seeds=1250, trials_per_round=2000)  # 3 rounds
    done = subprocess.run(
        DRIVER + [str(path), "--out", str(tmp_path / "driver.json")], capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(_rows(path)) == 5000


@pytest.mark.slow  # ~2 min on 2 cores; the default suite's kill test (test_sweep's) covers one round
def test_driver_killed_between_rounds_and_inside_one_then_resumed(write_spec, tmp_path):
    path = _spec(write_spec, "rounds", seeds=75, trials_per_round=100, key="cells_per_round")  # 3 rounds of 100 cells
    results = tmp_path / "store" / "rounds" / "results"

    between = _drive(path, tmp_path, FREEZESWEEP_DRIVER_FAULT="kill-after-round@1")
    between.wait(timeout=600)
    assert between.returncode == -signal.SIGKILL, between.stderr.read()[-3000:]
    os.killpg(between.pid, signal.SIGKILL)  # its embedded Ray
    assert len(_rows(path)) == 100  # the first round whole, nothing of the second
    kept = rows_by_id(results)

    inside = _drive(path, tmp_path)
    deadline = time.time() + 600
    while time.time() < deadline and inside.poll() is None and count_rows(results) < 150:
        time.sleep(0.05)
    assert inside.poll() is None, inside.stderr.read()[-3000:]
    os.killpg(inside.pid, signal.SIGKILL)
    inside.wait()
    assert 150 <= len(_rows(path)) < 300

    done = subprocess.run(
        DRIVER + [str(path), "--out", str(tmp_path / "driver.json")], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(_rows(path)) == 300
    assert {tid: row for tid, row in rows_by_id(results).items() if tid in kept} == kept  # nothing stored was touched
    assert (
        yaml.safe_load((tmp_path / "store" / "rounds" / "spec.yaml").read_text())["resources"]["trials_per_round"]
        == 100
    )


class _FirstStart(Exception):
    """Ends the run once a trial has started: what came before it is all the test reads."""


@ray_sweeps
def test_many_trials_wait_for_a_place_at_once(write_spec, tmp_path, monkeypatch):
    """Tune is handed every cell of the round before the first trial starts, not one per started trial
    (its default for a custom Searcher): one at a time, a cluster fills one worker start-up at a time
    and short trials all run on the node that started first."""
    events: list[str] = []
    suggest = tune_adapter.CellSearcher.suggest

    def counted(self, trial_id):
        cell = suggest(self, trial_id)
        events.extend(["suggested"] if isinstance(cell, dict) else [])
        return cell

    def stop_if() -> None:
        if "started" in events:
            raise _FirstStart

    monkeypatch.setattr(tune_adapter.CellSearcher, "suggest", counted)
    monkeypatch.setattr(
        tune_adapter.OutcomeCallback,
        "on_trial_start",
        lambda self, iteration, trials, trial, **info: events.append("started"),
        raising=False,
    )
    monkeypatch.delenv("TUNE_MAX_PENDING_TRIALS_PG", raising=False)
    sweep = resolve_here(load_spec(_spec(write_spec, "pending", seeds=2, trials_per_round=100)))  # 8 cells
    cells = list(build_grid(sweep))
    RaySession(num_cpus=2).connect()
    with pytest.raises(_FirstStart):
        tune_adapter.run_tune(
            sweep,
            cells,
            ray_storage(ResultStore(sweep.spec.store, "pending"), cluster=False),
            lambda results, attempts: None,
            experiment="pending",
            stop_if=stop_if,
        )
    assert events[: events.index("started")].count("suggested") == len(cells)
