"""freezesweep's Python API: what the command line does, as functions a notebook or a job script calls.

Every function here is exported at ``freezesweep`` itself (``import freezesweep as fs``):
``fs.load_spec`` / ``fs.build_spec`` make a validated spec, ``fs.plan`` is the dry run, ``fs.launch``
and ``fs.resume`` run a sweep (blocking) and return its :class:`LaunchSummary`; ``fs.results_frame``,
``fs.results_arrow``, ``fs.results_duckdb`` and ``fs.query`` read its rows; ``fs.status`` and
``fs.summary`` inspect it; ``fs.decide`` gives the decisions as objects and as a DataFrame;
``fs.report`` writes the HTML and Markdown report; ``fs.compact`` compacts the store.

The CLI (orchestrator/cli.py) parses its arguments, calls these and prints what they return.

Deferred on purpose: Ray, torch and transformers are imported inside the functions that need them,
so reading a stored sweep's rows never pays their import time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import pandas as pd

from freezesweep.orchestrator.spec import (
    DEFAULT_STORE,
    LARGE_GRID,
    NAME_PATTERN,
    SpecError,
    SweepNotFound,
    SweepSpec,
    read_yaml,
)
from freezesweep.results.reprs import short_repr
from freezesweep.results.store import ResultStore, StoreError

if TYPE_CHECKING:  # the annotations only: importing them at run time would import Ray and torch
    import duckdb
    import pyarrow as pa

    from freezesweep.orchestrator.launch import LaunchSummary
    from freezesweep.orchestrator.plan import ResolvedSweep, WorkEstimate
    from freezesweep.results.mlflow_export import Exported
    from freezesweep.results.report import Report, SweepRows
    from freezesweep.trials.config import TrialConfig

#: A spec as the API takes it: a YAML file's path, a mapping of its keys, or a :class:`SweepSpec`.
SpecSource = Union[str, Path, Mapping[str, Any], SweepSpec]
#: A stored sweep as the API takes it: its name, the spec file it was launched from, or that spec (a
#: :class:`SweepSpec`, as :func:`load_spec` gives it), which names its store too.
SweepRef = Union[str, Path, SweepSpec]

__all__ = [
    "SpecSource",
    "SweepRef",
    "UnreadableRowsWarning",
    "UnfinishedCellsWarning",
    "Plan",
    "SweepStatus",
    "Decision",
    "Decisions",
    "load_spec",
    "build_spec",
    "plan",
    "launch",
    "resume",
    "results_frame",
    "results_arrow",
    "results_duckdb",
    "query",
    "status",
    "summary",
    "decide",
    "report",
    "compact",
    "export_mlflow",
    "budget_prices",
]


class UnreadableRowsWarning(UserWarning):
    """Row files of a sweep that could not be read were left out (``resume`` sets them aside and runs
    their cells again)."""


class UnfinishedCellsWarning(UserWarning):
    """A launch or resume was interrupted (Ctrl-C, SIGTERM) and returned with cells not finished: nothing
    was lost, and :func:`resume` runs them (the summary's ``unfinished`` counts them)."""


# --- specs -----------------------------------------------------------------------------------------
def _raw_spec(source: SpecSource, store: str | None, address: str | None) -> tuple[Any, str]:
    """The spec's mapping with the overrides on top, and what to call it in errors."""
    overrides = {"store": store, "address": address}
    if isinstance(source, SweepSpec):
        raw, name = source.model_dump(mode="json"), f"sweep spec {source.name!r}"
    elif isinstance(source, Mapping):
        raw, name = dict(source), "sweep spec"
    else:
        return read_yaml(_spec_path(source, store), overrides), str(source)
    return {**raw, **{k: v for k, v in overrides.items() if v is not None}}, name


# The start of YAML text given where a file's path belongs: a key and its value ("name: demo"), a flow mapping.
_YAML_TEXT = re.compile(r"\s*(\{|[A-Za-z_][\w-]*:(\s|$))")


def _spec_path(source: object, store: str | None) -> str | Path:
    """A spec file's path, as given; what else was given where one belongs is said plainly (a walk-through:
    YAML text echoed whole as "no such file", bytes a bare TypeError, a stored sweep's name "no such file")."""
    if not isinstance(source, (str, Path)):
        raise TypeError(
            f"a spec is a YAML file's path (str or Path), a mapping of its keys or a SweepSpec, not {type(source).__name__}"
        )
    text = str(source)
    if os.path.exists(text):
        return source
    if isinstance(source, str) and ("\n" in text or _YAML_TEXT.match(text)):
        raise SpecError(
            [
                "looks like YAML text, not a file's path: a spec is read from its file, or given as a mapping of its "
                "keys (fs.load_spec(yaml.safe_load(text)), or fs.build_spec(**yaml.safe_load(text)))"
            ],
            f"spec text {_text_start(text)}",
        )
    root = store or DEFAULT_STORE
    if _is_stored_sweep(text, root):
        where = "" if root == DEFAULT_STORE else f", store={root!r}"
        raise SpecError(
            [
                f"no such file, but sweep {text!r} is in store {root!r}: resume continues it with the spec it was "
                f"launched with ({root.rstrip('/')}/{text}/spec.yaml): fs.resume({text!r}{where}), or "
                f"`freezesweep resume {text}{store_flag(root)}`; that spec file is a spec like any other (plan it by "
                "its path)"
            ],
            text,
        )
    return source


def _text_start(text: str) -> str:
    """A text's start, quoted, for an error that must not echo all of it."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return repr(first[:40] + "…" if len(first) > 40 or len(text.strip().splitlines()) > 1 else first)


def _is_stored_sweep(name: str, root: str, dotted: bool = False) -> bool:
    """``name`` is a sweep ``root`` holds (a store that cannot be read holds none, for this question);
    ``dotted``: a name like a spec file's (x.yaml) too."""
    if not re.match(NAME_PATTERN, name) or (name.endswith((".yaml", ".yml")) and not dotted):
        return False
    try:
        return ResultStore(root, name).exists()
    except (StoreError, OSError, ValueError):
        return False


def load_spec(
    source: SpecSource,
    *,
    store: str | None = None,
    address: str | None = None,
    check_data: bool = True,
    check_devices: bool = True,
) -> SweepSpec:
    """A sweep spec, validated: every problem named in one :class:`SpecError`.

    A stored sweep of the same name is not compared with it here: :func:`plan` and :func:`launch` refuse a
    changed protocol, and a reader given the spec (``fs.results_frame(spec)``) reads that sweep as stored.

    Args:
        source: a YAML file's path (not its text: give that as a mapping, ``yaml.safe_load(text)``), a
            mapping of the spec's keys, or a spec to check again.
        store: the store root, over the spec's own (default ``./sweeps``); a local folder or a URI
            such as ``s3://bucket/sweeps``.
        address: the Ray cluster the trials run on, over the spec's own.
        check_data: load the models and data to check them (False: shapes and values only).
        check_devices: check that the GPUs and CPUs the trials ask for are here (False: planned
            away from them).
    """
    from freezesweep.orchestrator.checks import validate

    raw, name = _raw_spec(source, store, address)
    # not against a stored sweep of its name: a spec that names what to read is read, however it differs
    return validate(raw, name, semantic=check_data, devices=check_devices, against_stored=False)


def build_spec(fields: Mapping[str, Any] | None = None, /, **more: Any) -> SweepSpec:
    """A spec from its keys, as a YAML file would hold them, validated like :func:`load_spec`.

    ``fs.build_spec(name="demo", model="sentence-transformers/all-MiniLM-L6-v2", datasets=["glue/sst2"],
    train_sizes=[200], frozen_layers=[0, 3, 6], seeds=[0, 1, 2])``
    """
    return load_spec({**(fields or {}), **more})


# --- plan: the dry run -----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)  # DataFrames have no single truth value to compare by
class Plan:
    """What a launch of the spec would do now; nothing was started or written."""

    name: str
    settle: bool  # settle mode: ``pending`` is its next round, ``cells`` its budget
    cells: list[TrialConfig]  # the grid (settle mode: every cell the budget allows)
    pending: list[TrialConfig]  # the cells a launch runs now
    done: int  # cells with a final row (ok, diverged)
    rounds: int  # Tune runs the pending cells take (``resources.trials_per_round`` Ray trials each)
    status: pd.DataFrame  # per axis value: done / failed / missing cells (settle: of those it ran, and next)
    work: WorkEstimate | None  # the pending cells' trial time, priced by the store's measured rows
    priced_from: tuple[str, ...]  # the store's other sweeps whose rows priced kinds this one has not run
    trials_at_once: int  # this machine's cores per trial, or ``max_concurrent_trials``
    notes: tuple[str, ...] = ()  # what a launch would say first: rows left out of the data, how ``precision:
    # auto`` was planned off its GPUs, a grid too small to advise
    size_words: str = ""  # the grid's axes, e.g. "1 models × 1 datasets × …"
    gpus_here: str | None = None  # this machine's GPUs and whether CUDA MPS is on (None: no GPU here)
    # settle mode: the most its rounds may still run (plan.settle_budget_left: every cell not done of the groups
    # still open), priced as ``work`` is, an upper bound; None in a fixed grid (``work`` prices all it runs)
    budget: list[TrialConfig] | None = None
    budget_work: WorkEstimate | None = None
    budget_priced_from: tuple[str, ...] = ()  # as ``priced_from``, for the budget's kinds

    __repr__ = short_repr  # a notebook prints it: the grid's size, not a million cells

    @property
    def note(self) -> str | None:
        """The notes as one text (None: none)."""
        return "; ".join(self.notes) or None


def plan(spec: SpecSource, *, store: str | None = None) -> Plan:
    """The dry run: the grid's cells, which are done and which a launch would run now, and the work
    left as the store's measured trial times price it. Nothing starts, nothing is written."""
    with _quiet_transformers():  # transformers' warnings of building the skeletons are not the user's
        return _plan(spec, store)


def _plan(spec: SpecSource, store: str | None) -> Plan:
    """``plan``'s work, under its quietened libraries."""
    from freezesweep.orchestrator.plan import build_grid, grid_size_words, round_count, settle_budget_left
    from freezesweep.orchestrator.sweeps import next_cells, resolve_for_plan
    from freezesweep.results.query import status_table
    from freezesweep.results.store import final_of
    from freezesweep.trials.placement import mps_here

    from freezesweep.orchestrator.checks import store_write_note, validate

    raw, name = _raw_spec(spec, store, None)
    # the trials' machines are not here; a stored sweep of its name is compared with it, as a launch does
    spec = validate(raw, name, devices=False, writes=False)
    sweep, precision_note = resolve_for_plan(spec)
    # what a launch will say too (_spec_notes), and a store this dry run may read but not write
    notes = tuple(n for n in (precision_note, *_spec_notes(spec), store_write_note(spec)) if n)
    cells = build_grid(sweep)
    result_store = ResultStore(spec.store, spec.name)
    rows = result_store.read_table(columns=["trial_id", "status", "wall_time_s"]).to_pandas()
    statuses = dict(zip(rows["trial_id"], rows["status"]))
    done = final_of(statuses)
    pending = list(next_cells(sweep, result_store, done))
    # settle mode prices its next round and the whole budget left, at most (what a report's open group quotes)
    budget = settle_budget_left(cells, pending, done) if spec.settle is not None else None
    (work, priced_from), (budget_work, budget_from) = _work(cells, pending, rows, result_store, budget)
    at_once = spec.resources.max_concurrent_trials or max(
        1, int((os.cpu_count() or 1) // spec.resources.cpus_per_trial)
    )
    return Plan(
        spec.name,
        spec.settle is not None,
        cells,
        pending,
        len(done & {c.trial_id for c in cells}),
        round_count(pending, sweep),
        status_table(_counted_cells(sweep, result_store, cells), statuses),  # as `status` counts
        work,
        priced_from,
        at_once,
        notes,
        grid_size_words(sweep) + _one_depth(spec, sweep.model_layers),
        mps_here(),
        budget,
        budget_work,
        budget_from,
    )


def _one_depth(spec: SweepSpec, model_layers: Mapping[str, int]) -> str:
    """Where ``all`` and a listed k are one depth of a model (a cell once): said beside the axes' product."""
    if "freeze" not in spec.methods or "all" not in spec.frozen_layers:
        return ""
    same = [f"{model}: all is k = {n}, also listed" for model, n in model_layers.items() if n in spec.frozen_layers]
    return f"; one cell per depth ({'; '.join(same)})" if same else ""


def _work(
    cells: list[TrialConfig],
    pending: list[TrialConfig],
    rows: pd.DataFrame,
    result_store: ResultStore,
    budget: list[TrialConfig] | None = None,
) -> tuple[tuple[WorkEstimate | None, tuple[str, ...]], tuple[WorkEstimate | None, tuple[str, ...]]]:
    """The pending cells' trial time, priced by the sweep's own measured ok rows, and for the kinds it
    has none of, by the store's other sweeps' (orchestrator/plan.py); and the sweeps that priced it. The
    same of ``budget`` (settle mode's budget left, which holds the pending cells; None: not priced), from
    the same rows: the other sweeps are read once for both, and the pending cells' price is what it is
    without a budget."""
    from freezesweep.orchestrator.plan import estimate_work, work_key

    measured = _measured(cells, rows)
    unpriced = [c for c in (pending if budget is None else budget) if work_key(c) not in measured]
    per_sweep = _measured_in_other_sweeps(unpriced, result_store) if unpriced else {}
    elsewhere, sources = _priced_by(per_sweep, None if budget is None else {work_key(c) for c in pending})
    work = estimate_work(pending, {**elsewhere, **measured}), sources
    if budget is None:
        return work, (None, ())
    elsewhere, sources = _priced_by(per_sweep, None)
    return work, (estimate_work(budget, {**elsewhere, **measured}), sources)


def _priced_by(
    per_sweep: Mapping[str, Mapping[tuple, list[float]]], kinds: set[tuple] | None
) -> tuple[dict[tuple, list[float]], tuple[str, ...]]:
    """The other sweeps' measured times (``_measured_in_other_sweeps``) of ``kinds`` (None: all), and the
    sweeps that had some."""
    found: dict[tuple, list[float]] = {}
    sources = []
    for name, times_of in per_sweep.items():
        for key, times in times_of.items():
            if kinds is None or key in kinds:
                found.setdefault(key, []).extend(times)
                sources.append(name)
    return found, tuple(dict.fromkeys(sources))


def _listed_values(raw: Mapping[str, Any], *keys: str) -> list[str]:
    """A stored spec's axis (a name or a list of them) under the first of ``keys`` it has."""
    value = next((raw[k] for k in keys if k in raw), None)
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, str)]


