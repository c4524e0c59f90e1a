"""Initial models are built once per worker and copied: a copy trains exactly as a fresh build does."""

import dataclasses

import pytest

from trials import run
from trials.run import run_trial


@pytest.fixture(autouse=True)
def _no_templates():
    run._TEMPLATES.clear()
    yield
    run._TEMPLATES.clear()


def _curves(result):
    return result.train_loss_curve, [(p.step, p.accuracy, p.loss) for p in result.eval_curve]


@pytest.mark.parametrize("model_init", ["pretrained", "random"])
def test_a_trial_from_a_copied_template_equals_one_from_a_fresh_build(tiny_trial, monkeypatch, model_init):
    cfg = dataclasses.replace(tiny_trial, frozen_layers=1, model_init=model_init)
    fresh = run_trial(cfg)
    run._TEMPLATES.clear()
    builds = []
    monkeypatch.setattr(run, "build_model", lambda *a: builds.append(a) or real_build(*a))
    run_trial(dataclasses.replace(cfg, frozen_layers=0, train_size=24))  # another cell of the same seed builds it
    from_copy = run_trial(cfg)
    assert len(builds) == 1 and len(run._TEMPLATES) == 1
    assert _curves(from_copy) == _curves(fresh)  # same head, same dropout draws after it
    other_seed = run_trial(dataclasses.replace(cfg, seed=1))
    assert len(builds) == 2 and _curves(other_seed) != _curves(fresh)


real_build = run.build_model
