import pandas as pd
import pytest

import numpy as np
from sklearn.metrics import f1_score

from tests.conftest import make_toy_dataset, make_toy_pair_dataset, needs_glue
from freezesweep.trials.data import DatasetError, describe_task, load_task, official_metric


@needs_glue
@pytest.mark.parametrize(
    "dataset,rows,majority", [("glue/sst2", (67349, 872), 0.509), ("glue/cola", (8551, 1043), 0.691)]
)
def test_real_glue_from_local_parquet(dataset, rows, majority, glue_dir):
    task = load_task(dataset, str(glue_dir))
    assert (len(task.train), len(task.validation)) == rows
    assert task.num_labels == 2
    assert task.baseline_metrics()["accuracy"] == pytest.approx(majority, abs=5e-4)
    assert describe_task(dataset, str(glue_dir)).rows == {"train": rows[0], "validation": rows[1]}


@needs_glue
def test_data_dir_from_environment(glue_dir, monkeypatch):
    monkeypatch.setenv("FREEZESWEEP_DATA_DIR", str(glue_dir))
    assert len(load_task("glue/cola").validation) == 1043


def test_hub_is_tried_and_explained_only_without_a_data_dir(monkeypatch, tmp_path):
    """No data dir named: the hub, and its failure explained. A named data dir without the task is
    an error naming the folder: the hub is never asked (its rows would carry the same trial_id). The hub
    here answers its probe (an unreachable one: tests/trials/test_hub.py): before, the test read this
    machine's network, and failed where the probe is refused at once."""
    import datasets

    from freezesweep.trials import hub

    monkeypatch.setattr(hub, "hub_problem", lambda repo_id, repo_type: None)
    calls = []

    def offline(*args, **kwargs):
        calls.append(args)
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.delenv("FREEZESWEEP_DATA_DIR", raising=False)
    with pytest.raises(DatasetError, match="FREEZESWEEP_DATA_DIR"):
        load_task("glue/sst2")
    assert calls == [("glue", "sst2")]
    with pytest.raises(DatasetError, match=f"no folder {tmp_path / 'cola'} in data_dir {tmp_path}"):
        load_task("glue/cola", data_dir=str(tmp_path))
    monkeypatch.setenv("FREEZESWEEP_DATA_DIR", str(tmp_path / "gone"))
    with pytest.raises(DatasetError, match=f"data_dir {tmp_path / 'gone'} is not a folder here"):
        describe_task("glue/cola")
    assert calls == [("glue", "sst2")]


def test_a_single_file_as_the_dataset_is_said_to_be_a_file(tmp_path):
    """Before: "no such folder here (…/train.csv)" of a file that exists (a new user's walk-through)."""
    folder = make_toy_dataset(tmp_path / "toy", n_train=30, n_val=20, fmt="csv")
    with pytest.raises(DatasetError, match="is a file; a dataset is a folder .* 'TRAIN_FILE,VALIDATION_FILE'"):
        load_task(str(folder / "train.csv"))


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_local_file_pair_with_custom_columns(tmp_path, fmt):
    folder = make_toy_dataset(tmp_path / fmt, n_train=30, n_val=20, fmt=fmt, text_column="review", label_column="y")
    task = load_task(str(folder), text_column="review", label_column="y")
    assert (len(task.train), len(task.validation), task.num_labels) == (30, 20, 2)
    assert isinstance(task.train.texts[0], str)


def test_string_labels_are_mapped(tmp_path):
    import pandas as pd

    for split in ("train", "validation"):
        pd.DataFrame({"text": ["a", "b", "c"], "label": ["pos", "neg", "pos"]}).to_csv(
            tmp_path / f"{split}.csv", index=False
        )
    task = load_task(str(tmp_path), text_column="text")
    assert task.train.labels.tolist() == [1, 0, 1]
    assert task.baseline_metrics()["accuracy"] == pytest.approx(2 / 3)


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(DatasetError, match="dataset 'nope/nothing': no such folder here"):
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


