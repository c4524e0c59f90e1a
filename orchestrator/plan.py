"""The plan: a pure, deterministic function of a resolved sweep (no I/O, no Ray).

``ResolvedSweep`` is a spec with everything that depends on the machine, the data or the cluster
decided once (orchestrator/launch.py ``resolve_for_launch``; orchestrator/sweeps.py for a stored sweep or this
machine). ``build_grid`` expands it into one TrialConfig per cell; the rest says which cells still
run and with what resources.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from freezesweep.orchestrator.local_files import Anchored, Shipment
from freezesweep.orchestrator.spec import SweepSpec
from freezesweep.results.settle import FULL, arm_labels, decide, next_round, variant_label
from freezesweep.results.store import FINAL_STATUSES
from freezesweep.trials.config import TrialConfig


@dataclass(frozen=True)
class ResolvedSweep:
    spec: SweepSpec  # precision resolved, select_metric per dataset, data_dir recorded
    model_layers: Mapping[str, int] = field(default_factory=dict)  # depth of each model (frozen_layers: all)
    address: str | None = None  # the Ray cluster the trials run on; None: an embedded Ray here
    # local files sent through Ray's object store (local_files: ship), or their absolute paths (node_local)
    shipment: Shipment | Anchored | None = None
    gpu_share: float | None = None  # each trial's GPU share: the spec's, or what gpus_per_trial auto measured
    gpu_packing: str | None = None  # what gpus_per_trial auto measured and chose, in words
    array_width: int | None = None  # the most cells per trial array: the spec's, or what fits the GPU share
    device: str | None = None  # "cpu" where the GPUs a cluster gives the trials are no CUDA devices; None: auto

    def __post_init__(self):
        problems = []
        if self.spec.training.precision == "auto":
            problems.append("precision is still auto")
        metrics = self.spec.training.select_metric
        if not (isinstance(metrics, dict) and set(self.spec.datasets) <= set(metrics)):
            problems.append(f"select_metric is not resolved per dataset ({metrics!r})")
        if "all" in self.spec.frozen_layers and not set(self.spec.models()) <= set(self.model_layers):
            problems.append("frozen_layers has 'all' but the models' depths are not known")
        if problems:
            raise ValueError("not a resolved sweep: " + "; ".join(problems))
        if self.gpu_share is None:  # auto not measured (inspection): a whole GPU, as its probe asks for
            object.__setattr__(self, "gpu_share", gpu_request(self.spec))
        if self.array_width is None:
            object.__setattr__(self, "array_width", self.spec.resources.array_width)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def on_cluster(self) -> bool:
        return self.address is not None


def build_grid(sweep: ResolvedSweep) -> list[TrialConfig]:
    """models × datasets × train_sizes × (each method × its own axis) × seeds, in the spec's order.
    A method's axis is crossed with that method only: freeze cells have frozen_layers, lora cells a
    rank, probe cells neither. Ids are content hashes, so adding a value to any axis leaves every
    existing cell's id unchanged (a freeze cell's id is what it was before methods existed)."""
    return list(iter_grid(sweep))


def iter_grid(sweep: ResolvedSweep) -> Iterator[TrialConfig]:
    """``build_grid``'s cells one at a time: a launch starts its first round after a round's worth of
    cells, not after the whole grid (a million cells take a minute to build and hash)."""
    spec = sweep.spec
    templates, metrics = {d: spec.trial_template(d) for d in spec.datasets}, spec.training.select_metric
    variants = {model: method_variants(spec, model, sweep.model_layers) for model in spec.models()}
    for model in spec.models():
        for dataset, size in itertools.product(spec.datasets, spec.train_sizes):
            for variant in variants[model]:
                for seed in spec.seed_values():  # a method's own settings win (e.g. lora.learning_rate)
                    yield TrialConfig(
                        model=model,
                        dataset=dataset,
                        train_size=size,
                        seed=seed,
                        select_metric=metrics[dataset],  # type: ignore[index]  # resolved: one per dataset
                        **{**templates[dataset], **variant},
                    )


def grid_size(sweep: ResolvedSweep) -> int:
    """How many cells ``build_grid`` gives, without building them."""
    spec = sweep.spec
    per_model = sum(len(method_variants(spec, model, sweep.model_layers)) for model in spec.models())
    return per_model * len(spec.datasets) * len(spec.train_sizes) * len(spec.seed_values())


def grid_size_words(sweep: ResolvedSweep) -> str:
    """``grid_size`` as its axes' product (``SweepSpec.cell_count_words``), each model's variants as
    ``build_grid`` makes them: 'all' and the same k listed are one (a walk-through: [0, 6, all] on a 6-layer
    model and 3 seeds read "6 cells (… × 3 variants × 3 seeds)")."""
    spec = sweep.spec
    return spec.cell_count_words(
        {model: len(method_variants(spec, model, sweep.model_layers)) for model in spec.models()}
    )


# a cell's axes as its row stores them: the protocol is the sweep's one (orchestrator/checks.py refuses a change)
GRID_AXES = ["model", "dataset", "train_size", "method", "frozen_layers", "lora_rank", "seed"]


def in_grid(sweep: ResolvedSweep, rows: pd.DataFrame) -> pd.Series:
    """Which of the sweep's stored rows (``GRID_AXES`` columns) are cells of its grid now: a row of an axis
    value since removed, or spelled otherwise (``./m`` for ``m``), is not (a launch never counts it as done,
    a report leaves it out). Linear in the rows, without building the grid."""
    spec = sweep.spec
    arms = {
        (model, variant_label(v["method"], v["frozen_layers"], v.get("lora_rank")))
        for model in spec.models()
        for v in method_variants(spec, model, sweep.model_layers)
    }
    labels = arm_labels(rows)
    any_model = {label for _, label in arms}  # a row without its model (a test's, an old writer's): any model's
    arm_in = [
        (m, label) in arms if isinstance(m, str) else label in any_model for m, label in zip(rows["model"], labels)
    ]
    return (
        rows["dataset"].isin(spec.datasets)
        & rows["train_size"].isin(spec.train_sizes)
        & rows["seed"].isin(spec.seed_values())
        & pd.Series(arm_in, index=rows.index, dtype=bool)
    )


def method_variants(spec: SweepSpec, model: str, model_layers: Mapping[str, int]) -> list[dict[str, Any]]:
    """Each method's cells of one (model, dataset, train size), as TrialConfig fields."""
    variants = []
    for method in spec.methods:
        shared = {"method": method, "frozen_layers": None, **spec.method_fields(method)}
        if method == "freeze":
            variants += [{**shared, "frozen_layers": k} for k in frozen_layers_of(spec, model, model_layers)]
        elif method == "lora":
            variants += [{**shared, "lora_rank": r} for r in spec.lora_ranks]
        else:
            variants.append(shared)
    return variants


