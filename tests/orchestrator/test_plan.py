"""orchestrator/plan.py: the grid is a pure, deterministic function of a resolved sweep."""

import dataclasses
import math

import pytest

from freezesweep.orchestrator.plan import (
    ResolvedSweep,
    build_grid,
    grid_size_words,
    hungriest_frozen_layers,
    launch_units,
    round_count,
    rounds,
    with_resources,
    with_doubled_gpu_share,
)
from freezesweep.orchestrator.spec import SweepSpec

RESOLVED = {
    "name": "s",
    "model": ["/nowhere/a", "/nowhere/b"],
    "datasets": ["/nowhere/d", "glue/cola"],
    "train_sizes": [10, 20],
    "methods": ["freeze", "lora", "probe"],
    "frozen_layers": [0, "all", 2],
    "lora_ranks": [4],
    "seeds": [0, 1],
    "training": {"precision": "fp32", "select_metric": {"/nowhere/d": "accuracy", "glue/cola": "matthews"}},
    "resources": {"cpus_per_trial": 2.5, "gpus_per_trial": 0.25},
}


def _sweep(**overrides) -> ResolvedSweep:
    return ResolvedSweep(
        SweepSpec.model_validate({**RESOLVED, **overrides}), model_layers={"/nowhere/a": 6, "/nowhere/b": 2}
    )


def test_the_grid_reads_nothing_and_is_deterministic():
    """No model, dataset or store exists: the plan needs none of them (depths and metrics are resolved)."""
    cells = build_grid(_sweep())
    assert cells == build_grid(_sweep())
    # per model: 2 datasets × 2 sizes × 2 seeds × (freeze k's + 1 rank + probe); for b, 'all' = 2 is listed already
    assert len(cells) == 2 * 2 * 2 * (3 + 1 + 1) + 2 * 2 * 2 * (2 + 1 + 1)
    assert len({c.trial_id for c in cells}) == len(cells)
    a = {c.frozen_layers for c in cells if c.model == "/nowhere/a" and c.method == "freeze"}
    assert a == {0, 6, 2}
    assert {c.dataset: c.select_metric for c in cells} == {"/nowhere/d": "accuracy", "glue/cola": "matthews"}
    assert [(c.seed, c.train_size) for c in cells[:4]] == [(0, 10), (1, 10), (0, 10), (1, 10)]  # seed innermost


def _product(words: str) -> int:
    """The product of a size's factors ("1 model × 2 variants × 3 seeds": 6), each factor's leading count."""
    counts = [int(factor.split()[0].replace(",", "")) for factor in words.split(" × ")]
    return math.prod(counts)


def test_the_grid_size_words_multiply_to_its_cells():
    """A walk-through: [0, 6, all] on a 6-layer model and 3 seeds read "6 cells (… × 3 variants × 3 seeds)"."""
    one = _sweep(model="/nowhere/a", methods=["freeze"], lora_ranks=[], frozen_layers=[0, 6, "all"], seeds=[0, 1, 2])
    assert len(build_grid(one)) == _product(grid_size_words(one)) == 2 * 2 * 2 * 3
    assert "× 2 variants ×" in grid_size_words(one)
    # models of unequal counts (b: 'all' is its listed 2): one factor, their sum, each named
    both = _sweep()
    assert grid_size_words(both).startswith("9 model variants (/nowhere/a: 5, /nowhere/b: 4) × ")
    assert len(build_grid(both)) == _product(grid_size_words(both))


def test_an_unresolved_sweep_is_refused():
    with pytest.raises(ValueError, match="precision is still auto"):
        ResolvedSweep(SweepSpec.model_validate({**RESOLVED, "training": {"precision": "auto"}}))
    with pytest.raises(ValueError, match="select_metric is not resolved per dataset"):
        ResolvedSweep(SweepSpec.model_validate({**RESOLVED, "training": {"precision": "fp32"}}))
    with pytest.raises(ValueError, match="depths are not known"):
        ResolvedSweep(SweepSpec.model_validate(RESOLVED))


def test_cells_carry_their_resources_not_a_new_identity():
    sweep = _sweep()
    cells = build_grid(sweep)
    placed = [with_resources(c, sweep) for c in cells]
    assert [c.trial_id for c in placed] == [c.trial_id for c in cells]
    assert {c.num_threads for c in placed} == {2}


