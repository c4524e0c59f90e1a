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

from orchestrator.checks import load_spec
from orchestrator.plan import build_grid
from orchestrator.sweeps import resolve_here
from tests.conftest import REPO, count_rows, rows_by_id

DRIVER = [sys.executable, str(REPO / "benchmarks" / "scale.py"), "--driver"]


def _spec(write_spec, name: str, seeds: int, cells_per_round: int) -> Path:
    """2 sizes × 2 depths × ``seeds``; instant trials, four at a time on 2 cores."""
    return write_spec(name, seeds=list(range(seeds)),
                      resources={"cpus_per_trial": 0.5, "max_failures": 0, "cells_per_round": cells_per_round})


def _rows(path: Path) -> pd.DataFrame:
    spec = load_spec(path, semantic=False)
    rows = pd.read_parquet(Path(spec.store) / spec.name / "results", columns=["trial_id", "status"])
    assert not rows["trial_id"].duplicated().any(), "a cell has two rows"
    assert set(rows["trial_id"]) <= {c.trial_id for c in build_grid(resolve_here(spec))}
    assert (rows["status"] == "ok").all()
    return rows


def _drive(path: Path, tmp_path: Path, **env) -> subprocess.Popen:
    return subprocess.Popen(DRIVER + [str(path), "--out", str(tmp_path / "driver.json")], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env})


@pytest.mark.slow
def test_five_thousand_cells_each_exactly_once(write_spec, tmp_path):
    path = _spec(write_spec, "five-thousand", seeds=1250, cells_per_round=2000)  # 3 rounds
    done = subprocess.run(DRIVER + [str(path), "--out", str(tmp_path / "driver.json")], capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(_rows(path)) == 5000


def test_driver_killed_between_rounds_and_inside_one_then_resumed(write_spec, tmp_path):
    path = _spec(write_spec, "rounds", seeds=150, cells_per_round=200)  # 600 cells, 3 rounds of 200
    results = tmp_path / "store" / "rounds" / "results"

    between = _drive(path, tmp_path, FREEZESWEEP_DRIVER_FAULT="kill-after-round@1")
    between.wait(timeout=600)
    assert between.returncode == -signal.SIGKILL, between.stderr.read()[-3000:]
    os.killpg(between.pid, signal.SIGKILL)  # its embedded Ray
    assert len(_rows(path)) == 200  # the first round whole, nothing of the second
    kept = rows_by_id(results)

    inside = _drive(path, tmp_path)
    deadline = time.time() + 600
    while time.time() < deadline and inside.poll() is None and count_rows(results) < 300:
        time.sleep(0.05)
    assert inside.poll() is None, inside.stderr.read()[-3000:]
    os.killpg(inside.pid, signal.SIGKILL)
    inside.wait()
    assert 300 <= len(_rows(path)) < 600

    done = subprocess.run(DRIVER + [str(path), "--out", str(tmp_path / "driver.json")], capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(_rows(path)) == 600
    assert {tid: row for tid, row in rows_by_id(results).items() if tid in kept} == kept  # nothing stored was touched
    assert yaml.safe_load((tmp_path / "store" / "rounds" / "spec.yaml").read_text())["resources"]["cells_per_round"] == 200
