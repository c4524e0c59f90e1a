"""The spec's problems in words a user reads: no regular expressions."""

import pytest

from freezesweep.orchestrator.spec import parse

SPEC = {"name": "ok", "model": "m", "datasets": ["d"], "train_sizes": [10], "frozen_layers": [0, 2], "seeds": [0]}


@pytest.mark.parametrize("name", ["no spaces please", "-starts-with-a-dash", "a/b"])
def test_an_invalid_sweep_name_is_explained_in_words_with_the_value(name):
    """A walk-through: "String should match pattern '^[A-Za-z0-9][A-Za-z0-9_.-]*$'"."""
    spec, problems = parse(SPEC | {"name": name})
    assert spec is None and problems == [
        "name: a folder name in the store: letters, digits, '_', '.' and '-' only, starting with a letter or digit "
        f"(got {name!r})"
    ]


def test_a_valid_name_has_no_problem():
    spec, problems = parse(SPEC | {"name": "sst2.v1_b-2"})
    assert problems == [] and spec is not None and spec.name == "sst2.v1_b-2"
