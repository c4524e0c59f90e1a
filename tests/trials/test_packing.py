"""The last layer narrowed to the head's token, and packed training batches: the same function of the
same weights as the padded, full model; used only where a model shows it."""

import dataclasses

import numpy as np
import pytest
import torch

from tests.conftest import save_tiny
from freezesweep.trials.worker import WorkerState
from freezesweep.trials import first_token
from freezesweep.trials.data import load_task
from freezesweep.trials.model import load_tokenizer
from freezesweep.trials import packing
from freezesweep.trials.eval_cache import eval_mode
from freezesweep.trials.packing import (
    AdditiveMaskFeed,
    PackedFeed,
    PaddedFeed,
    evaluation_feed,
    pack,
    position_offset,
    training_feed,
    widened,
)
from freezesweep.trials.syncs import HostSyncs
from freezesweep.trials.run import initial_model, run_trial
from freezesweep.trials.tokens import collate, tokenize_split


def _model_and_batch(cfg, tmp_path, rows=12):
    task = load_task(cfg.dataset, text_column=cfg.text_column, text_pair_column=cfg.text_pair_column)
    tokenizer = load_tokenizer(cfg.model)
    ids = tokenize_split(tokenizer, task.train, 128, tmp_path)
    chosen = np.arange(rows)
    batch = collate(_ragged(ids.select(chosen)), task.train.labels[chosen], tokenizer.pad_token_id)
    assert len(set(batch.attention_mask.sum(1).tolist())) > 1, "rows of different lengths: padding to remove"
    return initial_model(cfg, task.num_labels, WorkerState()), batch


def test_pack_keeps_each_rows_tokens_positions_and_first_token():
    batch = collate(_tokens([[101, 7, 102], [101], [101, 102]]), np.array([1, 0, 1]), pad_id=0)
    packed = pack(batch, position_offset=2)
    assert packed.input_ids.tolist() == [[101, 7, 102, 101, 101, 102]]
    assert packed.position_ids.tolist() == [[2, 3, 4, 2, 2, 3]]  # restarting per row, from the offset
    assert packed.sequence.tolist() == [0, 0, 0, 1, 2, 2] and packed.first_tokens.tolist() == [0, 3, 4]
    mask = packed.model_inputs()["attention_mask"][0, 0]
    assert (mask == 0).tolist() == [[s == t for t in [0, 0, 0, 1, 2, 2]] for s in [0, 0, 0, 1, 2, 2]]


def _ragged(tokens):
    """The rows cut to different lengths (the toy rows are all alike), each still ending in its own
    last token (the separator)."""

    def cut(rows):
        return tuple(np.concatenate([r[: max(1, len(r) - 1 - i % 4)], r[-1:]]) for i, r in enumerate(rows))

    from freezesweep.trials.tokens import Tokens

    return Tokens(cut(tokens.input_ids), None if tokens.token_type_ids is None else cut(tokens.token_type_ids))


def _tokens(rows):
    from freezesweep.trials.tokens import Tokens

    return Tokens(input_ids=tuple(np.array(r) for r in rows), token_type_ids=None)