@needs_glue
@pytest.mark.parametrize(
    "dataset,rows,official",
    [("glue/rte", (2490, 277), "accuracy"), ("glue/mrpc", (3668, 408), "f1"), ("glue/stsb", (5749, 1500), "pearson")],
)
def test_real_sentence_pair_tasks(dataset, rows, official, glue_dir):
    task = load_task(dataset, str(glue_dir))
    assert (len(task.train), len(task.validation)) == rows
    assert (
        task.train.pairs is not None and len(task.train.pairs) == rows[0] and task.train.pairs[0] != task.train.texts[0]
    )
    assert task.official_metrics[0] == official == official_metric(dataset)
    shape = describe_task(dataset, str(glue_dir))  # from Parquet metadata alone
    assert (shape.rows, shape.regression, shape.metrics) == (
        {"train": rows[0], "validation": rows[1]},
        task.regression,
        task.metrics,
    )


@needs_glue
def test_baselines_of_each_task(glue_dir):
    """The majority class for classification (accuracy, F1, Matthews of answering it everywhere); the train
    mean for STS-B, whose correlations with a constant are 0 by definition."""
    for dataset in ("glue/sst2", "glue/cola", "glue/rte", "glue/mrpc"):
        task = load_task(dataset, str(glue_dir))
        labels = task.validation.labels
        majority = np.bincount(labels).argmax()
        baseline = task.baseline_metrics()
        assert baseline["accuracy"] == pytest.approx(np.mean(labels == majority))
        assert baseline["matthews"] == 0.0  # a constant answer carries no information
        assert baseline["f1"] == pytest.approx(f1_score(labels, np.full(len(labels), majority)))
    mrpc = load_task("glue/mrpc", str(glue_dir)).baseline_metrics()  # majority "equivalent" (1): F1 = 2p / (1 + p)
    assert mrpc["accuracy"] == pytest.approx(279 / 408) and mrpc["f1"] == pytest.approx(2 * 279 / 408 / (1 + 279 / 408))
    assert load_task("glue/rte", str(glue_dir)).baseline_metrics()["accuracy"] == pytest.approx(146 / 277)
    stsb = load_task("glue/stsb", str(glue_dir))
    assert stsb.regression and stsb.num_labels == 1 and "accuracy" not in stsb.baseline_metrics()
    assert stsb.train.labels.dtype == np.float32 and stsb.train.labels.min() == 0 and stsb.train.labels.max() == 5
    assert stsb.baseline_metrics() == {"pearson": 0.0, "spearman": 0.0}


@needs_glue
def test_the_baseline_of_a_sample_is_the_samples(glue_dir):
    """The demo's evaluation (max_eval_examples 256 of SST-2's 872 validation rows): the constant
    predictor's accuracy there is 130 / 256, not the split's 444 / 872 that a one-class seed was held to."""
    from freezesweep.trials.config import TrialConfig
    from freezesweep.trials.run import eval_rows

    task = load_task("glue/sst2", str(glue_dir))
    rows = eval_rows(
        task, TrialConfig(dataset="glue/sst2", model="m", train_size=200, frozen_layers=0, max_eval_examples=256)
    )
    assert task.baseline_metrics(rows)["accuracy"] == 130 / 256 and task.baseline_metrics()["accuracy"] == 444 / 872


def test_local_pairs_and_float_labels(tmp_path):
    pairs = make_toy_pair_dataset(tmp_path / "pairs")
    task = load_task(str(pairs), text_column="sentence1", text_pair_column="sentence2")
    assert task.train.pairs is not None and not task.regression and task.metrics == ("accuracy", "f1", "matthews")
    single = load_task(str(pairs), text_column="sentence1")
    assert single.train.pairs is None and single.train.digest != task.train.digest  # the second text is content
    scores = load_task(
        str(make_toy_pair_dataset(tmp_path / "scores", regression=True)),
        text_column="sentence1",
        text_pair_column="sentence2",
    )
    assert scores.regression and scores.num_labels == 1 and scores.official_metrics == ("pearson", "spearman")
    assert scores.train.labels.dtype == np.float32
    with pytest.raises(
        DatasetError,
        match="no column 'second' \\(training.text_pair_column in a spec, --text-pair-column for a trial\\) in the train and validation split",
    ):
        load_task(str(pairs), text_column="sentence1", text_pair_column="second")


