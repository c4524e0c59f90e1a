"""orchestrator/checks.py's data checks with files of a user's own (a new user's walk-through): a file the
reader cannot read is one problem among the others, before any trial (exit 2); a dataset's classes are
listed briefly; and a probe that would fail inside every trial on a rare class is refused up front."""

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from freezesweep.orchestrator.checks import load_spec
from freezesweep.orchestrator.cli import app
from freezesweep.orchestrator.spec import SpecError
from freezesweep.trials.data import DatasetError, load_task
from freezesweep.trials.probe import MIN_FOLD_ROWS, ProbeError, _folds
from freezesweep.trials.subsets import subset_indices


def _problems(path) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return info.value.problems


def _folder(root, name: str, train: pd.DataFrame, validation: pd.DataFrame) -> str:
    folder = root / name
    folder.mkdir(parents=True)
    train.to_csv(folder / "train.csv", index=False)
    validation.to_csv(folder / "validation.csv", index=False)
    return str(folder)


def _rows(labels: list) -> pd.DataFrame:
    return pd.DataFrame({"sentence": [f"row {i}" for i in range(len(labels))], "label": labels})


def test_an_unreadable_file_is_one_problem_among_the_others(write_spec, toy_dataset, tiny_bert, tmp_path):
    """Before: `;`-separated CSV with commas in its texts: pandas' ParserError traceback (exit 1), which hid
    the spec's other problems (here a seed given twice and another dataset's train size)."""
    folder = tmp_path / "semi"
    folder.mkdir()
    (folder / "train.csv").write_text("sentence;label\ngreat, really;1\nawful, just awful;0\nfine, ok;1\n")
    pd.DataFrame({"sentence": ["x", "y"], "label": [1, 0]}).to_csv(folder / "validation.csv", index=False)
    problems = _problems(write_spec(datasets=[str(folder), toy_dataset], train_sizes=[24, 500], seeds=[0, 0]))
    said = "\n".join(problems)
    assert (
        f"datasets: {folder}: {folder}/train.csv cannot be read as CSV (its header 'sentence;label' is one "
        "column; are its fields separated by ';'?): a comma-separated file, UTF-8" in said
    )
    assert "duplicate values [0]" in said and f"[500] exceed the 240 train rows of {toy_dataset}" in said
    # one trial, as `freezesweep trial` runs it: the same checks, exit 2, the file named
    args = ["trial", "--model", tiny_bert]
    done = CliRunner().invoke(app, [*args, "--dataset", str(folder), "--train-size", "2", "--frozen-layers", "0"])
    assert done.exit_code == 2 and f"{folder}/train.csv cannot be read as CSV" in done.stderr, done.output


def test_a_header_only_train_file_is_one_problem_not_three(write_spec, tmp_path):
    """Before: unseen validation labels, 0 classes, and "train_sizes: [24, 48] exceed the 0 train rows"."""
    folder = _folder(tmp_path, "empty", _rows([]), _rows(["pos", "neg"]))
    assert _problems(write_spec(datasets=[folder])) == [f"datasets: {folder}: {folder}/train.csv has no rows"]


def test_many_classes_are_listed_briefly_with_a_hint(write_spec, tmp_path):
    """Before: `label_column: review` (the text and label columns swapped) made one bullet of 17,932
    characters: every "rarest class" and every unseen label, each a whole review."""
    review = "a long review of a film that goes on and on about the plot, number {}"
    train = pd.DataFrame({"review": [review.format(i) for i in range(60)], "sentiment": ["pos", "neg"] * 30})
    validation = pd.DataFrame({"review": [review.format(i) for i in range(40, 60)], "sentiment": ["pos"] * 20})
    folder = _folder(tmp_path, "swapped", train, validation)
    training = {"text_column": "sentiment", "label_column": "review"}
    problems = _problems(write_spec(datasets=[folder], train_sizes=[24], training=training))
    [sizes] = [p for p in problems if p.startswith("train_sizes:")]
    assert len(sizes) < 700 and "… and 31 more)" in sizes, sizes
    assert sizes.endswith("; 60 classes in 60 train rows: is label_column (training.label_column) a text column?")


def _rare(tmp_path, counts: dict[str, int]) -> str:
    labels = [name for name, n in counts.items() for _ in range(n)]
    return _folder(tmp_path, "rare", _rows(labels), _rows(list(counts) * 2))


def test_a_probe_on_a_rare_class_is_refused_before_any_trial(write_spec, tmp_path):
    """Before: ProbeError inside the trial ("needs at least 2 rows of each of at least 2 classes there
    (class 0: 1, …)"), retried by Ray, and failing again on every `resume` the CLI suggested."""
    folder = _rare(tmp_path, {"good": 40, "bad": 40, "meh": 3})
    sizes = [3, 8, 24, 80]
    spec = write_spec(datasets=[folder], train_sizes=sizes, methods=["freeze", "probe"])
    [problem] = _problems(spec)
    # what each subset holds of each class, drawn as the trial draws it from the labels as it encodes them
    task = load_task(folder)
    held = {n: np.bincount(task.train.labels[subset_indices(task.train.labels, n, 0)], minlength=3) for n in sizes}
    short = {n: [(task.label_names[c], int(h[c])) for c in np.flatnonzero(h < MIN_FOLD_ROWS)] for n, h in held.items()}
    short = {n: few for n, few in short.items() if few}
    assert short and 80 not in short  # the test means something: some sizes fall short, one does not
    said = "; ".join(
        f"n = {n}: " + ", ".join(f"{name!r} ({c} row{'s' * (c != 1)})" for name, c in few) for n, few in short.items()
    )
    assert problem == (
        f"train_sizes: {list(short)} give the probe fewer than 2 rows of a class in the stratified train subset "
        f"of {folder} ({said}), where its cross-validation needs 2 of each (a larger train size, or methods "
        "without probe for this dataset)"
    )
    assert "'meh'" in problem
    load_spec(write_spec(datasets=[folder], train_sizes=sizes))  # no probe cells: nothing to refuse


