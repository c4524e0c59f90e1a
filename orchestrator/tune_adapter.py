"""The one place where Ray Tune meets a trial.

Worker side: ``tune_trainable`` turns Ray's dict into a TrialConfig (unknown keys rejected), points
it at this node's copies of the files the driver shipped (orchestrator/local_files.py), runs the
plain-PyTorch trial, reports each evaluation to Tune and finally the whole result as JSON.
Driver side: ``StoreWriter`` writes each finished cell's row, so workers never touch the store.
A crash propagates so Ray's FailureConfig retries it; an out-of-memory error does not (it would
fail again the same way at the same density) and becomes an ``oom`` row at once, after the worker
has given the memory back; the launch retries such cells once with a larger GPU share.

Every row says where it ran: Ray's node id and IP and the trial's GPU share (gathered here, the one
place that meets Ray) beside the host and CUDA device the trial saw (trials/placement.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

from ray import tune

from orchestrator.local_files import Shipment
from trials.config import TrialConfig, TrialResult, result_from_dict

CELL_KEY = "cell"
RESULT_KEY = "freezesweep_result"
PLACEMENT_KEY = "freezesweep_placement"  # in every report, so a trial whose process dies is placed too


def trial_config_from_ray(config: dict) -> TrialConfig:
    unknown = sorted(set(config) - {CELL_KEY})
    if unknown:
        raise ValueError(f"unknown keys in Ray trial config: {', '.join(unknown)}")
    return TrialConfig.from_dict(config[CELL_KEY])


def tune_trainable(config: dict, shipment: Shipment | None = None) -> None:
    import transformers

    from trials import faults
    from trials.placement import where
    from trials.precision import resolve_device
    from trials.run import run_trial_or_oom

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    cfg = trial_config_from_ray(config)
    local = shipment.place(cfg) if shipment else cfg
    placement = {**where(resolve_device(cfg.device)), **ray_placement()}
    faults.set_gpu_share(placement["gpus_per_trial"])
    placed = json.dumps(placement)

    def on_eval(point) -> None:
        metrics = {f"val_{name}": value for name, value in point.metrics().items()}
        tune.report({**metrics, "val_loss": point.loss, "epoch": point.epoch, "step": point.step,
                     PLACEMENT_KEY: placed})

    result = run_trial_or_oom(local, on_eval=on_eval)  # an OOM is a row; other errors go to Ray's retries
    # The row names the files as the spec does, not this node's temporary copies of them.
    sent = dataclasses.replace(result.config, dataset_files=cfg.dataset_files, model_dir=cfg.model_dir)
    result = dataclasses.replace(result, config=sent, placement={**result.placement, **placement})
    tune.report({"val_score": result.best_val_score or 0.0, RESULT_KEY: json.dumps(result.to_dict(), default=str),
                 PLACEMENT_KEY: placed})


def ray_placement() -> dict[str, Any]:
    """What Ray knows of this trial's place: its node (ids are unique per node even when several
    nodes share a host), the node's IP, and the GPU share the trial was scheduled with (0 on CPU
    trials) with the number of trials that share packs on one GPU."""
    import ray

    from trials.placement import trials_per_gpu

    context = ray.get_runtime_context()
    share = float(context.get_assigned_resources().get("GPU", 0.0))
    return {"node_id": context.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
            "gpus_per_trial": share, "trials_per_gpu": trials_per_gpu(share)}


class StoreWriter(tune.Callback):
    """Driver-side: turn each finished or finally-failed Ray trial into one stored row.
    ``stop_if``: called at every step of Tune's loop; what it raises ends the run (the sweep's lock
    lost to another driver: no trial keeps running for rows that could not be written)."""

    _stop_if: Callable[[], None] | None = None  # also for instances unpickled from an older tuner.pkl

    def __init__(self, write: Callable[[TrialResult, int], None], stop_if: Callable[[], None] | None = None):
        self._write, self._stop_if = write, stop_if

    def __getstate__(self) -> dict:
        # Tune pickles its run config into tuner.pkl; the live sink (store, progress bar) stays out.
        return {"_write": None, "_stop_if": None}

    def on_step_begin(self, iteration, trials, **info):
        if self._stop_if is not None:
            self._stop_if()  # raised out of Tuner.fit: Tune stops its trials (TuneController.step)

    def _sink(self, outcome: TrialResult, attempts: int) -> None:
        if self._write is not None:
            self._write(outcome, attempts)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if RESULT_KEY in result:
            outcome = result_from_dict(json.loads(result[RESULT_KEY]))
            self._sink(outcome, trial.num_failures + 1)

    def on_trial_error(self, iteration, trials, trial, **info):
        from trials.run import failed_result

        cfg = trial_config_from_ray(trial.config)
        error, trace = _trial_error(trial)
        placement = last_placement(trial.last_result or {})
        self._sink(failed_result(cfg, error, trace=trace, placement=placement), trial.num_failures)


def last_placement(last: dict) -> dict[str, Any]:
    """Where a failed trial last reported from: our placement, else the host and IP Ray adds to every
    result; nothing when it died before its first report."""
    if PLACEMENT_KEY in last:
        return json.loads(last[PLACEMENT_KEY])
    return {key: last[key] for key in ("hostname", "node_ip") if last.get(key)}


def _trial_error(trial) -> tuple[BaseException, str | None]:
    """The trial's own exception (unwrapped from Ray's) and Ray's text traceback of it. Read from
    the trial's local files, which Ray writes before calling back (its storage copy syncs later)."""
    from ray import cloudpickle

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