def test_float_labels_on_a_classification_task_are_an_error(tmp_path):
    folder = make_toy_pair_dataset(tmp_path / "rte", regression=True)  # a GLUE classification task's name, float labels
    with pytest.raises(
        DatasetError, match="holds floats in the train and validation split, but glue/rte is a classification task"
    ) as info:
        describe_task("glue/rte", str(tmp_path))
    assert len(info.value.problems) == 1
    with pytest.raises(DatasetError, match="glue/rte is a classification task"):
        load_task("glue/rte", str(tmp_path))
    assert folder.is_dir()


# --- the data users bring: each problem named (file, column, rows, count) before any trial ---------
def _csv_pair(folder, train: str, validation: str):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.csv").write_text(train)
    (folder / "validation.csv").write_text(validation)
    return str(folder)


def test_an_empty_label_is_named_by_file_column_and_line(tmp_path):
    """Before: TypeError: '<' not supported between instances of 'int' and 'str', nothing named."""
    rows = "".join(f"row {i},{i % 2}\n" for i in range(8))
    folder = _csv_pair(tmp_path / "d", "sentence,label\n" + rows + "gap,\n" + rows, "sentence,label\na,0\nb,1\n")
    with pytest.raises(DatasetError) as info:
        load_task(folder)
    [problem] = info.value.problems
    assert problem == f"{folder}/train.csv: column 'label' has 1 missing or non-finite label(s), line 10"


def test_a_validation_label_train_never_has_is_refused(tmp_path):
    """Before: accepted, a 3-class head trained and the rows stored ok."""
    folder = _csv_pair(
        tmp_path / "d", "sentence,label\na,good\nb,bad\nc,good\n", "sentence,label\nx,good\ny,neutral\nz,neutral\n"
    )
    with pytest.raises(
        DatasetError,
        match=r"validation.csv: column 'label' holds label\(s\) \['neutral'\] that the "
        r"train split never has, lines 3, 4",
    ):
        load_task(folder)


def test_a_single_class_in_train_is_refused(tmp_path):
    folder = _csv_pair(tmp_path / "d", "sentence,label\na,1\nb,1\n", "sentence,label\nx,1\ny,0\n")
    with pytest.raises(
        DatasetError,
        match=r"train.csv: column 'label' has 1 class\(es\) \(\[1\]\): a classifier needs "
        "at least two",
    ):
        load_task(folder)


def test_empty_and_null_texts_are_refused_or_dropped_and_counted(tmp_path):
    """Before: accepted, and a null became the text "None"."""
    frame = pd.DataFrame({"sentence": ["fine", None, "  ", "good", "bad", "ok"], "label": [0, 1, 0, 1, 0, 1]})
    folder = tmp_path / "d"
    folder.mkdir()
    frame.to_parquet(folder / "train.parquet")
    frame.iloc[[0, 3, 4]].to_parquet(folder / "validation.parquet")
    with pytest.raises(DatasetError) as info:
        load_task(str(folder))
    assert info.value.problems == [
        f"{folder}/train.parquet: column 'sentence' has 2 empty or missing text(s), rows "
        "(0-based) 1, 2 (training.empty_texts: drop drops such rows)"
    ]
    task = load_task(str(folder), empty_texts="drop")
    assert task.dropped == {"train": 2, "validation": 0} and task.train.texts == ("fine", "good", "bad", "ok")
    assert "None" not in task.train.texts and list(task.train.labels) == [0, 1, 0, 1]


def test_labels_that_differ_only_in_case_or_whitespace_are_named(tmp_path):
    """Before: `pos`, `pos `, `neg`, `neg ` made a 4-class head, exit 0, no word."""
    train = "sentence,label\n" + "".join(
        f"row {i},{label}\n" for i, label in enumerate(["pos", "pos ", "neg", "neg ", "pos", "Neg"])
    )
    folder = _csv_pair(tmp_path / "d", train, "sentence,label\nx,pos\ny,neg\nz,pos \n")
    with pytest.raises(DatasetError) as info:
        load_task(folder)
    train_csv, validation_csv = f"{folder}/train.csv", f"{folder}/validation.csv"
    assert info.value.problems == [  # each spelling but the commonest says where it is
        f"label column 'label': 'Neg' (1 row: {train_csv} line 7), 'neg' (2 rows), 'neg ' (1 row: {train_csv} "
        "line 5) differ only in case or whitespace, so each would be a class of its own; spell each label one way "
        "in the files",
        f"label column 'label': 'pos' (3 rows), 'pos ' (2 rows: {train_csv} line 3; {validation_csv} line 4) "
        "differ only in case or whitespace, so each would be a class of its own; spell each label one way in the files",
    ]
    clean = _csv_pair(tmp_path / "ok", "sentence,label\na,pos\nb,neg\nc,Positive\n", "sentence,label\nx,pos\ny,neg\n")
    assert load_task(clean).num_labels == 3  # distinct words stay distinct classes


