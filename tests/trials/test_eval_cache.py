"""The evaluation cache is exact: cached and uncached evaluation give identical accuracies and losses."""

import dataclasses

import pytest
import torch

from freezesweep.trials.worker import WorkerState
from freezesweep.trials import eval_cache
from freezesweep.trials.eval_cache import PrefixStates, matches_full_model, prefix_states, starting_at
from freezesweep.trials.run import run_trial
from tests.conftest import lacking


@pytest.mark.parametrize(
    "model_fixture,k", [("tiny_bert", 1), ("tiny_bert", 2), ("tiny_roberta", 1), ("tiny_roberta", 3)]
)
def test_cached_and_uncached_evaluation_are_identical_in_fp32(request, tiny_trial, model_fixture, k, worker):
    cfg = dataclasses.replace(tiny_trial, model=request.getfixturevalue(model_fixture), frozen_layers=k, epochs=3)
    uncached = run_trial(dataclasses.replace(cfg, eval_cache=False), worker=worker)
    cached = run_trial(cfg, worker=worker)
    assert uncached.eval_cached_layers is None and cached.eval_cached_layers == k
    assert [(p.step, p.accuracy, p.loss) for p in cached.eval_curve] == [
        (p.step, p.accuracy, p.loss) for p in uncached.eval_curve
    ]
    assert cached.train_loss_curve == uncached.train_loss_curve  # training is untouched
    again = run_trial(dataclasses.replace(cfg, seed=1), worker=worker)  # a later trial of the worker reuses the states
    assert [p.accuracy for p in again.eval_curve] != [] and again.status == "ok"
    assert again.eval_cached_layers == k and len(worker.eval_states) == 1


@pytest.mark.parametrize("max_eval_examples", [None, 40])
def test_what_the_memory_probe_counts_is_an_entrys_real_size(tiny_trial, worker, max_eval_examples):
    """``eval_cache_tokens`` (what ``gpus_per_trial: auto`` adds per entry, without a model or a device)
    is the token positions an entry holds a hidden state for, the validation rows evaluated (all, or
    a sample) padded per length-sorted batch."""
    from freezesweep.trials.run import eval_cache_tokens

    cfg = dataclasses.replace(tiny_trial, frozen_layers=1, epochs=1, max_eval_examples=max_eval_examples)
    run_trial(cfg, worker=worker)
    (entry,) = worker.eval_states.values()
    hidden = entry.states[0].shape[-1]
    assert eval_cache_tokens(cfg, WorkerState()) == sum(s.numel() for s in entry.states) // hidden
    assert sum(s.shape[0] for s in entry.states) == (max_eval_examples or 60)  # every row evaluated, or the sample


def test_nothing_frozen_is_never_cached(tiny_trial, worker):
    assert run_trial(tiny_trial, worker=worker).eval_cached_layers is None  # k = 0: every layer trains
    assert run_trial(dataclasses.replace(tiny_trial, frozen_layers=-1), worker=worker).eval_cached_layers is None
    assert len(worker.eval_states) == 0


def test_a_random_init_is_cached_under_its_seed(tiny_trial, worker):
    """A random init is the same for every cell of a seed (the worker's template), another seed's is
    not: each seed gets its own entry, and each cached trial evaluates as its uncached twin."""
    for seed in (0, 1):
        cfg = dataclasses.replace(tiny_trial, frozen_layers=1, model_init="random", seed=seed, epochs=1)
        uncached = run_trial(dataclasses.replace(cfg, eval_cache=False), worker=worker)
        cached = run_trial(cfg, worker=worker)
        assert cached.eval_cached_layers == 1 and uncached.eval_cached_layers is None
        assert [(p.accuracy, p.loss) for p in cached.eval_curve] == [(p.accuracy, p.loss) for p in uncached.eval_curve]
    assert sorted(key.base.weights for key in worker.eval_states) == sorted(
        {f"random-{c}" for c in _derived(tiny_trial)}
    )


def _derived(cfg) -> list[int]:
    return [dataclasses.replace(cfg, model_init="random", seed=seed).derived_seed for seed in (0, 1)]


def _setup(cfg):
    import tempfile
    from pathlib import Path

    from freezesweep.trials.data import load_task
    from freezesweep.trials.model import load_tokenizer
    from freezesweep.trials.precision import resolve_precision
    from freezesweep.trials.run import initial_model
    from freezesweep.trials.tokens import eval_batches, tokenize_split

    task = load_task(cfg.dataset)
    tokenizer = load_tokenizer(cfg.model)
    ids = tokenize_split(tokenizer, task.validation, 128, Path(tempfile.mkdtemp()))
    batches = eval_batches(ids, task.validation.labels, 32, tokenizer.pad_token_id)
    model = initial_model(cfg, task.num_labels, WorkerState())
    return model, batches, resolve_precision("fp32", torch.device("cpu")), torch.device("cpu")


