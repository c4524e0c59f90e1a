"""A sweep as the plan sees it, without running anything: a spec resolved (on this machine, or with
what a launch measured on the cluster), or the resolved spec a sweep was stored with.

Inspection (status, summary, query, report) needs only this layer: no Ray, no torch.

One verb per meaning: ``resolve_*`` decides what depends on the machine, the data or the cluster
(``resolve_spec``, ``resolve_here``, ``resolve_for_plan``; a launch's is launch.py's
``resolve_for_launch``); ``load_*`` reads what a sweep's store holds (``load_sweep_spec``, ``load_sweep``).
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from freezesweep.orchestrator.checks import flatten, model_depths, select_metrics, stored_spec_mapping, validate
from freezesweep.orchestrator.plan import (
    GRID_AXES,
    ResolvedSweep,
    build_grid,
    gpu_request,
    in_grid,
    iter_grid,
    settle_round,
)
from freezesweep.orchestrator.spec import SpecError, SweepNotFound, SweepSpec
from freezesweep.results.store import LAUNCH_FILE, ResultStore, StoreError
from freezesweep.trials.config import TrialConfig
from freezesweep.trials.data import resolve_data_dir

if TYPE_CHECKING:
    import pandas as pd

# A stored spec with precision "auto" was written before ids named the resolved precision and before
# the reference schedule and paired seeds: its rows cannot be continued under the same ids.
OLD_SWEEP = (
    "this sweep was made by a freezesweep before 0.2 (other evaluation schedule, seeds and cell ids): "
    "its rows stay readable, but it cannot be continued; launch the spec under a new sweep name"
)


def resolve_spec(spec: SweepSpec, precision: str) -> SweepSpec:
    """``spec`` with its precision, each dataset's select metric (stored resolved, so status and report
    never need the data) and the data dir this machine reads (so ``resume`` works without the
    environment variable) decided. Its GPU share stays as written: ``auto`` is measured by a launch
    (a resume on other GPUs measures again)."""
    local = resolve_data_dir(None)
    spec = spec.model_copy(update={"data_dir": spec.data_dir or (str(local.resolve()) if local else None)})
    training = spec.training.model_copy(update={"precision": precision, "select_metric": select_metrics(spec)})
    return spec.model_copy(update={"training": training})


def _resolve_in(spec: SweepSpec, precision: str) -> ResolvedSweep:
    """``spec`` resolved in ``precision``, without Ray (inspection and plans: no cluster, no GPU share measured)."""
    return ResolvedSweep(resolve_spec(spec, precision), model_depths(spec))


def resolve_here(spec: SweepSpec) -> ResolvedSweep:
    """``spec`` resolved on this machine, without Ray: ``auto`` precision as this machine's CPU or GPU
    runs it natively (the embedded Ray's trials run here)."""
    return _resolve_in(spec, precision_here(spec))


def resolve_for_plan(spec: SweepSpec) -> tuple[ResolvedSweep, str | None]:
    """``spec`` resolved for a dry run (no Ray, nothing written): ``auto`` as the stored sweep ran it,
    else as this machine runs it; GPU trials planned where there is no GPU take bf16 (what GPUs since
    2020 resolve to), said in the note returned beside the sweep, since cell ids name the precision."""
    if spec.training.precision != "auto":
        return resolve_here(spec), None
    raw = stored_spec_mapping(ResultStore(spec.store, spec.name))
    stored = (raw.get("training") or {}).get("precision") if raw else None
    if stored not in (None, "auto"):
        return _resolve_in(spec, stored), None
    try:
        return resolve_here(spec), None
    except (RuntimeError, AssertionError):  # torch's "no CUDA" for GPU trials planned on a CPU machine
        return _resolve_in(spec, "bf16"), (
            "precision auto resolves on the trials' GPUs; planned as bf16 (GPUs of "
            "compute capability 8.0 and later), which fixes the cell ids shown"
        )


def cpu_precision_note(spec: SweepSpec) -> str | None:
    """CPU trials on this machine (no cluster: its nodes' CPUs are not this one's): what ``auto`` runs, or
    bf16 asked for where it is emulated (an AVX2 walk-through's bf16 ran 3–9× slower, said nowhere)."""
    if spec.address or os.environ.get("RAY_ADDRESS") or gpu_request(spec) > 0:
        return None
    from freezesweep.trials.precision import cpu_precision_note as note  # torch: deferred, as below

    return note(spec.training.precision)


def precision_here(spec: SweepSpec) -> str:
    if spec.training.precision != "auto":
        return spec.training.precision
    from freezesweep.trials.precision import (
        auto_precision,
    )  # torch: deferred, inspection of stored sweeps never needs it

    return auto_precision("cuda" if gpu_request(spec) > 0 else "cpu")


def load_sweep_spec(name: str, store_uri: str, semantic: bool = False) -> SweepSpec:
    """The spec a sweep was launched with, as stored; ``semantic=False`` skips the checks that load
    the model and data (inspection needs neither)."""
    store = ResultStore(store_uri, name)
    raw = stored_spec_mapping(store)
    if raw is None:
        raise no_such_sweep(store)
    source = f"{store_uri}/{name}/spec.yaml"
    spec = validate(raw, source, semantic=semantic)
    if spec.training.precision == "auto":  # stored unresolved: written by a freezesweep before 0.2
        raise SpecError([OLD_SWEEP], source)
    return spec


def no_such_sweep(store: ResultStore, also: Sequence[str] = (), spec_file: str | None = None) -> SweepNotFound:
    """A name the store does not hold (and ``also``: more names asked of it together, that it lacks too):
    where it was looked for, what is there, and how to point the command at the store a spec named
    (``store:``; the default is only ./sweeps)."""
    if store.lost_its_spec() and not also:  # its rows are there: not a missing sweep, a missing file
        return SweepNotFound(
            f"sweep {store.sweep!r} in store {store.uri!r} has rows but no spec.yaml (deleted?): launch its spec "
            f"file again with --store {store.uri} (store=… in Python): its ok rows count as done, nothing is lost",
            store.uri,
        )
    found = store.other_sweeps()
    remote = "://" in store.uri
    where = f"{store.uri!r} ({store.root_path()})" if not remote and store.uri != store.root_path() else repr(store.uri)
    held = (
        "which does not exist"
        if found is None
        else "which holds no sweep"
        if not found
        else f"which holds {', '.join(found[:10])}" + (f" and {len(found) - 10} more" if len(found) > 10 else "")
    )
    base = store.uri.rstrip("/")
    if "/" in base and store.root_is_a_sweep():  # --store sweeps/demo (its parent as given: s3://b/sweeps too)
        parent, own = base.rsplit("/", 1)
        held += f" (it is the folder of sweep {own!r}: its store is the folder above, {parent!r})"
    names = [store.sweep, *also]
    close = {n: c[0] for n in names if (c := difflib.get_close_matches(n, found or [], n=1))}
    if close:
        meant = ", ".join(f"{c!r}" if len(names) == 1 else f"{c!r} for {n!r}" for n, c in close.items())
        held += f" (did you mean {meant}?)"
    # A relative store is the current folder's, as it was the launch's (a spec file's `store:` too): said
    # where the store is missing or nothing in it is near the name (a typo in the right folder is a typo).
    relative = not remote and not os.path.isabs(os.path.expanduser(store.uri))
    elsewhere = (
        "a relative store is read from the current folder, as the launch that wrote it read it: run this where "
        "the sweep was launched, or give --store ROOT (store=ROOT in Python); "
        if relative and (found is None or not close)
        else ""
    )
    python = "" if elsewhere else " (store=ROOT in Python)"
    # given the spec file already (a walk-through was told to give it): the store is its `store:`
    tail = (
        f"the store is the one spec file {spec_file} names (its `store:`)"
        if spec_file
        else f"a sweep whose spec names another store (its `store:`) is read there: --store ROOT{python}, or give "
        "its spec file in place of the name, which names both"
    )
    return SweepNotFound(
        f"no sweep named {' or '.join(map(repr, names))} in store {where}, {held}; {elsewhere}{tail}", store.uri
    )


def launch_folder_for(spec: SweepSpec, store: ResultStore, here: str | None = None) -> str | None:
    """Where a resume of a stored sweep reads its spec's relative paths (its data dir, local datasets and
    model folders; cell ids name them as written): the folder its launch ran in, where more of them are
    found than from ``here`` (the current folder) and each one found here is found too; None: here."""
    relative = [p for p in _local_paths(spec) if not os.path.isabs(os.path.expanduser(p))]
    folder = store.read_launch_folder()
    here = os.path.abspath(here or os.getcwd())
    if not relative or folder is None or not os.path.isdir(folder) or os.path.abspath(folder) == here:
        return None
    found_here = {p for p in relative if os.path.exists(os.path.join(here, os.path.expanduser(p)))}
    found_there = {p for p in relative if os.path.exists(os.path.join(folder, os.path.expanduser(p)))}
    return folder if found_there > found_here else None


def lost_folder_note(spec: SweepSpec, store: ResultStore, here: str | None = None) -> str | None:
    """Where the folder a sweep was launched in is gone and some of its spec's relative paths are not found
    here either: said before a resume reads them (a walk-through moved its project folder, and the model
    folder not found was read as a hub id: "We couldn't connect to 'https://huggingface.co'")."""
    folder = store.read_launch_folder()
    if folder is not None and os.path.isdir(folder):
        return None
    here = os.path.abspath(here or os.getcwd())
    from freezesweep.trials.hub import cached_hub_model

    # with no launch folder kept, a model named like a hub id is one (not cached here, it downloads): only
    # a model that can only be a folder is looked for (a review: google-bert/bert-base-uncased was listed)
    models = spec.models() if folder else [m for m in spec.models() if _only_a_folder(m)]
    paths = [p for p in _local_paths(spec) if p not in spec.models() or p in models]
    relative = [p for p in paths if not os.path.isabs(os.path.expanduser(p))]
    missing = [p for p in relative if not os.path.exists(os.path.join(here, os.path.expanduser(p)))]
    missing = [p for p in missing if not cached_hub_model(p)]  # a hub model needs no folder (a review)
    if not missing:
        return None
    # a store an earlier version launched keeps no launch folder (an upgrade walk-through's resume)
    launched = (
        f"was launched in {folder}, which is gone"
        if folder
        else f"does not say which folder it was launched in ({LAUNCH_FILE} came after its launch)"
    )
    return (
        f"sweep {spec.name!r} {launched}; its spec's relative paths are read from here "
        f"({here}), where {', '.join(missing)} {'are' if len(missing) > 1 else 'is'} not found (a model not found "
        "is read as a hub id): run the resume from the folder that holds them"
    )


def _only_a_folder(model: str) -> bool:
    """A model name no hub id can be (``./model``, ``~/m``, ``a/b/c``): hub ids are ``name`` or ``org/name``."""
    return model.startswith((".", "~")) or model.replace(os.sep, "/").count("/") > 1


def _local_paths(spec: SweepSpec) -> list[str]:
    """Every path the spec may name (a model: a hub id or a folder, either way)."""
    datasets = [p.strip() for d in spec.datasets if not d.startswith("glue/") for p in d.split(",")]
    return [*([spec.data_dir] if spec.data_dir else []), *datasets, *spec.models()]


# What a launch decides and stores, that a spec file leaves open or names for this machine alone.
_RESOLVED_KEYS = {"training.precision": "auto", "training.select_metric": None, "data_dir": None}
_WHERE_KEYS = ("store", "address")


def spec_differences(stored: SweepSpec, given: SweepSpec | None) -> list[str]:
    """What ``given`` (a spec file's) says otherwise than the stored sweep, key by key ("training.epochs:
    stored 1.0, the file 2.0"), beside what a launch resolves where the file left it open (precision
    auto, the select metric, the data dir) and where things are (store, address)."""
    if given is None:
        return []
    ours, theirs = _as_launched(stored), _as_launched(given)
    return [
        f"{key}: stored {ours.get(key)!r}, the file {value!r}"
        for key, value in theirs.items()
        if key not in _WHERE_KEYS
        and ours.get(key) != value
        and not (key in _RESOLVED_KEYS and value == _RESOLVED_KEYS[key])
    ]


def _as_launched(spec: SweepSpec) -> dict[str, Any]:
    """A spec's values by dotted key (lists whole), its models as one list (`model: x` is `models: [x]`)
    and one select metric for every dataset as a launch stores it (``{dataset: metric}``)."""
    values = spec.model_dump(mode="json")
    values["model"] = spec.models()
    metric = spec.training.select_metric
    if isinstance(metric, str):
        values["training"]["select_metric"] = dict.fromkeys(spec.datasets, metric)
    return flatten(values)


def load_sweep(name: str, store_uri: str) -> ResolvedSweep:
    """A stored sweep, resolved as it was launched (its cells are what ``status`` and the report count)."""
    spec = load_sweep_spec(name, store_uri)
    training = spec.training.model_copy(update={"select_metric": select_metrics(spec)})  # a legacy one names one metric
    return ResolvedSweep(spec.model_copy(update={"training": training}), model_depths(spec), address=spec.address)


# What settle mode reads of the stored rows to choose its next round.
SETTLE_COLUMNS = ["trial_id", "status", "best_val_score", "baseline_score", "collapsed"]


def grid_statuses(sweep: ResolvedSweep, store: ResultStore) -> tuple[dict[str, str], dict[str, str]]:
    """trial_id → status of the stored rows that are cells of the grid now (``plan.in_grid``: a row of a
    value removed from an axis is no cell done; a walk-through's launch said "22/18 ended"), and of every
    stored row (none of which Ray's saved state may write again)."""
    rows = store.read_table(columns=["trial_id", "status", *GRID_AXES]).to_pandas()
    kept = rows[in_grid(sweep, rows)]
    return dict(zip(kept["trial_id"], kept["status"])), dict(zip(rows["trial_id"], rows["status"]))


def next_cells(sweep: ResolvedSweep, store: ResultStore, done: set[str]) -> Iterable[TrialConfig]:
    """The cells a launch runs now (and the dry run shows): a fixed grid's every cell without a final
    row (in ``done``), as the grid yields them (a launch's first round starts before the last cell is
    built); in settle mode, the next round the stored rows call for (orchestrator/plan.py settle_round)."""
    if sweep.spec.settle is None:
        return (c for c in iter_grid(sweep) if c.trial_id not in done)
    return [c for c in settle_round(sweep, build_grid(sweep), settle_rows(store)) if c.trial_id not in done]


def settle_rows(store: ResultStore) -> pd.DataFrame:
    """The stored rows' columns settle mode's rounds read (``SETTLE_COLUMNS``)."""
    return store.read_table(columns=SETTLE_COLUMNS).to_pandas()


def same_cells_note(spec: SweepSpec) -> str | None:
    """Another sweep of the store that holds this grid's cells: the same protocol, split_seed included, and
    a model, dataset, train size, arm and seed in common, so the same subsets, batch orders and run seeds
    (a cell's id is its content). They run again to the same numbers, and a question asked of them anew
    looks at rows already seen (a walk-through followed a report's "a new settle sweep" under the default
    split_seed, and its first round reran the other sweep's cells bit for bit). From the stored specs
    alone: no grid is built, no row read."""
    store = ResultStore(spec.store, spec.name)
    shared = {}
    for name in store.other_sweeps() or []:
        try:
            other = SweepSpec.model_validate(stored_spec_mapping(ResultStore(spec.store, name)) or {})
        except (ValueError, StoreError, OSError):  # an old, damaged or foreign sweep: nothing to compare
            continue
        cells = _cells_in_common(spec, other) if name != spec.name else 0
        if cells:
            shared[name] = cells
    if not shared:
        return None
    named = ", ".join(f"{cells:,} with sweep {name!r}" for name, cells in shared.items())
    return (
        f"this grid shares cells with other sweeps of the store ({named}): the same protocol and split_seed, "
        "so the same subsets, batch orders and run seeds; they run again to the same numbers, and a question "
        "asked of them anew looks at rows already seen (another split_seed gives fresh ones)"
    )


def _cells_in_common(spec: SweepSpec, other: SweepSpec) -> int:
    """How many cells both grids hold: the product of their axes' common values where their protocols
    are one on the datasets both have (``auto`` precision taken as the other's, as a launch resolves it;
    each dataset's select metric, part of a cell's id, resolved as checks' ``_protocol_changes`` does)."""
    common = [d for d in spec.datasets if d in other.datasets]
    if not common:
        return 0
    if spec.training.precision == "auto":
        spec = spec.model_copy(
            update={"training": spec.training.model_copy(update={"precision": other.training.precision})}
        )
    try:
        mine, theirs = (s.model_copy(update={"datasets": common}) for s in (spec, other))
        if flatten(mine.protocol(select_metrics(mine))) != flatten(theirs.protocol(select_metrics(theirs))):
            return 0
    except (ValueError, OSError):  # a dataset not readable here: its cells are not known to be shared
        return 0
    arms = len(_arms_of(spec) & _arms_of(other))
    axes = [(s.models(), s.datasets, s.train_sizes, s.seed_values()) for s in (spec, other)]
    shared = [len(set(a) & set(b)) for a, b in zip(*axes)]
    return arms * math.prod(shared)


def _arms_of(spec: SweepSpec) -> set[str]:
    """The spec's arms as written ("freeze 2", "freeze all", "lora 8", "probe")."""
    depths = {f"freeze {k}" for k in spec.frozen_layers} if "freeze" in spec.methods else set()
    ranks = {f"lora {r}" for r in spec.lora_ranks} if "lora" in spec.methods else set()
    return depths | ranks | ({"probe"} if "probe" in spec.methods else set())