def test_a_text_of_only_invisible_characters_is_empty(tmp_path):
    """Before: a text of zero-width spaces and joiners (and a byte-order mark) was accepted, where "   " was refused."""
    frame = pd.DataFrame(
        {
            "sentence": ["fine", "\u200b\u200b", " \u200d\ufeff ", "good", "caf\u00e9\u200b", "ok"],
            "label": [0, 1, 0, 1, 0, 1],
        }
    )
    folder = tmp_path / "d"
    folder.mkdir()
    frame.to_parquet(folder / "train.parquet")
    frame.iloc[[0, 3]].to_parquet(folder / "validation.parquet")
    with pytest.raises(DatasetError) as info:
        load_task(str(folder))
    assert info.value.problems == [
        f"{folder}/train.parquet: column 'sentence' has 2 empty or missing text(s), rows "
        "(0-based) 1, 2 (training.empty_texts: drop drops such rows)"
    ]
    task = load_task(str(folder), empty_texts="drop")
    assert task.train.texts == ("fine", "good", "caf\u00e9\u200b", "ok")  # a visible text keeps its bytes


def test_one_column_in_two_roles_is_refused(tmp_path):
    """A walk-through: `text_pair_column: sentence` on a single-text task trained each sentence paired with
    itself, two ok rows and no word."""
    folder = _csv_pair(tmp_path / "d", "sentence,label\na,pos\nb,neg\n", "sentence,label\nx,pos\ny,neg\n")
    with pytest.raises(DatasetError) as info:
        load_task(folder, text_pair_column="sentence")
    assert info.value.problems == [
        "column 'sentence' is both the text_column and the text_pair_column (training.text_column and "
        "training.text_pair_column in a spec): each role needs a column of its own"
    ]
    with pytest.raises(DatasetError, match="'label' is both the text_column and the label_column"):
        load_task(folder, text_column="label")
    # a second walk-through: the file's empty texts were said only once the roles were mended
    (tmp_path / "d" / "train.csv").write_text("sentence,label\na,pos\n,neg\nb,neg\n")
    with pytest.raises(DatasetError) as info:
        load_task(folder, text_pair_column="sentence")
    both, empty = info.value.problems
    assert both.startswith("column 'sentence' is both the text_column and the text_pair_column")
    assert empty == (
        f"{folder}/train.csv: column 'sentence' has 1 empty or missing text(s), line 3 (training.empty_texts: "
        "drop drops such rows)"
    )


def test_a_missing_column_hides_no_label_problem(tmp_path):
    """A walk-through: a text column missing from the validation file hid the labels' problems, which came
    only on the second try."""
    folder = _csv_pair(tmp_path / "d", "sentence,label\na,pos\nb,neg\nc,Pos\n", "text,label\nx,pos\ny,maybe\n")
    with pytest.raises(DatasetError) as info:
        load_task(folder)
    said = "\n".join(info.value.problems)
    assert "no column 'sentence'" in said and "validation split" in said
    assert "holds label(s) ['maybe'] that the train split never has" in said
    assert "'Pos' (1 row: " in said and "differ only in case" in said


def test_rows_are_named_by_their_file_lines_after_empty_texts_are_dropped(tmp_path):
    """The review: with empty_texts: drop the kept rows were renumbered, so a label problem named the
    line after its own ("line 4" for line 5)."""
    train = "sentence,label\n,pos\na,pos\nb,neg\nc,Pos\nd,\n"
    folder = _csv_pair(tmp_path / "d", train, "sentence,label\nx,pos\ny,neg\n")
    with pytest.raises(DatasetError) as info:
        load_task(folder, empty_texts="drop")
    said = "\n".join(info.value.problems)
    assert f"'Pos' (1 row: {folder}/train.csv line 5)" in said
    assert f"{folder}/train.csv: column 'label' has 1 missing or non-finite label(s), line 6" in said


