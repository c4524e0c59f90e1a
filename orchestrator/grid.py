"""The grid: a pure, deterministic expansion of a spec into one TrialConfig per cell."""

from __future__ import annotations

import itertools
from typing import Any

from orchestrator.spec import SweepSpec
from trials.config import TrialConfig


def build_grid(spec: SweepSpec) -> list[TrialConfig]:
    """models × datasets × train_sizes × (each method × its own axis) × seeds, in the spec's order.
    A method's axis is crossed with that method only: freeze cells have frozen_layers, lora cells a
    rank, probe cells neither. Ids are content hashes, so adding a value to any axis leaves every
    existing cell's id unchanged (a freeze cell's id is what it was before methods existed)."""
    template, metrics = spec.trial_template(), spec.select_metrics()
    variants = {model: method_variants(spec, model) for model in spec.models()}
    return [
        TrialConfig(model=model, dataset=dataset, train_size=size, seed=seed, select_metric=metrics[dataset],
                    **{**template, **variant})  # a method's own settings win (e.g. lora.learning_rate)
        for model in spec.models()
        for dataset, size in itertools.product(spec.datasets, spec.train_sizes)
        for variant in variants[model]
        for seed in spec.seeds
    ]


def method_variants(spec: SweepSpec, model: str) -> list[dict[str, Any]]:
    """Each method's cells of one (model, dataset, train size), as TrialConfig fields."""
    variants = []
    for method in spec.methods:
        shared = {"method": method, "frozen_layers": None, **spec.method_fields(method)}
        if method == "freeze":
            variants += [{**shared, "frozen_layers": k} for k in frozen_layers_of(spec, model)]
        elif method == "lora":
            variants += [{**shared, "lora_rank": r} for r in spec.lora_ranks]
        else:
            variants.append(shared)
    return variants


def frozen_layers_of(spec: SweepSpec, model: str) -> list[int]:
    """The spec's frozen layers for ``model``, 'all' as its layer count (once, if also listed)."""
    if "all" not in spec.frozen_layers:
        return list(spec.frozen_layers)
    from trials.model import load_model_config

    layers = load_model_config(model).num_hidden_layers
    return list(dict.fromkeys(layers if k == "all" else k for k in spec.frozen_layers))
