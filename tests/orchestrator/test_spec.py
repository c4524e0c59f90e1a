"""orchestrator/spec.py, the bottom layer: shapes and values, no I/O, defaults from one definition."""

import dataclasses

import numpy
import pydantic
import pytest

from freezesweep.orchestrator.spec import SpecError, SweepSpec, TrainingSpec, parse, read_stored_spec, spec_aliases
from freezesweep.trials.config import TrialConfig

MINIMAL = {
    "name": "s",
    "model": "some/model",
    "datasets": ["d"],
    "train_sizes": [10],
    "frozen_layers": [0],
    "seeds": [0],
}


def test_parse_needs_no_files_model_or_data():
    """A spec naming things that do not exist parses: only shapes and values are checked here."""
    spec, problems = parse({**MINIMAL, "model": "/nowhere/model", "datasets": ["/nowhere/data"]})
    assert problems == [] and spec.models() == ["/nowhere/model"]


def test_parse_lists_every_shape_problem():
    spec, problems = parse(
        {**MINIMAL, "colour": "red", "seeds": [1, 1], "train_sizes": [0], "training": {"precision": "fp8"}}
    )
    assert spec is None
    for expected in [
        "colour: unknown key",
        "duplicate values [1]",
        "train sizes must be positive",
        "training.precision: Input should be",
    ]:
        assert any(expected in p for p in problems), (expected, problems)
    assert parse(["not", "a", "mapping"]) == (None, ["the spec must be a mapping of keys, got list"])


def test_a_member_of_the_wrong_type_hides_no_range_problem_of_its_axis():
    """A walk-through: `frozen_layers: [0, al, -2]` named `al` alone (pydantic range-checks an axis only
    once every member has its type); `-2` came after the fix."""
    _, problems = parse({**MINIMAL, "frozen_layers": [0, "al", -2], "seeds": ["b", "-1", True], "train_sizes": [5]})
    assert problems[-2:] == [
        "frozen_layers: frozen layers must be >= -1 (-1 = embeddings only) or 'all': [-2] is not",
        "seeds: seeds must be >= 0: [-1] is not",  # a text of a number reads as the number
    ]
    assert sum("train_sizes" in p for p in problems) == 0  # an axis whose members all have their type


def test_training_defaults_are_trial_configs_field_by_field():
    """One source for the protocol's defaults: a sweep cell and `freezesweep trial` start from the same."""
    trial_defaults = {f.name: f.default for f in dataclasses.fields(TrialConfig)}
    training = TrainingSpec()
    for name, value in training.trial_fields().items():
        assert value == trial_defaults[name], name
    assert training.select_metric is None  # the one exception: unset means each task's official metric
    assert set(TrainingSpec.model_fields) - {"select_metric"} == set(training.trial_fields())


def test_large_axes_validate_in_linear_time():
    """100,000 seeds: the duplicate check counts once (it used list.count per value: hours at this size,
    caught by the suite's timeout), and an error names the problem without printing the whole axis."""
    seeds = list(range(100_000))
    spec, problems = parse({**MINIMAL, "seeds": seeds})
    assert problems == [] and len(spec.seeds) == 100_000
    _, problems = parse({**MINIMAL, "seeds": seeds + [7]})
    [problem] = problems
    assert "duplicate values [7]" in problem and len(problem) < 400


def test_protocol_takes_resolved_metrics_and_leaves_machine_fields_out():
    spec, _ = parse({**MINIMAL, "training": {"eval_batch_size": 8, "checkpoint_every_epochs": 1}})
    protocol = spec.protocol({"d": "accuracy"})
    assert protocol["training"]["select_metric"] == {"d": "accuracy"}
    assert "eval_batch_size" not in protocol["training"] and "checkpoint_every_epochs" not in protocol["training"]