@pytest.mark.parametrize(
    "model_fixture,data_fixture",
    [("tiny_bert", "toy_dataset"), ("tiny_roberta", "toy_dataset"), ("tiny_bert", "toy_pairs")],
)
def test_narrowed_and_packed_logits_are_the_full_models(
    request, tiny_trial, tmp_path, model_fixture, data_fixture, worker
):
    pairs = {"text_column": "sentence1", "text_pair_column": "sentence2"} if data_fixture == "toy_pairs" else {}
    cfg = dataclasses.replace(
        tiny_trial, model=request.getfixturevalue(model_fixture), dataset=request.getfixturevalue(data_fixture), **pairs
    )
    model, batch = _model_and_batch(cfg, tmp_path)
    model.eval()
    reader, feed = training_feed(model, batch, ("test", model_fixture), worker.feed_verdicts)
    assert reader is not None and isinstance(feed, PackedFeed)
    with torch.no_grad():
        full = model(**batch.model_inputs()).logits
        with first_token.narrowed(model, reader):
            narrow = model(**batch.model_inputs()).logits
            packed = feed.logits(model, feed.prepare(batch))
    torch.testing.assert_close(narrow, full, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(packed, full, rtol=1e-5, atol=1e-6)
    assert reader.rows is None  # evaluation after a packed step reads position 0 again


def test_roberta_positions_start_after_its_padding_index(tiny_trial, tiny_roberta, worker):
    model = initial_model(dataclasses.replace(tiny_trial, model=tiny_roberta), 2, worker)
    assert position_offset(model) == model.config.pad_token_id + 1
    assert position_offset(initial_model(tiny_trial, 2, worker)) == 0


def test_a_head_that_reads_every_token_is_run_in_full(tiny_trial, tmp_path, worker):
    """A head pooling the mean of the last layer would get a different input from a narrowed layer:
    the check sees it, and the trial trains the full, padded model."""
    model, batch = _model_and_batch(tiny_trial, tmp_path)
    pooler = model.bert.pooler
    pooler.forward = lambda states: pooler.activation(pooler.dense(states.mean(1)))
    reader, feed = training_feed(model, batch, ("test", "mean-pooled"), worker.feed_verdicts)
    assert reader is None and isinstance(feed, PaddedFeed)


def test_a_model_without_the_bert_layout_runs_in_full_and_trains(tiny_trial, tmp_path, minilm_tokenizer, worker):
    from transformers import DistilBertConfig

    config = DistilBertConfig(vocab_size=len(minilm_tokenizer), dim=32, n_layers=2, n_heads=2, hidden_dim=64)
    cfg = dataclasses.replace(tiny_trial, model=save_tiny(tmp_path / "distil", config, minilm_tokenizer))
    model, batch = _model_and_batch(cfg, tmp_path)
    reader, feed = training_feed(model, batch, ("test", "distil"), worker.feed_verdicts)
    assert reader is None and isinstance(feed, PaddedFeed)
    assert run_trial(cfg, worker=worker).status == "ok"


def test_a_trial_trains_the_same_packed_and_narrowed_as_padded_and_full(tiny_trial, tmp_path, minilm_tokenizer, worker):
    """Without dropout (its masks are drawn per computed token), the two paths are one computation:
    the same losses at every evaluation, to float rounding, in fp32."""
    from transformers import BertConfig

    config = BertConfig(
        vocab_size=len(minilm_tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    cfg = dataclasses.replace(tiny_trial, model=save_tiny(tmp_path / "no-dropout", config, minilm_tokenizer), epochs=3)
    fast = run_trial(cfg, worker=worker)
    plain = run_trial(dataclasses.replace(cfg, narrow_last_layer=False, pack_training=False), worker=worker)
    assert [p.step for p in fast.eval_curve] == [p.step for p in plain.eval_curve]
    np.testing.assert_allclose([p.loss for p in fast.eval_curve], [p.loss for p in plain.eval_curve], rtol=1e-4)
    np.testing.assert_allclose(
        [loss for _, loss in fast.train_loss_curve], [loss for _, loss in plain.train_loss_curve], rtol=1e-4
    )
    assert fast.eval_curve[-1].loss < fast.eval_curve[0].loss  # it learned: the comparison is not of two no-ops


@pytest.mark.parametrize("model_fixture", ["tiny_bert", "tiny_roberta"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_a_graphed_evaluation_gets_its_padding_mask_prebuilt_where_exact(
    request, tiny_trial, tmp_path, model_fixture, attention, worker, monkeypatch
):
    """A CUDA graph's capture refuses what transformers' own mask building does with a padded batch
    (SDPA's ``padding_mask.all()``: a host sync per batch; 5.17's eager mask: a host tensor), so a
    graphed evaluation hands the model its mask prebuilt, additive and 4-D: where the model gives the
    same logits so, on rows padded wider than the check's. A mask the model reads otherwise: the plain feed."""
    model, batch = _model_and_batch(
        dataclasses.replace(tiny_trial, model=request.getfixturevalue(model_fixture)), tmp_path
    )
    model.set_attn_implementation(attention)
    pad_id = load_tokenizer(tiny_trial.model).pad_token_id
    feed = evaluation_feed(model, batch, pad_id, ("test", model_fixture, attention), worker.feed_verdicts)
    assert type(feed) is AdditiveMaskFeed
    wide = widened(batch, batch.input_ids.shape[1] + 5, pad_id)
    with torch.no_grad(), eval_mode(model), HostSyncs() as syncs:
        plain = model(**wide.model_inputs()).logits
        syncs.mark("prebuilt")
        prebuilt = feed.logits(model, wide)
    torch.testing.assert_close(prebuilt, plain, rtol=1e-5, atol=1e-6)
    assert syncs.events[syncs.events.index("mark:prebuilt") + 1 :] == []  # nothing read on the host
    if attention == "sdpa":  # the plain mask was read on the host, as a capture refuses
        assert "Tensor.__bool__" in syncs.events[: syncs.events.index("mark:prebuilt")]
    monkeypatch.setattr(packing, "mask_as", lambda mask, form: torch.zeros(mask.shape)[..., None, None, :])
    assert type(evaluation_feed(model, batch, pad_id, ("test", "unmasked"), {})) is PaddedFeed