def test_wrong_states_are_caught_by_the_check(tiny_trial, worker):
    """The per-trial check is what makes the cache safe: states that are off by a little fail it."""
    model, batches, plan, device = _setup(tiny_trial)
    prefix = prefix_states(model, batches, plan, device, 1, ("key",), worker)
    assert matches_full_model(model, batches[0], prefix, plan, device)
    nudged = PrefixStates(1, tuple(s * (1 + 1e-6) for s in prefix.states), prefix.tuple_output)
    assert not matches_full_model(model, batches[0], nudged, plan, device)
    original = model.base_model.encoder.layer
    with starting_at(model, prefix.layer, prefix.tuple_output):  # the injector, then the one trained layer of two
        assert isinstance(model.base_model.encoder.layer[0], eval_cache._Injector)
        assert model.base_model.encoder.layer[1] is original[1] and len(model.base_model.encoder.layer) == 2
    assert model.base_model.encoder.layer is original  # restored


def test_a_deeper_prefix_starts_from_a_cached_shallower_one_and_runs_no_layer_twice(tiny_trial, tiny_roberta, worker):
    model, batches, plan, device = _setup(dataclasses.replace(tiny_trial, model=tiny_roberta))
    layers = model.base_model.encoder.layer
    direct = prefix_states(
        model, batches, plan, device, 2, ("direct",), worker
    )  # from the embeddings: no k=1 under this key
    prefix_states(model, batches, plan, device, 1, ("key",), worker)
    calls = [0, 0, 0]
    hooks = [
        layer.register_forward_hook(lambda m, a, o, i=i: calls.__setitem__(i, calls[i] + 1))
        for i, layer in enumerate(layers)
    ]
    chained = prefix_states(model, batches, plan, device, 2, ("key",), worker)
    for hook in hooks:
        hook.remove()
    assert calls == [0, len(batches), 0]  # only layer 2: layer 1 came from the cache, layer 3 is never needed
    assert all(torch.equal(a, b) for a, b in zip(chained.states, direct.states))
    assert matches_full_model(model, batches[0], chained, plan, device)


def test_the_exactness_check_runs_once_per_cache_entry(tiny_trial, monkeypatch, worker):
    from freezesweep.trials import eval_cache as module

    checks = []
    real = module.matches_full_model
    monkeypatch.setattr(module, "matches_full_model", lambda *a: checks.append(a) or real(*a))
    cfg = dataclasses.replace(tiny_trial, frozen_layers=1)
    run_trial(cfg, worker=worker)
    run_trial(dataclasses.replace(cfg, seed=1), worker=worker)  # same entry: no second check
    assert len(checks) == 1
    run_trial(dataclasses.replace(cfg, frozen_layers=2), worker=worker)  # another layer: another entry, another check
    assert len(checks) == 2


def test_an_entry_that_fails_the_check_is_not_used_or_chained_from(tiny_trial, monkeypatch, worker):
    from freezesweep.trials import eval_cache as module

    checks, computed = [], []
    monkeypatch.setattr(module, "matches_full_model", lambda *a: checks.append(1) or False)
    real_compute = module._compute
    monkeypatch.setattr(module, "_compute", lambda *a, **k: computed.append(a[4]) or real_compute(*a, **k))
    worker.clear()
    result = run_trial(dataclasses.replace(tiny_trial, frozen_layers=1), worker=worker)
    assert result.eval_cached_layers is None and len(worker.eval_states) == 0
    again = run_trial(
        dataclasses.replace(tiny_trial, frozen_layers=1, seed=1), worker=worker
    )  # the same entry: refused at once
    assert again.eval_cached_layers is None and len(worker.eval_states) == 0 and checks == computed == [1]


def test_the_cache_is_exact_on_sentence_pairs(tiny_trial, toy_pairs, worker):
    """The cached prefix is computed with the pairs' segment ids: without them it would not match the full
    model, the check would refuse it, and eval_cached_layers would be None."""
    cfg = dataclasses.replace(
        tiny_trial, dataset=toy_pairs, text_column="sentence1", text_pair_column="sentence2", frozen_layers=1, epochs=3
    )
    uncached = run_trial(dataclasses.replace(cfg, eval_cache=False), worker=worker)
    cached = run_trial(cfg, worker=worker)
    assert cached.eval_cached_layers == 1
    assert cached.eval_curve == uncached.eval_curve  # every metric and the loss, bit for bit


