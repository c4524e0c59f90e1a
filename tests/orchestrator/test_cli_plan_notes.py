"""orchestrator/cli.py's ``plan``: the notes a launch prints of the spec are printed by its dry run too."""

import pandas as pd
import pytest
from typer.testing import CliRunner

from freezesweep.orchestrator.cli import app

runner = CliRunner()


def test_plan_says_which_rows_empty_texts_drop_would_leave_out(write_spec, tmp_path, monkeypatch):
    """Before: only `launch` said "dropped 6 train … row(s)"; the dry run that should warn of it did not."""
    import ray

    monkeypatch.setattr(ray, "init", lambda *args, **kwargs: pytest.fail("plan started Ray"))
    folder = tmp_path / "gappy"
    folder.mkdir()
    rows = pd.DataFrame(
        {"sentence": [f"row {i}" if i % 10 else "" for i in range(60)], "label": [i % 2 for i in range(60)]}
    )
    for split in ("train", "validation"):
        rows.to_csv(folder / f"{split}.csv", index=False)
    path = write_spec("gappy", datasets=[str(folder)], train_sizes=[24], training={"empty_texts": "drop"})
    done = runner.invoke(app, ["plan", str(path)])
    assert done.exit_code == 0, done.output
    said = done.stdout.replace("\n", "")
    assert (
        f"note: {folder}: dropped 6 train and 6 validation row(s) with an empty or missing text "
        "(training.empty_texts: drop)" in said
    )
    assert "note: a fixed grid of 1 seed gives no freezing advice" in said  # the plan's own note, as before


def test_plan_says_float_labels_that_look_like_classes_are_read_as_scores(write_spec, tmp_path):
    """A walk-through: labels 0.0/1.0 became a regression task with no word (and JSONL's a classification)."""
    folder = tmp_path / "floats"
    folder.mkdir()
    rows = pd.DataFrame({"sentence": [f"row {i}" for i in range(60)], "label": [float(i % 2) for i in range(60)]})
    for split in ("train", "validation"):
        rows.to_json(folder / f"{split}.jsonl", orient="records", lines=True)
    done = runner.invoke(app, ["plan", str(write_spec("floats", datasets=[str(folder)], train_sizes=[24]))])
    assert done.exit_code == 0, done.output
    assert f"note: {folder}: labels are floats that are all whole numbers" in done.stdout.replace("\n", "")


def test_plan_says_a_tokenizer_marks_nothing_between_a_pairs_texts(write_spec, tmp_path, toy_pairs, tiny_bert):
    """A walk-through: GPT-2 (a tokenizer without a pair template) on MRPC and STS-B glued each pair's texts
    into one without a word; a BERT tokenizer's [SEP] marks it (no note)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, PreTrainedTokenizerFast

    from tests.conftest import save_tiny

    words = {
        w
        for text in pd.read_parquet(f"{toy_pairs}/train.parquet")[["sentence1", "sentence2"]].stack()
        for w in text.split()
    }
    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", *sorted(words)])}
    plain = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    plain.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=plain, unk_token="<unk>", pad_token="<pad>", eos_token="<pad>")
    config = GPT2Config(vocab_size=len(vocab), n_embd=32, n_layer=2, n_head=2, n_positions=128, pad_token_id=0)
    gpt = save_tiny(tmp_path / "gpt", config, tokenizer)
    columns = {"text_column": "sentence1", "text_pair_column": "sentence2"}
    done = runner.invoke(
        app,
        ["plan", str(write_spec("pairs", models=[gpt, tiny_bert], model=None, datasets=[toy_pairs], training=columns))],
    )
    assert done.exit_code == 0, done.output
    said = done.stdout.replace("\n", " ")
    assert f"note: {gpt}: its tokenizer marks nowhere where a pair's second text starts ({toy_pairs})" in said, (
        done.output
    )
    assert f"note: {tiny_bert}:" not in said