def _measured(cells: list[TrialConfig], rows: pd.DataFrame) -> dict[tuple, list[float]]:
    """The cells' ok rows' wall times by ``work_key``: what `plan` and the budget prices price with."""
    from freezesweep.orchestrator.plan import work_key

    wall = _ok_times(rows)
    measured: dict[tuple, list[float]] = {}
    for cell in cells:
        if cell.trial_id in wall:
            measured.setdefault(work_key(cell), []).append(wall[cell.trial_id])
    return measured


def _ok_times(rows: pd.DataFrame) -> dict[str, float]:
    ok = rows[(rows["status"] == "ok") & rows["wall_time_s"].notna()]  # NaN: not measured
    return dict(zip(ok["trial_id"], ok["wall_time_s"].astype(float)))


def _measured_in_other_sweeps(
    pending: list[TrialConfig], result_store: ResultStore
) -> dict[str, dict[tuple, list[float]]]:
    """The measured times of ``pending``'s kinds in the store's other sweeps of their models and
    datasets (``plan.measured_elsewhere``), by sweep (those with some). One that cannot be read prices nothing."""
    from freezesweep.orchestrator.checks import stored_spec_mapping
    from freezesweep.orchestrator.plan import PendingKinds, measured_elsewhere
    from freezesweep.orchestrator.sweeps import load_sweep

    models, datasets = {c.model for c in pending}, {c.dataset for c in pending}
    kinds = PendingKinds(pending)  # grouped by kind once, whatever the number of other sweeps
    found: dict[str, dict[tuple, list[float]]] = {}
    for name in result_store.other_sweeps() or []:
        if name == result_store.sweep:
            continue
        try:
            other_store = ResultStore(result_store.uri, name)
            # its spec as stored, read before anything that loads a model: only sweeps of these models and
            # datasets are resolved, their grids built and their rows read
            raw = stored_spec_mapping(other_store) or {}
            if not (
                models & set(_listed_values(raw, "model", "models")) and datasets & set(_listed_values(raw, "datasets"))
            ):
                continue
            other = load_sweep(name, result_store.uri)
            rows = other_store.read_table(columns=["trial_id", "status", "wall_time_s"])
        except (SpecError, StoreError, ValueError, OSError):  # an old, damaged or foreign sweep prices nothing
            continue
        times_of = measured_elsewhere(kinds, other, _ok_times(rows.to_pandas()))
        if times_of:
            found[name] = times_of
    return found


