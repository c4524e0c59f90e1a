"""The opt-in training cache: off by default; on, it trains exactly what a model whose frozen layers
have no dropout trains, and a cell's result does not depend on what ran before it in the worker."""

import dataclasses

import numpy as np
import pytest

from tests.conftest import save_tiny
from freezesweep.trials import train_cache
from freezesweep.trials.run import run_trial


@pytest.fixture(scope="module")
def tiny_bert_no_dropout(tmp_path_factory, minilm_tokenizer) -> str:
    """Without dropout the frozen layers are deterministic in training too, so the cached path must
    train the same model as the uncached one (up to float rounding of per-row vs padded batches)."""
    from transformers import BertConfig

    config = BertConfig(
        vocab_size=len(minilm_tokenizer),
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return save_tiny(tmp_path_factory.mktemp("tiny-bert-no-dropout"), config, minilm_tokenizer)


def test_off_by_default_and_part_of_the_identity(tiny_trial, worker):
    cfg = dataclasses.replace(tiny_trial, frozen_layers=1)
    assert run_trial(cfg, worker=worker).train_cached_layers is None and train_cache.entries(worker) == []
    assert dataclasses.replace(cfg, train_cache=True).trial_id != cfg.trial_id
    nothing_frozen = dataclasses.replace(cfg, frozen_layers=0)  # the flag cannot change such a cell: same id
    assert dataclasses.replace(nothing_frozen, train_cache=True).trial_id == nothing_frozen.trial_id
    assert run_trial(dataclasses.replace(nothing_frozen, train_cache=True), worker=worker).train_cached_layers is None


@pytest.mark.parametrize("k", [1, 2])
def test_cached_training_equals_training_without_dropout_in_the_frozen_layers(
    tiny_trial, tiny_bert_no_dropout, k, worker
):
    cfg = dataclasses.replace(tiny_trial, model=tiny_bert_no_dropout, frozen_layers=k, epochs=3)
    plain = run_trial(cfg, worker=worker)
    cached = run_trial(dataclasses.replace(cfg, train_cache=True), worker=worker)
    assert plain.train_cached_layers is None and cached.train_cached_layers == k
    np.testing.assert_allclose(
        [loss for _, loss in cached.train_loss_curve], [loss for _, loss in plain.train_loss_curve], rtol=1e-4
    )
    np.testing.assert_allclose([p.loss for p in cached.eval_curve], [p.loss for p in plain.eval_curve], rtol=1e-4)


def test_with_dropout_the_cache_is_a_real_deviation(tiny_trial, worker):
    cfg = dataclasses.replace(tiny_trial, frozen_layers=1, epochs=3)
    plain, cached = run_trial(cfg, worker=worker), run_trial(dataclasses.replace(cfg, train_cache=True), worker=worker)
    assert plain.train_loss_curve != cached.train_loss_curve


def test_nested_subsets_share_rows_and_history_does_not_change_a_result(tiny_trial, worker):
    cfg = dataclasses.replace(tiny_trial, frozen_layers=1, train_cache=True, train_size=24)
    fresh = run_trial(cfg, worker=worker)
    assert train_cache.entries(worker) == [24]
    run_trial(dataclasses.replace(cfg, train_size=48), worker=worker)  # a superset: only its 24 new rows are computed
    assert train_cache.entries(worker) == [48]
    worker.clear()
    run_trial(dataclasses.replace(cfg, train_size=48), worker=worker)
    after_bigger = run_trial(cfg, worker=worker)  # served entirely from rows another cell computed
    assert after_bigger.train_loss_curve == fresh.train_loss_curve
    assert [p.loss for p in after_bigger.eval_curve] == [p.loss for p in fresh.eval_curve]


def _budgeted(max_bytes: int):
    from freezesweep.trials.worker import MAX_TRAIN_ENTRIES, Lru, WorkerState, rows_bytes

    return WorkerState(train_states=Lru(MAX_TRAIN_ENTRIES, max_bytes, rows_bytes))


def test_the_worker_keeps_its_training_states_within_the_budget(tiny_trial):
    """Room for one entry of 24 rows: a second depth's entry is made and the first goes; an entry that
    grows past the budget alone (48 rows) is used by its trial, not kept, and drops no other. Each trial
    trains as it does in a worker with room."""
    from freezesweep.trials.worker import WorkerState, rows_bytes

    cfg = dataclasses.replace(tiny_trial, frozen_layers=1, train_cache=True, train_size=24, epochs=1)
    roomy = WorkerState()
    run_trial(cfg, worker=roomy)
    (entry,) = roomy.train_states.values()
    assert rows_bytes(entry) == sum(t.nbytes for t in entry.rows.values()) > 0  # counted as rows are added
    worker = _budgeted(rows_bytes(entry))
    for at in (cfg, dataclasses.replace(cfg, frozen_layers=2), dataclasses.replace(cfg, train_size=48)):
        kept, alone = run_trial(at, worker=worker), run_trial(at, worker=WorkerState())
        assert kept.train_cached_layers == at.frozen_layers and kept.train_loss_curve == alone.train_loss_curve
        assert worker.train_states.held_bytes() <= worker.train_states.max_bytes
        assert [key.layer for key in worker.train_states] == [at.frozen_layers if at.train_size == 24 else 2]
