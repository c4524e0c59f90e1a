import numpy as np
import pytest
import torch

from freezesweep.trials.data import Split
from freezesweep.trials.tokens import (
    WHOLE_SPLIT_SHARE,
    Tokens,
    collate,
    eval_batches,
    tokenize_rows,
    tokenize_split,
    train_batches,
)


class CountingTokenizer:
    def __init__(self, inner):
        self.inner, self.calls = inner, 0
        self.model_input_names = inner.model_input_names

    def __len__(self):
        return len(self.inner)

    def __call__(self, texts, *pairs, **kw):
        if isinstance(texts, list):
            self.calls += 1
            self.rows += len(texts)
        return self.inner(texts, *pairs, **kw)

    rows = 0  # rows encoded in list calls (the probe sentence is not one)


def test_tokenization_is_cached_on_disk(minilm_tokenizer, tmp_path):
    from freezesweep.trials.worker import WorkerState

    split = Split("train", ("a good film", "a bad one", "fine"), np.array([1, 0, 1]))
    counting = CountingTokenizer(minilm_tokenizer)
    first = tokenize_split(counting, split, 16, tmp_path, WorkerState())
    second = tokenize_split(counting, split, 16, tmp_path, WorkerState())  # as a fresh process would: from disk
    assert counting.calls == 1
    assert len(list((tmp_path / "tokens").glob("*.parquet"))) == 1
    assert [a.tolist() for a in first.input_ids] == [b.tolist() for b in second.input_ids]
    assert first.token_type_ids is None  # single sentences: the model's default segment 0
    changed = Split("train", ("a good film", "a bad one", "not fine"), np.array([1, 0, 1]))
    tokenize_split(counting, changed, 16, tmp_path)
    assert counting.calls == 2  # new content, new entry


@pytest.mark.parametrize("pairs", [False, True])
def test_a_few_rows_are_tokenized_alone_each_once_as_the_whole_split_gives_them(minilm_tokenizer, tmp_path, pairs):
    from freezesweep.trials.worker import WorkerState

    texts = tuple(f"row {i} says {'good ' * (i % 7)}things" for i in range(400))
    split = Split("train", texts, np.arange(400) % 2, pairs=tuple(f"pair {i}" for i in range(400)) if pairs else None)
    few = np.array([7, 3, 300, 7 + 1])
    assert len(few) < WHOLE_SPLIT_SHARE * len(split)
    counting, worker = CountingTokenizer(minilm_tokenizer), WorkerState()
    alone = tokenize_rows(counting, split, few, 16, tmp_path, worker)
    assert counting.rows == len(few)  # not the 400 of the split
    assert not (tmp_path / "tokens").exists()  # nor the split's disk cache
    more = np.array([300, 3, 11])  # two it has, one it has not
    again = tokenize_rows(counting, split, more, 16, tmp_path, worker)
    assert counting.rows == len(few) + 1
    whole = tokenize_split(minilm_tokenizer, split, 16, tmp_path, WorkerState())
    for rows, tokens in ((few, alone), (more, again)):
        assert [a.tolist() for a in tokens.input_ids] == [whole.input_ids[i].tolist() for i in rows]
        assert (tokens.token_type_ids is None) == (not pairs)
        if pairs:
            assert [a.tolist() for a in tokens.token_type_ids] == [whole.token_type_ids[i].tolist() for i in rows]
    assert alone.input_ids[0].dtype == whole.input_ids[0].dtype  # batches pad them alike


def test_a_large_share_of_a_split_reads_the_whole_split_cached_on_disk(minilm_tokenizer, tmp_path):
    from freezesweep.trials.worker import WorkerState

    split = Split("train", tuple(f"row {i}" for i in range(40)), np.arange(40) % 2)
    counting = CountingTokenizer(minilm_tokenizer)
    rows = np.arange(0, 40, 4)  # a quarter
    tokens = tokenize_rows(counting, split, rows, 16, tmp_path, WorkerState())
    assert counting.rows == len(split) and len(list((tmp_path / "tokens").glob("*.parquet"))) == 1
    assert len(tokens) == len(rows)
    tokenize_rows(counting, split, rows[:1], 16, tmp_path, WorkerState())  # a fresh worker, a few rows: tokenized alone
    assert counting.rows == len(split) + 1


def test_dynamic_padding_and_length_sorted_eval():
    ids = Tokens(tuple(np.arange(1, n + 1) for n in (5, 2, 9, 3, 7, 4)))
    labels = np.arange(6) % 2
    batches = eval_batches(ids, labels, batch_size=2, pad_id=0)
    widths = [b.input_ids.shape[1] for b in batches]
    assert widths == sorted(widths) == [3, 5, 9]
    assert sum(int(b.attention_mask.sum()) for b in batches) == 30
    train = train_batches(ids, labels, 4, 0, torch.Generator().manual_seed(0))
    assert [len(b.labels) for b in train] == [4, 2]
    for b in train:  # each batch pads to its own longest row only
        assert b.input_ids.shape[1] == int(b.attention_mask.sum(1).max())


PAIRS = Split(
    "validation",
    ("A man is playing a guitar on the stage tonight.", "Short one.", "word " * 60),
    np.array([1, 0, 1]),
    pairs=("Someone plays music.", "A rather longer second sentence " * 8, "tail"),
)


def test_pairs_are_the_tokenizers_own_pair_encoding(minilm_tokenizer, tmp_path):
    tokens = tokenize_split(minilm_tokenizer, PAIRS, 32, tmp_path)
    for i, (a, b) in enumerate(zip(PAIRS.texts, PAIRS.pairs)):
        expected = minilm_tokenizer(a, b, truncation="longest_first", max_length=32)
        assert tokens.input_ids[i].tolist() == expected["input_ids"]
        assert tokens.token_type_ids[i].tolist() == expected["token_type_ids"]
        assert 0 in expected["token_type_ids"] and 1 in expected["token_type_ids"]  # both segments kept tokens
    assert max(len(x) for x in tokens.input_ids) == 32  # truncated, longest first
    batch = collate(tokens, PAIRS.labels, minilm_tokenizer.pad_token_id)
    assert set(batch.model_inputs()) == {"input_ids", "attention_mask", "token_type_ids"}
    assert batch.token_type_ids.shape == batch.input_ids.shape
    assert int(batch.token_type_ids[batch.attention_mask == 0].abs().sum()) == 0  # padding is segment 0, masked


def test_a_tokenizer_without_segment_ids_gives_the_model_none(minilm_tokenizer, tmp_path):
    """RoBERTa's tokenizer has no token_type_ids among its model inputs; its model must get none."""
    import copy

    roberta_like = copy.deepcopy(minilm_tokenizer)
    roberta_like.model_input_names = ["input_ids", "attention_mask"]
    tokens = tokenize_split(roberta_like, PAIRS, 32, tmp_path)
    assert tokens.token_type_ids is None
    assert (
        tokens.input_ids[0].tolist()
        == roberta_like(PAIRS.texts[0], PAIRS.pairs[0], truncation="longest_first", max_length=32)["input_ids"]
    )
    assert set(collate(tokens, PAIRS.labels, 0).model_inputs()) == {"input_ids", "attention_mask"}


def test_regression_labels_stay_floats():
    batch = collate(Tokens((np.array([1, 2]), np.array([3]))), np.array([4.75, 0.2], dtype=np.float32), 0)
    assert batch.labels.dtype == torch.float32 and batch.labels.tolist() == pytest.approx([4.75, 0.2])
