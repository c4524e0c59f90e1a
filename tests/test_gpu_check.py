"""The prepared GPU check (benchmarks/gpu_check.sh, issue 35.7) cannot rot: its plan fits one short
device run, and its smoke mode (a tiny model, a few cells, on the CPU) runs every part end to end."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "benchmarks" / "gpu_check.sh"
DEVICE_RUN_S = 360  # the bound on the whole check: 6 minutes
KILL_AFTER_S = 10  # `timeout --kill-after`: what a part that ignores SIGTERM may add
MAX_FILES = 8  # what the device tool brings back from $OUT


def _plan(**env) -> tuple[dict[str, int], list[str]]:
    done = subprocess.run(
        ["bash", str(SCRIPT), "plan"], capture_output=True, text=True, check=True, env={**os.environ, **env}
    )
    rows = [line.split() for line in done.stdout.splitlines()]
    return {row[0]: int(row[1]) for row in rows if row[0] != "files"}, next(r[1:] for r in rows if r[0] == "files")


def test_the_check_fits_one_short_device_run():
    """Every part bounded, and the bounds together (each with its kill grace) under six minutes with
    room for the machine's own start of the run; no more files than the device tool brings back."""
    limits, files = _plan(GPU_CHECK_SMOKE="")
    assert list(limits) == ["tests", "profile", "grid", "arrays"]
    assert sum(limits.values()) + KILL_AFTER_S * len(limits) <= DEVICE_RUN_S + 30
    assert sum(limits.values()) <= DEVICE_RUN_S - 10
    assert len(files) <= MAX_FILES and len(set(files)) == len(files)
    assert {f"{part}.log" for part in limits} <= set(files)
    text = SCRIPT.read_text()
    assert "timeout --kill-after" in text and '--steps "$STEPS"' in text and "STEPS=30" in text


@pytest.mark.slow
@pytest.mark.timeout(1800)  # each part is capped at 400 s by the script itself (a busy CPU)
def test_the_smoke_mode_runs_every_part(tmp_path):
    """GPU_CHECK_SMOKE=1: prepare (a toy task where no GLUE files are at hand) and every part of `all`
    on the CPU, its CUDA graphs recorded and replayed there (a rehearsal); it says whether MPS was on, each
    part ends on its own, the step profile finds no host sync in the step, the grid writes its rows, and
    only the planned files are written."""
    out, carry = tmp_path / "out", tmp_path / "carry"
    out.mkdir()
    env = {
        **os.environ,
        "GPU_CHECK_SMOKE": "1",
        "GPU_CHECK_CARRY": str(carry),
        "OUT": str(out),
        "PYTHON": sys.executable,
        "FREEZESWEEP_DATA_DIR": str(tmp_path / "no-glue-here"),
    }
    subprocess.run(["bash", str(SCRIPT), "prepare"], env=env, check=True, capture_output=True, cwd=REPO)
    done = subprocess.run(["bash", str(SCRIPT), "all"], env=env, capture_output=True, text=True, cwd=REPO)
    summary = (out / "check.log").read_text()
    assert done.returncode == 0, done.stderr[-2000:]
    for part in ("tests", "profile", "grid", "arrays"):
        assert f"== {part}: exit 0" in summary, summary[-3000:]
    assert "CUDA MPS: not started" in summary  # the check says where its trials ran without MPS (a CPU)
    profile = json.loads((out / "profile.json").read_text())["per_step"]
    assert "single trial" in profile  # (CUDA graphs step aside on a CPU: their row is the GPU run's)
    assert profile["single trial"]["syncs"] == 0 and profile["single trial"]["wall_ms"] > 0
    assert "array of 2, CUDA graphs" in profile  # the GPU run's row name; its footnote reads the width
    log = (out / "profile.log").read_text()
    assert "array of 2, CUDA graphs: " in log and "single trial: the most CPU ms a step: aten::" in log
    assert all(ms > 0 for _, ms in profile["single trial"]["top_kernels"])  # where the step's time goes
    grid = json.loads((out / "grid.json").read_text())
    assert len(grid["freezesweep"]["cells"]) == 2  # glue/sst2, n = 50, k in {0, 2}
    # a rehearsal: the grid parts' CUDA graphs ran, recorded on the CPU (their units' lines say what ran)
    for part in ("grid", "arrays"):
        assert "cuda_graphs" in (text := (out / f"{part}.log").read_text()) and "eval_graphs" in text, text[-2000:]
    _, planned = _plan(GPU_CHECK_SMOKE="1")
    assert {p.name for p in out.iterdir()} <= set(planned)
    # the reference part, a device call of its own: its grid's seeds as trial arrays
    (apart := tmp_path / "reference").mkdir()
    done = subprocess.run(
        ["bash", str(SCRIPT), "reference"], env={**env, "OUT": str(apart)}, capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 0, done.stdout[-2000:]
    reference = json.loads((apart / "reference.json").read_text())["freezesweep+trial arrays"]
    assert len(reference["cells"]) == 4 and "4 of 4 rows ran in trial arrays" in done.stdout  # 2 seeds x k in {0, 2}
    # the slots part, another: the two seeds' arrays of 2 pooled into one array of slots
    (apart := tmp_path / "slots").mkdir()
    done = subprocess.run(
        ["bash", str(SCRIPT), "slots"], env={**env, "OUT": str(apart)}, capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 0, done.stdout[-2000:]
    assert "glue/sst2 n=50 k=0,2,0,2 in" in done.stdout and "4 of 4 rows ran in trial arrays" in done.stdout
    assert "cuda_graphs" in done.stdout and "eval_graphs" in done.stdout  # the slots' graphs, recorded


def _refused(carry_mode: str | None, smoke: str, tmp_path, part: str = "all") -> subprocess.CompletedProcess:
    carry = tmp_path / "carry"
    (carry / "glue").mkdir(parents=True)
    if carry_mode:
        (carry / "mode").write_text(carry_mode + "\n")
    env = {**os.environ, "GPU_CHECK_SMOKE": smoke, "GPU_CHECK_CARRY": str(carry), "OUT": str(tmp_path)}
    return subprocess.run(["bash", str(SCRIPT), part], env=env, capture_output=True, text=True, cwd=REPO)


@pytest.mark.parametrize(("made", "smoke"), [("gpu", "1"), ("smoke", "")])
def test_a_carry_of_the_other_mode_is_refused(tmp_path, made, smoke):
    """A smoke run on a GPU carry (BERT-base: minutes, not seconds) or the reverse: one line saying
    to prepare in this mode, before anything runs."""
    done = _refused(made, smoke, tmp_path)
    assert done.returncode == 2
    assert f"prepared for the {made} mode" in done.stderr and "gpu_check.sh prepare" in done.stderr
    assert not (tmp_path / "check.log").exists()


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a machine with nvidia-smi may have a GPU")
@pytest.mark.parametrize("part", ["all", "tests", "grid"])
def test_no_gpu_says_so_and_fails(tmp_path, part):
    done = _refused("gpu", "", tmp_path, part)
    assert done.returncode == 2
    assert "no GPU here" in done.stderr and "GPU_CHECK_SMOKE=1" in done.stderr