# --- launch and resume -----------------------------------------------------------------------------
@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[list[int]]:
    """SIGTERM (a scheduler or ``kill`` stopping the driver) handled like Ctrl-C: Tune stops its trials,
    the lock is released, Ray shuts down on the way out. Yields the signals received. Only the main
    thread may set a handler: elsewhere (a notebook's worker thread) SIGTERM keeps its own."""
    if _RECEIVED:  # nested (the CLI's around the API's): one handler, one list
        yield _RECEIVED[-1]
        return
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def on_term(signum, frame) -> None:
        received.append(signum)
        signal.raise_signal(signal.SIGINT)  # Tune's graceful stop while it runs; KeyboardInterrupt elsewhere

    previous = signal.signal(signal.SIGTERM, on_term)
    _RECEIVED.append(received)
    try:
        yield received
    finally:
        _RECEIVED.pop()
        signal.signal(signal.SIGTERM, previous)


_RECEIVED: list[list[int]] = []  # the signals list of the handler installed now, if any


def launch(
    spec: SpecSource, *, store: str | None = None, address: str | None = None, progress: bool = True
) -> LaunchSummary:
    """Validate a spec (against the cluster when there is one), then run every cell that has no ok row
    yet, blocking until the sweep is done, and return what happened.

    Ctrl-C (or SIGTERM) stops it as in the CLI: Tune stops its trials, nothing is lost, and the summary
    counts the cells left ``unfinished`` (``terminated`` says SIGTERM did it; its ``outcome`` and repr
    say it in words), with an :class:`UnfinishedCellsWarning`; before or after Tune runs it raises
    ``KeyboardInterrupt``. :func:`resume` goes on.

    Args:
        spec: a YAML file's path, a mapping of the spec's keys, or a :class:`SweepSpec`.
        store: the store root, over the spec's own.
        address: a Ray cluster's address (default: the spec's, else ``RAY_ADDRESS``, else a Ray of
            its own on this machine).
        progress: show progress on stdout: a live bar on a terminal; elsewhere (a file, a cluster job's log,
            a notebook) one line per finished trial and a summary line at least every minute. False turns that
            off; the ``note:`` and ``warning:`` lines about the spec and the store (a grid that gives no freezing
            advice, rows written from the spool) still go to stderr (``contextlib.redirect_stderr`` hides them).

    Raises:
        SpecError: the spec's problems, all of them, before any trial starts.
        SweepLocked: another driver runs this sweep.
        StoreUnavailable: finished rows could not reach the store (they wait in the local spool).
    """
    raw, name = _raw_spec(spec, store, address)
    return _launch(raw, name, progress)


