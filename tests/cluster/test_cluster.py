import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import jsonschema
import pandas as pd
import pytest
import yaml

from tests.conftest import REPO

CLUSTER = REPO / "cluster"


def test_aws_cluster_config_matches_rays_schema():
    schema = json.loads((resources.files("ray") / "autoscaler" / "ray-schema.json").read_text())
    config = yaml.safe_load((CLUSTER / "aws-gpu.yaml").read_text())
    jsonschema.validate(config, schema)
    assert config["available_node_types"]["gpu_worker"]["resources"]["GPU"] == 1
    assert all("RAY_AUTH_MODE=token" in c for c in config["head_start_ray_commands"] + config["worker_start_ray_commands"]
               if "ray start" in c)


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
