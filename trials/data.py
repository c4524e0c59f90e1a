"""Datasets by name: GLUE tasks from local Parquet files or the Hugging Face hub, or any local file pair.

Names:
- ``glue/<task>`` (sst2, cola, rte, mrpc, stsb, qnli, mnli, qqp): ``<data_dir>/<task>/{train,validation}.parquet``
  when a data dir is named (``data_dir`` from the config or ``FREEZESWEEP_DATA_DIR``), else
  ``load_dataset("glue", task)`` (MNLI: its matched validation split). A named data dir without the
  task is an error naming the folder, never a reason to go to the hub: the rows would come from
  other data under the same trial_id. Each task knows its text columns, its shape and its official
  metrics (``GLUE_TASKS``).
- a local folder holding ``train.<ext>`` and ``validation.<ext>`` with ext in parquet, csv, tsv,
  json, jsonl, or an explicit pair ``TRAIN_FILE,VALIDATION_FILE`` of such files;
  ``text_column``/``text_pair_column``/``label_column`` name the columns (default ``sentence``/none/
  ``label``). A local file whose train labels are floats is a regression task (one output, MSE);
  any other label is a class (string labels are mapped to ids in sorted order).
"""

from __future__ import annotations

import dataclasses
import csv
import functools
import glob
import hashlib
import os
import unicodedata
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from freezesweep.trials import hub
from freezesweep.trials.metrics import REGRESSION_METRICS, compute_metrics, describe_shape, task_metrics
from freezesweep.trials.worker import WorkerState, process_worker

DATA_DIR_ENV = "FREEZESWEEP_DATA_DIR"
CACHE_DIR_ENV = "FREEZESWEEP_CACHE_DIR"
SPLITS = ("train", "validation")
_EXTENSIONS = ("parquet", "csv", "tsv", "jsonl", "json")


@dataclass(frozen=True)
class GlueTask:
    text_column: str
    text_pair_column: str | None  # None: a single-sentence task
    num_labels: int  # 1: regression
    official_metrics: tuple[str, ...]  # GLUE's; the first picks the best evaluation unless the spec says otherwise
    validation_split: str = "validation"  # the hub's name of it


GLUE_TASKS = {
    "sst2": GlueTask("sentence", None, 2, ("accuracy",)),
    "cola": GlueTask("sentence", None, 2, ("matthews",)),
    "rte": GlueTask("sentence1", "sentence2", 2, ("accuracy",)),
    "mrpc": GlueTask("sentence1", "sentence2", 2, ("f1", "accuracy")),
    "stsb": GlueTask("sentence1", "sentence2", 1, REGRESSION_METRICS),
    "qnli": GlueTask("question", "sentence", 2, ("accuracy",)),
    "mnli": GlueTask("premise", "hypothesis", 3, ("accuracy",), "validation_matched"),
    "qqp": GlueTask("question1", "question2", 2, ("f1", "accuracy")),
}


GLUE_PAIR_TASKS = frozenset(name for name, task in GLUE_TASKS.items() if task.text_pair_column)


class DatasetError(ValueError):
    """``problems``: each problem on its own, where there are several (spec validation lists them);
    ``rows``: each split's rows where the files were read, ``classes``: train rows per class where the
    labels were (so the train sizes are checked beside the data's problems, not after their fix)."""

    def __init__(
        self,
        message: str,
        problems: list[str] | None = None,
        rows: dict[str, int] | None = None,
        classes: dict[str, int] | None = None,
    ):
        super().__init__(message)
        self.problems = problems or []
        self.rows = rows
        self.classes = classes


@dataclass(frozen=True)
class Columns:
    text: str
    pair: str | None
    label: str

    def named(self) -> dict[str, str]:
        """role → column, for the columns in use (errors name the spec key to change)."""
        roles = {"text_column": self.text, "text_pair_column": self.pair, "label_column": self.label}
        return {role: column for role, column in roles.items() if column}


@dataclass(frozen=True)
class Split:
    name: str
    texts: tuple[str, ...]
    labels: np.ndarray  # int64 class ids 0..num_labels-1, or float32 scores (regression)
    pairs: tuple[str, ...] | None = None  # each row's second text (sentence-pair tasks)

    @functools.cached_property
    def digest(self) -> str:
        """Content hash: the tokenization cache key must change when the rows change."""
        h = hashlib.sha256()
        for text in self.texts:
            h.update(text.encode())
            h.update(b"\0")
        for text in self.pairs or ():  # absent for single sentences: their digests are as before
            h.update(text.encode())
            h.update(b"\1")
        if self.labels.dtype.kind == "f":
            h.update(self.labels.astype(np.float64).tobytes())
        else:
            h.update(self.labels.astype(np.int64).tobytes())
        return h.hexdigest()[:16]

    def __len__(self) -> int:
        return len(self.texts)


