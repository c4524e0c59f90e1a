"""Exactly once under faults: driver kills at five moments, dying trials, OOM, one writer."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds
import duckdb
import pytest

from freezesweep.orchestrator.plan import build_grid
from freezesweep.orchestrator.sweeps import resolve_here
from freezesweep.orchestrator.launch import launch
from freezesweep.orchestrator.checks import load_spec
from freezesweep.orchestrator.spec import SpecError
from tests.conftest import count_rows, ray_sweeps

CLI = [sys.executable, "-m", "freezesweep.orchestrator.cli"]


@pytest.fixture(scope="module", autouse=True)
def _ray_once():
    yield
    import ray

    ray.shutdown()


def _count(results: Path) -> int:
    return count_rows(results)


def _start(args, env=None) -> subprocess.Popen:
    return subprocess.Popen(
        CLI + args,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def _kill_when(proc: subprocess.Popen, ready, timeout_s: float = 240) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None and not ready():
        time.sleep(0.05)
    assert proc.poll() is None, f"the driver ended before the kill: {proc.stderr.read()[-2000:]}"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _check_store(spec_path) -> pd.DataFrame:
    spec = load_spec(spec_path, semantic=False)
    folder = Path(spec.store) / spec.name / "results"
    rows = pd.read_parquet(folder)
    assert not rows["trial_id"].duplicated().any(), "a cell has two rows"
    assert set(rows["trial_id"]) == {c.trial_id for c in build_grid(resolve_here(spec))}, "a cell is missing or foreign"
    assert (rows["status"] == "ok").all(), rows[["status", "error"]]
    # Every file is readable by each reader on its own, and nothing half-written is visible.
    assert ds.dataset(str(folder)).count_rows() == len(rows)
    assert duckdb.sql(f"SELECT count(*) FROM read_parquet('{folder}/*.parquet')").fetchall() == [(len(rows),)]
    return rows


@pytest.mark.slow  # a long end-to-end run: `make test-slow` (CI runs both suites)
def test_driver_killed_at_five_moments(write_spec, tmp_path):
    path = write_spec(
        "kills",
        train_sizes=[24, 48, 96],
        frozen_layers=[0, 1, 2],
        seeds=[0, 1],
        training={"epochs": 3},
        resources={"max_concurrent_trials": 1},
    )
    store = str(tmp_path / "store")
    results = tmp_path / "store" / "kills" / "results"
    total = 18
    log = []

    # 1. before the first trial ends
    driver = _start(["launch", str(path)])
    _kill_when(driver, lambda: (tmp_path / "store" / "kills" / "_ray").exists())
    log.append(("before first result", _count(results)))
    # 2. mid-sweep; while it runs, a second launch is refused by the lock
    driver = _start(["resume", "kills", "--store", store])
    _kill_when(driver, lambda: _count(results) >= 5)
    log.append(("mid-sweep", _count(results)))
    # 3. while a result is being written (half a file staged when the driver dies)
    driver = _start(["resume", "kills", "--store", store], env={"FREEZESWEEP_DRIVER_FAULT": "kill-in-write@2"})
    driver.wait(timeout=300)
    assert driver.returncode == -signal.SIGKILL
    try:
        os.killpg(driver.pid, signal.SIGKILL)  # its embedded Ray
    except ProcessLookupError:
        pass
    staged = list((tmp_path / "store" / "kills" / "_staging").glob("*"))
    assert staged, "the kill should leave a half-written staged file behind"
    log.append(("during a write", _count(results)))
    # 4. near the end
    driver = _start(["resume", "kills", "--store", store])
    _kill_when(driver, lambda: _count(results) >= total - 3)  # leaves room for kill 5 below
    log.append(("near the end", _count(results)))
    # 5. during a resume that has little left (one more cell runs, then the kill)
    before = _count(results)
    driver = _start(["resume", "kills", "--store", store])
    _kill_when(driver, lambda: _count(results) >= before + 1)
    log.append(("during a resume", _count(results)))

    done = subprocess.run(CLI + ["resume", "kills", "--store", store], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _check_store(path)
    assert len(rows) == total
    assert not list((tmp_path / "store" / "kills" / "_staging").glob("*")), "leftovers were not cleaned"
    counts = [n for _, n in log]
    assert counts == sorted(counts) and counts[0] < counts[-1] < total, log  # kills landed mid-sweep
    print("kills survived:", log)


@ray_sweeps
def test_second_launch_is_refused_while_running(write_spec, tmp_path):
    path = write_spec(
        "locked", train_sizes=[24, 48, 96], training={"epochs": 12}, resources={"max_concurrent_trials": 1}
    )
    lock = tmp_path / "store" / "locked" / "_lock.json"
    first = _start(["launch", str(path)])
    try:
        deadline = time.time() + 120
        while not lock.exists() and time.time() < deadline:
            time.sleep(0.05)
        # the first launch holds the lock (its record, whole) before the second one starts
        assert json.loads(lock.read_text())["pid"] == first.pid, "the first launch never took the lock"
        second = subprocess.run(CLI + ["launch", str(path)], capture_output=True, text=True, timeout=120)
        assert second.returncode == 2
        assert f"pid {first.pid} on host" in second.stderr and "already running" in second.stderr
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    # The holder died without releasing: its lock is stale and is taken over.
    assert lock.exists()
    summary = launch(load_spec(path), show_progress=False)
    assert summary.ok == summary.ran and not lock.exists()
    _check_store(path)


def test_trials_that_die_crash_or_run_out_of_memory_become_rows(write_spec, tmp_path, monkeypatch):
    """Failures inside a trial become rows with a status, through Tune, in one launch of the default suite
    (no retries: what Ray's retries do is the next test's, in `make test-slow`)."""
    monkeypatch.setenv("FREEZESWEEP_FAULT_DIR", str(tmp_path / "faults"))
    monkeypatch.setenv(
        "FREEZESWEEP_FAULT",
        "exit@1:train_size=24,frozen_layers=0;crash@1:train_size=48,frozen_layers=0;oom@1:train_size=48,frozen_layers=2",
    )
    import ray

    ray.shutdown()  # workers must start with the fault switch in their environment
    try:
        summary = launch(load_spec(write_spec("failing", resources={"max_failures": 0})), show_progress=False)
    finally:
        ray.shutdown()  # and the next test's without it
    assert (summary.ran, summary.ok, summary.failed) == (4, 1, 3)
    rows = pd.read_parquet(tmp_path / "store" / "failing" / "results").set_index(["train_size", "frozen_layers"])
    assert len(rows) == 4 and (rows["attempts"] == 1).all()
    assert rows.loc[(24, 2), "status"] == "ok"
    assert rows.loc[(24, 0), "status"] == "failed" and rows.loc[(24, 0), "error"]  # its process died
    assert rows.loc[(48, 0), "status"] == "failed" and "RuntimeError: injected crash" in rows.loc[(48, 0), "error"]
    assert rows.loc[(48, 2), "status"] == "oom" and "out of memory" in rows.loc[(48, 2), "error"]


@ray_sweeps
def test_dying_trials_are_retried_failing_ones_become_rows(write_spec, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("FREEZESWEEP_FAULT_DIR", str(tmp_path / "faults"))
    monkeypatch.setenv(
        "FREEZESWEEP_FAULT",
        ";".join(
            [
                "exit@1:train_size=24,frozen_layers=0*1",  # the process dies once, then the retry succeeds
                "crash@2:train_size=48,frozen_layers=0",  # raises on every attempt
                "oom@1:train_size=48,frozen_layers=2",  # CUDA out of memory (simulated)
            ]
        ),
    )
    import ray

    ray.shutdown()  # workers must start with the fault switch in their environment
    path = write_spec("faulty", resources={"max_failures": 2})
    summary = launch(load_spec(path), show_progress=False)
    assert (summary.ran, summary.ok, summary.failed) == (4, 2, 2)
    rows = pd.read_parquet(tmp_path / "store" / "faulty" / "results").set_index(["train_size", "frozen_layers"])
    assert len(rows) == 4
    retried = rows.loc[(24, 0)]
    assert retried["status"] == "ok" and retried["attempts"] == 2
    crashed = rows.loc[(48, 0)]
    assert crashed["status"] == "failed" and crashed["attempts"] == 3  # 1 try + max_failures retries
    assert "RuntimeError: injected crash" in crashed["error"] and "faults.py" in crashed["error"]
    oom = rows.loc[(48, 2)]
    assert oom["status"] == "oom" and oom["attempts"] == 1 and "out of memory" in oom["error"]
    assert rows.loc[(24, 2)]["status"] == "ok"
    # Ray's traceback per failed attempt is not printed: the cell's line says why, its row keeps the traceback
    assert not [r for r in caplog.records if r.getMessage().startswith("Trial task failed")]

    # resume retries the failed and oom cells (the fault is gone now), and only them
    monkeypatch.delenv("FREEZESWEEP_FAULT")
    ray.shutdown()
    again = launch(load_spec(path), show_progress=False)
    assert (again.ran, again.ok) == (2, 2)
    _check_store(path)


@ray_sweeps
def test_oom_while_sharing_a_gpu_is_retried_once_with_twice_the_share(write_spec, tmp_path, monkeypatch):
    """Four trials per (fake) GPU: one cell fits at half a GPU, one fits nowhere. Each is run once more
    at twice the share; one row per cell at the end, the retries' rows marked with the share they ran
    at. Fake GPUs: Ray schedules by the label, the trials run on the CPU."""
    import ray

    monkeypatch.setenv(
        "FREEZESWEEP_FAULT",
        ";".join(
            [
                "oom<0.5@1:train_size=48,frozen_layers=2",  # out of memory at 0.25 of a GPU, fits at 0.5
                "oom<1@1:train_size=24,frozen_layers=2",  # out of memory at 0.25 and at 0.5
            ]
        ),
    )
    from freezesweep.orchestrator.ray_session import RaySession

    ray.shutdown()  # workers must start with the fault switch in their environment, and a GPU to share
    fake_gpu = RaySession(num_cpus=2, num_gpus=1)
    try:
        path = write_spec("packed", resources={"gpus_per_trial": 0.25})
        summary = launch(load_spec(path, semantic=False), show_progress=False, session=fake_gpu)  # no real GPU here
        assert (summary.ran, summary.ok, summary.failed, summary.oom_retried) == (4, 3, 1, 2)
        rows = pd.read_parquet(tmp_path / "store" / "packed" / "results").set_index(["train_size", "frozen_layers"])
        assert len(rows) == 4 and rows["trial_id"].is_unique
        fits = rows.loc[(48, 2)]
        assert (fits["status"], fits["oom_retry"], fits["gpus_per_trial"], fits["trials_per_gpu"]) == (
            "ok",
            True,
            0.5,
            2,
        )
        never = rows.loc[(24, 2)]
        assert (never["status"], never["oom_retry"], never["gpus_per_trial"]) == ("oom", True, 0.5)
        assert "out of memory" in never["error"]
        first_pass = rows.loc[[(24, 0), (48, 0)]]
        assert (first_pass["status"] == "ok").all() and not first_pass["oom_retry"].any()
        assert (first_pass["gpus_per_trial"] == 0.25).all() and (first_pass["trials_per_gpu"] == 4).all()
        assert rows["node_id"].notna().all() and rows["gpu_uuid"].isna().all()  # placed; no real GPU used

        # gpus_per_trial auto measures one trial on a GPU the cluster holds: the Ray task gets a (fake)
        # GPU, finds no CUDA there, and the launch says so in one line before any trial runs.
        auto = write_spec("auto", resources={"gpus_per_trial": "auto"})
        with pytest.raises(
            SpecError,
            match="resources.gpus_per_trial: auto: measuring one trial on a GPU failed: "
            "PrecisionError: device 'cuda' requested but CUDA is not available",
        ):
            launch(load_spec(auto, semantic=False), show_progress=False, session=fake_gpu)
        assert not (tmp_path / "store" / "auto" / "results").exists()
    finally:
        ray.shutdown()


@ray_sweeps
def test_trial_killed_after_its_checkpoint_resumes_from_it(write_spec, tmp_path, monkeypatch):
    """checkpoint_every_epochs in a sweep: the process dies after the checkpoint at step 3; Ray's retry
    continues from it (Ray's copy: a retry may run on another node) and ends exactly where an
    uninterrupted run ends."""
    from freezesweep.trials.config import TrialConfig
    from freezesweep.trials.run import run_trial

    monkeypatch.setenv("FREEZESWEEP_FAULT_DIR", str(tmp_path / "faults"))
    # 48 rows, batch 16: 3 steps an epoch, 12 in all; evaluations at 2, 4, 6, …; checkpoints at 3, 6, 9.
    # The 3rd evaluation (step 6) comes before step 6's checkpoint, so the retry resumes from step 3.
    monkeypatch.setenv("FREEZESWEEP_FAULT", "exit@3*1")
    import ray

    ray.shutdown()  # workers must start with the fault switch in their environment
    path = write_spec(
        "ckpt",
        train_sizes=[48],
        frozen_layers=[0],
        training={"epochs": 4, "checkpoint_every_epochs": 1, "precision": "fp32"},
    )
    summary = launch(load_spec(path), show_progress=False)
    assert (summary.ran, summary.ok) == (1, 1)
    row = pd.read_parquet(tmp_path / "store" / "ckpt" / "results").iloc[0]
    assert row["status"] == "ok" and row["attempts"] == 2 and row["resumed_from_step"] == 3
    # The retry started from Ray's copy of the checkpoint, in the sweep's Ray storage; once the trial
    # was over the driver deleted it.
    trial_dir = tmp_path / "store" / "ckpt" / "_ray" / "ckpt" / row["trial_id"]
    assert trial_dir.is_dir() and not list(trial_dir.glob("checkpoint_*")), "a finished trial leaves no checkpoint"

    monkeypatch.delenv("FREEZESWEEP_FAULT")
    cell = TrialConfig.from_dict({**__import__("json").loads(row["config"]), "checkpoint_dir": None})
    uninterrupted = run_trial(cell)
    assert [p["step"] for p in row["eval_curve"]] == [2, 4, 6, 8, 10, 12]
    assert [(p["step"], p["accuracy"], p["loss"]) for p in row["eval_curve"]] == [
        (p.step, p.accuracy, p.loss) for p in uninterrupted.eval_curve
    ]


@pytest.mark.slow  # a long end-to-end run: `make test-slow` (CI runs both suites)
def test_driver_killed_mid_trial_resumes_the_trial_from_its_checkpoint(write_spec, tmp_path):
    """The driver (and its embedded Ray) dies while a trial hangs after its checkpoint at step 3: the
    next launch starts that cell from the checkpoint Ray kept in the sweep's storage, not from step 0,
    ends where an uninterrupted run ends, and leaves no checkpoint behind."""
    from freezesweep.trials.config import TrialConfig
    from freezesweep.trials.run import run_trial

    faults = tmp_path / "faults"
    # As above: evaluations at steps 2, 4, 6, …, checkpoints at 3, 6, 9; the hang comes at step 6's
    # evaluation, before step 6's checkpoint.
    path = write_spec(
        "orphan",
        train_sizes=[48],
        frozen_layers=[0],
        training={"epochs": 4, "checkpoint_every_epochs": 1, "precision": "fp32"},
    )
    driver = _start(["launch", str(path)], env={"FREEZESWEEP_FAULT": "hang@3*1", "FREEZESWEEP_FAULT_DIR": str(faults)})
    _kill_when(driver, lambda: faults.is_dir() and any(faults.iterdir()))
    done = subprocess.run(
        CLI + ["resume", "orphan", "--store", str(tmp_path / "store")], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    row = _check_store(path).iloc[0]
    assert row["attempts"] == 1 and row["resumed_from_step"] == 3
    ray_dir = tmp_path / "store" / "orphan" / "_ray" / "orphan" / row["trial_id"]
    assert ray_dir.is_dir() and not list(ray_dir.glob("checkpoint_*")), "the finished cell left a checkpoint"
    cell = TrialConfig.from_dict({**__import__("json").loads(row["config"]), "checkpoint_dir": None})
    assert [(p["step"], p["accuracy"], p["loss"]) for p in row["eval_curve"]] == [
        (p.step, p.accuracy, p.loss) for p in run_trial(cell).eval_curve
    ]
