"""Launch and resume: ``resolve`` a spec once, then ``run`` it (the layer under the CLI).

``resolve(spec, session) -> ResolvedSweep`` decides, once and typed, everything that depends on the
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
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from freezesweep.orchestrator import local_files
from freezesweep.orchestrator.checks import validation_rows
from freezesweep.orchestrator.driver_faults import DriverFaults
from freezesweep.orchestrator.plan import (ResolvedSweep, build_grid, grid_size, hungriest_frozen_layers, iter_grid, rounds,
                               settle_round, with_doubled_gpu_share, with_resources)
from freezesweep.orchestrator.progress import SweepProgress
from freezesweep.orchestrator.ray_session import RaySession, TaskFailed, auto_precision_task, memory_probe_task
from freezesweep.orchestrator.ray_storage import RayStorage, checkpoint_storage_warning, ray_storage, store_cache_dir
from freezesweep.orchestrator.rows import result_row
from freezesweep.orchestrator.spec import SpecError, SweepSpec, read_stored_spec
from freezesweep.orchestrator.sweeps import OLD_SWEEP, precision_here, resolved
from freezesweep.orchestrator.tune_adapter import recover_from_ray, run_tune
from freezesweep.results.lock import SweepLock
from freezesweep.results.store import FINAL_STATUSES, ResultStore, SpoolingWriter
from freezesweep.trials.config import TrialConfig, TrialResult
from freezesweep.trials.memory_probe import describe


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


class StoreUnavailable(RuntimeError):
    pass


def launch(spec: SweepSpec, show_progress: bool = True, session: RaySession | None = None) -> LaunchSummary:
    """``resolve`` then ``run``, on the spec's cluster (or an embedded Ray) unless a session is given."""
    session = session or RaySession(spec.address)
    return run(resolve(spec, session), session, show_progress)


# --- resolve: decided once, before anything is written ----------------------------------------------
def resolve(spec: SweepSpec, session: RaySession) -> ResolvedSweep:
    if session.on_cluster:
        preflight(spec, session)  # every node has what its trials open, before anything is written
    precision = resolve_precision(spec, session)
    check_stored_precision(spec, precision)
    shipment = session.ship(spec) if local_files.mode(spec, session.on_cluster) == "ship" else None
    sweep = resolved(spec, precision, session.address, shipment)
    if spec.resources.gpus_per_trial != "auto":
        return sweep
    share, measured = measure_gpu_share(sweep, session)
    return dataclasses.replace(sweep, gpu_share=share, gpu_packing=measured)


def preflight(spec: SweepSpec, session: RaySession) -> None:
    """On a cluster: one SpecError naming every node that lacks what its trials would open."""
    how = local_files.mode(spec, on_cluster=True)
    problems = session.check_nodes(local_files.NodeNeeds.of(spec, how))
    if problems:
        why = (" (local_files: node_local: every node must hold the spec's data files and model folders at the "
               "same paths; local_files: ship sends them)") if how == "node_local" else ""
        raise SpecError(problems, f"preflight on the cluster's nodes{why}")


def resolve_precision(spec: SweepSpec, session: RaySession) -> str:
    """``auto`` decided once for the whole sweep, on the kind of device its trials get: this
    machine's CPU or GPU in the embedded Ray, a probe task with the trials' resources on a cluster."""
    if spec.training.precision != "auto" or not session.on_cluster:
        return precision_here(spec)
    gpus = 1.0 if spec.resources.gpus_per_trial == "auto" else spec.resources.gpus_per_trial
    try:
        [precision] = session.run_task(auto_precision_task, [{"device_type": "cuda" if gpus > 0 else "cpu"}],
                                       cpus=spec.resources.cpus_per_trial, gpus=gpus)
    except TaskFailed as exc:
        raise SpecError([f"resources: precision auto could not be resolved on the cluster: {exc}"], "launch") from None
    return precision


def check_stored_precision(spec: SweepSpec, precision: str) -> None:
    """An ``auto`` sweep continued on other hardware must not mix precisions: refuse, naming both."""
    store = ResultStore(spec.store, spec.name)
    text = store.read_spec()
    raw = read_stored_spec(text, f"{store.uri}/{spec.name}/spec.yaml") if text else None
    stored = (raw.get("training") or {}).get("precision", "auto") if raw else None
    if stored is None or stored == precision:
        return
    if stored == "auto":
        raise SpecError([OLD_SWEEP], f"{store.uri}/{spec.name}")
    raise SpecError([
        f"training.precision: {spec.training.precision} resolves to {precision} here, but sweep {spec.name!r} was "
        f"run in {stored} (set training.precision: {stored} to continue it in {stored}, or start a new sweep name)"
    ], f"{store.uri}/{spec.name}")


