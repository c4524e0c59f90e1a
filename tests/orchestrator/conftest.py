from pathlib import Path

import pytest
import yaml


@pytest.fixture
def write_spec(tmp_path, tiny_bert, toy_dataset):
    """Write a tiny sweep spec (tiny model, toy data) with overrides; returns its path."""

    def write(name: str = "tiny", **overrides) -> Path:
        spec = {
            "name": name,
            "model": tiny_bert,
            "datasets": [toy_dataset],
            "train_sizes": [24, 48],
            "frozen_layers": [0, 2],
            "seeds": [0],
            "training": {"epochs": 2, "learning_rate": 0.003, "eval_batch_size": 32},
            "resources": {"cpus_per_trial": 1, "max_failures": 1},
            "store": str(tmp_path / "store"),
        }
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(spec.get(key), dict):
                spec[key] = {**spec[key], **value}
            else:
                spec[key] = value
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec))
        return path

    return write