def resume(
    name: SweepRef, *, store: str | None = None, address: str | None = None, progress: bool = True
) -> LaunchSummary:
    """Run the cells of a stored sweep that have no ok row (failed ones are run again), with the spec
    it was launched with; otherwise as :func:`launch`."""
    from freezesweep.orchestrator.sweeps import launch_folder_for, load_sweep_spec, lost_folder_note, spec_differences

    given, (name, root) = name, located(name, store)
    stored = load_sweep_spec(name, root)  # validated in full by the launch, with the cluster
    differing = spec_differences(stored, _given_spec(given))
    if differing:  # a walk-through edited its spec file, then ran `resume FILE`: the edit went unseen
        print(
            f"note: resume runs sweep {name!r} as stored; its spec file differs ({'; '.join(differing)}): "
            "`freezesweep launch FILE` runs the file's (new cells; a changed protocol is refused)",
            file=sys.stderr,
        )
    raw = {**stored.model_dump(mode="json"), "store": root, "address": address or stored.address}
    folder = launch_folder_for(stored, ResultStore(root, name))
    if folder is None:
        lost = lost_folder_note(stored, ResultStore(root, name))
        if lost:
            print(f"note: {lost}", file=sys.stderr)
        return _launch(raw, f"{root}/{name}/spec.yaml", progress)
    print(f"note: the spec's relative paths are read from the folder it was launched in, {folder}", file=sys.stderr)
    raw["store"] = root = _root_identity(root)  # the same store from there
    with _working_folder(folder):
        return _launch(raw, f"{root}/{name}/spec.yaml", progress)


def _given_spec(given: SweepRef) -> SweepSpec | None:
    """The spec a sweep was named by, where it was a spec file or a SweepSpec (parsed only: what it says)."""
    from freezesweep.orchestrator.checks import validate

    if isinstance(given, SweepSpec):
        return given
    if not (str(given).endswith((".yaml", ".yml")) and os.path.isfile(given)):
        return None
    try:
        return validate(read_yaml(given), str(given), semantic=False)
    except SpecError:
        return None  # a file that does not parse differs in ways its own launch would name


@contextlib.contextmanager
def _working_folder(folder: str) -> Iterator[None]:
    """The process works in ``folder`` for a while (what ``cd folder`` before the command would do), the
    folders its environment names relative to where it was (the data dir, the cache and its spool) kept."""
    from freezesweep.trials.data import CACHE_DIR_ENV, DATA_DIR_ENV

    before, env = os.getcwd(), {name: os.environ.get(name) for name in (DATA_DIR_ENV, CACHE_DIR_ENV)}
    for name, value in env.items():
        if value:
            os.environ[name] = os.path.abspath(os.path.expanduser(value))
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)
        for name, value in env.items():
            if value:
                os.environ[name] = value


def _spec_notes(spec: SweepSpec) -> list[str]:
    """What ``plan`` and ``launch`` both say of a valid spec before anything runs: the data (rows
    empty_texts: drop leaves out; float labels read as scores), pairs, precision here, seeds, schedule."""
    from freezesweep.orchestrator.checks import data_notes, few_seeds_note, pair_notes, schedule_note
    from freezesweep.orchestrator.sweeps import cpu_precision_note, same_cells_note

    notes = [
        *data_notes(spec),
        *pair_notes(spec),
        cpu_precision_note(spec),
        few_seeds_note(spec),
        schedule_note(spec),
        same_cells_note(spec),
    ]
    return [n for n in notes if n]


def _launch(raw: Any, source: str, progress: bool) -> LaunchSummary:
    from freezesweep.orchestrator.checks import validate
    from freezesweep.orchestrator.ray_session import RaySession

    quiet_libraries()
    session = RaySession(raw.get("address") if isinstance(raw, dict) else None)
    with sigterm_as_interrupt() as terminated:
        spec = validate(raw, source, cluster=session)
        # the launcher's imports (Ray Tune, the trial's code: seconds) once the spec is known good
        from freezesweep.orchestrator.launch import launch as run_launch

        for note in _spec_notes(spec):
            print(f"note: {note}", file=sys.stderr)
        if spec.cell_count() > LARGE_GRID:
            print(
                f"a large grid: {spec.cell_count():,} cells ({spec.cell_count_words()}), run in rounds of "
                f"{spec.resources.trials_per_round:,} Ray trials",
                file=sys.stderr,
            )
        summary_ = run_launch(spec, show_progress=progress, session=session)
    summary_ = dataclasses.replace(summary_, terminated=bool(terminated))
    if summary_.unfinished:  # said where the caller looks, as the CLI says it: a notebook shows warnings
        warnings.warn(f"sweep {summary_.sweep!r} {summary_.outcome}", UnfinishedCellsWarning, stacklevel=3)
    return summary_


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """``quiet_libraries`` for one call, the caller's settings given back after it (a notebook's own)."""
    import transformers

    verbosity, bars = transformers.logging.get_verbosity(), transformers.utils.logging.is_progress_bar_enabled()
    quiet_libraries()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        if bars:
            transformers.utils.logging.enable_progress_bar()


def quiet_libraries() -> None:
    """transformers' warnings and download bars would drown the progress lines."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


# --- a stored sweep's rows -------------------------------------------------------------------------
def located(name: SweepRef, store: str | None = None) -> tuple[str, str]:
    """A stored sweep's name and store root: as given (default ./sweeps), or read from its spec file where
    ``name`` is one (``configs/demo.yaml``: its ``name:`` and ``store:``) or from its spec (a SweepSpec),
    or the sweep's own folder where ``name`` is a path to one (``sweeps/demo``); ``store`` given still wins."""
    if isinstance(name, SweepSpec):  # the README's flow: load_spec, launch, then decide(spec)
        return name.name, store or name.store
    if isinstance(name, Path):
        name = str(name)
    if not isinstance(name, str):
        raise TypeError(f"a sweep is its name, its spec file or its SweepSpec, not a {type(name).__name__}")
    spec_file = name.endswith((".yaml", ".yml"))
    if spec_file and "/" in name.replace(os.sep, "/") and not os.path.isfile(name):  # no sweep name has a /
        raise SpecError([f"no such spec file (looked for from {os.getcwd()})"], name)
    if spec_file and not os.path.isfile(name) and not _is_stored_sweep(name, store or DEFAULT_STORE, dotted=True):
        # a sweep may be named x.yaml, but a missing file is the likelier reading (a walk-through's `status nosuch.yaml`)
        raise SpecError(
            [
                f"no such spec file (looked for from {os.getcwd()}), nor a sweep of that name in store {store or DEFAULT_STORE!r}"
            ],
            name,
        )
    folder = os.path.normpath(name)
    if store is None and os.sep in folder and _stored_sweep_folder(folder):
        return os.path.basename(folder), os.path.dirname(folder)  # a sweep's own folder (sweeps/demo)
    if "/" in name.replace(os.sep, "/") and not spec_file:  # neither a name nor a sweep's folder: said so
        raise SpecError(
            ["not a sweep's name (a name has no /), nor a store's folder of one sweep (its spec.yaml naming it)"],
            name,
        )
    if not (spec_file and os.path.isfile(name)):
        return name, store or DEFAULT_STORE
    raw = read_yaml(name)
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise SpecError(["names no sweep (its `name:`), so it cannot say which stored sweep to read"], name)
    spec_store = raw.get("store") if isinstance(raw.get("store"), str) else DEFAULT_STORE
    return raw["name"], store or spec_store


