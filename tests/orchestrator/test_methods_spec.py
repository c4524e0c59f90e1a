"""The method and model axes in the spec and the grid: axes crossed with their own method only, every
problem in one error, and sweeps from before the axes keep their ids."""

import pytest
import yaml

from freezesweep.orchestrator.plan import build_grid
from freezesweep.orchestrator.sweeps import resolve_here
from freezesweep.orchestrator.checks import load_spec
from freezesweep.orchestrator.spec import SpecError


def _problems(path) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return info.value.problems


def test_method_axes_are_not_crossed_with_other_methods(write_spec):
    spec = load_spec(
        write_spec(methods=["freeze", "lora", "probe"], frozen_layers=[0, "all"], lora_ranks=[2, 8], seeds=[0, 1])
    )
    cells = build_grid(resolve_here(spec))
    # 2 sizes × (2 k + 2 ranks + 1 probe) × 2 seeds, not 2 × 2 × 2 × 3 × 2
    assert len(cells) == 2 * 5 * 2 == len({c.trial_id for c in cells})
    freeze = [c for c in cells if c.method == "freeze"]
    assert sorted({c.frozen_layers for c in freeze}) == [0, 2]  # 'all': the tiny model's 2 layers
    assert all(c.lora_rank is None and c.probe_folds is None for c in freeze)
    lora = [c for c in cells if c.method == "lora"]
    assert {c.lora_rank for c in lora} == {2, 8} and all(c.frozen_layers is None and c.lora_alpha == 16 for c in lora)
    probe = [c for c in cells if c.method == "probe"]
    assert len(probe) == 4 and all(c.frozen_layers is None and c.lora_rank is None for c in probe)
    assert {c.probe_pooling for c in probe} == {"auto"}
    assert {c.learning_rate for c in cells} == {0.003}  # the protocol's, unless LoRA sets its own
    faster = build_grid(
        resolve_here(
            load_spec(
                write_spec(methods=["freeze", "lora"], frozen_layers=[0], lora_ranks=[8], lora={"learning_rate": 5e-4})
            )
        )
    )
    assert {(c.method, c.learning_rate) for c in faster} == {("freeze", 0.003), ("lora", 5e-4)}


def test_a_sweep_from_before_methods_resumes_with_its_ids(write_spec, tmp_path):
    """A stored spec that says ``training.method: freeze`` and one model as a string (every spec before
    the axes) builds the cells of today's freeze-only spec, ids and all."""
    from freezesweep.orchestrator.sweeps import load_sweep
    from freezesweep.results.store import ResultStore
    from freezesweep.trials.config import TrialConfig

    path = write_spec("old", training={"select_metric": "accuracy"})
    raw = yaml.safe_load(path.read_text())
    raw["training"]["method"] = "freeze"
    ResultStore(raw["store"], "old").write_spec(yaml.safe_dump(raw))
    stored = build_grid(load_sweep("old", raw["store"]))
    assert [c.trial_id for c in stored] == [c.trial_id for c in build_grid(resolve_here(load_spec(path)))]
    # and those ids are what a TrialConfig with no method fields at all hashes to
    plain = [
        TrialConfig(
            dataset=c.dataset,
            model=c.model,
            train_size=c.train_size,
            frozen_layers=c.frozen_layers,
            seed=c.seed,
            epochs=2,
            learning_rate=0.003,
            precision="fp32",
        )
        for c in stored
    ]
    assert [c.trial_id for c in plain] == [c.trial_id for c in stored]


def test_every_method_problem_in_one_error(write_spec):
    problems = _problems(
        write_spec(methods=["freeze", "adapter"], lora_ranks=[0], lora={"targets": ["nope"]}, probe={"folds": 1})
    )
    for expected in [
        "methods.1: Input should be 'freeze', 'lora' or 'probe'",
        "LoRA ranks must be positive",
        "probe.folds: Input should be greater than or equal to 2",
    ]:
        assert any(expected in p for p in problems), (expected, problems)
    problems = _problems(write_spec(methods=["lora"], frozen_layers=[], lora={"targets": ["query", "qkv"]}))
    assert any("lora_ranks is empty, but methods has lora" in p for p in problems), problems
    assert any(
        p.startswith("lora.targets: ") and "'qkv' matches no Linear" in p and "attention.self.query" in p
        for p in problems
    ), problems
    problems = _problems(write_spec(lora_ranks=[8]))  # methods: [freeze] (the default)
    assert "lora_ranks is set, but methods has no lora" in problems, problems
    # a walk-through: settings of a method not swept passed without a word, a rank above the hidden size ran
    problems = _problems(write_spec(lora={"alpha": 32}, probe={"folds": 3}))
    for method in ("lora", "probe"):
        assert any(f"{method} is set, but methods has no {method}: its settings" in p for p in problems), problems
    problems = _problems(write_spec(methods=["freeze", "lora"], lora_ranks=[8, 10000]))
    assert any(p.startswith("lora_ranks: [10000] exceed the hidden size 32 of") for p in problems), problems


def test_a_model_axis_checks_frozen_layers_per_model(write_spec, tiny_bert, tiny_roberta):
    problems = _problems(write_spec(model=None, models=[tiny_bert, tiny_roberta], frozen_layers=[0, 3]))
    assert problems == [
        f"frozen_layers: [3] exceed the 2 layers of {tiny_bert} ('all' freezes every layer of each model)"
    ]
    spec = load_spec(write_spec(model=None, models=[tiny_bert, tiny_roberta], frozen_layers=[0, "all"]))
    cells = build_grid(resolve_here(spec))
    assert {(c.model, c.frozen_layers) for c in cells} == {
        (tiny_bert, 0),
        (tiny_bert, 2),
        (tiny_roberta, 0),
        (tiny_roberta, 3),
    }
    with pytest.raises(SpecError, match="give model or models, not both"):
        load_spec(write_spec(models=[tiny_bert], model=tiny_bert))
