"""Datasets by name: GLUE tasks from local Parquet files or the Hugging Face hub, or any local file pair.

Names:
- ``glue/<task>`` (sst2, cola): ``<data_dir>/<task>/{train,validation}.parquet`` when that folder
  exists (``data_dir`` from the config or ``FREEZESWEEP_DATA_DIR``), else ``load_dataset("glue", task)``.
- a local folder holding ``train.<ext>`` and ``validation.<ext>`` with ext in parquet, csv, tsv,
  json, jsonl, or an explicit pair ``TRAIN_FILE,VALIDATION_FILE`` of such files;
  ``text_column``/``label_column`` name the columns (default ``sentence``/``label``).
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

DATA_DIR_ENV = "FREEZESWEEP_DATA_DIR"
CACHE_DIR_ENV = "FREEZESWEEP_CACHE_DIR"
GLUE_TASKS = {"sst2": "sentence", "cola": "sentence"}  # single-sentence binary tasks
SPLITS = ("train", "validation")
_EXTENSIONS = ("parquet", "csv", "tsv", "jsonl", "json")


class DatasetError(ValueError):
    pass


@dataclass(frozen=True)
class Split:
    name: str
    texts: tuple[str, ...]
    labels: np.ndarray  # int64, 0..num_labels-1

    @functools.cached_property
    def digest(self) -> str:
        """Content hash: the tokenization cache key must change when the rows change."""
        h = hashlib.sha256()
        for text in self.texts:
            h.update(text.encode())
            h.update(b"\0")
        h.update(self.labels.astype(np.int64).tobytes())
        return h.hexdigest()[:16]

    def __len__(self) -> int:
        return len(self.texts)


@dataclass(frozen=True)
class TaskData:
    dataset: str
    train: Split
    validation: Split
    num_labels: int

    @property
    def majority_baseline(self) -> float:
        """Accuracy of always predicting the most frequent validation label."""
        counts = np.bincount(self.validation.labels, minlength=self.num_labels)
        return float(counts.max() / counts.sum())


def resolve_data_dir(data_dir: str | None) -> Path | None:
    value = data_dir or os.environ.get(DATA_DIR_ENV)
    return Path(value).expanduser() if value else None


def resolve_cache_dir(cache_dir: str | None) -> Path:
    """Where token caches, spools and remote stores' local state live."""
    value = cache_dir or os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "freezesweep"
    return Path(value).expanduser()


def load_task(
    dataset: str,
    data_dir: str | None = None,
    text_column: str | None = None,
    label_column: str | None = None,
) -> TaskData:
    return _load_task(dataset, resolve_data_dir(data_dir), text_column or "sentence", label_column or "label")


@functools.lru_cache(maxsize=4)  # a reused Ray worker loads a dataset once, not once per trial
def _load_task(dataset: str, data_dir: Path | None, text_column: str, label_column: str) -> TaskData:
    frames = _load_frames(dataset, data_dir)
    missing = [
        f"{split} split has no column {col!r} (columns: {', '.join(map(str, df.columns))})"
        for split, df in frames.items()
        for col in (text_column, label_column)
        if col not in df.columns
    ]
    if missing:
        raise DatasetError(f"dataset {dataset!r}: " + "; ".join(missing))
    label_values = sorted(set(frames["train"][label_column]) | set(frames["validation"][label_column]))
    label_index = {value: i for i, value in enumerate(label_values)}
    splits = {
        name: Split(
            name=name,
            texts=tuple(str(t) for t in df[text_column]),
            labels=np.asarray([label_index[v] for v in df[label_column]], dtype=np.int64),
        )
        for name, df in frames.items()
    }
    return TaskData(dataset, splits["train"], splits["validation"], num_labels=len(label_values))


def _load_frames(dataset: str, data_dir: Path | None) -> dict[str, pd.DataFrame]:
    if dataset.startswith("glue/"):
        task = dataset.split("/", 1)[1]
        if task not in GLUE_TASKS:
            raise DatasetError(f"unknown GLUE task {task!r}; known: {', '.join(sorted(GLUE_TASKS))}")
        if data_dir is not None and (data_dir / task).is_dir():
            return {s: _read_file(_find_split_file(data_dir / task, s)) for s in SPLITS}
        return _load_from_hub(task)
    if "," in dataset:
        files = [Path(p.strip()).expanduser() for p in dataset.split(",")]
        missing = [str(f) for f in files if not f.is_file()]
        if len(files) != 2 or missing or any(f.suffix.lstrip(".") not in _EXTENSIONS for f in files):
            raise DatasetError(f"dataset {dataset!r}: expected TRAIN_FILE,VALIDATION_FILE, two existing "
                               f"{'/'.join(_EXTENSIONS)} files" + (f" (missing: {', '.join(missing)})" if missing else ""))
        return {s: _read_file(f) for s, f in zip(SPLITS, files)}
    folder = Path(dataset).expanduser()
    if folder.is_dir():
        return {s: _read_file(_find_split_file(folder, s)) for s in SPLITS}
    raise DatasetError(
        f"unknown dataset {dataset!r}: use glue/<task> ({', '.join(sorted(GLUE_TASKS))}) or a folder "
        f"holding train and validation files ({', '.join(_EXTENSIONS)})"
    )


def _find_split_file(folder: Path, split: str) -> Path:
    for ext in _EXTENSIONS:
        path = folder / f"{split}.{ext}"
        if path.is_file():
            return path
    raise DatasetError(f"no {split}.{{{','.join(_EXTENSIONS)}}} in {folder}")


def _read_file(path: Path) -> pd.DataFrame:
    suffix = path.suffix.lstrip(".")
    if suffix == "parquet":
        return pd.read_parquet(path)
    if suffix in ("csv", "tsv"):
        return pd.read_csv(path, sep="\t" if suffix == "tsv" else ",", keep_default_na=False)
    return pd.read_json(path, lines=suffix == "jsonl")


def _load_from_hub(task: str) -> dict[str, pd.DataFrame]:
    try:
        import datasets

        ds = datasets.load_dataset("glue", task)
    except Exception as exc:  # offline, hub down, ...: say where local files would be looked for
        raise DatasetError(
            f"glue/{task}: no local copy (set data_dir or {DATA_DIR_ENV} to a folder holding "
            f"{task}/train.parquet and {task}/validation.parquet) and the hub failed: {exc}"
        ) from exc
    return {s: ds[s].to_pandas() for s in SPLITS}


def split_sizes(dataset: str, data_dir: str | None = None, text_column: str | None = None,
                label_column: str | None = None) -> dict[str, int]:
    """Row counts per split, cheaply where Parquet metadata has them (spec validation uses it)."""
    data_path = resolve_data_dir(data_dir)
    if dataset.startswith("glue/") and data_path is not None:
        task_dir = data_path / dataset.split("/", 1)[1]
        files = {s: _find_split_file(task_dir, s) for s in SPLITS} if task_dir.is_dir() else {}
        if files and all(f.suffix == ".parquet" for f in files.values()):
            import pyarrow.parquet as pq

            return {s: pq.ParquetFile(f).metadata.num_rows for s, f in files.items()}
    task = load_task(dataset, data_dir, text_column, label_column)
    return {"train": len(task.train), "validation": len(task.validation)}