@dataclass(frozen=True)
class TaskData:
    dataset: str
    train: Split
    validation: Split
    num_labels: int  # the model's outputs: 1 for regression
    regression: bool = False
    official_metrics: tuple[str, ...] = ("accuracy",)
    dropped: dict[str, int] = dataclasses.field(default_factory=dict)  # rows dropped per split (empty texts)
    label_names: tuple[str, ...] = ()  # class id -> the label as the files spell it (empty for regression)
    notes: tuple[str, ...] = ()  # what the user should hear of how the files were read (``_label_note``)

    @property
    def metrics(self) -> tuple[str, ...]:
        return task_metrics(self.regression, self.num_labels)

    def class_counts(self) -> dict[str, int]:
        """Train rows per class, by the label's own spelling (empty for regression)."""
        if self.regression:
            return {}
        counts = np.bincount(self.train.labels, minlength=self.num_labels)
        names = self.label_names or tuple(map(str, range(self.num_labels)))
        return {name: int(n) for name, n in zip(names, counts)}

    def baseline_metrics(self, rows: np.ndarray | None = None) -> dict[str, float]:
        """Every metric of a constant prediction on the validation rows ``rows`` (default: all of them),
        which must be the rows the scores it is compared with are computed on: the majority class of those
        rows (the majority baseline) for classification; the train labels' mean for regression (its
        correlations are 0.0 on any rows, see trials/metrics.py). On a sample (max_eval_examples) the
        sample's majority share, not the split's: 130 of SST-2's 256 sampled rows (0.5078) against 444 of
        its 872 (0.5092), where a model answering one class scores the former."""
        labels = self.validation.labels if rows is None else self.validation.labels[rows]
        if self.regression:
            constant = float(self.train.labels.astype(np.float64).mean())
        else:
            constant = int(np.argmax(np.bincount(labels, minlength=self.num_labels)))
        return compute_metrics(np.full(len(labels), constant), labels, self.regression, self.num_labels)


@dataclass(frozen=True)
class TaskShape:
    """What spec validation needs to know of a dataset, read as cheaply as its files allow."""

    rows: dict[str, int]
    regression: bool
    num_labels: int
    official_metrics: tuple[str, ...]
    dropped: dict[str, int] = dataclasses.field(default_factory=dict)  # rows dropped per split (empty texts)
    class_counts: dict[str, int] = dataclasses.field(default_factory=dict)  # train rows per class (classification)
    notes: tuple[str, ...] = ()  # what the user should hear of how the files were read (``TaskData.notes``)

    @property
    def metrics(self) -> tuple[str, ...]:
        return task_metrics(self.regression, self.num_labels)


def resolve_data_dir(data_dir: str | None) -> Path | None:
    value = data_dir or os.environ.get(DATA_DIR_ENV)
    return Path(value).expanduser() if value else None


def resolve_cache_dir(cache_dir: str | None) -> Path:
    """Where token caches, spools and remote stores' local state live."""
    value = cache_dir or os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "freezesweep"
    return Path(value).expanduser()


def glue_task(dataset: str) -> GlueTask | None:
    """The GLUE task a ``glue/<task>`` name means (None for local files); unknown tasks are errors."""
    if not dataset.startswith("glue/"):
        return None
    task = dataset.split("/", 1)[1]
    if task not in GLUE_TASKS:
        raise DatasetError(f"unknown GLUE task {task!r}; known: {', '.join(sorted(GLUE_TASKS))}")
    return GLUE_TASKS[task]


def task_columns(
    dataset: str, text_column: str | None = None, label_column: str | None = None, text_pair_column: str | None = None
) -> Columns:
    """The columns a trial reads: the given ones, else the GLUE task's, else sentence / none / label."""
    glue = glue_task(dataset)
    return Columns(
        text=text_column or (glue.text_column if glue else "sentence"),
        pair=text_pair_column or (glue.text_pair_column if glue else None),
        label=label_column or "label",
    )


def load_task(
    dataset: str,
    data_dir: str | None = None,
    text_column: str | None = None,
    label_column: str | None = None,
    text_pair_column: str | None = None,
    files: tuple[str, str] | None = None,
    empty_texts: str = "refuse",
    worker: WorkerState | None = None,
) -> TaskData:
    """``files``: the (train, validation) files to read, where this node holds them (the driver
    shipped them); None: the ones ``dataset`` and ``data_dir`` name (``split_files``). Every row is
    checked first (``data_problems``); ``empty_texts``: ``refuse`` rows with an empty or missing
    text (an error naming them), or ``drop`` them (``TaskData.dropped`` counts them)."""
    columns = task_columns(dataset, text_column, label_column, text_pair_column)
    key = (dataset, resolve_data_dir(data_dir), columns, tuple(files) if files else None, empty_texts)
    tasks = (worker or process_worker()).tasks  # a reused Ray worker loads a dataset once, not once per trial
    task = tasks.fresh(key)
    if task is None:
        task = _load_task(*key)
        tasks.put(key, task)
    return task


