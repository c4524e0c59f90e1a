import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO

CLUSTER = REPO / "cluster"


def test_stop_ends_this_clusters_processes_only(tmp_path):
    """`stop` ends the processes that name this cluster's folder, never another Ray on the machine
    (stand-ins with Ray's process names: no Ray is started)."""
    folder = tmp_path / "ours"
    idle = "import signal; signal.pause()"  # a stand-in process: waits for the signal that ends it

    def stand_in(*args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", idle, *args])

    ours = [stand_in("raylet", f"--session_dir={folder}/session_1"), stand_in("gcs_server", f"--log_dir={folder}/session_1/logs"),
            stand_in("dashboard.py", f"--temp-dir={folder}/")]
    theirs = [stand_in("raylet", f"--session_dir={tmp_path}/ours2/session_1"),  # a folder whose name starts like ours
              stand_in("gcs_server", f"--log_dir={tmp_path}/theirs/session_1/logs")]
    try:
        env = {**os.environ, "RAY_CLUSTER_DIR": str(folder), "RAY_STOP_GRACE_S": "10"}
        done = subprocess.run([str(CLUSTER / "local-cluster.sh"), "stop"], env=env, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        assert [p.wait(timeout=30) for p in ours] == [-signal.SIGTERM] * 3  # ended, gracefully
        assert [p.poll() for p in theirs] == [None, None]  # another Ray on the machine keeps running
    finally:
        for p in ours + theirs:
            p.kill()
            p.wait()


@pytest.mark.cluster
def test_sweep_on_a_two_node_cluster_packs_trials_per_gpu(write_spec, tmp_path):
    """A head plus a node with 1 fake GPU: gpus_per_trial 0.5 runs two trials at a time there."""
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_PORT": "6391"}
    script = str(CLUSTER / "local-cluster.sh")
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env["PATH"]
    subprocess.run([script, "start", "1"], check=True, env=env, capture_output=True)
    try:
        path = write_spec("clustered", resources={"gpus_per_trial": 0.5, "cpus_per_trial": 1})
        done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "launch", str(path), "--address",
                               "127.0.0.1:6391"], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        subprocess.run([script, "stop"], env=env, capture_output=True)
    rows = pd.read_parquet(tmp_path / "store" / "clustered" / "results")
    assert len(rows) == 4 and (rows["status"] == "ok").all()
    # Two Ray nodes on one host: the trials ran on the GPU node, named by its node id (the host name
    # is the same for both nodes), two trials per (fake) GPU.
    assert rows["node_id"].notna().all() and rows["node_id"].nunique() == 1 and rows["hostname"].nunique() == 1
    assert (rows["gpus_per_trial"] == 0.5).all() and (rows["trials_per_gpu"] == 2).all()