_WRITERS = {
    "parquet": lambda df, path: df.to_parquet(path),
    "csv": lambda df, path: df.to_csv(path, index=False),
    "jsonl": lambda df, path: df.to_json(path, orient="records", lines=True),
    "json": lambda df, path: df.to_json(path, orient="records"),
}


@pytest.mark.parametrize("fmt", sorted(_WRITERS))
def test_float_labels_are_one_task_in_every_format_and_whole_ones_are_noted(tmp_path, fmt):
    """Before: labels 0.0/1.0 were a regression task from Parquet and CSV but classification from JSON(L)
    (pandas' JSON reader made whole floats ints), and neither said a word of it."""
    for split in ("train", "validation"):
        frame = pd.DataFrame({"sentence": [f"{split} row {i}" for i in range(8)], "label": [0.0, 1.0] * 4})
        _WRITERS[fmt](frame, tmp_path / f"{split}.{fmt}")
    assert b"1.0" in (tmp_path / f"train.{fmt}").read_bytes() or fmt == "parquet"
    shape = describe_task(str(tmp_path))
    assert (shape.regression, shape.official_metrics[0]) == (True, "pearson")
    assert shape.notes == (
        "labels are floats that are all whole numbers (0.0, 1.0): read as a regression task; if they are "
        "classes, write them as integers or strings",
    )


def test_scores_that_are_not_all_whole_or_are_many_are_not_noted(tmp_path):
    for name, labels in (("halves", [0.0, 0.5, 1.0, 1.5] * 2), ("many", [float(i) for i in range(12)])):
        for split in ("train", "validation"):
            frame = pd.DataFrame({"sentence": [f"{split} row {i}" for i in range(len(labels))], "label": labels})
            (tmp_path / name).mkdir(exist_ok=True)
            frame.to_json(tmp_path / name / f"{split}.jsonl", orient="records", lines=True)
        shape = describe_task(str(tmp_path / name))
        assert shape.regression and shape.notes == (), name


def test_validation_rows_the_train_file_also_has_are_noted(tmp_path):
    """Before: one file given as both splits (or splits cut from a file that repeats rows) trained and
    scored without a word; its scores were partly recall. A text alike with another pair is not the row."""
    train = pd.DataFrame({"a": ["x", "y", "z", "w"], "b": ["1", "2", "3", "4"], "label": [0, 1, 0, 1]})
    train.to_csv(tmp_path / "train.csv", index=False)
    pd.concat([train.iloc[:2], train.iloc[2:].assign(b="new")]).to_csv(tmp_path / "validation.csv", index=False)
    assert describe_task(str(tmp_path), text_column="a").notes == (
        "4 of 4 validation rows (100 %) have a text the train file also has: a trial whose train subset holds "
        "them scores them from memory as well as from what it learned",
    )
    assert describe_task(str(tmp_path), text_column="a", text_pair_column="b").notes == (
        "2 of 4 validation rows (50 %) have a text and pair the train file also has: a trial whose train subset "
        "holds them scores them from memory as well as from what it learned",
    )


def test_a_validation_file_under_another_name_is_named_with_what_to_do(tmp_path):
    """Before: "no validation.{parquet,csv,tsv,jsonl,json} in …" of a folder holding dev.csv."""
    folder = make_toy_dataset(tmp_path / "d", n_train=10, n_val=10, fmt="csv")
    (folder / "validation.csv").rename(folder / "dev.csv")
    with pytest.raises(DatasetError) as info:
        load_task(str(folder))
    assert info.value.problems == [
        f"no validation.{{parquet,csv,tsv,jsonl,json}} in {folder}; found dev.csv: rename it to validation.csv, "
        f"or give the pair as TRAIN_FILE,VALIDATION_FILE ('{folder}/train.csv,{folder}/dev.csv')"
    ]
    (folder / "train.csv").rename(folder / "training.csv")  # both missing: both named, in one error
    with pytest.raises(DatasetError) as info:
        load_task(str(folder))
    assert [p.split("; found ")[1] for p in info.value.problems] == [
        "training.csv: rename it to train.csv",
        "dev.csv: rename it to validation.csv",
    ]