def test_aliases_and_stored_specs():
    assert spec_aliases({"models": ["a", "b"]})["model"] == ["a", "b"]
    assert spec_aliases({"training": {"method": "freeze"}})["methods"] == ["freeze"]
    with pytest.raises(ValueError, match="model or models"):
        spec_aliases({"model": "a", "models": ["b"]})
    # resources.cells_per_round: trials_per_round's name until 0.3.0 (user specs, stored spec.yaml files)
    renamed = SweepSpec.model_validate({**MINIMAL, "resources": {"cells_per_round": 50, "array_width": 4}})
    assert (renamed.resources.trials_per_round, renamed.resources.array_width) == (50, 4)
    assert "cells_per_round" not in renamed.to_yaml() and "trials_per_round: 50" in renamed.to_yaml()
    _, problems = parse({**MINIMAL, "seeds": [-1], "resources": {"cells_per_round": 50, "trials_per_round": 60}})
    assert len(problems) == 2  # both names given is one problem among the others, each named
    assert any(p.startswith("resources: give trials_per_round or its old name cells_per_round") for p in problems)
    legacy = read_stored_spec("name: s\ntraining: {epochs: 2}\n")
    assert legacy["training"]["select_metric"] == "accuracy"  # what rows before select_metric used


@pytest.mark.parametrize("text", ["name: [unclosed\n  : :", "just a string", "\x00\x01garbage"])
def test_a_damaged_stored_spec_is_one_clear_error_saying_what_to_do(text):
    with pytest.raises(SpecError) as info:
        read_stored_spec(text, "store/s/spec.yaml")
    [problem] = info.value.problems
    assert problem.startswith("damaged: ") and "relaunch the sweep's original spec file under the same name" in problem
    assert info.value.source == "store/s/spec.yaml"


def test_a_sweep_spec_is_frozen():
    spec = SweepSpec.model_validate(MINIMAL)
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        spec.name = "other"


def test_a_grid_over_the_limit_is_refused_with_its_count():
    """1.6 million cells used to pass, write spec.yaml and the lock, then hash ids for minutes."""
    spec, problems = parse(
        {
            **MINIMAL,
            "datasets": ["a", "b"],
            "train_sizes": [1, 2, 3, 4, 5],
            "frozen_layers": [0, 1, 2, 3],
            "seeds": list(range(40_000)),
        }
    )
    assert spec is None
    assert problems == [
        "the grid has 1,600,000 cells (1 model × 2 datasets × 5 train sizes × 4 variants × 40,000 "
        "seeds), over the limit of 1,000,000: split it into several sweeps"
    ]
    spec, _ = parse(
        {
            **MINIMAL,
            "methods": ["freeze", "lora", "probe"],
            "frozen_layers": [0, "all"],
            "lora_ranks": [4, 8],
            "seeds": [0, 1],
        }
    )
    assert spec.cell_count() == 1 * 1 * 1 * (2 + 2 + 1) * 2


def test_a_key_given_twice_at_any_depth_is_refused_naming_it_and_both_lines(tmp_path):
    """Before: the last one won silently (a second `seeds:` ran seed 1, a second `store:` moved the sweep)."""
    from freezesweep.orchestrator.spec import read_yaml

    path = tmp_path / "twice.yaml"
    path.write_text("name: s\nseeds: [0]\nstore: ./a\ntraining:\n  epochs: 1\n  epochs: 2\nseeds: [1]\nstore: ./b\n")
    with pytest.raises(SpecError) as info:
        read_yaml(path)
    assert info.value.source == str(path)
    assert info.value.problems == [
        "duplicate key 'epochs' on lines 5 and 6 (YAML keeps only the last; give it once)",
        "duplicate key 'seeds' on lines 2 and 7 (YAML keeps only the last; give it once)",
        "duplicate key 'store' on lines 3 and 8 (YAML keeps only the last; give it once)",
    ]
    path.write_text("name: s\nseeds: [0]\ntraining:\n  epochs: 1\nlora:\n  epochs: 1\n")  # one key per mapping
    assert read_yaml(path)["seeds"] == [0]


BOOLEAN = "a number, not a boolean (YAML reads yes/no, true/false and on/off as booleans)"


