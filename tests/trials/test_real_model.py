"""Real pretrained MiniLM-L6 on real SST-2, offline: proof that pretrained weights are loaded."""

import json
import subprocess
import sys

import pytest

from tests.conftest import MINILM, needs_glue

pytestmark = [pytest.mark.slow, needs_glue]


def _trial(glue_dir, *extra):
    cmd = [
        sys.executable,
        "-m",
        "freezesweep.orchestrator.cli",
        "trial",
        "--model",
        MINILM,
        "--dataset",
        "glue/sst2",
        "--train-size",
        "200",
        "--frozen-layers",
        "0",
        "--seed",
        "0",
        "--data-dir",
        str(glue_dir),
        "--json",
        *extra,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_pretrained_minilm_beats_majority_clearly(glue_dir):
    result = _trial(glue_dir)
    assert result["status"] == "ok"
    assert result["majority_baseline"] == pytest.approx(0.509, abs=5e-4)
    assert result["best_val_accuracy"] >= 0.75
    # the reference schedule: every ceil(0.5 * 200 / 16) = 7 steps of 130, never forced at the end
    assert [p["step"] for p in result["eval_curve"]] == list(range(7, 127, 7))


def test_random_init_same_shape_stays_near_majority(glue_dir):
    result = _trial(glue_dir, "--model-init", "random")
    assert result["total_params"] == 22713986  # the same architecture as the pretrained one
    assert result["best_val_accuracy"] <= 0.62