def measure_gpu_share(sweep: ResolvedSweep, session: RaySession) -> tuple[float, str]:
    """``gpus_per_trial: auto``: one trial of the grid's hungriest depth measured on a GPU where the
    trials run (a Ray task holding a whole GPU, in a worker process that exits after it, so the memory
    it took goes back), one probe per model; the sweep packs as densely as its hungriest model allows
    (trials/memory_probe.py). Returns the share, and what was measured in words."""
    t = sweep.spec.training
    shape = dict(batch_size=t.batch_size, max_seq_length=t.max_seq_length, model_init=t.model_init,
                 eval_batch_size=t.eval_batch_size, precision=t.precision, eval_rows=validation_rows(sweep.spec),
                 frozen_layers=hungriest_frozen_layers(build_grid(sweep)))
    calls = [{"model": model, "shipment": sweep.shipment, **shape} for model in sweep.spec.models()]
    try:
        probes = session.run_task(memory_probe_task, calls, cpus=sweep.spec.resources.cpus_per_trial, gpus=1,
                                  fresh_process=True)
    except TaskFailed as exc:
        raise SpecError([f"resources.gpus_per_trial: auto: measuring one trial on a GPU failed: {exc}"],
                        "launch") from None
    probe = max(probes, key=lambda p: p.gpus_per_trial)
    return probe.gpus_per_trial, f"gpus_per_trial auto: {describe(probe)}"


# --- run: the store is the source of truth --------------------------------------------------------
def run(sweep: ResolvedSweep, session: RaySession, show_progress: bool = True,
        trainable: Callable | None = None) -> LaunchSummary:
    """``trainable``: what each trial runs (None: the real one; benchmarks/scale.py passes an instant one)."""
    faults = DriverFaults.from_env()
    store = ResultStore(sweep.spec.store, sweep.name, on_staged=faults.on_staged)
    with SweepLock(store.fs, store.sweep_dir, uri=store.uri) as lock:
        store.guard = lock.check  # a driver that lost the sweep to another stops writing, saying why
        sink = open_for_writing(store, sweep)
        done = store.final_ids()
        total = grid_size(sweep)
        pending = peeked(next_cells(sweep, store, done))
        if pending is None:
            return LaunchSummary(total, len(done), 0, 0, 0)
        session.connect()  # before Tune reads its state back: the session decides where Ray runs
        storage = ray_storage(store, cluster=sweep.on_cluster)
        recovered = recover_rows(storage, sink, sweep.name, done)
        pending = peeked(c for c in pending if c.trial_id not in recovered)
        if pending is None:
            return LaunchSummary(total, len(done), 0, 0, 0, recovered=len(recovered))
        notice = checkpoint_storage_warning(bool(sweep.spec.training.checkpoint_every_epochs), sweep.spec.store,
                                            storage, on_cluster=sweep.on_cluster)
        if notice:
            print(f"warning: {notice}", file=sys.stderr)
        writer = RowWriter(sweep.name, sink, done | recovered,
                           SweepProgress(total=total, done=len(done | recovered), enabled=show_progress))
        retried = run_rounds(sweep, pending, storage, writer, stop_if=lock.raise_if_lost, trainable=trainable,
                             faults=faults)
        flush_or_fail(sink)
    return LaunchSummary(total, len(done), len(writer.outcomes), writer.ok, writer.failed, writer.diverged,
                         recovered=len(recovered), unfinished=len(writer.planned - set(writer.outcomes)),
                         oom_retried=retried, gpu_packing=sweep.gpu_packing)


SETTLE_COLUMNS = ["trial_id", "status", "best_val_score", "baseline_score", "collapsed"]


def next_cells(sweep: ResolvedSweep, store: ResultStore, done: set[str]) -> Iterable[TrialConfig]:
    """The cells to run now: a fixed grid's every cell without a final row (in ``done``), as the grid
    yields them (the first round starts before the last cell is built); in settle mode, the next round
    the stored rows call for (orchestrator/plan.py settle_round)."""
    if sweep.spec.settle is None:
        return (c for c in iter_grid(sweep) if c.trial_id not in done)
    rows = store.read_table(columns=SETTLE_COLUMNS).to_pandas()
    return [c for c in settle_round(sweep, build_grid(sweep), rows) if c.trial_id not in done]


def peeked(cells: Iterable[TrialConfig]) -> Iterator[TrialConfig] | None:
    """The cells, or None when there are none (read one ahead, then put back)."""
    cells = iter(cells)
    first = next(cells, None)
    return None if first is None else itertools.chain([first], cells)


def run_rounds(sweep: ResolvedSweep, pending: Iterable[TrialConfig], storage: RayStorage, writer: "RowWriter",
               stop_if: Callable[[], None], trainable: Callable | None = None,
               faults: DriverFaults = DriverFaults()) -> int:
    """The pending cells; in settle mode, then each next round the rows call for, until it is settled,
    at its budget, or interrupted (a cell without an outcome: ``resume`` goes on from the store). A cell
    runs once per launch: one that failed waits for the next launch. Returns how many ran again with
    twice the GPU share."""
    retried = run_cells(sweep, pending, storage, writer, stop_if, trainable, faults)
    while sweep.spec.settle is not None and not writer.planned - set(writer.outcomes):
        pending = peeked(next_cells(sweep, writer.sink.store, set(writer.outcomes) | writer.final_ids))
        if pending is None:
            break
        retried += run_cells(sweep, pending, storage, writer, stop_if, trainable, faults)
    return retried


