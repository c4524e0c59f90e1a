"""A sweep mixing model families through Ray (issue 28): a tiny DeBERTa-v2, a tiny Qwen2 and the real
MiniLM, frozen_layers -1, 0, 2 and all, runs to the end with no failed row."""

from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import MINILM
from tests.families import FAMILIES, save_family
from freezesweep.orchestrator.checks import load_spec
from freezesweep.orchestrator.launch import launch


@pytest.fixture(scope="module", autouse=True)
def _ray_once():
    yield
    import ray

    ray.shutdown()


@pytest.mark.slow
def test_a_sweep_of_deberta_qwen2_and_minilm_has_no_failed_row(write_spec, tmp_path, minilm_tokenizer):
    deberta = save_family(tmp_path / "deberta", FAMILIES["deberta-v2"], minilm_tokenizer)
    qwen2 = save_family(tmp_path / "qwen2", FAMILIES["qwen2"], minilm_tokenizer)
    spec = load_spec(
        write_spec(
            "families",
            model=[deberta, qwen2, MINILM],
            frozen_layers=[-1, 0, 2, "all"],
            train_sizes=[24],
            training={"epochs": 1, "max_seq_length": 32},
        )
    )
    summary = launch(spec, show_progress=False)
    assert (summary.total, summary.ok) == (12, 12)
    rows = pd.read_parquet(Path(spec.store) / "families" / "results")
    assert len(rows) == 12 and (rows["status"] == "ok").all(), rows[["model", "frozen_layers", "status", "error"]]
    deep = rows[rows["frozen_layers"] >= 2]  # every frozen layer's evaluation cached, each family's own check passed
    assert all("eval_cache" in list(used) for used in deep["optimisations"]), deep[["model", "optimisations"]]