def test_a_boolean_is_never_a_number(tmp_path):
    """Issue 36: `seeds: [yes, no]` (YAML's booleans) or seeds=[True] read as seeds 1 and 0. Every number
    of a spec refuses a boolean, each named; a number written as 200.0 still reads as 200."""
    from freezesweep.orchestrator.spec import read_yaml

    path = tmp_path / "bools.yaml"
    path.write_text(
        "name: s\nmodel: m\ndatasets: [d]\ntrain_sizes: [on]\nfrozen_layers: [0, true]\nseeds: [yes, no]\n"
        "split_seed: off\ntraining: {epochs: yes, batch_size: true, max_eval_examples: no}\n"
        "resources: {max_failures: no, cpus_per_trial: yes, trials_per_round: on}\n"
        "lora: {alpha: yes}\nprobe: {folds: yes}\n"
    )
    _, problems = parse(read_yaml(path))
    expected = [
        "train_sizes.0",
        "frozen_layers.1",
        "seeds.0",
        "seeds.1",
        "split_seed",
        "training.epochs",
        "training.batch_size",
        "training.max_eval_examples",
        "resources.max_failures",
        "resources.cpus_per_trial",
        "resources.trials_per_round",
        "lora.alpha",
        "probe.folds",
    ]
    assert sorted(p.split(":")[0] for p in problems) == sorted(expected), problems
    assert all(BOOLEAN in p for p in problems)
    settle = {k: v for k, v in MINIMAL.items() if k != "seeds"} | {"settle": {"max_seeds": True, "tolerance": True}}
    assert sorted(p.split(":")[0] for p in parse(settle)[1]) == ["settle.max_seeds", "settle.tolerance"]
    _, problems = parse({**MINIMAL, "seeds": [True]})  # the API's spelling
    assert problems == [f"seeds.0: {BOOLEAN} (got True)"]
    _, problems = parse({**MINIMAL, "seeds": [0, numpy.bool_(True)], "train_sizes": [numpy.int64(10)]})
    assert [p.split(":")[0] for p in problems] == ["seeds.1"]  # numpy's booleans too; its integers read
    spec, _ = parse({**MINIMAL, "train_sizes": [200.0], "frozen_layers": ["all", 0]})
    assert spec.train_sizes == [200] and spec.frozen_layers == ["all", 0]


def test_an_unknown_key_names_the_key_it_may_mean_and_a_missing_one_shows_no_spec():
    """Before: ``train_size: unknown key`` beside ``train_sizes: Field required (got {…the whole spec…})``."""
    raw = {k: v for k, v in MINIMAL.items() if k != "train_sizes"}
    spec, problems = parse({**raw, "train_size": [50], "training": {"epoch": 3}, "resources": {"gpus_per_trail": 1}})
    assert spec is None
    assert sorted(problems) == [
        "resources.gpus_per_trail: unknown key (did you mean gpus_per_trial?)",
        "train_size: unknown key (did you mean train_sizes?)",
        "train_sizes: Field required",
        "training.epoch: unknown key (did you mean epochs?)",
    ]
    assert parse({**MINIMAL, "colour": "red"})[1] == ["colour: unknown key"]  # nothing near: no guess


def test_every_problem_across_keys_is_named_in_one_error():
    """Before: seeds + settle was the only problem named; without seeds, the next run named tolerance +
    settle (pydantic stops at the first check across keys that fails), and a method's axis after that.
    Each is a problem of its own (they were one line joined by "; ": "2 problem(s)" for 4)."""
    spec, problems = parse(
        {**MINIMAL, "settle": {"max_seeds": 4}, "tolerance": 0.02, "lora_ranks": [4], "seeds": [0, 1]}
    )
    assert spec is None
    assert problems == [
        "lora_ranks is set, but methods has no lora",
        "seeds and settle both given: settle mode chooses the seeds (0, 1, … up to settle.max_seeds); drop seeds",
        "tolerance and settle both given: a settle sweep asks settle.tolerance; drop tolerance",
    ]
    # the grid's size with them
    _, problems = parse({**MINIMAL, "lora_ranks": [4], "seeds": list(range(1_000_001))})
    assert len(problems) == 2 and "lora_ranks is set" in problems[0] and "over the limit" in problems[1]
    # settle's own rule (full fine-tuning) beside them; a spec without seeds or settle says so beside the axes'
    _, problems = parse({**MINIMAL, "frozen_layers": [2], "settle": {}, "tolerance": 0.02, "seeds": []})
    assert problems == [
        "tolerance and settle both given: a settle sweep asks settle.tolerance; drop tolerance",
        "settle compares every arm with full fine-tuning: frozen_layers must hold 0",
    ]
    _, problems = parse({**MINIMAL, "methods": ["lora"], "seeds": []})
    assert problems == [
        "lora_ranks is empty, but methods has lora",
        "frozen_layers is set, but methods has no freeze",
        "seeds: give at least one seed, or a settle section (settle mode chooses them)",
    ]