def _load_task(
    dataset: str, data_dir: Path | None, columns: Columns, files: tuple[str, ...] | None, empty_texts: str
) -> TaskData:
    paths = dict(zip(SPLITS, map(Path, files))) if files else split_files(dataset, data_dir)
    frames = _load_from_hub(dataset) if paths is None else _read_files(paths)
    where = {s: str(paths[s]) if paths else f"{dataset} {s} split (the hub)" for s in frames}
    problems = _column_problems({s: list(map(str, df.columns)) for s, df in frames.items()}, columns)
    if problems:
        # every text column there (a column in two roles): its empty texts are told in the same error too
        if all(c in df for df in frames.values() for c in (columns.text, columns.pair) if c):
            problems += _texts(frames, columns, where, empty_texts)[2]
        problems += _row_problems(frames, where, {})
        # the labels of each split that has them, told in the same error: a label column missing from one
        # split hid the other's label problems until it was mended (a walk-through); no rows is said above
        labelled = {s: df for s, df in frames.items() if columns.label in df and len(df)}
        if labelled:
            problems += _labels_checked(dataset, labelled, columns.label, where)[1]
        raise DatasetError(f"dataset {dataset!r}: " + "; ".join(problems), problems, _row_counts(frames))
    frames, dropped, problems = _texts(frames, columns, where, empty_texts)
    problems += _row_problems(frames, where, dropped)
    if not all(len(df) for df in frames.values()):  # the labels of no rows would only echo it (0 classes, …)
        raise DatasetError(f"dataset {dataset!r}: " + "; ".join(problems), problems, _row_counts(frames))
    (labels, regression, shape_problems), label_problems = _labels_checked(dataset, frames, columns.label, where)
    problems += label_problems
    if problems:
        classes = None if regression or shape_problems else _class_counts(labels["train"])
        raise DatasetError(f"dataset {dataset!r}: " + "; ".join(problems), problems, _row_counts(frames), classes)
    encoded, names = _encode_labels(labels, regression)
    splits = {
        name: Split(
            name=name,
            texts=tuple(df[columns.text]),
            labels=encoded[name],
            pairs=tuple(df[columns.pair]) if columns.pair else None,
        )
        for name, df in frames.items()
    }
    num_labels = 1 if regression else len(set(encoded["train"]) | set(encoded["validation"]))
    return TaskData(
        dataset,
        splits["train"],
        splits["validation"],
        num_labels=num_labels,
        regression=regression,
        official_metrics=_official_metrics(dataset, regression),
        dropped=dropped,
        label_names=names,
        notes=tuple(
            n for n in (_label_note(dataset, labels["train"], regression), _overlap_note(dataset, splits)) if n
        ),
    )


# A regression task whose train labels are this few whole numbers is more likely classes written as floats
FEW_SCORES = 10


def _label_note(dataset: str, train: pd.Series, regression: bool) -> str | None:
    """A local regression task whose train labels are all whole numbers, and few of them (0.0 and 1.0):
    classes written as floats (pandas writes an int column with a gap as floats), which would train one
    output by MSE, silently. A GLUE task's shape is its own."""
    if not regression or glue_task(dataset) is not None:
        return None
    values = np.unique(train.dropna().to_numpy(dtype=float))
    if len(values) > FEW_SCORES or not np.array_equal(values, np.round(values)):
        return None
    shown = ", ".join(f"{v:.1f}" for v in values[:SHOWN_ROWS]) + (", …" if len(values) > SHOWN_ROWS else "")
    return (
        f"labels are floats that are all whole numbers ({shown}): read as a regression task; if they are "
        "classes, write them as integers or strings"
    )


def _class_counts(train: pd.Series) -> dict[str, int]:
    """Train rows per class among the labels present, by their spelling, in the order of their class ids
    (``TaskData.class_counts``'s: sorted values, so 2 before 10), which a stratified subset depends on."""
    return {str(name): int(n) for name, n in train.dropna().value_counts().sort_index().items()}


SHOWN_VALUES, VALUE_WIDTH = 5, 40


def shown_values(values: list) -> str:
    """At most SHOWN_VALUES values, each cut to VALUE_WIDTH characters, as a list: a text column read as
    the labels listed 260 review texts as "rarest classes" in one 17,932-character line."""
    said = [repr(cut_value(v)) for v in values[:SHOWN_VALUES]]
    more = [f"… and {len(values) - SHOWN_VALUES} more"] if len(values) > SHOWN_VALUES else []
    return "[" + ", ".join(said + more) + "]"


def cut_value(value):
    return value[: VALUE_WIDTH - 1] + "…" if isinstance(value, str) and len(value) > VALUE_WIDTH else value


# Classes past this many, at least half as many as the rows, are more likely texts than labels
MANY_CLASSES = 10


def label_column_hint(class_counts: dict[str, int]) -> str:
    """Where the classes are nearly as many as the train rows, the question a walk-through needed (its text
    and label columns swapped): "; 300 classes in 300 train rows: is label_column a text column?"."""
    classes, rows = len(class_counts), sum(class_counts.values())
    if classes <= MANY_CLASSES or classes * 2 < rows:
        return ""
    return f"; {classes} classes in {rows} train rows: is label_column (training.label_column) a text column?"


def _row_counts(frames: dict[str, pd.DataFrame]) -> dict[str, int]:
    """Each split's rows, where it has any: a train split of none is said as such, and no train size is
    then said to exceed its 0 rows."""
    return {split: len(frame) for split, frame in frames.items() if len(frame)}


# On fewer validation rows every score is all or nothing (accuracy 1.000, each seed "collapsed")
MIN_VALIDATION_ROWS = 2


def _row_problems(frames: dict[str, pd.DataFrame], where: dict[str, str], dropped: dict[str, int]) -> list[str]:
    """A split of no rows (a header-only file, or every row dropped for an empty text), and a validation
    split too small to score on: said once, not as the label problems they would make."""
    problems = []
    for split, frame in frames.items():
        after = f" left after dropping {dropped[split]} with an empty text" if dropped.get(split) else ""
        if not len(frame):
            problems.append(f"{where[split]} has no rows{after}")
        elif split == "validation" and len(frame) < MIN_VALIDATION_ROWS:
            problems.append(
                f"{where[split]} has {_rows_count(len(frame))}{after}: a validation set needs at least "
                f"{MIN_VALIDATION_ROWS} (on one row every score is all or nothing)"
            )
    return problems


# --- the rows checked before any trial: each problem names the file, the column, the rows, the count ----
SHOWN_ROWS = 5