# --- files the reader cannot read, or reads into nothing to train or score on: one problem each ---------
def _pair(folder, name: str, content: bytes, fmt: str):
    """A folder whose ``name`` split is ``content`` (bytes, as a user's editor wrote them) and whose other
    split is a clean file of the same format."""
    folder.mkdir(parents=True, exist_ok=True)
    clean = pd.DataFrame({"sentence": ["fine", "dull", "good", "bad"], "label": [1, 0, 1, 0]})
    _WRITERS[fmt](clean, folder / f"{'validation' if name == 'train' else 'train'}.{fmt}")
    (folder / f"{name}.{fmt}").write_bytes(content)
    return folder / f"{name}.{fmt}"


UNREADABLE = {  # a walk-through's files: each was a raw traceback (exit 1) that hid every other problem
    "semicolons, texts with commas": (
        "csv",
        b"sentence;label\ngreat, really great;1\nawful, just awful;0\n",
        "CSV (its header 'sentence;label' is one column; are its fields separated by ';'?)",
    ),
    "semicolons, texts with several commas": (  # pandas' "Expected 1 fields in line 3, saw 4" before (a docs walk)
        "csv",
        b"sentence;label\ngreat, really, truly great;1\nawful, just, so awful;0\n",
        "CSV (its header 'sentence;label' is one column; are its fields separated by ';'?)",
    ),
    "stray fields": ("csv", b"sentence,label\ngreat,1\nawful,0,x,y\n", "CSV (Error tokenizing data. C error: Expected"),
    "tabs in a .csv": (
        "csv",
        b"sentence\tlabel\ngreat, really\t1\nawful\t0\n",
        "CSV (its header 'sentence\\tlabel' is one column; are its fields separated by '\\t'?)",
    ),
    "latin-1": ("csv", "sentence,label\ncafé crème,1\nbad,0\n".encode("latin-1"), "CSV ('utf-8' codec can't decode"),
    "0 bytes": ("csv", b"", "CSV (No columns to parse from file)"),
    "a broken JSON line": ("jsonl", b'{"sentence": "a", "label": 1}\n{"sentence": "b",\n', "JSON Lines (Expected"),
    "a corrupted Parquet": ("parquet", b"PAR1 not really parquet", "Parquet ("),
}


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_a_file_the_reader_cannot_parse_is_named_with_its_reason(tmp_path, case):
    """Before: pandas' or pyarrow's traceback (ParserError, UnicodeDecodeError, EmptyDataError, ArrowInvalid),
    nothing else named."""
    fmt, content, reason = UNREADABLE[case]
    path = _pair(tmp_path / "d", "train", content, fmt)
    with pytest.raises(DatasetError) as info:
        load_task(str(tmp_path / "d"))
    [problem] = info.value.problems
    assert problem.startswith(f"{path} cannot be read as {reason}"), problem
    assert "\n" not in problem and len(problem) < 400


def test_both_unreadable_files_of_a_pair_are_named_at_once(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "train.csv").write_bytes(b"")
    (folder / "validation.csv").write_bytes("sentence,label\nnaïve,1\n".encode("latin-1"))
    with pytest.raises(DatasetError) as info:
        load_task(str(folder))
    assert [p.split(" cannot be read")[0] for p in info.value.problems] == [
        f"{folder}/train.csv",
        f"{folder}/validation.csv",
    ]


def test_a_jsonl_file_with_a_byte_order_mark_is_read(tmp_path):
    """Before: ValueError "Expected object or value" (the BOM Windows' editors write)."""
    rows = '{"sentence": "fine", "label": 1}\n{"sentence": "dull", "label": 0}\n'
    path = _pair(tmp_path / "d", "train", b"\xef\xbb\xbf" + rows.encode(), "jsonl")
    task = load_task(str(path.parent))
    assert task.train.texts == ("fine", "dull") and task.num_labels == 2


