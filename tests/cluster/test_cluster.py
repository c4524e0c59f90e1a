"""Multi-node Ray on one machine (cluster/local-cluster.sh): token authentication, fake GPUs, a worker
that cannot see the driver's files, `ray job submit`, and a worker node killed mid-sweep.

One cluster for the module (starting Ray nodes is most of the cost): a head and w1 with one fake GPU
each, and `hidden`, a CPU-only worker in a mount namespace where an empty tmpfs lies over pytest's
temporary folders (the tiny model, the toy data, the store, the token caches) and the user's caches.
GPU sweeps therefore run on the head and w1 only; CPU sweeps reach `hidden` too."""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow.fs as pafs
import pytest

from freezesweep.orchestrator.plan import build_grid
from freezesweep.orchestrator.sweeps import resolve_here
from freezesweep.orchestrator.checks import load_spec
from freezesweep.results.store import ResultStore
from tests.conftest import FAKE_AWS, REPO, free_port

CLUSTER = REPO / "cluster"
SCRIPT = str(CLUSTER / "local-cluster.sh")
CLI = [sys.executable, "-m", "freezesweep.orchestrator.cli"]


def test_stop_ends_this_clusters_processes_only(tmp_path):
    """`stop` ends the processes that name this cluster's folder, what they started, and the head's
    client proxy (it names the port), never another Ray on the machine (stand-ins with Ray's process
    names: no Ray is started)."""
    folder = tmp_path / "ours"
    idle = "import signal; signal.pause()"  # a stand-in process: waits for the signal that ends it
    # A node process whose child renamed itself (as Ray's agents and workers do): no folder in its command line.
    parent = (
        "import signal, subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import signal; signal.pause()',"
        " 'ray::IDLE']); signal.pause()"
    )

    def stand_in(*args: str, code: str = idle) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", code, *args])

    ours = [
        stand_in("raylet", f"--session_dir={folder}/session_1"),
        stand_in("gcs_server", f"--log_dir={folder}/session_1/logs"),
        stand_in("dashboard.py", f"--temp-dir={folder}/"),
        stand_in("ray.util.client.server", "--address=10.0.0.1:6399", "--port=10001"),
        stand_in("raylet", f"--session_dir={folder}/w1/session_1", code=parent),
    ]
    theirs = [
        stand_in("raylet", f"--session_dir={tmp_path}/ours2/session_1"),  # a folder whose name starts like ours
        stand_in("gcs_server", f"--log_dir={tmp_path}/theirs/session_1/logs"),
        stand_in("ray.util.client.server", "--address=10.0.0.1:63990", "--port=10001"),
    ]
    child = _children(ours[-1].pid)
    try:
        env = {**os.environ, "RAY_CLUSTER_DIR": str(folder), "RAY_PORT": "6399", "RAY_STOP_GRACE_S": "10"}
        done = subprocess.run([SCRIPT, "stop"], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert [p.wait(timeout=30) for p in ours] == [-signal.SIGTERM] * 5  # ended, gracefully
        assert not _alive(child), "a process the node started outlived it"
        assert [p.poll() for p in theirs] == [None, None, None]  # another Ray on the machine keeps running
    finally:
        for p in ours + theirs:
            p.kill()
            p.wait()
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_kill_worker_ends_that_node_at_once(tmp_path):
    """`kill-worker NAME`: SIGKILL for that worker's processes and what they started (a machine that
    vanishes says goodbye to no one); the head and the other workers keep running."""
    folder = tmp_path / "ours"
    parent = (
        "import signal, subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import signal; signal.pause()',"
        " 'ray::ImplicitFunc']); signal.pause()"
    )
    victim = subprocess.Popen([sys.executable, "-c", parent, "raylet", f"--session_dir={folder}/w1/session_1"])
    others = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import signal; signal.pause()",
                "raylet",
                f"--session_dir={folder}/{node}/session_1",
            ]
        )
        for node in ("w10", "session_1")
    ]
    child = _children(victim.pid)
    try:
        env = {**os.environ, "RAY_CLUSTER_DIR": str(folder)}
        done = subprocess.run([SCRIPT, "kill-worker", "w1"], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert victim.wait(timeout=30) == -signal.SIGKILL
        assert _ends(child) and [p.poll() for p in others] == [None, None]
        missing = subprocess.run([SCRIPT, "kill-worker", "w2"], env=env, capture_output=True, text=True, timeout=60)
        assert missing.returncode == 1 and "no worker node w2" in missing.stderr
    finally:
        for p in [victim, *others]:
            p.kill()
            p.wait()
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def _children(pid: int, timeout_s: float = 30) -> int:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        if kids:
            return int(kids[0])
        time.sleep(0.05)
    raise AssertionError(f"process {pid} started no child")


def _ends(pid: int, timeout_s: float = 30) -> bool:
    """The process is gone within the timeout (a signal is delivered a moment after kill returns)."""
    deadline = time.time() + timeout_s
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def _alive(pid: int) -> bool:
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
    return bool(state) and not state.startswith("Z")


# --- one cluster for the tests below -------------------------------------------------------------------
def _can_hide() -> bool:
    """A private mount namespace (root, or CAP_SYS_ADMIN) for the worker that must not see our files."""
    return subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0


@dataclass
class Cluster:
    env: dict
    port: int
    dashboard: int
    hidden: list[str] = field(default_factory=list)  # what the `hidden` worker cannot see ([]: no such worker)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def script(self, *args: str, **env: str) -> None:
        done = subprocess.run([SCRIPT, *args], env={**self.env, **env}, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"local-cluster.sh {' '.join(args)}: {done.stdout[-2000:]}{done.stderr[-3000:]}"

    def node_ids(self, *names: str, timeout_s: float = 120) -> dict[str, str]:
        """Ray's node id of each named node, once every one of them is alive (polled: a node that
        `ray start` just started registers with the head a moment later)."""
        deadline = time.time() + timeout_s
        while True:
            listed = subprocess.run(
                [
                    "ray",
                    "list",
                    "nodes",
                    "--address",
                    f"http://127.0.0.1:{self.dashboard}",
                    "--format",
                    "json",
                    "--limit",
                    "100",
                ],
                env=self.env,
                capture_output=True,
                text=True,
            )
            nodes = json.loads(listed.stdout) if listed.returncode == 0 else []
            alive = {n["node_name"]: n["node_id"] for n in nodes if n.get("state") == "ALIVE"}
            if all(name in alive for name in names):
                return {name: alive[name] for name in names}
            assert time.time() < deadline, f"nodes {names} not all alive: {alive} {listed.stderr[-2000:]}"
            time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    port, dashboard = free_port(), free_port()
    folder = tempfile.mkdtemp(prefix="fs-ray-")  # short: Ray's socket paths below it must fit in 107 bytes
    env = {
        **os.environ,
        **FAKE_AWS,
        "RAY_AUTH_MODE": "token",
        "RAY_PORT": str(port),
        "RAY_DASHBOARD_PORT": str(dashboard),
        "RAY_CLUSTER_DIR": folder,
        "RAY_HEAD_CPUS": "1",
        "RAY_HEAD_GPUS": "1",
        "RAY_WORKER_CPUS": "1",
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"],
        # every node (and a job's driver, which gets the head's environment) keeps its caches here
        "FREEZESWEEP_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "cache"),
    }
    env.pop("RAY_ADDRESS", None)
    basetemp = tmp_path_factory.getbasetemp()
    hidden = [
        str(basetemp),
        *(
            p
            for p in (os.path.expanduser("~/.cache"), os.environ.get("FREEZESWEEP_DATA_DIR"), os.environ.get("HF_HOME"))
            if p and os.path.isdir(p)
        ),
    ]
    cluster = Cluster(env, port, dashboard, hidden=hidden if _can_hide() else [])
    try:
        cluster.script("start", "1", "1")  # the head and w1, one fake GPU each
        if cluster.hidden:
            # 2 CPUs, the only node with 2: a trial that asks for 2 runs there and nowhere else
            cluster.script("add-worker", "hidden", "0", RAY_HIDE=":".join(cluster.hidden), RAY_WORKER_CPUS="2")
        cluster.node_ids("head", "w1", *(["hidden"] if cluster.hidden else []))
        yield cluster
    finally:
        subprocess.run([SCRIPT, "stop"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


def _rows(spec_path: Path) -> pd.DataFrame:
    """The sweep's rows, checked: exactly one per cell of its grid, every one ok."""
    spec = load_spec(spec_path, semantic=False)
    rows = ResultStore(spec.store, spec.name).read()
    assert not rows["trial_id"].duplicated().any(), "a cell has two rows"
    assert set(rows["trial_id"]) == {c.trial_id for c in build_grid(resolve_here(spec))}, "a cell is missing or foreign"
    assert (rows["status"] == "ok").all(), rows[["status", "error"]]
    return rows


@pytest.mark.cluster
def test_sweep_submitted_as_a_ray_job_spreads_over_nodes(cluster, write_spec, tmp_path):
    """`ray job submit` (token authentication, through the head's dashboard) runs the driver on the
    head; half a fake GPU per trial packs two trials on each GPU node, and the rows name both.

    Three trials meet at their first evaluation (a fault rule, forwarded by the driver): three at
    once need both nodes. (Without it, 4 quick cells once all ran on one node, two after two.)"""
    # single trials: on GPU nodes the 4 cells would otherwise pool into one trial array, one Ray trial
    path = write_spec(
        "jobbed", resources={"gpus_per_trial": 0.5, "cpus_per_trial": 0.5}, training={"trial_array": False}
    )
    meet = {"env_vars": {"FREEZESWEEP_FAULT": "meet3@1", "FREEZESWEEP_FAULT_DIR": str(tmp_path / "faults")}}
    address = f"http://127.0.0.1:{cluster.dashboard}"
    done = subprocess.run(
        [
            "ray",
            "job",
            "submit",
            "--address",
            address,
            "--runtime-env-json",
            json.dumps(meet),
            "--",
            *CLI,
            "launch",
            str(path),
        ],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = _rows(path)
    nodes = cluster.node_ids("head", "w1")
    assert set(rows["node_id"]) == {nodes["head"], nodes["w1"]}  # ids tell two nodes of one host apart
    assert rows["hostname"].nunique() == 1
    assert (rows["gpus_per_trial"] == 0.5).all() and (rows["trials_per_gpu"] == 2).all()


@pytest.mark.cluster
def test_worker_that_cannot_see_the_drivers_files_runs_trials(cluster, write_spec):
    if not cluster.hidden:
        pytest.skip("no private mount namespace here (unshare --mount needs root or CAP_SYS_ADMIN)")
    # Each trial asks for 2 CPUs, which only `hidden` has: every cell must run there, whatever order the
    # scheduler picks. (With 1 CPU a trial, enough cells to outlast its worker's start-up was a guess:
    # 4 two-epoch cells once all ran on one node, and so did 12 four-epoch ones in CI on 2 busy cores.)
    path = write_spec("unseen", resources={"gpus_per_trial": 0, "cpus_per_trial": 2})
    done = subprocess.run(
        [*CLI, "launch", str(path), "--address", cluster.address],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = _rows(path)
    assert set(rows["node_id"]) == {cluster.node_ids("hidden")["hidden"]}, (
        f"a trial ended on a node that sees our files:\n{rows[['node_id', 'attempts']]}"
    )


@pytest.mark.cluster
def test_worker_node_killed_mid_sweep_loses_and_duplicates_no_cell(cluster, write_spec, tmp_path, s3):
    """A third GPU node, `victim`, whose trials hang after their second evaluation (its environment
    alone holds the fault), is killed once one of them hangs there: that trial is run again on another
    node, `rescue`, from its last checkpoint, which Ray kept in the S3 store's _ray folder; the sweep
    ends with every cell exactly once.

    The trials ask for 3 CPUs, which only `victim` has (the head and w1 have 1, `hidden` 2 and no GPU),
    so the first trial runs there whatever order the scheduler picks (with 1 CPU a trial, fast trials
    could all end on the head and w1 before any reached `victim`); `rescue`, with 3 CPUs, joins after
    the kill."""
    faults = tmp_path / "faults"
    cluster.script(
        "add-worker",
        "victim",
        "1",
        RAY_WORKER_CPUS="3",
        FREEZESWEEP_FAULT="hang@2*1",
        FREEZESWEEP_FAULT_DIR=str(faults),
    )
    victim = cluster.node_ids("victim")["victim"]
    # 2 or 3 steps an epoch: an evaluation and then a checkpoint after each epoch; the hang comes at
    # the second evaluation, before the second checkpoint.
    path = write_spec(
        "preempted",
        store=s3.uri,
        training={"epochs": 3, "eval_every_epochs": 1, "checkpoint_every_epochs": 1},
        resources={"gpus_per_trial": 1, "cpus_per_trial": 3, "max_failures": 2},
    )
    log = tmp_path / "driver.log"  # a file, not a pipe: nobody reads while the test waits
    with open(log, "w") as out:
        driver = subprocess.Popen(
            [*CLI, "launch", str(path), "--address", cluster.address],
            env=cluster.env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        hung = _first_hang(faults, driver, log)
        cluster.script("kill-worker", "victim")
        cluster.script("add-worker", "rescue", "1", RAY_WORKER_CPUS="3")
        rescue = cluster.node_ids("rescue")["rescue"]
        driver.wait(timeout=600)
    finally:
        driver.kill()
        # The module's other tests see the head, w1 and hidden only (no rescue node yet: nothing to end).
        subprocess.run([SCRIPT, "kill-worker", "rescue"], env=cluster.env, capture_output=True, timeout=300)
    assert driver.returncode == 0, log.read_text()[-5000:]
    rows = _rows(path).set_index("trial_id")
    assert victim not in set(rows["node_id"])  # its one trial never finished there
    assert set(rows["node_id"]) == {rescue}  # the others waited for a node with 3 CPUs
    again = rows.loc[hung]
    assert again["attempts"] == 2 and again["resumed_from_step"] == math.ceil(again["train_size"] / 16)  # epoch 1
    assert (rows.drop(index=hung)["attempts"] == 1).all()
    store = ResultStore(s3.uri, "preempted")
    ray_files = [i.path for i in store.fs.get_file_info(pafs.FileSelector(f"{store.sweep_dir}/_ray", recursive=True))]
    assert any(f"/_ray/preempted/{hung}" in p for p in ray_files)  # Ray's state and checkpoints: in the store
    assert not [p for p in ray_files if "/checkpoint_" in p], "a finished trial left its checkpoint"


def _first_hang(faults: Path, driver: subprocess.Popen, log: Path, timeout_s: float = 300) -> str:
    """The trial id of the first trial the fault stopped (its marker file is written as it fires)."""
    deadline = time.time() + timeout_s
    while not (faults.is_dir() and any(faults.iterdir())):
        assert driver.poll() is None, f"the sweep ended before any trial hung: {log.read_text()[-3000:]}"
        assert time.time() < deadline, "no trial hung on the victim node"
        time.sleep(0.1)
    return next(faults.iterdir()).name.rsplit("-", 1)[0]