def test_problems_across_keys_are_named_beside_a_keys_own():
    """Before: a key that failed on its own (a typo, a boolean seed) hid every problem across keys until it
    was mended (pydantic runs no check of the whole spec then; a docs walk-through). A check that reads the
    failed key is not made: it would speak of a value nobody gave."""
    _, problems = parse(
        {**MINIMAL, "trainng": {"epochs": 1}, "seeds": [0], "settle": {"tolerance": 0.02}, "lora_ranks": [8]}
    )
    assert problems == [
        "trainng: unknown key (did you mean training?)",
        "lora_ranks is set, but methods has no lora",
        "seeds and settle both given: settle mode chooses the seeds (0, 1, … up to settle.max_seeds); drop seeds",
    ]
    _, problems = parse({**MINIMAL, "seeds": [True], "settle": {}, "lora_ranks": [8]})
    assert problems[0].startswith("seeds.0: ") and problems[1:] == ["lora_ranks is set, but methods has no lora"]
    _, problems = parse({**MINIMAL, "methods": ["lora", "prob"], "lora_ranks": [8]})
    assert len(problems) == 1 and problems[0].startswith("methods.1: ")  # methods failed: nothing said of its axes
    # a rule is left out alone: probe's settings failed, the axes' rule still speaks
    _, problems = parse({**MINIMAL, "probe": {"folds": 1}, "lora_ranks": [8]})
    assert problems[0].startswith("probe.folds: ") and problems[1:] == ["lora_ranks is set, but methods has no lora"]
    # a misspelt key is that key given: no rule speaks of the default standing in for it (a diff review)
    without = {k: v for k, v in MINIMAL.items() if k != "frozen_layers"}
    assert parse({**without, "frozen_layer": [0, 2], "settle": {}, "seeds": []})[1] == [
        "frozen_layer: unknown key (did you mean frozen_layers?)"
    ]


def test_a_failed_settle_section_is_still_settle_given():
    """A walk-through: settle's own problem (its budget below its initial seeds, an unknown key) hid seeds +
    settle and tolerance + settle, and an unknown key hid the budget: pydantic runs no check of a model
    whose field failed. Both layers of checks speak now; a budget key that failed is not compared."""
    both = {"seeds": [0, 1], "tolerance": 0.02}
    _, problems = parse({**MINIMAL, **both, "settle": {"initial_seeds": 5, "max_seeds": 3}})
    assert [p.split(" (")[0] for p in problems] == [
        "settle: settle.max_seeds",
        "seeds and settle both given: settle mode chooses the seeds",
        "tolerance and settle both given: a settle sweep asks settle.tolerance; drop tolerance",
    ]
    _, problems = parse({**MINIMAL, "seeds": [], "settle": {"initial_seeds": 12, "max_seeds": "x"}})
    assert len(problems) == 1 and problems[0].startswith("settle.max_seeds: ")  # not "(10) is below"
    _, problems = parse({**MINIMAL, "seeds": [], "settle": {"initial_seeds": 12, "max_seed": 4}})
    assert problems == ["settle.max_seed: unknown key (did you mean max_seeds?)"]


def test_model_and_models_both_given_leaves_the_rest_checked():
    _, problems = parse({**MINIMAL, "models": ["a"], "seeds": [0, 0], "lora_ranks": [4]})
    assert [p.split(" [")[0] for p in problems] == [
        "give model or models, not both",
        "seeds: duplicate values",
        "lora_ranks is set, but methods has no lora",
    ]
    _, problems = parse({**MINIMAL, "models": 5})  # models' own problem too, named by its key
    assert problems == [
        "give model or models, not both",
        "models: should be a model name (hub id or folder) or a list of them (got 5)",
    ]


def test_a_fractional_depth_is_one_problem():
    """Before: `frozen_layers: [0, 2.5]` was two problems, one per member of the union (`….int: …` and
    `….literal['all']: Input should be 'all'`), where `All` was one sentence."""
    _, problems = parse({**MINIMAL, "frozen_layers": [0, 2.5, 2.0, "All"]})
    depth = "a depth is an integer (-1 embeddings only, 0 nothing, k layers) or all"
    assert problems == [f"frozen_layers.1: {depth} (got 2.5)", f"frozen_layers.3: {depth} (got 'All')"]