def open_for_writing(store: ResultStore, sweep: ResolvedSweep) -> SpoolingWriter:
    """The store made ready under the lock: a crash's staged leftovers removed and its compaction
    finished or undone, unreadable row files set aside (their cells run again), rows kept from a run
    whose store went away written first (they count as done), the resolved spec stored."""
    store.clean_staging()
    store.recover_compaction()
    for path in store.quarantine_unreadable():
        print(f"warning: {path} could not be read; moved to {store.quarantine_dir} (kept) and its cell runs again",
              file=sys.stderr)
    sink = SpoolingWriter(store, spool_dir(store))
    flush_or_fail(sink)
    store.write_spec(sweep.spec.to_yaml())
    return sink


def run_cells(sweep: ResolvedSweep, pending: Iterable[TrialConfig], storage: RayStorage, writer: "RowWriter",
              stop_if: Callable[[], None], trainable: Callable | None = None,
              faults: DriverFaults = DriverFaults()) -> int:
    """The pending cells through Tune in rounds (plan.rounds: Tune's state stays bounded), then those
    that ran out of memory once more with twice the GPU share; returns how many were retried. A round
    that ends with a cell without an outcome was interrupted: nothing more starts (``resume`` goes on)."""
    out_of_memory: list[TrialConfig] = []
    with writer.progress:
        try:
            for cells in rounds(pending, sweep.spec.resources.cells_per_round):
                cells = [with_resources(c, sweep) for c in cells]
                writer.planned |= {c.trial_id for c in cells}
                run_tune(sweep, cells, storage, writer.write, experiment=sweep.name, stop_if=stop_if,
                         trainable=trainable)
                if not writer.has_outcomes(cells):
                    return 0
                out_of_memory += [c for c in cells if writer.outcomes[c.trial_id] == "oom"]
                compact(writer.sink.store)
                faults.on_round_end()
            retried = retry_out_of_memory(sweep, out_of_memory, storage, writer, stop_if, trainable)
            compact(writer.sink.store)
            return retried
        except Exception:
            stop_if()  # Tune wraps what a callback raised in a TuneError: say why, plainly
            raise


def compact(store: ResultStore) -> None:
    """A round's final rows into one part (the store stays tens of files). A store unreachable for the
    moment leaves them as they are, readable: the next round or launch compacts them."""
    try:
        store.compact()
    except OSError as exc:
        print(f"warning: the store's rows were not compacted this time ({exc})", file=sys.stderr)


def retry_out_of_memory(sweep: ResolvedSweep, out_of_memory: list[TrialConfig], storage: RayStorage,
                        writer: "RowWriter", stop_if: Callable[[], None], trainable: Callable | None = None) -> int:
    """Run once more, with twice the GPU share, the cells that ran out of memory in this launch (see
    the module's docstring for the rows); only once every round had its outcomes (an interrupted
    launch leaves them to ``resume``)."""
    larger = with_doubled_gpu_share(sweep)
    if larger is None or not out_of_memory:
        return 0
    # its own experiment: resume recovers from the main one
    run_tune(larger, [with_resources(c, larger) for c in out_of_memory], storage,
             functools.partial(writer.write, oom_retry=True), experiment=f"{sweep.name}-oom-retry", stop_if=stop_if,
             trainable=trainable)
    return len(out_of_memory)


def recover_rows(storage: RayStorage, sink: SpoolingWriter, sweep_name: str, done: set[str]) -> set[str]:
    """Cells whose final result Ray's experiment state holds but the store does not (the driver died
    between the two): written now instead of run again."""
    recovered = recover_from_ray(storage, sweep_name, done)
    for result in recovered:
        sink.write_row(result_row(sweep_name, result))
    return {result.trial_id for result in recovered}


def spool_dir(store: ResultStore) -> str:
    """Always on this machine: it holds rows while the store (local or remote) is unreachable."""
    return store_cache_dir(store, "spool")


def flush_or_fail(sink: SpoolingWriter) -> None:
    waiting = sink.flush()
    if waiting:
        raise StoreUnavailable(
            f"{waiting} finished result(s) could not be written to the store ({sink.last_error}); they are kept "
            f"in {sink.spool_dir} and will be written by the next `freezesweep resume` once the store is reachable"
        )


class RowWriter:
    """Driver-side sink of trial outcomes: one row per cell, final rows (ok, diverged) kept for good."""

    def __init__(self, sweep: str, sink: SpoolingWriter, final_ids: set[str], progress: SweepProgress):
        self.sweep, self.sink, self.progress = sweep, sink, progress
        self.final_ids = set(final_ids)
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
        if result.trial_id in self.final_ids:
            return  # a final row is never overwritten
        self.sink.write_row(result_row(self.sweep, result, attempts=attempts, oom_retry=oom_retry))
        replaced = self.outcomes.get(result.trial_id)  # a retry's row replaces this launch's oom row
        self.outcomes[result.trial_id] = result.status
        if result.status in FINAL_STATUSES:
            self.final_ids.add(result.trial_id)
        self.progress.advance(result, replaces=replaced)
