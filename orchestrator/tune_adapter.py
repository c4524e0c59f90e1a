"""The one place where Ray Tune meets a trial (the only user of Ray Tune).

Driver side: ``run_tune`` runs a list of cells as one Tune experiment and hands each cell's outcome to
the launch (``OutcomeCallback``), so workers never touch the store; ``recover_from_ray`` reads the
outcomes an earlier launch's Tune recorded but its driver never stored.
Worker side: ``tune_trainable`` turns Ray's dict into a TrialConfig (unknown keys rejected), points
it at this node's copies of the files the driver shipped (orchestrator/local_files.py), runs the
plain-PyTorch trial, reports each evaluation to Tune and finally the whole result as JSON.
A crash propagates so Ray's FailureConfig retries it; an out-of-memory error does not (it would
fail again the same way at the same density) and becomes an ``oom`` row at once, after the worker
has given the memory back; the launch retries such cells once with a larger GPU share.

Every row says where it ran: Ray's node id and IP and the trial's GPU share (gathered here, the one
place that meets Ray) beside the host and CUDA device the trial saw (trials/placement.py).

Checkpoints (``checkpoint_every_epochs``) are Ray's: each one the trial saves is handed to Tune, which
copies it to the sweep's Ray storage (orchestrator/ray_storage.py); a retry, on whatever node, starts
from the latest, and a cell's first attempt from the one an earlier launch left (its driver died); the
driver deletes them once the trial is over.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import pickle
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import ray
import transformers
from ray import cloudpickle, tune
from ray.tune.search import Searcher

from freezesweep.orchestrator.local_files import Anchored, Shipment
from freezesweep.orchestrator.plan import ResolvedSweep
from freezesweep.orchestrator.ray_storage import RayStorage, drop_checkpoints, latest_checkpoints
from freezesweep.trials.array import group_cells, run_array_or_oom
from freezesweep.trials.config import TrialConfig, TrialResult, result_from_dict
from freezesweep.trials.placement import trials_per_gpu, where
from freezesweep.trials.precision import trial_device
from freezesweep.trials.run import failed_result, run_trial_or_oom

# Where each finished or finally failed cell's outcome goes (the launch's row writer), with the number
# of attempts Ray made.
OutcomeSink = Callable[[list[TrialResult], int], object]  # outcomes that arrived together, the attempt they are

CELL_KEY = "cell"  # a trial's config in Tune: the cell's trial_id only (the cells travel once, by id)
# ... except cells a run adds as it goes (settle mode's next seeds, orchestrator/settle_feed.py): their
# fields travel in the trial's config, by trial_id (the object store's copy was made when the run began)
FIELDS_KEY = "cell_fields"
ARRAY_SEPARATOR = "+"  # a trial array's config: its members' trial_ids joined (hex ids never hold it)
# A report's final rows: one row's dict (a single trial), or a list of them (a trial array's members
# that became final at one step: one report, so the driver pays its per-report work once for them).
RESULT_KEY = "freezesweep_result"
PLACEMENT_KEY = "freezesweep_placement"  # in every report, so a trial whose process dies is placed too
CHECKPOINT_ERROR_KEY = "freezesweep_checkpoint_error"  # Ray's storage refused a checkpoint from this node


def trial_config_from_ray(config: dict, cells: dict[str, dict]) -> TrialConfig:
    """The cell a Tune trial runs: its config names the trial_id, ``cells`` holds each id's fields."""
    [cfg] = trial_configs_from_ray(config, cells)
    return cfg