def test_a_class_too_rare_for_any_train_size_is_said_to_be(write_spec, tmp_path):
    folder = _rare(tmp_path, {"good": 40, "bad": 40, "meh": 1})
    [problem] = _problems(write_spec(datasets=[folder], train_sizes=[24, 81], methods=["freeze", "probe"]))
    assert problem.startswith("train_sizes: [24, 81] give the probe fewer than 2 rows of a class")
    assert problem.endswith(
        "(n = 24: 'meh' (1 row); n = 81: 'meh' (1 row)), where its cross-validation needs 2 of each ('meh' has "
        "fewer than 2 train rows in all: more rows of it, or methods without probe for this dataset)"
    )


def test_a_regression_probe_on_one_train_row_is_refused(write_spec, tmp_path):
    scores = [i / 10 for i in range(30)]
    folder = _folder(tmp_path, "scores", _rows(scores), _rows(scores[:6]))
    problems = _problems(write_spec(datasets=[folder], train_sizes=[1, 24], methods=["probe"], frozen_layers=[]))
    assert problems == [
        f"train_sizes: [1]: the probe needs at least 2 train rows of {folder} to cross-validate (a larger train "
        "size, or methods without probe for this dataset)"
    ]


def test_the_probes_own_error_names_a_class_as_the_files_write_it():
    with pytest.raises(ProbeError, match=r"\('good': 5, 'meh': 1\): a larger train size"):
        _folds(np.array([0] * 5 + [1]), False, 5, 0, ("good", "meh"))
    with pytest.raises(ProbeError, match=r"\(class 0: 5, class 1: 1\)"):  # no names given: the ids
        _folds(np.array([0] * 5 + [1]), False, 5, 0)


def _misspelled_label_column(tmp_path) -> str:
    """The walk-through's `mydata/bad`: train has an empty label (line 22) and `Pos`, `pos ` beside
    `pos`; validation's label column is misspelled `lable`."""
    labels = ["pos" if i % 2 else "neg" for i in range(25)]
    labels[3], labels[5], labels[20] = "Pos", "pos ", ""
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "train.csv").write_text("sentence,label\n" + "".join(f"s{i},{v}\n" for i, v in enumerate(labels)))
    (folder / "validation.csv").write_text("sentence,lable\nx,pos\ny,neg\n")
    return str(folder)


def test_a_split_lacking_the_label_column_hides_no_label_problem_of_the_other(write_spec, tmp_path):
    """Before: only validation's missing `label` column was said; train's empty label and its labels
    spelled three ways came only once validation's header was mended."""
    folder = _misspelled_label_column(tmp_path)
    problems = _problems(write_spec(datasets=[folder]))
    assert problems[0] == (
        f"datasets: {folder}: no column 'label' (training.label_column in a spec, --label-column for a trial) "
        "in the validation split (columns: sentence, lable)"
    )
    assert f"datasets: {folder}: {folder}/train.csv: column 'label' has 1 missing or non-finite label(s), line 22" in (
        problems
    )
    [spellings] = [p for p in problems if "differ only in case or whitespace" in p]
    assert "'Pos' (1 row: " in spellings and "'pos ' (1 row: " in spellings and "'pos' (10 rows)" in spellings
    # validation's labels, unread, are not said to be unseen by train
    assert not any("never has" in p for p in problems)


def test_a_missing_column_names_each_splits_own_columns(tmp_path):
    """Before: `label_column: review` said "(columns: sentence, label)" for both splits, though
    validation's are `sentence, lable`."""
    folder = _misspelled_label_column(tmp_path)
    with pytest.raises(DatasetError) as info:
        load_task(folder, label_column="review")
    assert info.value.problems[0] == (
        "no column 'review' (training.label_column in a spec, --label-column for a trial) in the train and "
        "validation split (train columns: sentence, label; validation columns: sentence, lable)"
    )


def test_a_train_split_lacking_the_label_column_hides_no_label_problem_of_validation(tmp_path):
    """The other way round: validation's own label problems are said beside train's missing column; what
    needs train's labels (unseen labels, too few classes) waits for it."""
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "train.csv").write_text("sentence,lable\na,pos\nb,neg\n")
    (folder / "validation.csv").write_text("sentence,label\nx,pos\ny,\nz,Pos\nw,pos\n")
    with pytest.raises(DatasetError) as info:
        load_task(str(folder))
    missing, empty, spellings = info.value.problems
    assert missing.endswith("in the train split (columns: sentence, lable)")
    assert empty == f"{folder}/validation.csv: column 'label' has 1 missing or non-finite label(s), line 3"
    assert spellings.startswith(f"label column 'label': 'Pos' (1 row: {folder}/validation.csv line 4), 'pos' (2 rows)")
    # scores too: validation's floats are the only labels to go by
    (folder / "validation.csv").write_text("sentence,label\nx,0.5\ny,\nz,0.25\n")
    with pytest.raises(DatasetError) as info:
        load_task(str(folder))
    assert info.value.problems[1:] == [
        f"{folder}/validation.csv: column 'label' has 1 missing or non-finite score(s), line 3"
    ]
