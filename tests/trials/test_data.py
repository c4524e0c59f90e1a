import pytest

from tests.conftest import make_toy_dataset, needs_glue
from trials.data import DatasetError, load_task, split_sizes


@needs_glue
@pytest.mark.parametrize("dataset,rows,majority", [("glue/sst2", (67349, 872), 0.509), ("glue/cola", (8551, 1043), 0.691)])
def test_real_glue_from_local_parquet(dataset, rows, majority, glue_dir):
    task = load_task(dataset, str(glue_dir))
    assert (len(task.train), len(task.validation)) == rows
    assert task.num_labels == 2
    assert task.majority_baseline == pytest.approx(majority, abs=5e-4)
    assert split_sizes(dataset, str(glue_dir)) == {"train": rows[0], "validation": rows[1]}


@needs_glue
def test_data_dir_from_environment(glue_dir, monkeypatch):
    monkeypatch.setenv("FREEZESWEEP_DATA_DIR", str(glue_dir))
    assert len(load_task("glue/cola").validation) == 1043


def test_hub_fallback_is_tried_and_explained(monkeypatch, tmp_path):
    import datasets

    calls = []

    def offline(*args, **kwargs):
        calls.append(args)
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.delenv("FREEZESWEEP_DATA_DIR", raising=False)
    with pytest.raises(DatasetError, match="FREEZESWEEP_DATA_DIR"):
        load_task("glue/sst2", data_dir=str(tmp_path))  # a data dir without sst2/ → hub
    assert calls == [("glue", "sst2")]


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_local_file_pair_with_custom_columns(tmp_path, fmt):
    folder = make_toy_dataset(tmp_path / fmt, n_train=30, n_val=20, fmt=fmt, text_column="review", label_column="y")
    task = load_task(str(folder), text_column="review", label_column="y")
    assert (len(task.train), len(task.validation), task.num_labels) == (30, 20, 2)
    assert isinstance(task.train.texts[0], str)


def test_string_labels_are_mapped(tmp_path):
    import pandas as pd

    for split in ("train", "validation"):
        pd.DataFrame({"text": ["a", "b", "c"], "label": ["pos", "neg", "pos"]}).to_csv(tmp_path / f"{split}.csv", index=False)
    task = load_task(str(tmp_path), text_column="text")
    assert task.train.labels.tolist() == [1, 0, 1]
    assert task.majority_baseline == pytest.approx(2 / 3)


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(DatasetError, match="unknown dataset"):
        load_task("nope/nothing")
    with pytest.raises(DatasetError, match="unknown GLUE task"):
        load_task("glue/mnli-typo")
    folder = make_toy_dataset(tmp_path / "d", n_train=5, n_val=5)
    with pytest.raises(DatasetError, match="no column 'text'.*columns: sentence, label"):
        load_task(str(folder), text_column="text")


def test_explicit_file_pair_with_any_names(tmp_path):
    folder = make_toy_dataset(tmp_path / "d", n_train=30, n_val=20, fmt="parquet")
    (folder / "train.parquet").rename(tmp_path / "my-train.parquet")
    (folder / "validation.parquet").rename(tmp_path / "dev-set.parquet")
    task = load_task(f"{tmp_path / 'my-train.parquet'},{tmp_path / 'dev-set.parquet'}")
    assert (len(task.train), len(task.validation)) == (30, 20)
    with pytest.raises(DatasetError, match="missing: .*nope.csv"):
        load_task(f"{tmp_path / 'my-train.parquet'},{tmp_path / 'nope.csv'}")