def trial_configs_from_ray(config: dict, cells: dict[str, dict]) -> list[TrialConfig]:
    """The cells a Tune trial runs: one, or the members of a trial array (trials/array.py), whose ids
    its config joins with ``ARRAY_SEPARATOR``; ``cells`` holds each id's fields, or the config does
    (``FIELDS_KEY``: a cell added to a run as it went)."""
    unknown = sorted(set(config) - {CELL_KEY, FIELDS_KEY})
    if unknown:
        raise ValueError(f"unknown keys in Ray trial config: {', '.join(unknown)}")
    carried = config.get(FIELDS_KEY) or {}
    return [
        TrialConfig.from_dict(carried[trial_id] if trial_id in carried else cells[trial_id])
        for trial_id in config[CELL_KEY].split(ARRAY_SEPARATOR)
    ]


def unit_id(cells: list[TrialConfig]) -> str:
    """What a Tune trial's config names: a cell's trial_id, or an array's member ids joined."""
    return ARRAY_SEPARATOR.join(c.trial_id for c in cells)


def tune_trainable(
    config: dict,
    cells: dict[str, dict],
    shipment: Shipment | Anchored | None = None,
    earlier: dict | None = None,
    width: int | None = None,
) -> None:
    """One Ray trial: one cell, or one trial array. ``cells``: the round's cells by trial id (in the
    object store once, not in each trial's config); ``shipment``: the files the driver shipped (or
    their absolute paths: orchestrator/local_files.py);
    ``earlier``: an earlier launch's last checkpoint of some cells (``tune.Checkpoint`` by trial id);
    ``width``: an array's slots (``resources.array_width``)."""
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    cfgs = trial_configs_from_ray(config, cells)
    local = [shipment.place(cfg, fetch=ray.get) if shipment else cfg for cfg in cfgs]
    placement = {**where(trial_device(cfgs[0])), **ray_placement()}
    placed = json.dumps(placement)
    if len(cfgs) > 1:
        array_trainable(cfgs, local, placement, width)
        return
    cfg = cfgs[0]
    with ray_checkpoints(local[0], placed, (earlier or {}).get(cfg.trial_id)) as (placed_cfg, on_checkpoint):
        # an OOM is a row; other errors go to Ray's retries
        result = run_trial_or_oom(
            placed_cfg, on_eval=functools.partial(report_evaluation, placed=placed), on_checkpoint=on_checkpoint
        )
    report_result(result, cfg, placement)


def array_trainable(
    cfgs: list[TrialConfig], local: list[TrialConfig], placement: dict[str, Any], width: int | None
) -> None:
    """One Ray trial for a trial array: each member's row reported as soon as it is final (a diverged
    member's first; the rows final at one step together, in one report), the first member's
    evaluations as the trial's progress. An array that runs out of memory runs again at half its width
    (trials/array.py ``run_array_or_oom``)."""
    placed, sent = json.dumps(placement), {c.trial_id: c for c in cfgs}
    first = local[0].trial_id

    def on_eval(cfg: TrialConfig, point) -> None:
        if cfg.trial_id == first:  # one report per evaluation of the array: the driver handles each
            report_evaluation(point, placed)

    run_array_or_oom(local, on_eval, lambda results: report_results(results, sent, placement), width=width)


def report_evaluation(point, placed: str) -> None:
    metrics = {f"val_{name}": value for name, value in point.metrics().items()}
    tune.report({**metrics, "val_loss": point.loss, "epoch": point.epoch, "step": point.step, PLACEMENT_KEY: placed})


def report_result(result: TrialResult, cfg: TrialConfig, placement: dict[str, Any]) -> None:
    """The cell's row to the driver (``cfg``: the cell as sent)."""
    report_results([result], {cfg.trial_id: cfg}, placement)


def report_results(results: list[TrialResult], sent: dict[str, TrialConfig], placement: dict[str, Any]) -> None:
    """Rows that became final at one step (a single trial's one, an array's members'), in one report
    (``sent``: the cells as sent)."""
    rows = [as_sent(result, sent[result.trial_id], placement) for result in results]
    tune.report(
        {
            "val_score": max(row.best_val_score or 0.0 for row in rows),
            RESULT_KEY: json.dumps([row.to_dict() for row in rows], default=str),
            PLACEMENT_KEY: json.dumps(placement),
        }
    )


