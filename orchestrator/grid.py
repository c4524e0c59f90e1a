"""The grid: a pure, deterministic expansion of a spec into one TrialConfig per cell."""

from __future__ import annotations

import itertools

from orchestrator.spec import SweepSpec
from trials.config import TrialConfig


def build_grid(spec: SweepSpec) -> list[TrialConfig]:
    """datasets × train_sizes × frozen_layers × seeds, in the spec's order; ids are content hashes,
    so adding a seed or a size leaves every existing cell's id unchanged."""
    template, metrics = spec.trial_template(), spec.select_metrics()
    return [
        TrialConfig(dataset=dataset, train_size=size, frozen_layers=k, seed=seed, select_metric=metrics[dataset],
                    **template)
        for dataset, size, k, seed in itertools.product(spec.datasets, spec.train_sizes, spec.frozen_layers, spec.seeds)
    ]