def _stored_sweep_folder(folder: str) -> bool:
    """A store's folder of one sweep: its spec.yaml names it (a user's own spec.yaml in a folder of
    theirs names whatever sweep it launches, seldom the folder's name)."""
    spec_file = os.path.join(folder, "spec.yaml")
    if not os.path.isfile(spec_file):
        return False
    try:
        raw = read_yaml(spec_file)
    except SpecError:
        return False
    return isinstance(raw, dict) and raw.get("name") == os.path.basename(folder)


def _each_once(names: SweepRef | Sequence[SweepRef], store: str | None = None) -> list[SweepRef]:
    """One sweep or several, each once (``report demo demo`` read it twice, and said so twice)."""
    refs = [names] if isinstance(names, (str, Path, SweepSpec)) else list(names)
    unique: dict[Any, SweepRef] = {}
    for ref in refs:
        try:
            name, uri = located(ref, store)
            key: Any = (name, _root_identity(uri))
        except SpecError:  # a spec file that is not there: the reader says so, with the others
            key = ref
        unique.setdefault(key, ref)
    return list(unique.values())


def _root_identity(uri: str) -> str:
    """One store however it is spelled: ``./sweeps``, ``sweeps`` and its absolute path are one folder."""
    return uri.rstrip("/") if "://" in uri else os.path.abspath(os.path.expanduser(uri))


def _ref_words(ref: SweepRef) -> str:
    return ref.name if isinstance(ref, SweepSpec) else str(ref)


def _store(name: SweepRef, store: str | None) -> ResultStore:
    """The sweep's store; SpecError when it holds no such sweep (a typo must not read as no rows)."""
    sweep, uri = located(name, store)
    result_store = ResultStore(uri, sweep)
    if not result_store.exists():
        from freezesweep.orchestrator.sweeps import no_such_sweep

        with _launched_elsewhere(name, store):
            raise no_such_sweep(result_store)
    return result_store


@contextlib.contextmanager
def _launched_elsewhere(name: SweepRef, store: str | None) -> Iterator[None]:
    """A SweepSpec's sweep not in the store the spec names: ``fs.launch(spec, store=...)`` wrote it elsewhere,
    and the spec still names its own store; said with what to pass. A spec file's: not told to give it."""
    try:
        yield
    except SweepNotFound as exc:
        spec_file = isinstance(name, (str, Path)) and str(name).endswith((".yaml", ".yml")) and os.path.isfile(name)
        if spec_file and store is None:  # its spec file was given: not told to give it
            from freezesweep.orchestrator.sweeps import no_such_sweep

            sweep, root = located(name)
            raise no_such_sweep(ResultStore(root, sweep), spec_file=str(name)) from None
        if not isinstance(name, SweepSpec) or store is not None:
            raise
        raise SweepNotFound(
            f"{exc.args[0]}; this SweepSpec names store {name.store!r}: a sweep launched with store=ROOT is read with "
            "the same store=ROOT (a LaunchSummary's .store says where its sweep is)",
            exc.source,
        ) from None


def _warn_unreadable(result_store: ResultStore) -> None:
    if result_store.unreadable:
        warnings.warn(
            f"skipped {len(result_store.unreadable)} unreadable row file(s) (`freezesweep resume "
            f"{result_store.sweep}{store_flag(result_store.uri)}`, fs.resume in Python, moves them aside and runs "
            "their cells again): " + ", ".join(result_store.unreadable),
            UnreadableRowsWarning,
            stacklevel=3,
        )


def results_frame(
    name: SweepRef, *, store: str | None = None, columns: str | Sequence[str] | None = None
) -> pd.DataFrame:
    """A sweep's rows, one per cell that has run, as a pandas DataFrame (``columns``: only these, a name or a
    list of names; default every column, the evaluation curves included). Rows of freezesweep before 0.2
    read as picked by accuracy (``select_metric``); a row file that cannot be read is left out with an
    :class:`UnreadableRowsWarning`. A column the rows do not have is a ValueError that lists theirs."""
    from freezesweep.results.query import read_rows

    wanted = _columns(columns)
    result_store = _store(name, store)
    rows = read_rows(result_store, columns=wanted)
    _warn_unreadable(result_store)
    return rows


def results_arrow(name: SweepRef, *, store: str | None = None, columns: str | Sequence[str] | None = None) -> pa.Table:
    """A sweep's rows as they are stored, as a pyarrow Table (``columns``: only these, a name or a list of
    names). A column the rows do not have is a ValueError that lists theirs."""
    wanted = _columns(columns)
    result_store = _store(name, store)
    table = result_store.read_table(columns=wanted)
    _warn_unreadable(result_store)
    return table


def _columns(columns: str | Sequence[str] | None) -> list[str] | None:
    """The columns asked for, as a list (None: all). One name is one column: iterated, a string was its
    letters ("Column f does not exist"); a name the rows lack is said with the names they have."""
    from freezesweep.results.store import SCHEMA

    if columns is None:
        return None
    listed = [columns] if isinstance(columns, str) else list(columns)
    if not all(isinstance(c, str) for c in listed):
        raise TypeError(f"columns is a column's name or a list of names, not {columns!r}")
    unknown = [c for c in listed if c not in SCHEMA.names]
    if unknown:
        raise ValueError(
            f"no column {', '.join(map(repr, unknown))} in a sweep's rows; their columns: {', '.join(SCHEMA.names)}"
        )
    return listed or None