def as_sent(result: TrialResult, cfg: TrialConfig, placement: dict[str, Any]) -> TrialResult:
    """The row names the files as the spec does, not this node's copies of them nor their absolute
    paths (``cfg``: the cell as sent), and no checkpoint folder (gone with the trial); placed where it ran."""
    config = dataclasses.replace(
        result.config,
        data_dir=cfg.data_dir,
        dataset_files=cfg.dataset_files,
        model_dir=cfg.model_dir,
        checkpoint_dir=None,
    )
    return dataclasses.replace(result, config=config, placement={**result.placement, **placement})


def reported_rows(payload: str) -> list[TrialResult]:
    """The rows of a report's ``RESULT_KEY``: one (a single trial) or several (an array's)."""
    loaded = json.loads(payload)
    return [result_from_dict(row) for row in (loaded if isinstance(loaded, list) else [loaded])]


@contextlib.contextmanager
def ray_checkpoints(
    cfg: TrialConfig, placed: str, earlier: tune.Checkpoint | None = None
) -> Iterator[tuple[TrialConfig, Callable | None]]:
    """The trial's config with its checkpoints in a folder on this node, first filled from Ray's
    latest checkpoint of the trial when this is a retry (the earlier attempt may have run on a node
    that is gone), else from ``earlier`` (an earlier launch's), and the hook that hands each
    checkpoint the trial saves to Ray at once."""
    if not cfg.checkpoint_every_epochs:
        yield cfg, None
        return
    # In Ray's temp folder of the node, named by Ray's id of the trial (unique per run, the same for
    # its retries): an attempt whose process died leaves its folder behind, and the next attempt
    # on this node starts by clearing it.
    context = tune.get_context()
    folder = (
        Path(ray.get_runtime_context().get_temp_dir())
        / "freezesweep-checkpoints"
        / f"{context.get_experiment_name()}-{context.get_trial_id()}"
    )
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    try:
        fill_from(folder, tune.get_checkpoint() or earlier, placed)
        yield dataclasses.replace(cfg, checkpoint_dir=str(folder)), RayCheckpoints(str(folder), placed)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def fill_from(folder: Path, latest: tune.Checkpoint | None, placed: str) -> None:
    """The folder filled from the checkpoint; one this node cannot read (a local store on another
    machine, storage down) leaves it empty: the trial starts over, which costs time, never the row."""
    if latest is None:
        return
    try:
        latest.to_directory(str(folder))
    except Exception as exc:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        tune.report(
            {PLACEMENT_KEY: placed, CHECKPOINT_ERROR_KEY: f"reading {latest.path}: {type(exc).__name__}: {exc}"[:500]}
        )


class RayCheckpoints:
    """Hands the folder to Ray after each save (Tune copies it to its storage before returning). When
    Ray's storage cannot be written from this node (a local store on a machine of its own), the trial
    runs on without checkpoints rather than failing: they only save work, the row is the same. The
    driver is told, once (OutcomeCallback). A node that has saved one already met a passing failure
    (storage briefly unreachable): it tries again at the next checkpoint."""

    def __init__(self, folder: str, placed: str):
        self.folder, self.placed, self.saved, self.refused = folder, placed, 0, False

    def __call__(self, path) -> None:
        if self.refused:
            return
        try:
            tune.report({PLACEMENT_KEY: self.placed}, checkpoint=tune.Checkpoint.from_directory(self.folder))
            self.saved += 1
        except Exception as exc:  # raised while copying to storage, before anything was reported
            self.refused = self.saved == 0
            error = f"saving: {type(exc).__name__}: {exc}"[:500]
            tune.report({PLACEMENT_KEY: self.placed, CHECKPOINT_ERROR_KEY: error})


