"""Initial models are built once per worker and copied: a copy trains exactly as a fresh build does,
and leaves the RNG exactly where a fresh build leaves it."""

import dataclasses
import random

import numpy as np
import pytest
import torch

from freezesweep.trials import run
from freezesweep.trials.model import build_model, built_model
from freezesweep.trials.run import initial_model, run_trial, seed_everything


def _curves(result):
    return result.train_loss_curve, [(p.step, p.accuracy, p.loss) for p in result.eval_curve]


def _rng() -> tuple:
    return random.random(), float(np.random.random()), torch.rand(3).tolist()


@pytest.mark.parametrize("model_init", ["pretrained", "random"])
def test_a_copy_is_a_fresh_build_bit_for_bit_and_leaves_the_rng_where_a_build_does(tiny_trial, model_init, worker):
    cfg = dataclasses.replace(tiny_trial, model_init=model_init)
    seed_everything(cfg.derived_seed)  # the independent reference: build it directly
    built = build_model(cfg.model, 2, cfg.model_init)
    after_build = _rng()
    initial_model(cfg, 2, worker)  # fills the template
    copied = initial_model(cfg, 2, worker)  # from the template
    assert _rng() == after_build
    assert len(worker.templates) == 1
    built_state, copied_state = built.state_dict(), copied.state_dict()
    assert built_state.keys() == copied_state.keys()
    assert all(torch.equal(built_state[k], copied_state[k]) for k in built_state)


def test_a_trial_from_a_copied_template_equals_one_from_a_fresh_build(tiny_trial, monkeypatch, worker):
    cfg = dataclasses.replace(tiny_trial, frozen_layers=1)
    fresh = run_trial(cfg, worker=worker)
    worker.clear()
    builds = []
    monkeypatch.setattr(run, "built_model", lambda *a: builds.append(a) or built_model(*a))
    run_trial(
        dataclasses.replace(cfg, frozen_layers=0, train_size=24), worker=worker
    )  # another cell of the same seed builds it
    from_copy = run_trial(cfg, worker=worker)
    assert len(builds) == 1 and len(worker.templates) == 1
    assert _curves(from_copy) == _curves(fresh)  # same head, same dropout draws after it
    other_seed = run_trial(dataclasses.replace(cfg, seed=1), worker=worker)
    assert len(builds) == 2 and _curves(other_seed) != _curves(fresh)