def test_rounds_count_ray_trials_and_never_split_an_array():
    """A round is at most ``trials_per_round`` Ray trials, an array one of them (its start is paid per
    round: counted in cells, arrays would pay it as often as single cells do)."""
    sweep = dataclasses.replace(_sweep(), array_width=3)  # GPU trials in fp32: freeze cells train as arrays
    cells = build_grid(sweep)
    units = launch_units(cells, sweep)
    assert max(len(u) for u in units) == 3 and len(units) < len(cells)  # arrays, and cells alone (LoRA, probe)
    chunks = list(rounds(units, 4))
    assert [len(r) for r in chunks] == [4] * (len(units) // 4) + ([len(units) % 4] if len(units) % 4 else [])
    assert [u for r in chunks for u in r] == units  # every unit once, whole, in order
    assert sorted(c.trial_id for r in chunks for u in r for c in u) == sorted(c.trial_id for c in cells)
    plan_of = dataclasses.replace(
        sweep,
        spec=sweep.spec.model_copy(
            update={"resources": sweep.spec.resources.model_copy(update={"trials_per_round": 4})}
        ),
    )
    assert round_count(cells, plan_of) == len(chunks)
    on_cpu = dataclasses.replace(plan_of, gpu_share=0.0)  # no arrays: a trial a cell, counted without placing each
    assert len(launch_units(cells, on_cpu)) == len(cells) and round_count(cells, on_cpu) == -(-len(cells) // 4)


def test_the_hungriest_depth_and_the_doubled_share():
    cells = build_grid(_sweep())
    assert hungriest_frozen_layers(cells) == 0
    assert hungriest_frozen_layers([c for c in cells if c.method == "freeze" and c.frozen_layers == 2]) == 2
    assert hungriest_frozen_layers([c for c in cells if c.method == "probe"]) == 0
    sweep = _sweep()
    assert sweep.gpu_share == 0.25
    larger = with_doubled_gpu_share(sweep)
    assert larger.gpu_share == 0.5 and with_doubled_gpu_share(larger).gpu_share == 1.0
    assert larger.spec == sweep.spec  # what the user asked for is kept (a resume measures or uses it again)
    assert with_doubled_gpu_share(dataclasses.replace(sweep, gpu_share=1.0)) is None
    assert with_doubled_gpu_share(_sweep(resources={"gpus_per_trial": 0})) is None


def test_other_sweeps_price_the_pending_cells_without_redoing_their_protocols(monkeypatch):
    """Before: each pending cell's protocol was computed again for every other sweep of the store (a
    105,000-cell plan into a store of 7 tiny sweeps: 735,014 calls, 25 s where an empty store took 15).
    Now once per kind of cell it is asked for, whatever the number of sweeps, and the prices are the same."""
    from freezesweep.orchestrator import plan

    pending = build_grid(_sweep(seeds=list(range(10))))
    others = [_sweep(name=f"o{i}", split_seed=i + 1, seeds=[0]) for i in range(3)]
    walls = [{c.trial_id: 10.0 * (i + 1) for c in build_grid(o)} for i, o in enumerate(others)]
    slower = _sweep(name="slower", seeds=[0], training={**RESOLVED["training"], "epochs": 20})  # another protocol
    calls, cost_protocol = [], plan.cost_protocol
    monkeypatch.setattr(plan, "cost_protocol", lambda cell: calls.append(cell) or cost_protocol(cell))
    sweeps = [*zip(others, walls), (slower, {c.trial_id: 99.0 for c in build_grid(slower)})]
    found = [plan.measured_elsewhere(plan.PendingKinds(pending), o, w) for o, w in sweeps]  # kinds made per sweep
    kinds_of_cells = {plan.work_key(c) for c in pending}
    assert [sorted({t for ts in f.values() for t in ts}) for f in found] == [[10.0], [20.0], [30.0], []]
    assert all(set(f) == kinds_of_cells for f in found[:3])
    # per sweep, each pending kind's protocol once (not each cell's), and each of its measured cells' own
    other_cells = sum(len(build_grid(o)) for o, _ in sweeps)
    assert len(calls) == len(sweeps) * len(kinds_of_cells) + other_cells < len(pending)
    calls.clear()
    kinds = plan.PendingKinds(pending)  # made once for every sweep: each kind's protocol once in all
    assert [plan.measured_elsewhere(kinds, o, w) for o, w in sweeps] == found
    assert len(calls) == len(kinds_of_cells) + other_cells


def test_a_settle_sweeps_budget_left_is_its_open_groups_cells_not_done():
    """What `plan` prices as the most a settle sweep may still run: a group with no cell in the next round
    is settled (or at its budget) and runs no more; an open group's cells with a final row are done."""
    from freezesweep.orchestrator.plan import settle_budget_left
    from freezesweep.orchestrator.plan import settle_group as group

    cells = build_grid(_sweep(seeds=[], settle={"max_seeds": 4}))
    groups = list(dict.fromkeys(map(group, cells)))
    open_one, settled = groups[0], groups[1]
    done = {c.trial_id for c in cells if group(c) in (open_one, settled) and c.seed < 3}
    pending = [c for c in cells if group(c) == open_one and c.seed == 3][:2]  # its next round: two arms' 4th seed
    left = settle_budget_left(cells, pending, done)
    assert left == [c for c in cells if group(c) == open_one and c.seed == 3]
    assert set(map(group, settle_budget_left(cells, cells, set()))) == set(groups)  # a new sweep: all of it
    assert settle_budget_left(cells, [], done) == []  # settled