def frozen_layers_of(spec: SweepSpec, model: str, model_layers: Mapping[str, int]) -> list[int]:
    """The spec's frozen layers for ``model``, 'all' as its layer count (once, if also listed)."""
    return list(dict.fromkeys(model_layers[model] if k == "all" else k for k in spec.frozen_layers))


def with_resources(cell: TrialConfig, sweep: ResolvedSweep) -> TrialConfig:
    """How a cell runs (machine fields, never identity): its threads and its GPU share (which pins a
    CPU cell to the CPU: trials/precision.py resolve_device). Its checkpoints go where the Tune
    adapter puts them (Ray's storage)."""
    return dataclasses.replace(
        cell,
        num_threads=max(1, math.floor(sweep.spec.resources.cpus_per_trial)),
        gpus_per_trial=sweep.gpu_share,
        device=sweep.device or cell.device,
    )


def launch_units(pending: Iterable[TrialConfig], sweep: ResolvedSweep) -> list[list[TrialConfig]]:
    """The pending cells as a launch runs them (``with_resources``), one list per Ray trial: a trial
    array's members, or one cell (``trials.array.group_cells``). Linear in the cells."""
    from freezesweep.trials.array import group_cells  # torch: a launch's, not every reader's of the plan

    return group_cells([with_resources(c, sweep) for c in pending], sweep.array_width)