def results_duckdb(name: SweepRef, *, store: str | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection whose view ``results`` is the sweep's rows (as :func:`query` reads them):
    ``fs.results_duckdb("demo").sql("SELECT frozen_layers, avg(best_val_score) FROM results GROUP BY 1")``."""
    from freezesweep.results.query import connect

    result_store = _store(name, store)
    con = connect(result_store)
    _warn_unreadable(result_store)
    return con


#: What ``query`` asks when given no SQL (the CLI's ``query`` without ``--sql`` too): each row's cell and score.
QUERY_SQL = (
    "SELECT dataset, model, method, train_size, frozen_layers, lora_rank, seed, status, select_metric, "
    "best_val_score FROM results ORDER BY dataset, model, method, train_size, frozen_layers, lora_rank, seed"
)


def query(name: SweepRef, sql: str = QUERY_SQL, *, store: str | None = None) -> pd.DataFrame:
    """SQL (DuckDB) over the sweep's rows, the table ``results``; the answer as a DataFrame. Without ``sql``:
    each row's cell, status and selected metric, as the CLI's ``query`` shows them."""
    return results_duckdb(name, store=store).execute(sql).df()


# --- inspection: status, summary ---------------------------------------------------------------------
def _stored_sweep(name: SweepRef, store: str | None) -> tuple[ResolvedSweep, ResultStore]:
    """A stored sweep, as it was launched, and its store."""
    from freezesweep.orchestrator.sweeps import load_sweep

    sweep, root = located(name, store)
    with _launched_elsewhere(name, store):
        return load_sweep(sweep, root), ResultStore(root, sweep)


def _counted_cells(
    sweep: ResolvedSweep, result_store: ResultStore, cells: list[TrialConfig] | None = None
) -> list[TrialConfig]:
    """The cells a sweep's rows are counted against: its grid (``cells``, where the caller built it); in
    settle mode, the cells it ran and its next round (an arm decided early never runs the budget's other seeds)."""
    from freezesweep.orchestrator.plan import build_grid, settle_scope
    from freezesweep.orchestrator.sweeps import settle_rows

    cells = build_grid(sweep) if cells is None else cells
    if sweep.spec.settle is None:
        return cells
    return settle_scope(sweep, cells, settle_rows(result_store))


@dataclass(frozen=True, eq=False)  # DataFrames have no single truth value to compare by
class SweepStatus:
    """A stored sweep's progress."""

    name: str
    table: pd.DataFrame  # per axis value: done / failed / missing cells
    nodes: pd.DataFrame | None  # the Ray nodes the rows ran on (None: no row yet)
    gpus: int  # distinct GPUs the rows ran on
    notes: tuple[str, ...] = ()  # the store's state beside its rows: an interrupted compaction, a stale lock
    failures: pd.DataFrame | None = None  # why the failed cells failed: each error's first line, its cells

    __repr__ = short_repr


def status(name: SweepRef, *, store: str | None = None) -> SweepStatus:
    """Done / failed / missing cells per axis value, and the nodes (Ray node ids) the rows ran on."""
    from freezesweep.results.lock import store_notes
    from freezesweep.results.query import NODE_COLUMNS, failure_reasons, placement, status_table

    sweep, result_store = _stored_sweep(name, store)
    # one read: statuses, nodes and the failures' errors
    rows = result_store.read_table(columns=["trial_id", *NODE_COLUMNS, "error"]).to_pandas()
    _warn_unreadable(result_store)
    statuses = dict(zip(rows["trial_id"], rows["status"]))
    notes = (*store_notes(result_store), *_compact_advice(result_store, statuses))
    table = status_table(_counted_cells(sweep, result_store), statuses)
    if not len(rows):
        return SweepStatus(result_store.sweep, table, None, 0, notes)
    # nunique skips CPU rows' nulls
    gpus = int(rows["gpu_uuid"].nunique())
    return SweepStatus(result_store.sweep, table, placement(rows), gpus, notes, failure_reasons(rows))


def store_flag(store: str) -> str:
    """The ``--store`` a command needs to find a sweep in ``store`` (none for the default store)."""
    return "" if store == DEFAULT_STORE else f" --store {store}"


def _compact_advice(result_store: ResultStore, statuses: dict[str, str]) -> list[str]:
    """Thousands of single-row files (a store from before compaction, rounds that never finished): every
    read opens each of them; one `compact` makes them one part. Parts of an earlier version: it rewrites
    them in today's columns."""
    from freezesweep.results.store import COMPACT_ADVICE_FILES

    singles = result_store.compactable(statuses)
    outdated = len(result_store.outdated_parts(result_store.layout().parts))
    where = store_flag(result_store.uri)
    run = f"run `freezesweep compact {result_store.sweep}{where}`"
    return [
        *(
            [
                f"note: {outdated:,} part(s) of results/ were written by an earlier freezesweep, without columns "
                "added since (plain readers' globs refuse a column one file lacks, once today's rows are beside "
                f"them): {run} to rewrite them in today's"
            ]
            if outdated
            else []
        ),
        *(
            [
                f"note: {singles:,} small files hold final rows (single-row files, or a trial array's rows), each "
                f"opened by every command: {run} to put them into one Parquet part"
            ]
            if singles > COMPACT_ADVICE_FILES
            else []
        ),
    ]


def summary(name: SweepRef, *, store: str | None = None, metric: str | None = None) -> pd.DataFrame:
    """The selected metric (or ``metric``: accuracy, f1, matthews, pearson, spearman) at the best
    evaluation per dataset × train size × frozen layers, over seeds (mean, median, std, min, max);
    with several models or methods, per model and method too."""
    from freezesweep.results.query import SUMMARY_COLUMNS, read_rows
    from freezesweep.results.query import summary as summarize

    result_store = _store(name, store)
    table = summarize(read_rows(result_store, columns=SUMMARY_COLUMNS), metric=metric)
    _warn_unreadable(result_store)
    return table


# --- decisions and the report ----------------------------------------------------------------------
def _sweep_rows(name: SweepRef, store: str | None, tolerance: float | None) -> SweepRows:
    """A stored sweep's rows for the report: its status against its grid, and a settle sweep's rule with
    every look it may take and the comparisons its confidence is shared by (the report's intervals are
    the ones the rounds were decided by)."""
    from freezesweep.orchestrator.plan import in_grid, sweep_arms
    from freezesweep.results.query import status_table
    from freezesweep.results.report import SweepRows

    if tolerance is not None and not tolerance > 0:  # "worse by more than -0.01" claims nothing sane
        raise SpecError(
            [f"tolerance: {tolerance:g} is not above 0 (how much below full fine-tuning still counts)"],
            _ref_words(name),
        )
    sweep, result_store = _stored_sweep(name, store)
    settle = sweep.spec.settle
    rule = settle.rule() if settle else None
    asked = sweep.spec.question_tolerance()
    if tolerance is not None and tolerance != asked:
        # each tolerance makes another depth its sequence's first false claim: the readings' errors add up
        why = (
            "its rounds stopped on that question"
            if rule
            else "its spec's `tolerance:`, fixed before its rows"
            if sweep.spec.tolerance is not None
            else "the default: its spec gives no `tolerance:`"
        )
        raise SpecError(
            [
                f"sweep {result_store.sweep!r} asked tolerance {asked:g} ({why}), and a tolerance chosen after "
                f"seeing the rows voids the confidence; report it without a tolerance, or ask {tolerance:g} as a new "
                "sweep (a new name and another split_seed); `freezesweep summary` and `query` read the rows freely"
            ],
            _ref_words(name),
        )
    family = (rule, rule.looks, sweep_arms(sweep)) if rule else None
    rows = SweepRows.from_store(
        result_store, status_table(_counted_cells(sweep, result_store), result_store.statuses()), family, asked
    )
    _warn_unreadable(result_store)
    kept = in_grid(sweep, rows.rows)  # a row of a value removed from an axis is no part of the answer now
    return dataclasses.replace(rows, rows=rows.rows[kept], left_out=int((~kept).sum()))


@dataclass(frozen=True)
class Decision:
    """How many layers to freeze for one (sweep, model, dataset, train size): a sweep of several models has a
    decision per model."""

    sweep: str  # the sweep's name
    model: str | None  # the model the decision is for (None: rows that do not name it)
    dataset: str
    train_size: int
    learned: str  # "learned", "nothing learned" or "undecided": does full fine-tuning beat the baseline
    frozen_layers: int | None  # the advice: the last depth the fixed sequence showed within (None: none)
    mean_diff: float | None  # its mean paired difference from full fine-tuning, on the selected metric
    # Its own bounds, at the level the sequence tested it (results/settle.py): ci_low > -tolerance is the
    # "within" claim, family-wise valid with the group's other claims; ci_high at the same level.
    ci_low: float | None
    ci_high: float | None
    sentence: str  # the decision in words, as the report says it
    record: Mapping[str, Any]  # every column of the decision table (results/decision.py)

    __repr__ = short_repr

    def __str__(self) -> str:
        return self.sentence


@dataclass(frozen=True, eq=False)  # DataFrames have no single truth value to compare by
class Decisions(Sequence[Decision]):
    """The decisions of one or more sweeps: a sequence of :class:`Decision` and, as ``frame``, the same
    as a DataFrame (one row each)."""

    items: tuple[Decision, ...]
    frame: pd.DataFrame

    __repr__ = short_repr

    def __str__(self) -> str:
        return "\n".join(d.sentence for d in self.items)

    @classmethod
    def of(cls, frame: pd.DataFrame) -> "Decisions":
        return cls(tuple(_decision(record) for record in frame.to_dict("records")), frame)

    def __getitem__(self, index):  # type: ignore[override]
        return self.items[index]

    def __len__(self) -> int:
        return len(self.frame)


def _decision(record: dict[str, Any]) -> Decision:
    def number(key: str) -> float | None:
        value = record.get(key)
        return None if value is None or value != value else float(value)  # NaN: no advice

    k = number("frozen_layers")
    model = record.get("model")
    return Decision(
        record["sweep"],
        model if isinstance(model, str) else None,  # NaN: rows that do not name it
        record["dataset"],
        int(record["train_size"]),
        record["learned"],
        None if k is None else int(k),
        number("mean_diff"),
        number("ci_low"),
        number("ci_high"),
        record["sentence"],
        record,
    )


def decide(
    names: SweepRef | Sequence[SweepRef], *, store: str | None = None, tolerance: float | None = None
) -> Decisions:
    """The decision per sweep, dataset and train size: how many layers can be frozen with the selected
    metric within the tolerance each sweep asked (a fixed grid's ``tolerance:``, 0.01 unless given; a settle
    sweep's ``settle.tolerance``; ``tolerance``, if given, must be it), with intervals that hold over every
    look the sweep took. Several sweeps: side by side, as in the report."""
    from freezesweep.results.report import decisions

    names = _each_once(names, store)
    sweeps = [_sweep_rows(n, store, tolerance) for n in names]
    return Decisions.of(decisions(sweeps, _tolerance(tolerance, sweeps)))


def _tolerance(tolerance: float | None, sweeps: Sequence[SweepRows]) -> float:
    """The report's tolerance, for its figures and the groups of no stored sweep: the one asked (each
    sweep's own, ``_sweep_rows`` refused any other); else the sweeps' own where they share one; else 0.01.
    Each sweep's decisions answer its own question whatever this is."""
    from freezesweep.results.stats import TOLERANCE

    if tolerance is not None:
        return tolerance
    own = {s.tolerance for s in sweeps}
    return own.pop() if len(own) == 1 and None not in own else TOLERANCE


def report(
    names: SweepRef | Sequence[SweepRef], out: str | Path, *, store: str | None = None, tolerance: float | None = None
) -> Report:
    """Write the report of one or more sweeps (side by side) to ``out``: ``index.html`` (self-contained),
    ``report.md`` and ``figures/``. Returns what it holds: ``decisions``, ``completeness``, the tables
    and figures. Rebuilt at any time, also while a sweep runs: what is missing is said."""
    from freezesweep.results.report import write_report

    names = _each_once(names, store)
    _out_problem(Path(out))
    _all_stored(names, store)
    sweeps = [_sweep_rows(n, store, tolerance) for n in names]
    return write_report(sweeps, str(out), _tolerance(tolerance, sweeps))


def _out_problem(out: Path) -> None:
    """The report's folder can be one: neither it nor the nearest existing folder above it is a file (a
    walk-through: `--out README.md` was a NotADirectoryError traceback after reading every row). Named
    as the folder, not the CLI's option: ``fs.report(..., out)`` has no ``--out`` (a second walk-through)."""
    existing = next(p for p in (out, *out.absolute().parents) if p.exists())
    if not existing.is_dir():
        what = "is a file" if existing == out else f"lies under the file {existing}"
        raise SpecError([f"{what}: the report is a folder (index.html, report.md, figures/)"], f"report folder {out}")
    try:  # a probe folder made and removed: os.access says yes to root where nothing can be made (/proc)
        os.rmdir(tempfile.mkdtemp(prefix=".freezesweep-probe-", dir=existing))
    except OSError as exc:
        raise SpecError(
            [f"cannot make the report's folder in {existing} ({exc.strerror or exc})"], f"report folder {out}"
        ) from None


def _all_stored(names: Sequence[SweepRef], store: str | None) -> None:
    """Every sweep asked of a report is there, or one SweepNotFound names each that is not (per store)."""
    from freezesweep.orchestrator.sweeps import no_such_sweep

    missing: dict[str, list[str]] = {}
    unread: list[str] = []  # spec files that are not there, or name no sweep
    spec_missing: SweepRef = ""  # a SweepSpec whose sweep is not where it says: launched with another store=?
    for name in names:
        try:
            sweep, uri = located(name, store)
        except SpecError as exc:
            unread += [f"{exc.source}: {problem}" for problem in exc.problems]
            continue
        if not ResultStore(uri, sweep).exists() and sweep not in missing.get(uri, []):
            missing.setdefault(uri, []).append(sweep)
            spec_missing = name if isinstance(name, SweepSpec) else spec_missing
    errors = [no_such_sweep(ResultStore(uri, sweeps[0]), also=sweeps[1:]) for uri, sweeps in missing.items()]
    if errors and not unread:  # a LookupError however many stores lack them
        with _launched_elsewhere(spec_missing, store):
            raise (
                errors[0]
                if len(errors) == 1
                else SweepNotFound("; and ".join(e.args[0] for e in errors), errors[0].source)
            )
    if errors or unread:
        raise SpecError([*unread, *(e.args[0] for e in errors)], ", ".join(map(_ref_words, names)))


def budget_prices(decisions: pd.DataFrame, names: SweepRef | Sequence[SweepRef], store: str | None = None) -> list[str]:
    """What deciding each open group would cost: a new settle sweep at the budget the decision names
    (``decided_at_seeds``), priced as ``plan`` prices pending cells (the store's measured trial times)."""
    from freezesweep.orchestrator.plan import build_grid

    lines, each = [], _each_once(names, store)
    for name in each:
        resolved, result_store = _stored_sweep(name, store)
        asked = decisions[(decisions["sweep"] == result_store.sweep) & decisions["decided_at_seeds"].notna()]
        if asked.empty:
            continue
        rows = result_store.read_table(columns=["trial_id", "status", "wall_time_s"]).to_pandas()
        measured = _measured(build_grid(resolved), rows)
        for _, group in asked.iterrows():
            lines.append(_budget_price(resolved, group, measured, many=len(each) > 1))
    return lines


def _group_cells(cells: list[TrialConfig], group: pd.Series) -> list[TrialConfig]:
    """The cells of one decision's group: its dataset and train size, and its model where it names one."""
    model = group.get("model")
    return [
        c
        for c in cells
        if (c.dataset, c.train_size) == (group["dataset"], group["train_size"])
        and (not isinstance(model, str) or c.model == model)
    ]


def _budget_price(resolved: ResolvedSweep, group: pd.Series, measured: dict[tuple, list[float]], many: bool) -> str:
    """``many``: several sweeps reported, each line named by its sweep as their decisions are."""
    from freezesweep.orchestrator.plan import build_grid, estimate_work

    from freezesweep.orchestrator.spec import SettleSpec

    budget = int(group["decided_at_seeds"])
    asked = resolved.spec.settle or SettleSpec(tolerance=resolved.spec.question_tolerance())  # a fixed grid's: new
    settle = asked.model_copy(update={"max_seeds": budget})
    grown_spec = resolved.spec.model_copy(update={"settle": settle, "seeds": [], "tolerance": None})
    grown = dataclasses.replace(resolved, spec=grown_spec)
    cells = _group_cells(build_grid(grown), group)
    estimate = estimate_work(cells, measured)
    cost = "" if estimate is None else f", about {estimate.trial_s / 3600:,.2f} trial-hours at the measured times"
    several = len(resolved.spec.models()) > 1  # a decision per model: each priced on its own
    model, size = (f"{group['model']} · ", "size and model") if several else ("", "size")
    sweep = f"{resolved.spec.name} · " if many else ""
    return (
        f"{sweep}{model}{group['dataset']}, n = {group['train_size']}: a new settle sweep with settle.max_seeds {budget} "
        f"runs at most {len(cells):,} trials for this {size}{cost} (`freezesweep plan` on its spec prices the whole "
        "sweep)"
    )


def compact(name: SweepRef, *, store: str | None = None, on_note: Callable[[str], None] | None = None) -> int:
    """Compact a sweep's final rows into one Parquet part (a launch also does it between rounds), under
    the sweep's lock; crash-safe. As a launch does first, it finishes an interrupted compaction and sets
    unreadable row files aside in ``_quarantine/``, each named to ``on_note`` (default: a warning).
    Returns how many files were compacted (single-row files, files of rows written together, and parts an
    earlier freezesweep wrote, rewritten in today's columns)."""
    from freezesweep.results.lock import SweepLock

    result_store = _store(name, store)
    try:
        with SweepLock(result_store.fs, result_store.sweep_dir, uri=result_store.uri) as lock:
            result_store.guard = lock.check
            for note in result_store.make_ready().notes():
                on_note(note) if on_note else warnings.warn(note, UserWarning, stacklevel=2)
            return result_store.compact()
    except OSError as exc:  # a read-only store (a walk-through's): its lock cannot be taken, said in one line
        raise StoreError(f"cannot compact sweep {result_store.sweep!r} in {result_store.uri!r}: {exc}") from exc


def export_mlflow(
    name: SweepRef, *, store: str | None = None, tracking_uri: str | None = None, experiment: str | None = None
) -> "Exported":
    """Every row of a sweep as an MLflow run (axes and protocol as params, best and final metrics, the
    evaluation curve as stepped metrics, status/node/precision as tags), in ``experiment`` (default: the
    sweep's name) at ``tracking_uri`` (default: ``MLFLOW_TRACKING_URI``, else MLflow 3's own
    ``sqlite:///mlflow.db`` in the current folder). Idempotent: run again, it adds only the rows MLflow
    lacks and replaces a cell's run by a newer row. A folder (``./mlruns``, which MLflow 3 refuses) or a
    server that does not answer is a ``TrackingError`` before any row. Needs the ``mlflow`` extra
    (ImportError without it)."""
    result_store = _store(name, store)  # an unknown sweep is a SpecError before MLflow is touched
    from freezesweep.results.mlflow_export import export_store

    done = export_store(result_store, tracking_uri, experiment)
    _warn_unreadable(result_store)
    return done