def test_a_separator_at_the_end_of_every_row_shifts_no_column(tmp_path):
    """Before: pandas took the texts as the index, the labels as the texts, and a missing label crashed the
    row naming (ValueError: invalid literal for int())."""
    train = "sentence,label\nfine,pos,\ndull,neg,\ngood,pos,\nmeh,,\n"
    folder = _csv_pair(tmp_path / "d", train, "sentence,label\nx,pos,\ny,neg,\n")
    with pytest.raises(DatasetError) as info:
        load_task(folder)
    assert info.value.problems == [f"{folder}/train.csv: column 'label' has 1 missing or non-finite label(s), line 5"]
    (tmp_path / "d" / "train.csv").write_text(train.replace("meh,,", "meh,neg,"))
    task = load_task(folder)
    assert task.train.texts == ("fine", "dull", "good", "meh") and task.label_names == ("neg", "pos")


def test_fields_past_the_header_are_refused_by_their_lines(tmp_path):
    """Before: a field past the header's on every row shifted every column silently (the texts read as the
    index); on one row only (an unquoted comma in a text), a traceback."""
    every = "sentence,label\nfine,1,2020\ndull,0,2021\ngreat, really,1\n"
    folder = _csv_pair(tmp_path / "d", every, "sentence,label\nx,1\ny,0\n")
    with pytest.raises(DatasetError) as info:
        load_task(folder)
    assert [p.split(": a comma")[0] for p in info.value.problems] == [
        f"{folder}/train.csv cannot be read as CSV (more fields than its header's 2 on line(s) 2, 3, 4)"
    ]
    # a review: an unlabelled row-number column first (df.to_csv(index_label=False), R's write.table) read
    # as pandas always read it, its numbers dropped
    numbered = _csv_pair(
        tmp_path / "n", "sentence,label\n0,fine,1\n1,great,1\n2,dull,0\n", "sentence,label\nx,1\ny,0\n"
    )
    assert load_task(numbered).train.texts == ("fine", "great", "dull")
    (tmp_path / "d" / "train.csv").write_text("sentence,label\nfine,1\ngreat, really,1\ndull,0\n")
    with pytest.raises(DatasetError) as info:
        load_task(folder)
    assert [p.split(": a comma")[0] for p in info.value.problems] == [
        f"{folder}/train.csv cannot be read as CSV (Error tokenizing data. C error: Expected 2 fields in line 3, saw 3)"
    ]


def test_a_header_only_file_is_said_to_have_no_rows_once(tmp_path):
    """Before: three derived errors (unseen validation labels, 0 classes, and a size exceeding 0 rows)."""
    folder = _csv_pair(tmp_path / "d", "sentence,label\n", "sentence,label\nx,1\ny,0\n")
    with pytest.raises(DatasetError) as info:
        load_task(folder)
    assert info.value.problems == [f"{folder}/train.csv has no rows"]
    assert info.value.rows == {"validation": 2} and info.value.classes is None
    with pytest.raises(DatasetError) as info:  # every row dropped: said so
        load_task(_csv_pair(tmp_path / "e", "sentence,label\n ,1\n", "sentence,label\nx,1\ny,0\n"), empty_texts="drop")
    assert info.value.problems == [f"{tmp_path}/e/train.csv has no rows left after dropping 1 with an empty text"]


def test_a_train_file_in_a_format_not_read_is_named(tmp_path):
    """Before: `no train.{parquet,csv,tsv,jsonl,json} in …` of a folder holding train.xlsx."""
    folder = make_toy_dataset(tmp_path / "d", n_train=10, n_val=10, fmt="csv")
    (folder / "train.csv").rename(folder / "train.xlsx")
    with pytest.raises(DatasetError) as info:
        load_task(str(folder))
    assert info.value.problems == [
        f"no train.{{parquet,csv,tsv,jsonl,json}} in {folder}; found train.xlsx, a format not read "
        "(parquet, csv, tsv, jsonl, json)"
    ]


def test_scores_beyond_float32_are_refused_by_file_column_and_line(tmp_path):
    """Before: 1e39 passed (a numpy overflow warning only), then the trial diverged or its baseline was NaN."""
    train = "sentence,label\n" + "".join(f"row {i},{i / 4}\n" for i in range(6)) + "huge,1e39\n"
    folder = _csv_pair(tmp_path / "d", train, "sentence,label\nx,0.5\ny,-2e40\n")
    with pytest.raises(DatasetError) as info:
        load_task(folder)
    assert info.value.problems == [
        f"{folder}/train.csv: column 'label' has 1 score(s) beyond float32's range (±3.4e+38), line 8; rescale them",
        f"{folder}/validation.csv: column 'label' has 1 score(s) beyond float32's range (±3.4e+38), line 3; "
        "rescale them",
    ]