@pytest.mark.parametrize("method", ["freeze", "probe"])
def test_a_prefix_weight_the_checkpoint_lacks_is_cached_per_seed(tiny_trial, tmp_path, worker, method):
    """Pretrained weights are every seed's, so their cached states serve every seed; a prefix weight
    the checkpoint lacks is drawn from each seed, and so are the states after it: each seed gets its
    own entry, and each cached trial scores as its uncached twin."""
    model = lacking(tiny_trial.model, tmp_path / "lacking", "encoder.layer.0.attention.self.query.weight")
    probe = {"frozen_layers": None, "probe_pooling": "auto", "probe_folds": 2, "probe_cs": 2}
    fields = {"frozen_layers": 1} if method == "freeze" else {"method": "probe", **probe}
    for seed in (0, 1):
        cfg = dataclasses.replace(tiny_trial, model=model, seed=seed, epochs=1, **fields)
        uncached = run_trial(dataclasses.replace(cfg, eval_cache=False), worker=WorkerState())
        cached = run_trial(cfg, worker=worker)
        assert cached.status == "ok" and cached.best_val_metrics == uncached.best_val_metrics
        assert [(p.accuracy, p.loss) for p in cached.eval_curve] == [(p.accuracy, p.loss) for p in uncached.eval_curve]
    assert len({key.base.weights for key in worker.eval_states}) == 2  # one per seed


def _budgeted(max_bytes: int) -> WorkerState:
    from freezesweep.trials.worker import MAX_EVAL_ENTRIES, Lru, states_bytes

    return WorkerState(eval_states=Lru(MAX_EVAL_ENTRIES, max_bytes, states_bytes))


def _entry_bytes(cfg) -> int:
    from freezesweep.trials.worker import states_bytes

    probe = WorkerState()
    run_trial(cfg, worker=probe)
    (entry,) = probe.eval_states.values()
    return states_bytes(entry)


def test_an_entry_that_would_pass_the_budget_alone_is_not_made(tiny_trial, monkeypatch):
    """A validation set too large for the worker's budget: priced from its first batch and not made (no
    layer past that batch runs for it), the trial evaluates in full as its uncached twin, and the refusal
    is no verdict on the model (a worker with room makes the entry)."""
    from freezesweep.trials import eval_cache as module

    cfg = dataclasses.replace(tiny_trial, frozen_layers=1, epochs=1)
    size = _entry_bytes(cfg)
    outputs = []
    real_output_of = module.output_of
    monkeypatch.setattr(module, "output_of", lambda *a: outputs.append(1) or real_output_of(*a))
    small = _budgeted(size - 1)
    refused = run_trial(cfg, worker=small)
    uncached = run_trial(dataclasses.replace(cfg, eval_cache=False), worker=WorkerState())
    assert refused.eval_cached_layers is None and "eval_cache" not in refused.optimisations
    assert [(p.accuracy, p.loss) for p in refused.eval_curve] == [(p.accuracy, p.loss) for p in uncached.eval_curve]
    assert len(small.eval_states) == 0 and outputs == [1] and not small.eval_exact  # one batch priced it
    assert run_trial(cfg, worker=_budgeted(size)).eval_cached_layers == 1


def test_the_worker_keeps_its_entries_within_the_budget(tiny_trial):
    """Room for one entry: a second depth's entry is made (chained from the first) and the first goes;
    each trial evaluates from its cache as its uncached twin does."""
    cfg = dataclasses.replace(tiny_trial, frozen_layers=1, epochs=1)
    worker = _budgeted(_entry_bytes(cfg))
    for k in (1, 2):
        at = dataclasses.replace(cfg, frozen_layers=k)
        cached, uncached = run_trial(at, worker=worker), run_trial(dataclasses.replace(at, eval_cache=False))
        assert cached.eval_cached_layers == k
        assert [(p.accuracy, p.loss) for p in cached.eval_curve] == [(p.accuracy, p.loss) for p in uncached.eval_curve]
    assert [key.layer for key in worker.eval_states] == [2]
    assert worker.eval_states.held_bytes() <= worker.eval_states.max_bytes


def test_an_lru_bounded_in_bytes_drops_the_oldest_and_keeps_nothing_too_large():
    from freezesweep.trials.worker import Lru

    lru = Lru(8, max_bytes=10, size=len)
    assert lru.put("a", "xxxx") == [] and lru.put("b", "xxxx") == []
    assert lru.put("c", "xxxx") == ["a"] and list(lru) == ["b", "c"]
    assert lru.put("d", "x" * 11) == ["d"] and list(lru) == ["b", "c"]  # alone past the bound: not kept, none dropped
