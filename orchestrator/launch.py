"""Launch and resume: ``resolve_for_launch`` a spec once, then ``run`` it (the layer under the CLI).

``resolve_for_launch(spec, session) -> ResolvedSweep`` decides, once and typed, everything that depends on the
machine, the data or the cluster: each node has what its trials open (preflight), the precision
``auto`` means where the trials run, the select metric per dataset, the data dir, the files shipped
through Ray's object store and the GPU share ``auto`` measures.

``run(sweep, session) -> LaunchSummary``: the store is the source of truth. Under the sweep's lock, a
launch runs exactly the cells of the grid that have no ``ok`` row, so re-launching (or ``resume``)
after any interruption runs nothing twice and loses nothing, and a grown spec runs only its new cells.

Out of GPU memory: a cell whose trial ran out of memory while sharing a GPU is run once more in the
same launch with twice the share (half as many trials per GPU). Its ``oom`` row is written at once
and the retry's row replaces it (one file per cell, moved into place whole), so the store holds
exactly one row per cell at every moment: a driver that dies in between leaves the ``oom`` row, and
``resume`` runs the cell again. A retry that runs out of memory too leaves an ``oom`` row at the
larger share; both kinds of retry row say ``oom_retry``.

Preemption: a trial whose process or node dies is run again by Ray (``max_failures``) and, with
``checkpoint_every_epochs``, continues from its last checkpoint, which Ray keeps in its storage
(orchestrator/ray_storage.py): on a cluster with a remote store, the sweep's ``_ray`` folder there,
which every node reaches, so the retry may run on any node; a trial whose driver died continues from
it in the next launch. Its row is written once, when it finishes: one row per cell still.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pandas as pd

from freezesweep.orchestrator import local_files
from freezesweep.orchestrator.local_files import Anchored, Shipment
from freezesweep.orchestrator.checks import model_depths, stored_spec_mapping
from freezesweep.orchestrator.driver_faults import DriverFaults
from freezesweep.orchestrator.plan import (
    ResolvedSweep,
    grid_size,
    eval_entries_per_dataset,
    hungriest_frozen_layers,
    in_grid,
    launch_units,
    method_variants,
    rounds,
    with_doubled_gpu_share,
    with_resources,
)
from freezesweep.orchestrator.progress import SweepProgress
from freezesweep.orchestrator.ray_session import (
    PROBE_TIMEOUT_S,
    RaySession,
    TaskFailed,
    memory_probe_task,
    trial_device_task,
)
from freezesweep.orchestrator.ray_storage import RayStorage, checkpoint_storage_warning, ray_storage, store_cache_dir
from freezesweep.orchestrator.rows import result_row
from freezesweep.orchestrator.spec import DEFAULT_STORE, SpecError, SweepSpec
from freezesweep.orchestrator.settle_feed import SettleFeed
from freezesweep.orchestrator.sweeps import (
    OLD_SWEEP,
    grid_statuses,
    next_cells,
    precision_here,
    resolve_spec,
    settle_rows,
)
from freezesweep.orchestrator.tune_adapter import recover_from_ray, run_tune
from freezesweep.results.lock import SweepLock
from freezesweep.results.store import FINAL_STATUSES, ResultStore, SpoolingWriter, StoreUnavailable, final_of
from freezesweep.trials.array import array_key
from freezesweep.trials.config import TrialConfig, TrialResult
from freezesweep.trials.memory_probe import describe
from freezesweep.trials.run import eval_cache_tokens
from freezesweep.trials.worker import MAX_EVAL_ENTRIES, WorkerState


@dataclass(frozen=True)
class LaunchSummary:
    total: int
    already_ok: int
    ran: int  # trials that reached an outcome this launch (ok + failed)
    ok: int
    failed: int  # failed and out of memory (resume runs them again)
    diverged: int = 0  # a non-finite loss: a final outcome, as ok is
    recovered: int = 0  # rows taken from Ray's experiment state instead of re-running
    unfinished: int = 0  # planned but without an outcome (the launch was interrupted)
    oom_retried: int = 0  # cells run again with twice the GPU share after running out of memory
    gpu_packing: str | None = None  # what gpus_per_trial auto measured and chose
    sweep: str = ""  # the sweep's name
    store: str = ""  # its store's root
    terminated: bool = False  # stopped by SIGTERM (a scheduler), not Ctrl-C: ``unfinished`` cells wait for resume
    settle: bool = False  # settle mode: rounds run the cells the answer needs, more or fewer than ``total``

    @property
    def not_needed(self) -> int:
        """Settle mode, ended with nothing failed: cells of the grid no round ran, each group's rounds
        stopped once it was decided or at its budget (a walk-through read "the answer was decided without
        them" where the budget ran out); a failed cell stops the rounds undecided: resume runs it, then the rest."""
        left = self.total - self.already_ok - self.recovered - self.ran
        return max(0, left) if self.settle and not (self.unfinished or self.failed) else 0

    @property
    def outcome(self) -> str:
        """The launch in one line, what to do next included: "complete", "interrupted: …", "… failed"."""
        again = f"fs.resume({self.sweep!r}{'' if self.store == DEFAULT_STORE else f', store={self.store!r}'})"
        if self.unfinished:
            how = "stopped by SIGTERM" if self.terminated else "interrupted"
            return f"{how}: {self.unfinished} of {self.total} cells not finished (nothing was lost); {again} runs them"
        if self.failed:
            return f"{self.failed} cell(s) failed; {again} runs them again"
        return "complete"

    def __repr__(self) -> str:  # the outcome first: an interrupted launch says so where a notebook prints it
        fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
        return f"LaunchSummary(outcome={self.outcome!r}, {fields})"


def launch(spec: SweepSpec, show_progress: bool = True, session: RaySession | None = None) -> LaunchSummary:
    """``resolve_for_launch`` then ``run``, on the spec's cluster (or an embedded Ray) unless a session is given."""
    session = session or RaySession(spec.address)
    return run(resolve_for_launch(spec, session), session, show_progress)


# --- resolve: decided once, before anything is written ----------------------------------------------
def resolve_for_launch(spec: SweepSpec, session: RaySession) -> ResolvedSweep:
    if session.on_cluster:
        preflight(spec, session)  # every node has what its trials open, before anything is written
    device, auto = trials_device(spec, session)
    precision = auto if spec.training.precision == "auto" else spec.training.precision
    check_stored_precision(spec, precision)
    shipment = session.ship(spec) if local_files.mode(spec, session.on_cluster) == "ship" else local_files.anchor(spec)
    decided, depths = resolve_spec(spec, precision), model_depths(spec)
    share, measured, width = (
        (None, None, None)
        if spec.resources.gpus_per_trial != "auto"
        else (1.0, "gpus_per_trial auto: not measured, the trials' GPUs are no CUDA devices", 1)
        if device == "cpu"
        else measure_gpu_share(decided, depths, shipment, session)
    )
    return ResolvedSweep(decided, depths, session.address, shipment, share, measured, width, device)


def preflight(spec: SweepSpec, session: RaySession) -> None:
    """On a cluster: one SpecError naming every node that lacks what its trials would open."""
    how = local_files.mode(spec, on_cluster=True)
    problems = session.check_nodes(local_files.NodeNeeds.of(spec, how))
    if problems:
        why = (
            (
                " (local_files: node_local: every node must hold the spec's data files and model folders at the "
                "same paths; local_files: ship sends them)"
            )
            if how == "node_local"
            else ""
        )
        raise SpecError(problems, f"preflight on the cluster's nodes{why}")


# A precision given, the probe only tells CUDA devices from fake GPUs (no trial arrays there): not worth
# waiting long for a GPU that a busy cluster's other sweeps hold (auto's precision is worth the wait).
GIVEN_PRECISION_PROBE_S = 20.0


def trials_device(spec: SweepSpec, session: RaySession) -> tuple[str | None, str]:
    """Decided once for the whole sweep, on the kind of device its trials get: ``cpu`` where the GPUs a
    cluster gives them are no CUDA devices (fake GPUs: the trials run on the CPU, so no trial arrays,
    and said), else None (each trial's own ``auto``); and what precision ``auto`` means there: this
    machine's CPU or GPU in the embedded Ray, a probe task with the trials' resources on a cluster."""
    auto = spec.training.precision == "auto"
    gpus = 1.0 if spec.resources.gpus_per_trial == "auto" else spec.resources.gpus_per_trial
    if not session.on_cluster or (gpus == 0 and not auto):
        return None, precision_here(spec) if auto else spec.training.precision
    try:
        [(device, precision)] = session.run_task(
            trial_device_task,
            [{"device_type": "cuda" if gpus > 0 else "cpu"}],
            cpus=spec.resources.cpus_per_trial,
            gpus=gpus,
            timeout_s=PROBE_TIMEOUT_S if auto else GIVEN_PRECISION_PROBE_S,
        )
    except TaskFailed as exc:
        if not auto:  # each trial then finds its own device, as before the probe asked
            print(f"note: the trials' device was not probed ({exc}): each trial finds its own", file=sys.stderr)
            return None, spec.training.precision
        raise SpecError(
            [f"resources: the trials' device could not be probed on the cluster: {exc}"], "launch"
        ) from None
    if gpus > 0 and device == "cpu":
        if spec.training.precision == "fp16":  # a CUDA precision (trials/precision.py): every trial would fail
            raise SpecError(
                ["training.precision: fp16 needs a CUDA device, but the GPUs the cluster gives the trials are none "
                 "(fake GPUs: use bf16, fp32 or auto)"],
                "launch",
            )  # fmt: skip
        print(
            f"note: the GPUs the cluster gives these trials are no CUDA devices (ray start --num-gpus on a machine "
            f"without one, or torch without CUDA): they run on the CPU, in {precision} where precision is auto, "
            "without trial arrays",
            file=sys.stderr,
        )
        return "cpu", precision
    return None, precision


def check_stored_precision(spec: SweepSpec, precision: str) -> None:
    """An ``auto`` sweep continued on other hardware must not mix precisions: refuse, naming both."""
    store = ResultStore(spec.store, spec.name)
    raw = stored_spec_mapping(store)
    stored = (raw.get("training") or {}).get("precision", "auto") if raw else None
    if stored is None or stored == precision:
        return
    if stored == "auto":
        raise SpecError([OLD_SWEEP], f"{store.uri}/{spec.name}")
    raise SpecError(
        [
            f"training.precision: {spec.training.precision} resolves to {precision} here, but sweep {spec.name!r} was "
            f"run in {stored} (set training.precision: {stored} to continue it in {stored}, or start a new sweep name)"
        ],
        f"{store.uri}/{spec.name}",
    )


def measure_gpu_share(
    spec: SweepSpec, model_layers: Mapping[str, int], shipment: Shipment | Anchored | None, session: RaySession
) -> tuple[float, str, int]:
    """``gpus_per_trial: auto``: one trial of the grid's hungriest depth measured on a GPU where the
    trials run (a Ray task holding a whole GPU, in a worker process that exits after it, so the memory
    it took goes back), one probe per model; the sweep packs as densely as its hungriest model allows
    (trials/memory_probe.py). Where the cells train as trial arrays, one array of
    ``resources.array_width`` cells is measured (halved until it fits). ``spec``: resolved (its
    precision decided). Returns the share, what was measured in words, and the array width."""
    t = spec.training
    shape = dict(
        batch_size=t.batch_size,
        max_seq_length=t.max_seq_length,
        model_init=t.model_init,
        eval_batch_size=t.eval_batch_size,
        precision=t.precision,
        frozen_layers=hungriest_depth(spec, model_layers),
        width=spec.resources.array_width if arrays_apply(spec) else 1,
    )
    calls = [
        {"model": model, "shipment": shipment, **shape, "eval_tokens": worker_eval_tokens(spec, model, model_layers)}
        for model in spec.models()
    ]
    try:
        probes = session.run_task(
            memory_probe_task, calls, cpus=spec.resources.cpus_per_trial, gpus=1, fresh_process=True
        )
    except TaskFailed as exc:
        raise SpecError(
            [f"resources.gpus_per_trial: auto: measuring one trial on a GPU failed: {exc}"], "launch"
        ) from None
    probe = max(probes, key=lambda p: p.gpus_per_trial)
    return probe.gpus_per_trial, f"gpus_per_trial auto: {describe(probe)}", min(p.width for p in probes)


def worker_eval_tokens(spec: SweepSpec, model: str, model_layers: Mapping[str, int]) -> int:
    """The token positions of the evaluation cache entries a worker of ``model``'s cells keeps: each
    dataset's validation rows as its evaluation pads them (trials/run.py ``eval_cache_tokens``: read
    and tokenized here, once per dataset, and not kept), once per entry (``eval_entries_per_dataset``),
    the largest ``MAX_EVAL_ENTRIES``."""
    each = eval_entries_per_dataset(spec, model, model_layers)
    if not each:
        return 0
    per_dataset = [eval_cache_tokens(_cell(spec, model, dataset), WorkerState()) for dataset in spec.datasets]
    entries = sorted((tokens for tokens in per_dataset for _ in range(each)), reverse=True)
    return sum(entries[:MAX_EVAL_ENTRIES])


def _cell(spec: SweepSpec, model: str, dataset: str) -> TrialConfig:
    """A cell of ``model`` on ``dataset`` with every field the sweep shares (its depth, size and seed
    aside: what the evaluation cache and the array switch do not depend on)."""
    return TrialConfig(
        dataset=dataset,
        model=model,
        train_size=spec.train_sizes[0],
        frozen_layers=0,
        gpus_per_trial=1.0,
        **spec.trial_template(dataset),
    )


def arrays_apply(spec: SweepSpec) -> bool:
    """Whether the sweep's freeze cells train as trial arrays on a GPU (trials/array.py ``array_key``,
    asked of one cell with a GPU share: every freeze cell of a spec shares what it decides on)."""
    if "freeze" not in spec.methods:
        return False
    return array_key(_cell(spec, spec.models()[0], spec.datasets[0])) is not None


def hungriest_depth(spec: SweepSpec, model_layers: Mapping[str, int]) -> int:
    """``plan.hungriest_frozen_layers`` of the grid, from each model's variants alone: every dataset,
    train size and seed has the same ones, so the grid (maybe a million cells) is never built."""
    variants: list[Any] = [
        SimpleNamespace(**v) for model in spec.models() for v in method_variants(spec, model, model_layers)
    ]
    return hungriest_frozen_layers(variants)


# --- run: the store is the source of truth --------------------------------------------------------
def run(
    sweep: ResolvedSweep,
    session: RaySession,
    show_progress: bool = True,
    trainable: Callable | None = None,
    feed: bool = True,
) -> LaunchSummary:
    """``trainable``: what each trial runs (None: the real one; benchmarks/scale.py passes an instant one).
    ``feed``: settle mode's groups go on within a Tune run (False: one run a round, as until 2026-11-29;
    benchmarks/settle_rounds.py measures both)."""
    faults = DriverFaults.from_env()
    store = ResultStore(sweep.spec.store, sweep.name, on_staged=faults.on_staged)
    with SweepLock(store.fs, store.sweep_dir, uri=store.uri) as lock:
        store.guard = lock.check  # a driver that lost the sweep to another stops writing, saying why
        sink = open_for_writing(store)
        statuses, every = grid_statuses(sweep, store)  # rows of axis values since removed are no cells of it
        done = final_of(statuses)
        unfinished = set(statuses) - done  # cells whose stored row a final one replaces
        total, settle = grid_size(sweep), sweep.spec.settle is not None
        ran_none = functools.partial(
            LaunchSummary, total, len(done), 0, 0, 0, sweep=sweep.name, store=sweep.spec.store, settle=settle
        )
        pending = peeked(next_cells(sweep, store, done))
        if pending is None:
            store_spec(store, sweep)
            return ran_none()
        session.connect()  # before Tune reads its state back: the session decides where Ray runs
        store_spec(store, sweep)
        storage = ray_storage(store, cluster=sweep.on_cluster)
        recovered = recover_rows(storage, sink, sweep, final_of(every), set(every) - final_of(every))
        pending = peeked(c for c in pending if c.trial_id not in recovered)
        if pending is None:
            return ran_none(recovered=len(recovered))
        notice = checkpoint_storage_warning(
            bool(sweep.spec.training.checkpoint_every_epochs), sweep.spec.store, storage, on_cluster=sweep.on_cluster
        )
        if notice:
            print(f"warning: {notice}", file=sys.stderr)
        progress = SweepProgress(
            total=total,
            done=len(done | recovered),
            enabled=show_progress,
            models=len(sweep.spec.models()),
            at_most=settle,
        )
        writer = RowWriter(
            sweep.name, sink, done | recovered, progress, on_row=row_tracker(sweep), unfinished=unfinished - recovered
        )
        retried = run_rounds(Launch(sweep, storage, writer, lock.raise_if_lost, faults, trainable, feed), pending)
        flush_or_fail(sink)
    return ran_summary(sweep, (total, len(done), len(recovered)), writer, retried)


def ran_summary(sweep: ResolvedSweep, counts: tuple[int, int, int], writer: RowWriter, retried: int) -> LaunchSummary:
    """What a launch that ran trials did: ``counts`` are the grid's cells, those done before it and
    those recovered from an earlier driver's trials; ``writer`` saw every outcome of this one."""
    total, done, recovered = counts
    return LaunchSummary(
        total,
        done,
        len(writer.outcomes),
        writer.ok,
        writer.failed,
        writer.diverged,
        recovered=recovered,
        unfinished=len(writer.planned - set(writer.outcomes)),
        oom_retried=retried,
        gpu_packing=sweep.gpu_packing,
        sweep=sweep.name,
        store=sweep.spec.store,
        settle=sweep.spec.settle is not None,
    )


def peeked(cells: Iterable[TrialConfig]) -> Iterator[TrialConfig] | None:
    """The cells, or None when there are none (read one ahead, then put back)."""
    cells = iter(cells)
    first = next(cells, None)
    return None if first is None else itertools.chain([first], cells)


@dataclass(frozen=True)
class Launch:
    """What every round of one launch runs with, passed down whole."""

    sweep: ResolvedSweep
    storage: RayStorage  # Ray's experiment state and checkpoints (orchestrator/ray_storage.py)
    writer: "RowWriter"  # each outcome's row, and the progress shown
    stop_if: Callable[[], None]  # raises when the sweep's lock was lost: Tune stops
    faults: DriverFaults  # the driver's fault switch (tests)
    trainable: Callable | None = None  # what each trial runs (None: the real one)
    feed: bool = True  # settle mode: a group's next cells join the running Tune run (False: a run a round)


def run_rounds(launch: Launch, pending: Iterable[TrialConfig]) -> int:
    """The pending cells; in settle mode, then each next round the rows call for, until it is settled,
    at its budget, or interrupted (a cell without an outcome: ``resume`` goes on from the store): within
    the same Tune run as its rows come in (``settle_feed``), here for the groups that run left (a cell
    failed, ran out of memory, or the run was full). A cell runs once per launch: one that failed waits
    for the next launch. Returns how many ran again with twice the GPU share."""
    writer = launch.writer
    retried = run_cells(launch, pending)
    while launch.sweep.spec.settle is not None and not writer.planned - set(writer.outcomes):
        pending = peeked(next_cells(launch.sweep, writer.sink.store, set(writer.outcomes) | writer.final_ids))
        if pending is None:
            break
        retried += run_cells(launch, pending)
    return retried


def open_for_writing(store: ResultStore) -> SpoolingWriter:
    """The store made ready under the lock: a crash's staged leftovers removed and its compaction
    finished or undone, unreadable row files set aside (their cells run again), rows kept from a run
    whose store went away written first (they count as done)."""
    for note in store.make_ready().notes():
        print(note, file=sys.stderr)
    sink = SpoolingWriter(store, spool_dir(store))
    flush_or_fail(sink, announce=True)
    return sink


def store_spec(store: ResultStore, sweep: ResolvedSweep) -> None:
    """The resolved spec stored, and the folder its relative paths are read from (resume reads them
    there): once Ray has started, so that a launch whose Ray could not start stores none (a walk-through's
    unwritable HOME left a spec that then refused the same sweep's changed protocol)."""
    store.write_spec(sweep.spec.to_yaml())
    store.write_launch_folder(os.getcwd())


def run_cells(launch: Launch, pending: Iterable[TrialConfig]) -> int:
    """The pending cells through Tune in rounds (plan.rounds: Tune's state stays bounded), then the
    members of failed trial arrays alone (``retry_alone``), then the cells that ran out of memory once
    more with twice the GPU share; returns how many of those were retried. A round
    that ends with a cell without an outcome was interrupted: nothing more starts (``resume`` goes on)."""
    sweep, writer = launch.sweep, launch.writer
    out_of_memory: list[TrialConfig] = []
    in_failed_arrays: list[TrialConfig] = []
    chunks = list(rounds(launch_units(pending, sweep), sweep.spec.resources.trials_per_round))
    with writer.progress:
        try:
            for number, round_units in enumerate(chunks, 1):
                cells = [c for unit in round_units for c in unit]
                writer.planned |= {c.trial_id for c in cells}
                # Settle mode: the last run goes on with each group's next cells as its rows come in. Only
                # the last: a group with cells in a later run would go on before they ran (run twice).
                feed = settle_feed(launch, round_units) if number == len(chunks) else None
                run_tune(
                    sweep,
                    cells,
                    launch.storage,
                    writer.write_all if feed is None else feed.sink(writer.write_all),
                    experiment=sweep.name,
                    stop_if=launch.stop_if,
                    trainable=launch.trainable,
                    units=round_units,  # grouped once, above
                    feed=feed,
                )
                round_units = round_units + (feed.added if feed is not None else [])
                cells = [c for unit in round_units for c in unit]
                writer.planned |= {c.trial_id for c in cells}
                if not writer.has_outcomes(cells):
                    return 0
                out_of_memory += [c for c in cells if writer.outcomes[c.trial_id] == "oom"]
                in_failed_arrays += [
                    c for unit in round_units if len(unit) > 1 for c in unit if writer.outcomes[c.trial_id] == "failed"
                ]
                compact(writer.sink.store)
                launch.faults.on_round_end()
            if not retry_alone(launch, in_failed_arrays):
                return 0  # interrupted: what is left waits for resume
            out_of_memory += [c for c in in_failed_arrays if writer.outcomes[c.trial_id] == "oom"]
            retried = retry_out_of_memory(launch, out_of_memory)
            compact(writer.sink.store)
            return retried
        except Exception:
            launch.stop_if()  # Tune wraps what a callback raised in a TuneError: say why, plainly
            raise


def settle_feed(launch: Launch, first: list[list[TrialConfig]]) -> SettleFeed | None:
    """Settle mode's next cells for a run that starts with ``first`` (orchestrator/settle_feed.py); None
    for a fixed grid, where the launch asked for one Tune run a round (``Launch.feed``: the benchmark's
    switch), or where the store does not hold every row the launch wrote (spooled: the store unreachable
    for the moment; the rounds then read the store after each run, as they did before the feed)."""
    sweep, writer = launch.sweep, launch.writer
    if sweep.spec.settle is None or not launch.feed or writer.sink.pending():
        return None
    try:
        stored = settle_rows(writer.sink.store)
    except OSError:
        return None
    return SettleFeed(
        sweep,
        stored,
        first,
        ran=lambda trial_id: trial_id in writer.outcomes or trial_id in writer.final_ids,
        on_step=launch.faults.on_round_end,
        limit=sweep.spec.resources.trials_per_round,
    )


def compact(store: ResultStore) -> None:
    """A round's final rows into one part (the store stays tens of files). A store unreachable for the
    moment leaves them as they are, readable: the next round or launch compacts them."""
    try:
        store.compact()
    except OSError as exc:
        print(f"warning: the store's rows were not compacted this time ({exc})", file=sys.stderr)


def retry_alone(launch: Launch, cells: list[TrialConfig]) -> bool:
    """Run once more, each as a trial of its own, the members of trial arrays that failed (Ray's retries
    spent): one member's error failed every member of its array, so each gets its own outcome, and the
    row of a member that fails alone names its own error. Its row replaces the array's failed one; a
    launch interrupted before leaves those rows, which ``resume`` runs again. Returns whether each got
    its own outcome (False: interrupted; those without count as unfinished, not as failed)."""
    again: set[str] = set()

    def sink(results: list[TrialResult], attempts: int) -> None:
        launch.writer.write_all(results, attempts)
        again.update(result.trial_id for result in results)

    if not cells:
        return True
    run_tune(
        launch.sweep,
        cells,
        launch.storage,
        sink,
        experiment=f"{launch.sweep.name}-alone",  # its own experiment: resume recovers from the main one
        stop_if=launch.stop_if,
        trainable=launch.trainable,
        units=[[c] for c in cells],
    )
    interrupted = [c.trial_id for c in cells if c.trial_id not in again]
    for trial_id in interrupted:  # its array's failed row stays in the store: resume runs it
        launch.writer.outcomes.pop(trial_id, None)
    return not interrupted


def retry_out_of_memory(launch: Launch, out_of_memory: list[TrialConfig]) -> int:
    """Run once more, with twice the GPU share, the cells that ran out of memory in this launch (see
    the module's docstring for the rows); only once every round had its outcomes (an interrupted
    launch leaves them to ``resume``)."""
    larger = with_doubled_gpu_share(launch.sweep)
    if larger is None or not out_of_memory:
        return 0
    # its own experiment: resume recovers from the main one
    run_tune(
        larger,
        [with_resources(c, larger) for c in out_of_memory],
        launch.storage,
        functools.partial(launch.writer.write_all, oom_retry=True),
        experiment=f"{larger.name}-oom-retry",
        stop_if=launch.stop_if,
        trainable=launch.trainable,
    )
    return len(out_of_memory)


def recover_rows(
    storage: RayStorage, sink: SpoolingWriter, sweep: ResolvedSweep, stored: set[str], unfinished: set[str]
) -> set[str]:
    """Cells whose final result Ray's experiment state holds but the store does not (the driver died
    between the two): written now instead of run again, as one file (``stored``: every final row's cell,
    a value since removed from the grid's too, whose trials Ray's state also keeps; ``unfinished``: cells
    whose stored row is not final, which these replace). Returned: the recovered cells of the grid now."""
    recovered = recover_from_ray(storage, sweep.name, stored)
    if not recovered:
        return set()
    rows = [result_row(sweep.name, result) for result in recovered]
    sink.write_rows(rows, replacing=unfinished)
    written = pd.DataFrame(rows)
    return set(written.loc[in_grid(sweep, written), "trial_id"])


def spool_dir(store: ResultStore) -> str:
    """Always on this machine: it holds rows while the store (local or remote) is unreachable."""
    return store_cache_dir(store, "spool")


def flush_or_fail(sink: SpoolingWriter, announce: bool = False) -> None:
    """The spooled rows into the store, or StoreUnavailable naming what waits; ``announce``: say how many
    rows an earlier run kept in the spool were written now."""
    spooled = len(sink.pending())
    waiting = sink.flush()
    if announce and spooled > waiting:
        print(
            f"note: wrote {spooled - waiting} row(s) kept in the spool ({sink.spool_dir}) while the store could not "
            "take them",
            file=sys.stderr,
        )
    if waiting:
        raise StoreUnavailable(
            f"{waiting} finished result(s) could not be written to the store ({sink.last_error}); they are kept "
            f"in {sink.spool_dir} and will be written by the next `freezesweep resume` once the store is reachable"
        )


def row_tracker(sweep: ResolvedSweep) -> Callable[[dict], None] | None:
    """The spec's opt-in tracker (``tracking: {mlflow: URI}``): each row logged as it lands."""
    tracking = sweep.spec.tracking
    if not tracking.mlflow:
        return None
    from freezesweep.results.mlflow_export import LiveTracker

    return LiveTracker(tracking.mlflow, tracking.experiment or sweep.name, sweep.name)


class RowWriter:
    """Driver-side sink of trial outcomes: one row per cell, final rows (ok, diverged) kept for good.
    ``on_row``: called with each row written (the spec's tracker; it never raises). ``unfinished``:
    cells the store holds a row of that is not final (failed, oom): a final row replaces it."""

    def __init__(
        self,
        sweep: str,
        sink: SpoolingWriter,
        final_ids: set[str],
        progress: SweepProgress,
        on_row: Callable[[dict], None] | None = None,
        unfinished: set[str] | None = None,
    ):
        self.sweep, self.sink, self.progress, self.on_row = sweep, sink, progress, on_row
        self.final_ids = set(final_ids)
        self.unfinished = set(unfinished or ())
        self.outcomes: dict[str, str] = {}  # trial_id -> status of the row this launch wrote last
        self.planned: set[str] = set()  # the cells this launch set out to run

    @property
    def ok(self) -> int:
        return sum(status == "ok" for status in self.outcomes.values())

    @property
    def diverged(self) -> int:
        return sum(status == "diverged" for status in self.outcomes.values())

    @property
    def failed(self) -> int:
        return len(self.outcomes) - self.ok - self.diverged

    def has_outcomes(self, cells: list[TrialConfig]) -> bool:
        return all(c.trial_id in self.outcomes for c in cells)

    def write(self, result: TrialResult, attempts: int, oom_retry: bool = False) -> None:
        self.write_all([result], attempts, oom_retry)

    def write_all(self, results: list[TrialResult], attempts: int, oom_retry: bool = False) -> list[dict]:
        """Outcomes that arrived together (an array's members over at one step): their final rows go
        to the store as one file (``ResultStore.write_rows``). Returns the rows written."""
        results = [r for r in results if r.trial_id not in self.final_ids]  # a final row is never overwritten
        rows = [result_row(self.sweep, r, attempts=attempts, oom_retry=oom_retry) for r in results]
        if not rows:
            return rows
        self.sink.write_rows(rows, replacing=self.unfinished)
        for result, row in zip(results, rows):
            if self.on_row is not None:
                self.on_row(row)
            replaced = self.outcomes.get(result.trial_id)  # a retry's row replaces this launch's oom row
            self.outcomes[result.trial_id] = result.status
            (self.final_ids if result.status in FINAL_STATUSES else self.unfinished).add(result.trial_id)
            self.progress.advance(result, replaces=replaced)
        return rows