def ray_placement() -> dict[str, Any]:
    """What Ray knows of this trial's place: its node (ids are unique per node even when several
    nodes share a host), the node's IP, and the GPU share the trial was scheduled with (0 on CPU
    trials) with the number of trials that share packs on one GPU."""
    context = ray.get_runtime_context()
    share = float(context.get_assigned_resources().get("GPU", 0.0))
    return {
        "node_id": context.get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "gpus_per_trial": share,
        "trials_per_gpu": trials_per_gpu(share),
    }


class OutcomeCallback(tune.Callback):
    """Driver-side: hand each finished or finally-failed Ray trial's outcome to the sink (the launch
    writes it as the cell's row).
    ``stop_if``: called at every step of Tune's loop; what it raises ends the run (the sweep's lock
    lost to another driver: no trial keeps running for rows that could not be written).
    ``trial_over``: called with the trial id of each trial that is over (its checkpoints deleted)."""

    _stop_if: Callable[[], None] | None = None  # also for instances unpickled from an older tuner.pkl
    _trial_over: Callable[[str], None] | None = None
    _told_checkpoint_error = False

    def __init__(
        self,
        write: OutcomeSink,
        cells: dict[str, dict],
        stop_if: Callable[[], None] | None = None,
        trial_over: Callable[[str], None] | None = None,
    ):
        self._write, self._cells, self._stop_if, self._trial_over = write, cells, stop_if, trial_over

    def __getstate__(self) -> dict:
        # Tune pickles its run config into tuner.pkl; the live sink (store, progress bar) stays out.
        return {"_write": None, "_cells": {}, "_stop_if": None, "_trial_over": None}

    def on_step_begin(self, iteration, trials, **info):
        if self._stop_if is not None:
            self._stop_if()  # raised out of Tuner.fit: Tune stops its trials (TuneController.step)

    def _sink(self, outcomes: list[TrialResult], attempts: int) -> None:
        if self._write is not None and outcomes:
            self._write(outcomes, attempts)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if RESULT_KEY in result:  # an array's members over at one step: together, as one file of rows
            self._sink(reported_rows(result[RESULT_KEY]), trial.num_failures + 1)
        if CHECKPOINT_ERROR_KEY in result and not self._told_checkpoint_error:
            self._told_checkpoint_error = True
            where = json.loads(result.get(PLACEMENT_KEY, "{}")).get("node_ip", "a node")
            print(
                f"warning: trials on {where} cannot use checkpoints in Ray's storage "
                f"({result[CHECKPOINT_ERROR_KEY]}); they run on, resuming only from checkpoints that were saved",
                file=sys.stderr,
            )

    def _over(self, trial) -> None:
        if self._trial_over is not None:
            self._trial_over(trial.config[CELL_KEY])

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._over(trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        error, trace = _trial_error(trial)
        placement = last_placement(trial.last_result or {})
        cfgs = trial_configs_from_ray(trial.config, self._cells)  # an array's final rows stay (RowWriter)
        if len(cfgs) > 1:  # what one member raised ended them all: said as the array's (each runs again alone)
            wrapped = RuntimeError(f"its trial array of {len(cfgs)} cells failed: {type(error).__name__}: {error}")
            wrapped.__cause__, error = error, wrapped  # an out-of-memory error stays one (failed_result's is_oom)
        self._sink([failed_result(cfg, error, trace=trace, placement=placement) for cfg in cfgs], trial.num_failures)
        self._over(trial)  # Ray's retries are spent: a later launch starts the cell afresh


def last_placement(last: dict) -> dict[str, Any]:
    """Where a failed trial last reported from: our placement, else the host and IP Ray adds to every
    result; nothing when it died before its first report."""
    if PLACEMENT_KEY in last:
        return json.loads(last[PLACEMENT_KEY])
    return {key: last[key] for key in ("hostname", "node_ip") if last.get(key)}


def _trial_error(trial) -> tuple[BaseException, str | None]:
    """The trial's own exception (unwrapped from Ray's) and Ray's text traceback of it. Read from
    the trial's local files, which Ray writes before calling back (its storage copy syncs later)."""
    error: object = None
    text: str | None = None
    try:
        if trial.pickled_error_file and os.path.exists(trial.pickled_error_file):
            with open(trial.pickled_error_file, "rb") as f:
                error = cloudpickle.load(f)
        if trial.error_file and os.path.exists(trial.error_file):
            with open(trial.error_file) as f:
                text = f.read()
    except Exception as exc:  # the error files themselves unreadable: still a failed row
        return exc, text
    cause = getattr(error, "cause", None)  # RayTaskError wraps the trial's own exception
    if isinstance(cause, BaseException):
        error = cause
    if not isinstance(error, BaseException):
        error = RuntimeError(text.strip().splitlines()[-1] if text else "trial failed (no error recorded by Ray)")
    return error, text


# --- driver side: one Tune experiment over a list of cells -----------------------------------------
class Feed(Protocol):
    """Where a run's further cells come from once its first ones are handed out (settle mode's next
    seeds: orchestrator/settle_feed.py)."""

    def more(self) -> list[list[TrialConfig]] | None:
        """Further units (one Ray trial each); None: none yet, outcomes still to come; []: none, ever."""

    def over(self, unit: list[TrialConfig]) -> None:
        """A unit's Ray trial is over (its outcomes, if any, were handed to the run's sink before)."""


class CellSearcher(Searcher):
    """Hands Tune the cells one at a time (a trial array's members as one trial) through Tune's
    extension point for where trials come from (``ray.tune.search.Searcher``), so the driver's work
    per trial does not grow with the number of cells: one ``grid_search`` over the cells made Tune
    deep-copy the whole list for every trial it generated (ray/tune/search/variant_generator.py,
    ``_grid_search_generator``). ``feed``: the run's further cells once these are handed out (their
    fields travel in the trial's config, ``FIELDS_KEY``); without one the run ends with ``units``."""

    def __init__(self, units: list[list[TrialConfig]], feed: Feed | None = None):
        super().__init__()
        self._ids, self._next = [unit_id(unit) for unit in units], 0
        self._feed, self._shipped = feed, len(units)  # the units whose cells are in the object store
        self._by_id = {unit_id(unit): unit for unit in units} if feed is not None else {}
        self._units: dict[str, list[TrialConfig]] = {}  # with a feed: Tune's trial id -> the unit it runs
        self.added: set[str] = set()  # the cells the feed added

    def suggest(self, trial_id: str) -> dict | str | None:
        if self._next >= len(self._ids):
            further = self._feed.more() if self._feed is not None else []
            if not further:
                return None if further is None else Searcher.FINISHED
            self._ids += [unit_id(unit) for unit in further]
            self._by_id.update({unit_id(unit): unit for unit in further})
            self.added.update(c.trial_id for unit in further for c in unit)
        self._next += 1
        config: dict[str, Any] = {CELL_KEY: self._ids[self._next - 1]}
        if self._feed is not None:
            unit = self._units[trial_id] = self._by_id.pop(config[CELL_KEY])
            if self._next > self._shipped:  # added as the run went
                config[FIELDS_KEY] = {c.trial_id: c.to_dict() for c in unit}
        return config

    def __getstate__(self) -> dict:
        # Tune pickles its search algorithm into tuner.pkl: the live feed (the launch's rows) stays out.
        return {**self.__dict__, "_feed": None, "_by_id": {}, "_units": {}, "added": set()}

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """Outcomes reach the store through OutcomeCallback; the feed, if any, is told the trial is over."""
        unit = self._units.pop(trial_id, None)
        if unit is not None and self._feed is not None:
            self._feed.over(unit)

    def save(self, checkpoint_path: str) -> None:
        """Tune's snapshots keep the position only: the store, not Ray's state, says what is left."""
        with open(checkpoint_path, "wb") as f:
            pickle.dump({"next": self._next}, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self._next = pickle.load(f)["next"]


MAX_PENDING_TRIALS = 200  # a user's TUNE_MAX_PENDING_TRIALS_PG (e.g. 1.1 × CPUs of a larger cluster) wins


def run_tune(
    sweep: ResolvedSweep,
    cells: list[TrialConfig],
    storage: RayStorage,
    on_outcome: OutcomeSink,
    experiment: str,
    stop_if: Callable[[], None] | None = None,
    trainable: Callable = None,
    units: list[list[TrialConfig]] | None = None,
    feed: Feed | None = None,
) -> None:
    """Run ``cells`` as the Tune experiment ``experiment`` in ``storage`` (Ray connected), each outcome
    to ``on_outcome``. ``stop_if`` is called at every step of Tune's loop: what it raises ends the run.
    ``trainable``: what a trial runs (``tune_trainable``; benchmarks/scale.py measures Tune alone with
    an instant one). ``units``: ``cells`` grouped as ``group_cells`` groups them, when the caller has.
    ``feed``: further units the run takes as it goes (``CellSearcher``)."""
    _quiet_tune_defaults()
    resources = sweep.spec.resources
    checkpoints = bool(sweep.spec.training.checkpoint_every_epochs)
    # An earlier launch's driver died while some of these cells ran: each starts from its last checkpoint.
    earlier = checkpoints_to_resume(storage, experiment, {c.trial_id for c in cells}) if checkpoints else {}
    outcomes: set[str] = set()
    by_id = {c.trial_id: c.to_dict() for c in cells}
    units = units or group_cells(cells, sweep.array_width)  # one Tune trial per array (alone: one per cell)

    def sink(results: list[TrialResult], attempts: int) -> None:
        on_outcome(results, attempts)
        outcomes.update(result.trial_id for result in results)

    searcher = CellSearcher(units, feed)
    tuner = tune.Tuner(
        _with_cells(trainable or tune_trainable, sweep, by_id, earlier),
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            num_samples=len(units) if feed is None else -1,  # -1: until the feed has no more
            max_concurrent_trials=resources.max_concurrent_trials,
            reuse_actors=True,  # one worker process runs many trials: imports, tokenizer and token cache stay warm
            trial_dirname_creator=trial_dirname,
        ),
        run_config=_run_config(
            experiment,
            storage,
            resources.max_failures,
            OutcomeCallback(
                sink,
                by_id,
                stop_if,
                trial_over=functools.partial(drop_checkpoints, storage, experiment) if checkpoints else None,
            ),
        ),
    )
    fit_keeping_outcomes(tuner, storage, lambda: {c.trial_id for c in cells} | searcher.added <= outcomes)


def fit_keeping_outcomes(tuner: tune.Tuner, storage: RayStorage, all_out: Callable[[], bool]) -> None:
    """``tuner.fit()``. Once the trials are over Ray reads its experiment state back (a result grid the
    launch does not use): a remote store gone by then fails that read, though every outcome has reached
    the spool already (``all_out()``), so that failure is a warning. The launch's flush then says what is
    kept where, as it does for rows. Any other OSError (storage unreachable from the start, a spool
    write failing) propagates."""
    try:
        tuner.fit()
    except OSError as exc:
        if not (storage.shared and all_out()):
            raise
        print(
            f"warning: Ray could not read its state back from {storage.path} after the last trial ({exc}); "
            "every trial's outcome is kept",
            file=sys.stderr,
        )


def _with_cells(trainable: Callable, sweep: ResolvedSweep, by_id: dict[str, dict], earlier: dict) -> Callable:
    """``trainable`` with what every trial may need (the cells, the shipped files, earlier checkpoints)
    in the object store once, not in each trial's config (``tune.with_parameters``), and the trial's
    CPU and GPU share."""
    return tune.with_resources(
        tune.with_parameters(trainable, cells=by_id, shipment=sweep.shipment, earlier=earlier, width=sweep.array_width),
        {"cpu": sweep.spec.resources.cpus_per_trial, "gpu": sweep.gpu_share},
    )


def _run_config(experiment: str, storage: RayStorage, max_failures: int, outcomes: OutcomeCallback) -> tune.RunConfig:
    """Where the experiment's state goes, Ray's retries, and ``outcomes`` told of every trial's end."""
    return tune.RunConfig(
        name=experiment,
        storage_path=storage.path,
        storage_filesystem=storage.filesystem,
        # A trial whose process or node dies is run again, from its last checkpoint when it has one
        # (ray_checkpoints above); only the latest is kept, and none once the trial is over.
        failure_config=tune.FailureConfig(max_failures=max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
        callbacks=[outcomes],
        verbose=0,
    )


def _quiet_tune_defaults() -> None:
    """Tune's output and waiting as a sweep of many short trials needs them; each stays the user's to set."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0: no Tune tables; our bar reports
    # Tune's own per-trial CSV, JSON and TensorBoard files: nothing here reads them (rows are the store's).
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # Tune's traceback of every failed attempt (ray/tune/execution/tune_controller.py, _trial_task_failure):
    # 36 failed attempts printed 2,324 lines. A failed cell's line says why and its row keeps the traceback;
    # TUNE_PRINT_ALL_TRIAL_ERRORS=1 brings Tune's back.
    os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")
    # Trials Tune keeps waiting for a place at once. Its "auto" gives a custom Searcher one, so each
    # trial waited for the one before it to start: a cluster filled one worker start-up at a time and
    # short trials all ran on the first node (ray/tune/execution/tune_controller.py,
    # _get_max_pending_trials). Grid search's own default instead: max(200, 1.1 × the cluster's CPUs).
    os.environ.setdefault("TUNE_MAX_PENDING_TRIALS_PG", str(MAX_PENDING_TRIALS))


def trial_dirname(trial) -> str:
    """A cell's trial folder is its id (its checkpoints live there); an array's, its first member's
    id and its width (arrays keep no checkpoints)."""
    ids = trial.config[CELL_KEY].split(ARRAY_SEPARATOR)
    return ids[0] if len(ids) == 1 else f"{ids[0]}-array{len(ids)}"


def checkpoints_to_resume(storage: RayStorage, experiment: str, trial_ids: set[str]) -> dict[str, tune.Checkpoint]:
    """The latest checkpoint an earlier launch's Ray kept of each of these cells, by trial id."""
    return {
        trial: tune.Checkpoint(folder, filesystem=storage.fs)
        for trial, folder in latest_checkpoints(storage, experiment, trial_ids).items()
    }


def recover_from_ray(storage: RayStorage, experiment: str, done: set[str]) -> list[TrialResult]:
    """The ok outcomes the experiment's state (an earlier launch's Tune) holds of cells not in ``done``
    (the store's final rows): the driver died between Ray's record and the store's row. Ray's state is
    an optimisation only: any problem reading it (absent, corrupt, another Ray version) just means
    those cells run again."""
    path = f"{storage.path}/{experiment}"
    found: list[TrialResult] = []
    try:
        if not tune.Tuner.can_restore(path, storage_filesystem=storage.filesystem):
            return found
        restored = tune.Tuner.restore(path, trainable=tune_trainable, storage_filesystem=storage.filesystem)
        for trial in restored.get_results():
            payload = (trial.metrics or {}).get(RESULT_KEY)
            for result in reported_rows(payload) if payload else []:
                if result.status == "ok" and result.trial_id not in done:
                    # State written before rows were placed has no placement in the result: Ray's host and IP.
                    placement = {**last_placement(trial.metrics), **result.placement}
                    found.append(dataclasses.replace(result, placement=placement))
    except Exception:
        return found
    return found