def test_a_one_row_validation_set_and_scores_that_never_vary_are_refused(tmp_path):
    """Before: accepted without a word: accuracy 1.000 on one row (every seed "collapsed"), Pearson of
    constant validation scores recorded as 0.000, and constant train scores trained on (where one class is
    refused)."""
    folder = _csv_pair(tmp_path / "one", "sentence,label\na,1\nb,0\nc,1\n", "sentence,label\nx,1\n")
    with pytest.raises(DatasetError) as info:
        load_task(folder)
    assert info.value.problems == [
        f"{folder}/validation.csv has 1 row: a validation set needs at least 2 (on one row every score is all "
        "or nothing)"
    ]
    folder = _csv_pair(tmp_path / "flat", "sentence,label\na,2.5\nb,2.5\n", "sentence,label\nx,3.0\ny,3.0\nz,\n")
    with pytest.raises(DatasetError) as info:
        load_task(folder)
    assert info.value.problems[1:] == [
        f"{folder}/train.csv: column 'label' has one score (2.5) on every row: nothing to learn; a regression "
        "task needs scores that vary",
        f"{folder}/validation.csv: column 'label' has one score (3) on every row: Pearson and Spearman are "
        "undefined on it; a regression task needs scores that vary",
    ]


def test_a_text_column_read_as_the_labels_is_said_briefly_with_a_hint(tmp_path):
    """Before: `label_column: review` listed 60 unseen "labels" as full review texts, one bullet of
    17,932 characters."""
    review = "a long review of a film that goes on and on about the plot, number {}"
    folder = tmp_path / "d"
    folder.mkdir()
    for split, n in (("train", 300), ("validation", 60)):
        texts = [review.format(f"{split}-{i}") for i in range(n)]
        pd.DataFrame({"review": texts, "sentiment": ["pos", "neg"] * (n // 2)}).to_csv(
            folder / f"{split}.csv", index=False
        )
    with pytest.raises(DatasetError) as info:
        load_task(str(folder), text_column="sentiment", label_column="review")
    [problem] = info.value.problems
    assert len(problem) < 700, problem
    assert "'a long review of a film that goes on an…'" in problem and "… and 55 more]" in problem
    assert problem.endswith("; 300 classes in 300 train rows: is label_column (training.label_column) a text column?")


def test_rows_are_named_by_their_own_lines_after_a_text_spanning_lines(tmp_path):
    """Before: a row's line was its place + 2, wrong after a quoted text of several lines or a blank line."""
    train = 'sentence,label\n"a text\nover three\nlines",pos\n\nb,neg\nc,\n'
    folder = _csv_pair(tmp_path / "d", train, "sentence,label\nx,pos\ny,neg\n")
    with pytest.raises(DatasetError) as info:
        load_task(folder)
    assert info.value.problems == [f"{folder}/train.csv: column 'label' has 1 missing or non-finite label(s), line 7"]


def test_a_stored_index_is_never_taken_for_a_row(tmp_path):
    """A Parquet file written with an index of its own (``df.iloc[::2].to_parquet``, or a text index):
    rows are named by their place in the file, never by the stored index (int() of a text crashed)."""
    frame = pd.DataFrame({"sentence": ["a", "b", "c", "d"], "label": ["pos", "neg", None, "pos"]}, index=list("wxyz"))
    folder = tmp_path / "d"
    folder.mkdir()
    frame.to_parquet(folder / "train.parquet")
    frame.iloc[[0, 1]].to_parquet(folder / "validation.parquet")
    with pytest.raises(DatasetError) as info:
        load_task(str(folder))
    assert info.value.problems == [
        f"{folder}/train.parquet: column 'label' has 1 missing or non-finite label(s), row (0-based) 2"
    ]
    # a review: an index named like a column ("cannot insert label, already exists") is dropped
    named = frame.fillna("pos").rename_axis("label")
    twin = tmp_path / "twin"
    twin.mkdir()
    named.to_parquet(twin / "train.parquet")
    named.iloc[[0, 1]].to_parquet(twin / "validation.parquet")
    assert load_task(str(twin)).train.texts == ("a", "b", "c", "d")
