"""A real sweep through Ray with all three methods: pretrained MiniLM-L6 on real SST-2, freeze, LoRA
(rank 8) and probe cells on the same subsets and seeds, landing in one store, and `summary` showing all three."""

import io
import os
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from tests.conftest import MINILM, needs_glue

pytestmark = [pytest.mark.slow, needs_glue]
CLI = [sys.executable, "-m", "freezesweep.orchestrator.cli"]


def test_freeze_lora_and_probe_cells_land_side_by_side(tmp_path, glue_dir):
    spec = {
        "name": "methods",
        "model": MINILM,
        "datasets": ["glue/sst2"],
        "train_sizes": [64],
        "methods": ["freeze", "lora", "probe"],
        "frozen_layers": ["all"],
        "lora_ranks": [8],
        "seeds": [0],
        "data_dir": str(glue_dir),
        "store": str(tmp_path / "store"),
        "training": {"epochs": 2, "max_eval_examples": 128},
        "resources": {"cpus_per_trial": 1},
    }
    path = tmp_path / "methods.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(CLI + ["launch", str(path)], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = pd.read_parquet(tmp_path / "store" / "methods" / "results").set_index("method")
    assert (rows["status"] == "ok").all() and sorted(rows.index) == ["freeze", "lora", "probe"]
    freeze, lora, probe = rows.loc["freeze"], rows.loc["lora"], rows.loc["probe"]
    assert freeze["frozen_layers"] == 6 and pd.isna(lora["frozen_layers"]) and pd.isna(probe["frozen_layers"])
    # MiniLM-L6: 6 layers × 4 projections × r (384 + 384), plus the pooler and the 2-class classifier
    head = 384 * 384 + 384 + 384 * 2 + 2
    assert lora["lora_rank"] == 8 and lora["trainable_params"] == 6 * 4 * 8 * 768 + head
    assert list(lora["lora_targets"])[0] == "attention.self.query"
    assert freeze["trainable_params"] == head  # every layer frozen: the head alone
    assert probe["probe_pooling"] == "mean" and probe["probe_c"] > 0 and probe["trainable_params"] == 384 + 1
    assert probe["best_val_accuracy"] > 0.6  # pretrained sentence embeddings separate SST-2 at n = 64
    assert len(set(rows["train_indices_digest"])) == 1  # the same subset for every method
    summary = subprocess.run(
        CLI + ["summary", "methods", "--store", str(tmp_path / "store"), "--format", "csv"],
        capture_output=True,
        text=True,
        env=env,
    )
    table = pd.read_csv(io.StringIO(summary.stdout))
    assert sorted(table["method"]) == ["freeze", "lora", "probe"] and "lora_rank" in table