def round_count(pending: list[TrialConfig], sweep: ResolvedSweep) -> int:
    """How many rounds a launch runs ``pending`` in (``rounds`` of ``launch_units``), without placing
    each cell (~40 µs a cell, 4 s at 100,000): whether arrays pay is the sweep's (its switch, device and
    GPU share, the same for every cell), so one placed cell says it for all. An estimate where
    ``gpus_per_trial`` is auto: a launch may narrow the arrays to what its GPU measured."""
    from freezesweep.trials.array import arrays_pay, group_cells

    size = sweep.spec.resources.trials_per_round
    if not pending or sweep.array_width < 2 or not arrays_pay(with_resources(pending[0], sweep)):
        return -(-len(pending) // size)  # no arrays: a Ray trial a cell
    return -(-len(group_cells(pending, sweep.array_width, anywhere=True)) // size)


def rounds(units: Iterable[list[TrialConfig]], size: int) -> Iterator[list[list[TrialConfig]]]:
    """The units (``launch_units``: one Ray trial each), in rounds of at most ``size`` of them
    (``resources.trials_per_round``), each one Tune run: Tune's experiment state, its snapshots and
    its per-step bookkeeping grow with the trials of one run (ray#11233: snapshot time; TuneController
    scans its trial list at every step), and a round's start has a fixed cost on the driver (its Tuner,
    its trial actors importing the trial code: docs/scale.md), so counting trials, not cells, divides
    that cost by the arrays' width too. Units are never split: an array's members lie as far apart in
    the grid's order as the grid has seeds."""
    chunk: list[list[TrialConfig]] = []
    for unit in units:
        if len(chunk) >= size:
            yield chunk
            chunk = []
        chunk.append(unit)
    if chunk:
        yield chunk


def hungriest_frozen_layers(cells: list[TrialConfig]) -> int:
    """The freeze depth whose trial needs the most memory: nothing frozen (0) beats the embeddings
    alone (-1), which beats k layers; a LoRA cell backpropagates through every layer, as k = 0 does
    (the probe trains no layer at all)."""
    ks = {0 if c.method == "lora" else c.frozen_layers for c in cells if c.method != "probe"}
    return 0 if 0 in ks or not ks else (-1 if -1 in ks else min(ks))


def eval_entries_per_dataset(spec: SweepSpec, model: str, model_layers: Mapping[str, int]) -> int:
    """The evaluation cache entries one dataset's cells of ``model`` make in a worker
    (trials/eval_cache.py): one per frozen depth of at least one layer (probe cells share the
    every-layer one; LoRA cells make none), and of a random init one per seed too (its key names the
    seed). A worker keeps every entry it met, up to its ``MAX_EVAL_ENTRIES``, and a trial array holds
    each of its members' depths at once."""
    depths = {
        model_layers[model] if v["method"] == "probe" else v["frozen_layers"]
        for v in method_variants(spec, model, model_layers)
        if v["method"] in ("freeze", "probe")
    }
    seeds = len(spec.seeds) if spec.training.model_init == "random" else 1
    return seeds * sum(1 for k in depths if k >= 1)


def gpu_request(spec: SweepSpec) -> float:
    """The GPU a trial asks for: its share, or for ``auto`` (not measured yet) a whole GPU."""
    share = spec.resources.gpus_per_trial
    return 1.0 if share == "auto" else share


def with_doubled_gpu_share(sweep: ResolvedSweep) -> ResolvedSweep | None:
    """The sweep with twice the GPU share per trial (at most a whole GPU), for the cells that ran out
    of memory; None when trials do not share GPUs (CPU trials, or a whole GPU each: nothing to give)."""
    if not 0 < sweep.gpu_share < 1:
        return None
    return dataclasses.replace(sweep, gpu_share=min(1.0, 2 * sweep.gpu_share))


@dataclass(frozen=True)
class WorkEstimate:
    trial_s: float  # the pending cells' summed trial time
    measured_cells: int  # pending cells priced by a measured row of their own kind (the rest by the median)
    measured_rows: int  # the rows the prices come from


def estimate_work(pending: list[TrialConfig], wall_s: Mapping[tuple, list[float]]) -> WorkEstimate | None:
    """The pending cells' trial time from measured rows (``wall_s``: each ok row's wall time by
    ``work_key``): a cell costs the median of its own kind (model, dataset, train size, variant), else
    of its (model, dataset, train size), else of every measured row. None without any measured row."""
    every = [s for times in wall_s.values() for s in times]
    if not every:
        return None
    by_size: dict[tuple, list[float]] = {}
    for key, times in wall_s.items():
        by_size.setdefault(key[:3], []).extend(times)
    total, own = 0.0, 0
    medians: dict[tuple, float] = {}  # a kind's median once: a settle plan prices its whole budget too
    for cell in pending:
        key = work_key(cell)
        if key not in medians:
            medians[key] = statistics.median(wall_s.get(key) or by_size.get(key[:3]) or every)
        own += key in wall_s
        total += medians[key]
    return WorkEstimate(total, own, len(every))


def work_key(cell: TrialConfig) -> tuple:
    """What a trial's time depends on, as far as the plan can tell: model, data, size and variant."""
    return cell.model, cell.dataset, cell.train_size, cell.variant()


def cost_protocol(cell: TrialConfig) -> tuple:
    """What else a trial's time depends on across sweeps: the protocol (epochs, batch size, precision,
    …), but for ``split_seed`` (another draw of subsets of the same sizes costs the same)."""
    return tuple(sorted((name, repr(value)) for name, value in cell.protocol().items() if name != "split_seed"))


class PendingKinds:
    """The pending cells by kind (``work_key``), each kind's protocol (``cost_protocol``, ~40 µs a cell)
    computed once, when a measured row of that kind is first met: a plan matches the pending cells with
    every other sweep of the store, and computing each cell's protocol once per sweep made a 105,000-cell
    plan into a store of 7 tiny sweeps 25 s where an empty store took 15 (735,014 calls, most of its time)."""

    def __init__(self, pending: Iterable[TrialConfig]):
        # the cells of a kind differ in their seed alone, so share their protocol; the last one stands for
        # them, as it did when each cell's protocol was computed
        self._cells = {work_key(cell): cell for cell in pending}
        self._protocols: dict[tuple, tuple] = {}

    def protocol(self, key: tuple) -> tuple | None:
        """The protocol of the pending cells of kind ``key`` (None: no pending cell is of that kind)."""
        if key not in self._protocols and key in self._cells:
            self._protocols[key] = cost_protocol(self._cells[key])
        return self._protocols.get(key)


def measured_elsewhere(
    kinds: PendingKinds, other: ResolvedSweep, wall_s: Mapping[str, float]
) -> dict[tuple, list[float]]:
    """Another sweep's measured times (``wall_s``: its ok rows' wall time by trial id) of the pending
    cells' kinds (``work_key``) under their protocol: a new sweep with another split_seed, or one grown
    from an earlier sweep's kinds, is priced before its first trial. Linear in the other sweep's cells:
    ``kinds``, made once for every other sweep, adds nothing per pending cell."""
    found: dict[tuple, list[float]] = {}
    for cell in build_grid(other) if wall_s else ():
        if cell.trial_id not in wall_s:
            continue
        key = work_key(cell)
        wanted = kinds.protocol(key)
        if wanted is not None and cost_protocol(cell) == wanted:
            found.setdefault(key, []).append(wall_s[cell.trial_id])
    return found


def arm_of(cell: TrialConfig) -> str:
    """The cell's arm in settle mode's terms: "freeze k=3", "lora r=8", "probe"."""
    return variant_label(cell.method, cell.frozen_layers, cell.lora_rank)


def settle_round(sweep: ResolvedSweep, cells: list[TrialConfig], rows: pd.DataFrame) -> list[TrialConfig]:
    """Settle mode's next round (results/settle.py), given the stored rows (trial_id, status,
    best_val_score, baseline_score): per (model, dataset, train size), the cells the rule asks for
    (full fine-tuning's seeds until it is known to learn, then the arms' initial seeds, then seeds only
    for undecided arms, nearest deciding first: results.settle.next_round),
    and the group's cells whose row is not final (a failed one runs again). Empty: settled."""
    rule = sweep.spec.settle.rule()
    by_id = {c.trial_id: c for c in cells}
    stored = rows[rows["trial_id"].isin(by_id)]
    wanted: list[TrialConfig] = []
    for members in settle_groups(cells).values():
        wanted += group_round(members, stored, rule)
    return list(dict.fromkeys(wanted))


def settle_group(cell: TrialConfig) -> tuple:
    """The settle group a cell belongs to: its model, dataset and train size (each decided on its own rows)."""
    return (cell.model, cell.dataset, cell.train_size)


def settle_groups(cells: Iterable[TrialConfig]) -> dict[tuple, list[TrialConfig]]:
    """The cells by settle group, in the grid's order."""
    groups: dict[tuple, list[TrialConfig]] = {}
    for cell in cells:
        groups.setdefault(settle_group(cell), []).append(cell)
    return groups


def settle_scope(sweep: ResolvedSweep, cells: list[TrialConfig], rows: pd.DataFrame) -> list[TrialConfig]:
    """A settle sweep's cells as far as its rule reaches now: those with a stored row and those of the
    next round. The budget's other seeds of an arm decided early are never run, so never missing."""
    wanted = {c.trial_id for c in settle_round(sweep, cells, rows)} | set(rows["trial_id"])
    return [c for c in cells if c.trial_id in wanted]


def settle_budget_left(cells: list[TrialConfig], pending: list[TrialConfig], done: set[str]) -> list[TrialConfig]:
    """The most a settle sweep may still run: every cell without a final row (``done``) of the groups
    (model, dataset, train size) its next round (``pending``) runs in. A group with no cell in it is
    settled or at its budget and runs no more; an open one stops once it is decided, so its rounds run
    this at most, most often far less. Linear in the grid."""
    open_groups = {settle_group(c) for c in pending}
    return [c for c in cells if c.trial_id not in done and settle_group(c) in open_groups]


def sweep_arms(sweep: ResolvedSweep) -> dict[str, tuple[str, ...]]:
    """Each model's arms of the sweep's groups (full fine-tuning aside), from its variants without
    building the grid: the fixed sequence walks a model's frozen depths, and Holm's family counts every
    arm's claims (results.settle.decide)."""
    return {
        model: tuple(
            sorted(
                {
                    variant_label(v["method"], v["frozen_layers"], v.get("lora_rank"))
                    for v in method_variants(sweep.spec, model, sweep.model_layers)
                }
                - {FULL}
            )
        )
        for model in sweep.spec.models()
    }


def group_round(members: list[TrialConfig], stored: pd.DataFrame, rule) -> list[TrialConfig]:
    """One settle group's next cells (``settle_round``'s per group), from its stored rows: those the rule
    asks for and those whose row is not final."""
    ids = {c.trial_id: c for c in members}
    mine = stored[stored["trial_id"].isin(ids)]
    arms = pd.DataFrame(
        {
            "arm": [arm_of(ids[t]) for t in mine["trial_id"]],
            "seed": [ids[t].seed for t in mine["trial_id"]],
            "score": mine["best_val_score"].to_numpy(),
            "baseline_score": mine["baseline_score"].to_numpy(),
            "status": mine["status"].to_numpy(),
            "collapsed": mine["collapsed"].to_numpy() if "collapsed" in mine else None,
        }
    )
    grid_arms = {arm_of(c) for c in members}
    decision = decide(arms, rule, arms=grid_arms)
    seeds_done = arms.groupby("arm")["seed"].agg(set).to_dict()
    by_arm_seed = {(arm_of(c), c.seed): c for c in members}
    asked = next_round(decision, rule, sorted(grid_arms - {FULL}), seeds_done)
    again = [ids[t] for t, status in zip(mine["trial_id"], mine["status"]) if status not in FINAL_STATUSES]
    return again + [by_arm_seed[key] for key in asked if key in by_arm_seed]