def _rows_words(where: str, positions: np.ndarray) -> str:
    """The first rows at ``positions`` (0-based data rows of the file, also after rows were dropped) as the
    file numbers them: a CSV or TSV file's lines (its header is line 1), else 0-based rows; then how many."""
    shown = [int(p) for p in positions[:SHOWN_ROWS]]
    starts = _record_lines(where) if where.endswith((".csv", ".tsv")) else ()
    lines = all(p < len(starts) for p in shown)  # else (a file changed since) rows, which are always right
    said = ", ".join(str(starts[p] if lines else p) for p in shown)
    more = f", … ({len(positions)} in all)" if len(positions) > SHOWN_ROWS else ""
    unit = ("line" if lines else "row (0-based)") if len(positions) == 1 else ("lines" if lines else "rows (0-based)")
    return f"{unit} {said}{more}"


def _record_lines(where: str) -> tuple[int, ...]:
    """The line each data row of a CSV or TSV file starts on: a quoted text may span several lines, and
    pandas skips blank lines, so a row's line is not its place + 2. Read only on the error path (the csv
    module counts lines, pandas does not); () where the file cannot be read so."""
    path = Path(where)
    try:
        return _record_lines_of(path, path.stat().st_mtime_ns)
    except (OSError, UnicodeError, csv.Error):
        return ()


@functools.lru_cache(maxsize=4)  # one file's problems each name rows: it is read once for all of them
def _record_lines_of(path: Path, _mtime_ns: int) -> tuple[int, ...]:
    # a blank line is no row (read_csv's skip_blank_lines)
    return tuple(line for line, record in _records(path, _SEPARATORS[path.suffix.lstrip(".")]) if record)


