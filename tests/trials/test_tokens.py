import numpy as np
import torch

from trials.data import Split
from trials.tokens import eval_batches, tokenize_split, train_batches


class CountingTokenizer:
    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def __len__(self):
        return len(self.inner)

    def __call__(self, texts, **kw):
        self.calls += isinstance(texts, list)
        return self.inner(texts, **kw)


def test_tokenization_is_cached_on_disk(minilm_tokenizer, tmp_path):
    from trials import tokens

    split = Split("train", ("a good film", "a bad one", "fine"), np.array([1, 0, 1]))
    counting = CountingTokenizer(minilm_tokenizer)
    first = tokenize_split(counting, split, 16, tmp_path)
    tokens._read_cache.cache_clear()  # as a fresh process would be
    second = tokenize_split(counting, split, 16, tmp_path)
    assert counting.calls == 1
    assert len(list((tmp_path / "tokens").glob("*.parquet"))) == 1
    assert [a.tolist() for a in first] == [b.tolist() for b in second]
    changed = Split("train", ("a good film", "a bad one", "not fine"), np.array([1, 0, 1]))
    tokenize_split(counting, changed, 16, tmp_path)
    assert counting.calls == 2  # new content, new entry


def test_dynamic_padding_and_length_sorted_eval():
    ids = tuple(np.arange(1, n + 1) for n in (5, 2, 9, 3, 7, 4))
    labels = np.arange(6) % 2
    batches = eval_batches(ids, labels, batch_size=2, pad_id=0)
    widths = [b.input_ids.shape[1] for b in batches]
    assert widths == sorted(widths) == [3, 5, 9]
    assert sum(int(b.attention_mask.sum()) for b in batches) == 30
    train = train_batches(ids, labels, 4, 0, torch.Generator().manual_seed(0))
    assert [len(b.labels) for b in train] == [4, 2]
    for b in train:  # each batch pads to its own longest row only
        assert b.input_ids.shape[1] == int(b.attention_mask.sum(1).max())
