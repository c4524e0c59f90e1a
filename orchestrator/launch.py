"""Launch and resume: plan the missing cells from the store, run them through Ray Tune, write rows.

The store is the source of truth: a launch runs exactly the cells of the spec that have no ``ok``
row, so re-launching (or ``resume``) after any interruption runs nothing twice and loses nothing,
and a grown spec runs only its new cells.

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
import math
import os
import sys
from dataclasses import dataclass

from orchestrator import driver_faults, local_files
from orchestrator.grid import build_grid
from orchestrator.progress import SweepProgress
from orchestrator.ray_storage import (RayStorage, checkpoint_storage_warning, drop_checkpoints,
                                      earlier_checkpoints, ray_storage, store_cache_dir)
from orchestrator.rows import result_row
from orchestrator.spec import SpecError, SweepSpec
from results.lock import SweepLock
from results.store import ResultStore, SpoolingWriter
from trials.config import TrialConfig, TrialResult
from trials.data import resolve_data_dir

# Environment a trial reads, forwarded to workers on other nodes (local workers inherit it anyway)...
_FORWARDED_ENV_PREFIXES = ("FREEZESWEEP_", "HF_", "TRANSFORMERS_")
# ...except the driver's folders: a node has its own caches, and the data dir is in the spec (its
# files shipped or checked on every node).
_DRIVER_PATH_ENV = frozenset({"FREEZESWEEP_DATA_DIR", "FREEZESWEEP_CACHE_DIR", "HF_HOME", "HF_HUB_CACHE",
                              "HF_DATASETS_CACHE", "HF_TOKEN_PATH", "TRANSFORMERS_CACHE"})


@dataclass(frozen=True)
class LaunchSummary:
    total: int
    already_ok: int
    ran: int  # trials that reached an outcome this launch (ok + failed)
    ok: int
    failed: int
    recovered: int = 0  # rows taken from Ray's experiment state instead of re-running
    unfinished: int = 0  # planned but without an outcome (the launch was interrupted)
    oom_retried: int = 0  # cells run again with twice the GPU share after running out of memory
    gpu_packing: str | None = None  # what gpus_per_trial auto measured and chose


def plan(spec: SweepSpec, done: set[str]) -> tuple[list[TrialConfig], list[TrialConfig]]:
    """(all cells, cells still to run) given the ids that already have an ok row."""
    cells = build_grid(spec)
    return cells, [c for c in cells if c.trial_id not in done]


class StoreUnavailable(RuntimeError):
    pass


def launch(spec: SweepSpec, show_progress: bool = True) -> LaunchSummary:
    store = ResultStore(spec.store, spec.name, mid_write=driver_faults.in_write)
    if spec.data_dir is None and resolve_data_dir(None) is not None:
        # Record where the data came from, so `resume` works without the environment variable.
        spec = spec.model_copy(update={"data_dir": str(resolve_data_dir(None).resolve())})
    if cluster_address(spec.address):
        _init_ray(spec.address)
        local_files.preflight(spec)  # every node has what its trials open, before anything is written
    requested, spec = spec.training.precision, resolve_sweep_precision(spec)
    # Stored resolved, per dataset: status and report never need the data to know a cell's metric.
    resolved = spec.training.model_copy(update={"select_metric": spec.select_metrics()})
    spec = spec.model_copy(update={"training": resolved})
    with SweepLock(store.fs, store.sweep_dir, uri=store.uri) as lock:
        store.guard = lock.check  # a driver that lost the sweep to another stops writing, saying why
        _check_stored_precision(store, spec, requested)
        store.clean_staging()
        sink = SpoolingWriter(store, spool_dir(store))
        _flush_or_fail(sink)  # rows kept from a run whose store went away count as done
        store.write_spec(spec.to_yaml())
        done = store.ok_ids()
        cells, pending = plan(spec, done)
        storage = _ray_storage(spec, store)
        recovered = _recover_from_ray(storage, store, sink, {c.trial_id for c in pending})
        pending = [c for c in pending if c.trial_id not in recovered]
        if not pending:
            return LaunchSummary(len(cells), len(cells) - len(recovered), 0, 0, 0, recovered=len(recovered))
        shipment = _ship(spec)
        spec, packing = resolve_gpus_per_trial(spec, hungriest_frozen_layers(pending), shipment)
        pending = [_machine_fields(c, spec) for c in pending]
        notice = checkpoint_storage_warning(spec, storage, on_cluster=cluster_address(spec.address) is not None)
        if notice:
            print(f"warning: {notice}", file=sys.stderr)
        writer = RowWriter(spec.name, sink, done | recovered,
                           SweepProgress(total=len(cells), done=len(cells) - len(pending), enabled=show_progress))
        with writer.progress:
            try:
                _run_tune(spec, pending, storage, writer.write, stop_if=lock.raise_if_lost, shipment=shipment)
                retried = _retry_ooms_with_more_memory(spec, pending, storage, writer, stop_if=lock.raise_if_lost,
                                                       shipment=shipment)
            except Exception:
                lock.raise_if_lost()  # Tune wraps what a callback raised in a TuneError: say why, plainly
                raise
        _flush_or_fail(sink)
    outcomes = writer.ok + writer.failed
    return LaunchSummary(len(cells), len(cells) - len(pending) - len(recovered), outcomes, writer.ok, writer.failed,
                         recovered=len(recovered), unfinished=len(pending) - outcomes, oom_retried=retried,
                         gpu_packing=packing)


def hungriest_frozen_layers(cells: list[TrialConfig]) -> int:
    """The freeze depth whose trial needs the most memory: nothing frozen (0) beats the embeddings
    alone (-1), which beats k layers; a LoRA cell backpropagates through every layer, as k = 0 does
    (the probe trains no layer at all)."""
    ks = {0 if c.method == "lora" else c.frozen_layers for c in cells if c.method != "probe"}
    return 0 if 0 in ks or not ks else (-1 if -1 in ks else min(ks))


def roomier(spec: SweepSpec) -> SweepSpec | None:
    """The spec with twice the GPU share per trial (at most a whole GPU); None when trials do not
    share GPUs (CPU trials, or a whole GPU each: nothing to give them)."""
    share = spec.resources.gpus_per_trial
    if not 0 < share < 1:
        return None
    resources = spec.resources.model_copy(update={"gpus_per_trial": min(1.0, 2 * share)})
    return spec.model_copy(update={"resources": resources})


def _retry_ooms_with_more_memory(spec: SweepSpec, pending: list[TrialConfig], storage: RayStorage,
                                 writer: "RowWriter", stop_if=None, shipment=None) -> int:
    """Run once more, with twice the GPU share, the cells that ran out of memory in this launch (see
    the module's docstring for the rows). Not after an interruption: a cell without an outcome
    means the run was stopped, and ``resume`` picks everything up."""
    more = roomier(spec)
    oom = [c for c in pending if writer.outcomes.get(c.trial_id) == "oom"]
    if more is None or not oom or any(c.trial_id not in writer.outcomes for c in pending):
        return 0
    _run_tune(more, oom, storage, functools.partial(writer.write, oom_retry=True), experiment=f"{spec.name}-oom-retry",
              stop_if=stop_if, shipment=shipment)
    return len(oom)


# A stored spec with precision "auto" was written before ids named the resolved precision and before
# the reference schedule and paired seeds: its rows cannot be continued under the same ids.
OLD_SWEEP = ("this sweep was made by a freezesweep before 0.2 (other evaluation schedule, seeds and cell ids): "
             "its rows stay readable, but it cannot be continued; launch the spec under a new sweep name")
PROBE_TIMEOUT_S = 300


def resolve_sweep_precision(spec: SweepSpec) -> SweepSpec:
    """``auto`` decided once for the whole sweep, on the kind of device its trials get: this
    machine's CPU or GPU in the embedded Ray, a probe task with the trials' resources on a cluster."""
    if spec.training.precision != "auto":
        return spec
    gpus = gpu_request(spec)
    device_type = "cuda" if gpus > 0 else "cpu"
    if cluster_address(spec.address):
        import ray

        _init_ray(spec.address)
        probe = ray.remote(num_cpus=spec.resources.cpus_per_trial, num_gpus=gpus)(_auto_precision)
        try:
            precision = ray.get(probe.remote(device_type), timeout=PROBE_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise SpecError([f"resources: no node of the cluster ran a probe with {spec.resources.cpus_per_trial} CPU and "
                             f"{gpus} GPU within {PROBE_TIMEOUT_S} s (are there such nodes?), "
                             "so precision auto could not be resolved"], "launch") from None
    else:
        precision = _auto_precision(device_type)
    return spec.model_copy(update={"training": spec.training.model_copy(update={"precision": precision})})


def _auto_precision(device_type: str) -> str:
    from trials.precision import auto_precision

    return auto_precision(device_type)


def gpu_request(spec: SweepSpec) -> float:
    """The GPU a trial asks for: its share, or for ``auto`` (not measured yet) a whole GPU."""
    share = spec.resources.gpus_per_trial
    return 1.0 if share == "auto" else share


def resolve_gpus_per_trial(spec: SweepSpec, frozen_layers: int,
                           shipment: local_files.Shipment | None = None) -> tuple[SweepSpec, str | None]:
    """``auto``: one trial with ``frozen_layers`` (the sweep's fewest: the largest footprint) measured
    on a GPU where the trials run (a Ray task holding a whole GPU, in a worker process that exits after
    it, so the memory it took goes back), then as many trials per GPU as fit (trials/memory_probe.py).
    Measured per launch, not stored: a resume on other GPUs measures again. Returns the spec with the
    share, and what was measured in words."""
    if spec.resources.gpus_per_trial != "auto":
        return spec, None
    import ray

    t = spec.training
    _init_ray(spec.address)
    task = ray.remote(num_cpus=spec.resources.cpus_per_trial, num_gpus=1, max_calls=1)(_memory_probe)
    shape = dict(batch_size=t.batch_size, max_seq_length=t.max_seq_length, model_init=t.model_init,
                 eval_batch_size=t.eval_batch_size, precision=t.precision, frozen_layers=frozen_layers)
    try:  # one probe per model; the sweep packs as densely as its hungriest model allows
        probes = ray.get([task.remote(model=model, shipment=shipment, **shape) for model in spec.models()],
                         timeout=PROBE_TIMEOUT_S)
        probe = max(probes, key=lambda p: p.gpus_per_trial)
    except ray.exceptions.GetTimeoutError:
        raise SpecError([f"resources.gpus_per_trial: auto: no node ran the memory probe (1 GPU, "
                         f"{spec.resources.cpus_per_trial} CPU) within {PROBE_TIMEOUT_S} s"], "launch") from None
    except ray.exceptions.RayTaskError as exc:
        raise SpecError([f"resources.gpus_per_trial: auto: measuring one trial on a GPU failed: "
                         f"{local_files.first_line(exc)}"], "launch") from None
    from trials.memory_probe import describe

    resources = spec.resources.model_copy(update={"gpus_per_trial": probe.gpus_per_trial})
    return spec.model_copy(update={"resources": resources}), f"gpus_per_trial auto: {describe(probe)}"


def _memory_probe(model: str, shipment: local_files.Shipment | None = None, **kwargs):
    from trials.memory_probe import probe

    return probe(model=shipment.model_files(model) if shipment else model, **kwargs)


def _ship(spec: SweepSpec) -> local_files.Shipment | None:
    """The spec's local files in Ray's object store, when trials get them that way (local_files.mode)."""
    if local_files.mode(spec) != "ship":
        return None
    _init_ray(spec.address)
    return local_files.pack(spec)


def _check_stored_precision(store: ResultStore, spec: SweepSpec, requested: str) -> None:
    """An ``auto`` sweep continued on other hardware must not mix precisions: refuse, naming both."""
    import yaml

    text = store.read_spec()
    stored = ((yaml.safe_load(text) or {}).get("training") or {}).get("precision", "auto") if text else None
    if stored is None or stored == spec.training.precision:
        return
    if stored == "auto":
        raise SpecError([OLD_SWEEP], f"{store.uri}/{spec.name}")
    raise SpecError([
        f"training.precision: {requested} resolves to {spec.training.precision} here, but sweep {spec.name!r} was "
        f"run in {stored} (set training.precision: {stored} to continue it in {stored}, or start a new sweep name)"
    ], f"{store.uri}/{spec.name}")


def _machine_fields(cell: TrialConfig, spec: SweepSpec) -> TrialConfig:
    """How a cell runs (not identity): threads. Its checkpoints go where the Ray adapter puts them
    (tune_adapter.ray_checkpoints: Ray's storage, below)."""
    return dataclasses.replace(cell, num_threads=max(1, math.floor(spec.resources.cpus_per_trial)))


def _ray_storage(spec: SweepSpec, store: ResultStore) -> RayStorage:
    return ray_storage(store, cluster=cluster_address(spec.address) is not None)


def _recover_from_ray(storage: RayStorage, store: ResultStore, sink: SpoolingWriter,
                      pending_ids: set[str]) -> set[str]:
    """Cells whose final result Ray's experiment state holds but the store does not (the driver died
    between the two): written now instead of run again. Ray's state is an optimisation only: any
    problem reading it (absent, corrupt, another Ray version) just means those cells run again."""
    import json

    from orchestrator.tune_adapter import RESULT_KEY, last_placement, tune_trainable
    from trials.config import result_from_dict

    path = f"{storage.path}/{store.sweep}"
    recovered: set[str] = set()
    try:
        from ray import tune

        if not pending_ids or not tune.Tuner.can_restore(path, storage_filesystem=storage.filesystem):
            return recovered
        restored = tune.Tuner.restore(path, trainable=tune_trainable, storage_filesystem=storage.filesystem)
        for trial in restored.get_results():
            payload = (trial.metrics or {}).get(RESULT_KEY)
            result = result_from_dict(json.loads(payload)) if payload else None
            if result is not None and result.status == "ok" and result.trial_id in pending_ids:
                # State written before rows were placed has no placement in the result: Ray's host and IP.
                placement = {**last_placement(trial.metrics), **result.placement}
                sink.write_row(result_row(store.sweep, dataclasses.replace(result, placement=placement)))
                recovered.add(result.trial_id)
    except Exception:
        return recovered
    return recovered


def spool_dir(store: ResultStore) -> str:
    """Always on this machine: it holds rows while the store (local or remote) is unreachable."""
    return store_cache_dir(store, "spool")


def _flush_or_fail(sink: SpoolingWriter) -> None:
    waiting = sink.flush()
    if waiting:
        raise StoreUnavailable(
            f"{waiting} finished result(s) could not be written to the store ({sink.last_error}); they are kept "
            f"in {sink.spool_dir} and will be written by the next `freezesweep resume` once the store is reachable"
        )


class RowWriter:
    """Driver-side sink of trial outcomes: one row per cell, ok rows final."""

    def __init__(self, sweep: str, sink: SpoolingWriter, ok_ids: set[str], progress: SweepProgress):
        self.sweep, self.sink, self.progress = sweep, sink, progress
        self.ok_ids = set(ok_ids)
        self.outcomes: dict[str, str] = {}  # trial_id -> status of the row this launch wrote last

    @property
    def ok(self) -> int:
        return sum(status == "ok" for status in self.outcomes.values())

    @property
    def failed(self) -> int:
        return len(self.outcomes) - self.ok

    def write(self, result: TrialResult, attempts: int, oom_retry: bool = False) -> None:
        if result.trial_id in self.ok_ids:
            return  # an ok row is final: never overwritten
        self.sink.write_row(result_row(self.sweep, result, attempts=attempts, oom_retry=oom_retry))
        replaced = self.outcomes.get(result.trial_id)  # a retry's row replaces this launch's oom row
        self.outcomes[result.trial_id] = result.status
        if result.status == "ok":
            self.ok_ids.add(result.trial_id)
        self.progress.advance(result, replaces=replaced)


def _run_tune(spec: SweepSpec, pending: list[TrialConfig], storage: RayStorage, write,
              experiment: str | None = None, stop_if=None, shipment: local_files.Shipment | None = None) -> None:
    from ray import tune

    from orchestrator.tune_adapter import CELL_KEY, StoreWriter, trial_config_from_ray, tune_trainable

    _init_ray(spec.address)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0: no Tune tables; our bar reports
    resources = {"cpu": spec.resources.cpus_per_trial, "gpu": spec.resources.gpus_per_trial}
    name = experiment or spec.name  # the retry of OOMs has its own: resume recovers from the main one
    # An earlier launch's driver died while some of these cells ran: each starts from its last checkpoint.
    earlier = earlier_checkpoints(storage, name, {c.trial_id for c in pending}) \
        if spec.training.checkpoint_every_epochs else {}
    outcomes: set[str] = set()

    def write_outcome(result, attempts, **kwargs) -> None:
        write(result, attempts, **kwargs)
        outcomes.add(result.trial_id)

    tuner = tune.Tuner(
        # with_parameters: what every trial may need goes to the object store once, not into each one's config
        tune.with_resources(tune.with_parameters(tune_trainable, shipment=shipment, earlier=earlier), resources),
        param_space={CELL_KEY: tune.grid_search([c.to_dict() for c in pending])},
        tune_config=tune.TuneConfig(
            max_concurrent_trials=spec.resources.max_concurrent_trials,
            reuse_actors=True,  # one worker process runs many trials: imports, tokenizer and token cache stay warm
            trial_dirname_creator=lambda trial: trial_config_from_ray(trial.config).trial_id,
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=storage.path,
            storage_filesystem=storage.filesystem,
            # A trial whose process or node dies is run again, from its last checkpoint when it has one
            # (tune_adapter.ray_checkpoints); only the latest is kept, and none once the trial is over.
            failure_config=tune.FailureConfig(max_failures=spec.resources.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            callbacks=[StoreWriter(write_outcome, stop_if, trial_over=functools.partial(drop_checkpoints, storage, name)
                                   if spec.training.checkpoint_every_epochs else None)],
            verbose=0,
        ),
    )
    try:
        tuner.fit()
    except OSError as exc:
        # Once the trials are over Ray reads its experiment state back (a result grid the launch does
        # not use): a remote store gone by then fails that read, though every outcome has reached the
        # spool already. The launch's flush then says what is kept where, as it does for rows.
        # Any other OSError (storage unreachable from the start, a spool write failing) propagates.
        if not (storage.shared and {c.trial_id for c in pending} <= outcomes):
            raise
        print(f"warning: Ray could not read its state back from {storage.path} after the last trial ({exc}); "
              "every trial's outcome is kept", file=sys.stderr)


def cluster_address(address: str | None) -> str | None:
    """The Ray cluster a sweep runs on: the spec's or --address, else RAY_ADDRESS, else None (a local Ray)."""
    return address or os.environ.get("RAY_ADDRESS") or None


def _init_ray(address: str | None) -> None:
    import ray

    if ray.is_initialized():
        return
    env = {k: v for k, v in os.environ.items() if k.startswith(_FORWARDED_ENV_PREFIXES) and k not in _DRIVER_PATH_ENV}
    ray.init(address=cluster_address(address), include_dashboard=False,
             log_to_driver=False, logging_level="ERROR", runtime_env={"env_vars": env} if env else None)


def sweep_from_store(name: str, store_uri: str, semantic: bool = True) -> SweepSpec:
    """The resolved spec a sweep was launched with; ``semantic=False`` skips the checks that load
    the model and data (inspection needs neither)."""
    from orchestrator.spec import SpecError, parse_spec, read_stored_spec

    text = ResultStore(store_uri, name).read_spec()
    if text is None:
        raise SpecError([f"no sweep named {name!r} in store {store_uri!r}"], "resume")
    source = f"{store_uri}/{name}/spec.yaml"
    spec = parse_spec(read_stored_spec(text), source, semantic=semantic)
    if spec.training.precision == "auto":  # stored unresolved: written by a freezesweep before 0.2
        raise SpecError([OLD_SWEEP], source)
    return spec