def _records(path: Path, sep: str) -> Iterator[tuple[int, list[str]]]:
    """Each record after a CSV or TSV file's header, with the line it starts on (the header is line 1)."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter=sep)
        next(reader, None)
        start = reader.line_num + 1
        for record in reader:
            yield start, record
            start = reader.line_num + 1


def _blank(series: pd.Series) -> np.ndarray:
    """Missing (null, NaN) or empty cells: nothing left once whitespace and invisible format characters
    (zero-width space and joiners, the byte-order mark, soft hyphens: Unicode's Cf) are taken out."""
    text = series.astype("string")
    # astype(bool): an empty column's map is of strings, which pandas will not `|` with booleans
    return (series.isna() | text.map(_invisible, na_action="ignore").fillna(True).astype(bool)).to_numpy(dtype=bool)


def _invisible(text: str) -> bool:
    """Only whitespace and format characters; stops at the first visible one (a real text's first)."""
    return all(c.isspace() or unicodedata.category(c) == "Cf" for c in text)


def _texts(
    frames: dict[str, pd.DataFrame], columns: Columns, where: dict[str, str], empty_texts: str
) -> tuple[dict[str, pd.DataFrame], dict[str, int], list[str]]:
    """Rows whose text (or second text) is empty or missing: problems, or dropped and counted. The
    texts that stay are strings (a number in a CSV text column is its text, never ``None``)."""
    kept, dropped, problems = {}, {}, []
    for split, df in frames.items():
        text_columns = [c for c in (columns.text, columns.pair) if c]
        blank = {c: _blank(df[c]) for c in text_columns}
        if empty_texts == "drop":
            keep = ~np.logical_or.reduce(list(blank.values()))
            # the index stays each row's place in its file: a later problem names the file's own line
            df, dropped[split] = df[keep], int((~keep).sum())
        else:
            problems += [
                f"{where[split]}: column {column!r} has {int(mask.sum())} empty or missing text(s), "
                f"{_rows_words(where[split], np.flatnonzero(mask))} (training.empty_texts: drop drops "
                "such rows)"
                for column, mask in blank.items()
                if mask.any()
            ]
        kept[split] = df.assign(**{c: df[c].astype(str) for c in text_columns})
    return kept, dropped, problems


def _label_values(series: pd.Series) -> pd.Series:
    """Labels as one type: numbers where every present value reads as one (a CSV column with an empty
    cell comes back as strings), else strings. Missing ones stay missing (NaN / None)."""
    if pd.api.types.is_numeric_dtype(series) or pd.api.types.is_bool_dtype(series):
        return series
    blank = _blank(series)
    numbers = pd.to_numeric(series[~blank], errors="coerce")
    if numbers.notna().all():
        values = pd.to_numeric(series.where(~blank), errors="coerce")
        # whole numbers with a gap are classes, not scores: the gap alone made them floats
        return values.astype("Int64") if (numbers == numbers.round()).all() else values
    return series.where(~blank).map(lambda v: v if v is None or v != v else str(v))


def _labels_checked(
    dataset: str, frames: dict[str, pd.DataFrame], column: str, where: dict[str, str]
) -> tuple[tuple[dict[str, pd.Series], bool, list[str]], list[str]]:
    """((each split's labels, regression?, the shape's problems), every problem of the labels)."""
    labels = {s: _label_values(df[column]) for s, df in frames.items()}
    regression, shape_problems = _label_shape(
        dataset, column, {s: pd.api.types.is_float_dtype(v) for s, v in labels.items()}
    )
    return (labels, regression, shape_problems), shape_problems or _label_problems(labels, column, where, regression)


def _label_problems(labels: dict[str, pd.Series], column: str, where: dict[str, str], regression: bool) -> list[str]:
    """Missing or non-finite labels; for classes, among the labels present (so one error names them
    all), labels of validation that train never has, fewer than two classes in train, and spellings of
    one label."""
    problems = []
    for split, values in labels.items():
        bad = values.isna().to_numpy()
        if pd.api.types.is_numeric_dtype(values):
            bad = bad | ~np.isfinite(values.to_numpy(dtype=float, na_value=np.nan))
        if bad.any():
            what = "missing or non-finite score(s)" if regression else "missing or non-finite label(s)"
            problems.append(
                f"{where[split]}: column {column!r} has {int(bad.sum())} {what}, "
                f"{_rows_words(where[split], values.index.to_numpy()[bad])}"
            )
    if regression:
        return problems + _score_problems(labels, column, where)
    if "train" not in labels:  # only validation has the label column: no train classes to hold it against
        return problems + _spelling_problems(labels, column, where)
    train = set(labels["train"].dropna())
    validation = labels.get("validation", pd.Series(dtype=object))  # none: its label column is missing
    unseen = (validation.notna() & ~validation.isin(train)).to_numpy()
    if unseen.any():
        names = sorted(set(validation[unseen]), key=str)
        problems.append(
            f"{where['validation']}: column {column!r} holds label(s) {shown_values(names)} that the train split "
            f"never has, {_rows_words(where['validation'], validation.index.to_numpy()[unseen])}"
            + label_column_hint(_class_counts(labels["train"]))
        )
    if len(train) < 2:
        problems.append(
            f"{where['train']}: column {column!r} has {len(train)} class(es) ({shown_values(sorted(train, key=str))}): "
            "a classifier needs at least two"
        )
    return problems + _spelling_problems(labels, column, where)


# The model's scores are float32 (``Split.labels``): a larger one is inf there, and the loss diverges
FLOAT32_MAX = float(np.finfo(np.float32).max)


def _score_problems(labels: dict[str, pd.Series], column: str, where: dict[str, str]) -> list[str]:
    """Finite scores beyond float32 (1e39: a trial "diverged", or its baseline was NaN), and a split whose
    scores are all one value: nothing to learn from in train (as one class is refused), and Pearson and
    Spearman undefined in validation (recorded as 0.000)."""
    problems = []
    why = {"train": "nothing to learn", "validation": "Pearson and Spearman are undefined on it"}
    for split, values in labels.items():
        scores = values.to_numpy(dtype=float, na_value=np.nan)
        huge = np.isfinite(scores) & (np.abs(scores) > FLOAT32_MAX)
        if huge.any():
            problems.append(
                f"{where[split]}: column {column!r} has {int(huge.sum())} score(s) beyond float32's range "
                f"(±{FLOAT32_MAX:.3g}), {_rows_words(where[split], values.index.to_numpy()[huge])}; rescale them"
            )
        finite = np.unique(scores[np.isfinite(scores)])
        if len(finite) == 1 and len(values) > 1:  # one row is said as such (``_row_problems``)
            problems.append(
                f"{where[split]}: column {column!r} has one score ({finite[0]:g}) on every row: {why[split]}; a "
                "regression task needs scores that vary"
            )
    return problems


def _spelling_problems(labels: dict[str, pd.Series], column: str, where: dict[str, str]) -> list[str]:
    """String labels that differ only in case or whitespace (``pos``, ``pos `` and ``Pos``): each
    would be a class of its own, silently. Each spelling but the commonest says where it is."""
    counts = pd.concat(list(labels.values())).dropna().value_counts()
    spellings: dict[str, list[str]] = {}
    for value in sorted(v for v in counts.index if isinstance(v, str)):
        spellings.setdefault(" ".join(value.split()).casefold(), []).append(value)
    problems = []
    groups = [names for names in spellings.values() if len(names) > 1]
    for names in groups[:SHOWN_VALUES]:  # a text column read as labels has many: the first few show what to do
        commonest = max(names, key=lambda n: counts[n])
        said = [
            f"{cut_value(n)!r} ({_rows_count(counts[n])}{'' if n == commonest else _found(labels, n, where)})"
            for n in names[:SHOWN_VALUES]
        ] + ([f"… and {len(names) - SHOWN_VALUES} more"] if len(names) > SHOWN_VALUES else [])
        problems.append(
            f"label column {column!r}: {', '.join(said)} differ only in case or whitespace, so each would be a "
            "class of its own; spell each label one way in the files"
        )
    if len(groups) > SHOWN_VALUES:
        problems.append(
            f"label column {column!r}: {len(groups) - SHOWN_VALUES} more labels are spelled in several ways"
        )
    return problems


def _rows_count(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def _found(labels: dict[str, pd.Series], value: str, where: dict[str, str]) -> str:
    """Where ``value`` is: each file holding it, with its first rows."""
    places = [
        (split, series.index.to_numpy()[(series == value).to_numpy(dtype=bool, na_value=False)])
        for split, series in labels.items()
    ]
    return ": " + "; ".join(f"{where[split]} {_rows_words(where[split], at)}" for split, at in places if len(at))


def _column_problems(split_columns: dict[str, list[str]], columns: Columns) -> list[str]:
    """One problem per missing column, naming the splits that lack it and the spec key that names it; and
    one column read in two roles (a walk-through: `text_pair_column: sentence` on SST-2 trained each
    sentence paired with itself, without a word)."""
    roles = list(columns.named().items())
    problems = [
        f"column {column!r} is both the {role} and the {other} (training.{role} and training.{other} in a spec): "
        "each role needs a column of its own"
        for i, (role, column) in enumerate(roles)
        for other, same in roles[i + 1 :]
        if column == same
    ]
    for role, column in columns.named().items():
        lacking = [split for split, names in split_columns.items() if column not in names]
        if lacking:
            problems.append(
                f"no column {column!r} (training.{role} in a spec, --{role.replace('_', '-')} for a trial) in the "
                f"{' and '.join(lacking)} split ({_columns_words({s: split_columns[s] for s in lacking})})"
            )
    return problems


def _columns_words(split_columns: dict[str, list[str]]) -> str:
    """The columns the splits lacking one have: once where they are the same, else each split's own (a
    walk-through: validation's misspelled `lable` was hidden behind train's columns)."""
    if len({tuple(names) for names in split_columns.values()}) == 1:
        return f"columns: {', '.join(next(iter(split_columns.values())))}"
    return "; ".join(f"{split} columns: {', '.join(names)}" for split, names in split_columns.items())


def _label_shape(dataset: str, label_column: str, float_labels: dict[str, bool]) -> tuple[bool, list[str]]:
    """(regression?, problems): a GLUE task's shape is known; a local file is a regression task
    when its train labels are floats. Float labels on a classification task are an error."""
    glue = glue_task(dataset)
    # without train's labels (its label column missing, said apart) validation's are the only ones to go by
    regression = glue.num_labels == 1 if glue else float_labels.get("train", any(float_labels.values()))
    floats = [split for split, is_float in float_labels.items() if is_float]
    if regression or not floats:
        return regression, []
    why = "" if glue else " (a local dataset is a regression task only when its train labels are floats)"
    return regression, [
        f"label column {label_column!r} holds floats in the {' and '.join(floats)} split, but "
        f"{dataset} is a classification task{why}"
    ]


def _encode_labels(labels: dict[str, pd.Series], regression: bool) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
    """Each split's labels as float scores or class ids, and the classes' names (by id)."""
    if regression:
        return {split: series.to_numpy(dtype=np.float32) for split, series in labels.items()}, ()
    values = sorted(set(labels["train"]) | set(labels["validation"]))
    index = {value: i for i, value in enumerate(values)}
    encoded = {split: np.asarray([index[v] for v in series], dtype=np.int64) for split, series in labels.items()}
    return encoded, tuple(map(str, values))


def _official_metrics(dataset: str, regression: bool) -> tuple[str, ...]:
    glue = glue_task(dataset)
    if glue is not None:
        return glue.official_metrics
    return REGRESSION_METRICS if regression else ("accuracy",)


def official_metric(
    dataset: str,
    data_dir: str | None = None,
    text_column: str | None = None,
    label_column: str | None = None,
    text_pair_column: str | None = None,
    empty_texts: str = "refuse",
) -> str:
    """The metric that picks a trial's best evaluation unless the spec names one: GLUE's official
    one (no data read), else accuracy, or Pearson for a regression file (its labels are read)."""
    glue = glue_task(dataset)
    if glue is not None:
        return glue.official_metrics[0]
    shape = describe_task(dataset, data_dir, text_column, label_column, text_pair_column, empty_texts)
    return shape.official_metrics[0]


def split_files(dataset: str, data_dir: str | Path | None = None) -> dict[str, Path] | None:
    """The train and validation files ``dataset`` is read from on this machine, or None for a GLUE
    task with no data dir (config or ``FREEZESWEEP_DATA_DIR``): the hub. A local path that is named
    but missing raises DatasetError naming it: it never falls back to the hub."""
    glue = glue_task(dataset)
    if glue is not None:
        root = resolve_data_dir(str(data_dir) if data_dir else None)
        if root is None:
            return None
        folder = root / dataset.split("/", 1)[1]
        if not root.is_dir():
            raise DatasetError(f"{dataset}: data_dir {root} is not a folder here (see data_dir or {DATA_DIR_ENV})")
        if not folder.is_dir():
            raise DatasetError(
                f"{dataset}: no folder {folder} in data_dir {root} (a named data dir is never "
                f"replaced by the hub: add the task there, or name no data_dir and no {DATA_DIR_ENV} "
                "to read GLUE from the hub)"
            )
        return _glue_files(folder, glue)
    if "," in dataset:
        files = [Path(p.strip()).expanduser() for p in dataset.split(",")]
        missing = [str(f) for f in files if not f.is_file()]
        if len(files) != 2 or missing or any(f.suffix.lstrip(".") not in _EXTENSIONS for f in files):
            raise DatasetError(
                f"dataset {dataset!r}: expected TRAIN_FILE,VALIDATION_FILE, two existing "
                f"{'/'.join(_EXTENSIONS)} files" + (f" (missing: {', '.join(missing)})" if missing else "")
            )
        return dict(zip(SPLITS, files))
    folder = Path(dataset).expanduser()
    if folder.is_dir():
        return _find_split_files(folder, {s: s for s in SPLITS})
    if folder.is_file():  # a new user's first try: the train file alone
        raise DatasetError(
            f"dataset {dataset!r}: is a file; a dataset is a folder holding train and validation files, or the "
            f"pair of them as one string 'TRAIN_FILE,VALIDATION_FILE' ({', '.join(_EXTENSIONS)})"
        )
    raise DatasetError(
        f"dataset {dataset!r}: no such folder here ({folder.absolute()}); a dataset is glue/<task> "
        f"({', '.join(sorted(GLUE_TASKS))}) or a folder holding train and validation files ({', '.join(_EXTENSIONS)})"
    )


def _glue_files(folder: Path, glue: GlueTask) -> dict[str, Path]:
    """A local GLUE copy: ``validation.*``, or the hub's split name (MNLI's ``validation_matched.*``)."""
    names = dict.fromkeys((glue.validation_split, "validation"))
    for name in names:
        if _split_file(folder, name):
            return _find_split_files(folder, {"train": "train", "validation": name}, pairs=False)
    return _find_split_files(folder, {s: s for s in SPLITS}, pairs=False)  # raises, naming what is missing


# Other names a split's file goes by (GLUE's own downloads say dev): said in the error, never read, since
# a test file may be unlabelled or the rows a user holds back
OTHER_SPLIT_NAMES = {"train": ("training",), "validation": ("dev", "val", "valid", "eval", "test")}


def _split_file(folder: Path, name: str) -> Path | None:
    return next((p for ext in _EXTENSIONS if (p := folder / f"{name}.{ext}").is_file()), None)


def _find_split_files(folder: Path, names: dict[str, str], pairs: bool = True) -> dict[str, Path]:
    """Each split's file (``names``: split -> the file's name without its extension); one error naming
    every missing one, and the file under another name it may be (``dev.csv``), with what to do (``pairs``:
    a pair of files is an answer; not for a GLUE task's folder, whose name says its columns and metrics)."""
    found = {split: _split_file(folder, name) for split, name in names.items()}
    missing = [split for split, path in found.items() if path is None]
    if not missing:
        return {split: path for split, path in found.items() if path}
    problems = []
    for split in missing:
        problem = f"no {names[split]}.{{{','.join(_EXTENSIONS)}}} in {folder}"
        unread = sorted(p.name for p in folder.glob(f"{glob.escape(names[split])}.*") if p.is_file())
        if unread:  # train.xlsx: the file is there, in a format the reader does not take
            problem += f"; found {' and '.join(unread)}, a format not read ({', '.join(_EXTENSIONS)})"
        others = [p for name in OTHER_SPLIT_NAMES.get(split, ()) if (p := _split_file(folder, name))]
        if others:
            which = (
                f"it to {names[split]}{others[0].suffix}"
                if len(others) == 1
                else f"the one of {split} rows to {names[split]}.<ext>"
            )
            problem += f"; found {' and '.join(p.name for p in others)}: rename {which}"
            pair = {s: found[s] or others[0] for s in names}
            if pairs and len(missing) == 1:
                problem += f", or give the pair as TRAIN_FILE,VALIDATION_FILE ('{pair['train']},{pair['validation']}')"
        problems.append(problem)
    raise DatasetError("; ".join(problems), problems)


# What each format is read as, said where a file is not (a new user's `;`-separated or latin-1 CSV)
_FORMATS = {
    "csv": ("CSV", "a comma-separated file, UTF-8, its header line first; a text holding a comma in double quotes"),
    "tsv": ("TSV", "a tab-separated file, UTF-8, its header line first; a text holding a tab in double quotes"),
    "jsonl": ("JSON Lines", "one JSON object per line, UTF-8"),
    "json": ("JSON", 'a JSON array of objects ({"sentence": ..., "label": ...}), UTF-8'),
    "parquet": ("Parquet", "a Parquet file, as pandas' to_parquet writes one"),
}
_SEPARATORS = {"csv": ",", "tsv": "\t"}


def _read_files(paths: dict[str, Path]) -> dict[str, pd.DataFrame]:
    """Each split's file; one DatasetError naming every file that cannot be read (both of a pair)."""
    frames, problems = {}, []
    for split, path in paths.items():
        try:
            frames[split] = _read_file(path)
        except DatasetError as exc:
            problems.append(str(exc))
    if problems:
        raise DatasetError("; ".join(problems), problems)
    return frames


def _read_file(path: Path) -> pd.DataFrame:
    """The file's rows, indexed 0..n-1 (rows are named by their place in the file, never by a stored
    index); a DatasetError naming the file, the reader's reason and what the format should be."""
    suffix = path.suffix.lstrip(".")
    try:
        if suffix in _SEPARATORS:
            frame = _read_csv(path, _SEPARATORS[suffix])
        elif suffix == "parquet":
            frame = pd.read_parquet(path)
        else:
            # dtype=False: each value as the file writes it; pandas' default turns whole floats (1.0) into ints,
            # so the same labels made a classification task from JSON and a regression task from Parquet or CSV.
            # utf-8-sig: a byte-order mark (Windows' editors write one) is read past, as the CSV reader does
            frame = pd.read_json(path, lines=suffix == "jsonl", dtype=False, encoding="utf-8-sig")
    except (ValueError, OSError) as exc:
        # pandas' ParserError and EmptyDataError, UnicodeDecodeError and pyarrow's ArrowInvalid are all
        # ValueErrors: each is said as its file's problem, beside every other problem, not as a traceback
        name, expected = _FORMATS[suffix]
        raise DatasetError(f"{path} cannot be read as {name} ({_reason(exc)}): {expected}") from exc
    # a named index (a Parquet file's) is kept as a column, unless a column has its name already (a review)
    named = [name for name in frame.index.names if name is not None]
    return frame.reset_index(drop=not named or any(name in frame.columns for name in named))


def _reason(exc: Exception) -> str:
    """The reader's reason on one short line (pyarrow's and pandas' run to several)."""
    lines = str(exc).strip().splitlines()
    reason = lines[0].strip() if lines else type(exc).__name__
    return reason if len(reason) <= 200 else reason[:199] + "…"


def _read_csv(path: Path, sep: str) -> pd.DataFrame:
    """index_col=False: with one field more than the header on each row (a trailing separator), pandas
    would otherwise take the first column as the index and shift every column (pandas' read_csv docs). It
    then drops that field, with a warning: harmless where it is empty, refused where it holds data."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", pd.errors.ParserWarning)
        try:
            frame = pd.read_csv(path, sep=sep, keep_default_na=False, index_col=False, encoding="utf-8-sig")
        except pd.errors.ParserError:  # a row with more fields than a one-column header: its texts hold ``sep``
            with open(path, encoding="utf-8-sig") as f:
                _one_column(f.readline().rstrip("\r\n"), sep)
            raise
    if len(frame.columns) == 1:
        _one_column(str(frame.columns[0]), sep)
    if any(issubclass(w.category, pd.errors.ParserWarning) for w in caught):
        try:
            numbered = [(line, record) for line, record in _records(path, sep) if record]  # read once
        except csv.Error as exc:  # the csv module's own limits (a field past 128 KiB): the lines unknown
            raise ValueError(f"more fields than its header's {len(frame.columns)} on some line ({exc})") from exc
        fields = len(frame.columns)
        lines = [line for line, record in numbered if any(field.strip() for field in record[fields:])]
        if lines and _row_numbers_first([record for _, record in numbered], fields):
            # an unlabelled index column first, as df.to_csv(index_label=False) and R's write.table(sep=",")
            # write it: read as pandas reads it (its index), then dropped
            return pd.read_csv(path, sep=sep, keep_default_na=False, encoding="utf-8-sig").reset_index(drop=True)
        if lines:
            more = f", … ({len(lines)} in all)" if len(lines) > SHOWN_ROWS else ""
            shown = ", ".join(map(str, lines[:SHOWN_ROWS])) + more
            raise ValueError(f"more fields than its header's {len(frame.columns)} on line(s) {shown}")
    return frame


def _one_column(header: str, sep: str) -> None:
    """A header of one column is never a dataset's: where another separator is in it, say so."""
    others = [other for other in ("\t", ";", ",", "|") if other != sep and other in header]
    if sep not in header and others:
        raise ValueError(f"its header {header!r} is one column; are its fields separated by {others[0]!r}?")


def _row_numbers_first(records: list[list[str]], fields: int) -> bool:
    """Every row one field more than the header, the first a distinct whole number (a row number); any
    other extra field is data past the header, refused (which column it belongs to cannot be known)."""
    firsts = [record[0].strip() for record in records if len(record) == fields + 1]
    return len(firsts) == len(records) > 0 and len(set(firsts)) == len(firsts) and all(f.isdigit() for f in firsts)


def _load_from_hub(dataset: str) -> dict[str, pd.DataFrame]:
    glue, task = glue_task(dataset), dataset.split("/", 1)[1]
    no_files = (
        f"glue/{task}: no data dir named (set data_dir or {DATA_DIR_ENV} to a folder holding "
        f"{task}/train.parquet and {task}/validation.parquet)"
    )
    # `datasets` retries for ~25 s before it fails, or reads a copy it cached: fail at once where it has none
    problem = hub.hub_problem("nyu-mll/glue", "dataset")
    if problem is not None and not _glue_cached():
        raise DatasetError(f"{no_files}, and {problem} and `datasets` has no copy of GLUE cached")
    try:
        import datasets

        ds = datasets.load_dataset("glue", task)
    except Exception as exc:  # hub down, not in the cache offline, ...: say where local files would be looked for
        raise DatasetError(f"{no_files} and the hub failed: {exc}") from exc
    return {"train": ds["train"].to_pandas(), "validation": ds[glue.validation_split].to_pandas()}


def _glue_cached() -> bool:
    """Whether `datasets` holds a copy of GLUE, which ``load_dataset`` reads where the hub cannot be
    reached (its own fallback, datasets/load.py: ``CachedDatasetModuleFactory``, asked the same way)."""
    try:
        from datasets.load import CachedDatasetModuleFactory

        CachedDatasetModuleFactory("glue").get_module()
    except Exception:  # not cached, or a datasets without that factory: no cache to fall back to
        return False
    return True


def _overlap_note(dataset: str, splits: dict[str, Split]) -> str | None:
    """Validation rows whose text (and pair) train also holds: their scores measure recall as well as
    what was learned (splits cut from one file that repeats rows, or one split copied as the other): said,
    not refused. A GLUE task's split is its own (CoLA's validation shares 16 of its
    1,043 sentences with its train)."""
    if glue_task(dataset) is not None:
        return None
    train, val = splits["train"], splits["validation"]
    seen = set(zip(train.texts, train.pairs or train.texts))
    shared = sum(row in seen for row in zip(val.texts, val.pairs or val.texts))
    if not shared:
        return None
    what = "text and pair" if val.pairs else "text"
    return (
        f"{shared:,} of {len(val):,} validation rows ({100 * shared / len(val):.3g} %) have a {what} the train file "
        "also has: a trial whose train subset holds them scores them from memory as well as from what it learned"
    )


def describe_task(
    dataset: str,
    data_dir: str | None = None,
    text_column: str | None = None,
    label_column: str | None = None,
    text_pair_column: str | None = None,
    empty_texts: str = "refuse",
) -> TaskShape:
    """Rows per split and the task's shape; raises DatasetError naming every problem (missing
    columns, float labels on a classification task, every row ``load_task`` refuses). Spec validation
    runs it per dataset: the rows are read and checked once, before any trial."""
    task = load_task(dataset, data_dir, text_column, label_column, text_pair_column, empty_texts=empty_texts)
    return TaskShape(
        {"train": len(task.train), "validation": len(task.validation)},
        task.regression,
        task.num_labels,
        task.official_metrics,
        task.dropped,
        task.class_counts(),
        task.notes,
    )


def shape_words(shape: TaskShape) -> str:
    """E.g. "a regression task: pearson, spearman" (what fits it), for errors."""
    return f"{describe_shape(shape.regression, shape.num_labels)}: {', '.join(shape.metrics)}"
