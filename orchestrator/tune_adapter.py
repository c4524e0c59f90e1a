"""The one place where Ray Tune meets a trial.

Worker side: ``tune_trainable`` turns Ray's dict into a TrialConfig (unknown keys rejected), runs
the plain-PyTorch trial, reports each evaluation to Tune and finally the whole result as JSON.
Driver side: ``StoreWriter`` writes each finished cell's row, so workers never touch the store.
A crash propagates so Ray's FailureConfig retries it; an out-of-memory error does not (it would
fail again the same way) and becomes an ``oom`` row at once.
"""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Callable

from ray import tune

from trials.config import TrialConfig, TrialResult, result_from_dict

CELL_KEY = "cell"
RESULT_KEY = "freezesweep_result"


def trial_config_from_ray(config: dict) -> TrialConfig:
    unknown = sorted(set(config) - {CELL_KEY})
    if unknown:
        raise ValueError(f"unknown keys in Ray trial config: {', '.join(unknown)}")
    return TrialConfig.from_dict(config[CELL_KEY])


def tune_trainable(config: dict) -> None:
    import torch
    import transformers

    from trials.run import clear_caches, failed_result, run_trial

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    cfg = trial_config_from_ray(config)

    def on_eval(point) -> None:
        metrics = {f"val_{name}": value for name, value in point.metrics().items()}
        tune.report({**metrics, "val_loss": point.loss, "epoch": point.epoch, "step": point.step})

    try:
        result = run_trial(cfg, on_eval=on_eval)
    except torch.cuda.OutOfMemoryError as exc:
        result = failed_result(cfg, exc)
        clear_caches()  # cached states and models may sit on the GPU beside the trials packed there
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # give the memory back before this worker takes the next trial
    tune.report({"val_score": result.best_val_score or 0.0, RESULT_KEY: json.dumps(result.to_dict(), default=str)})


class StoreWriter(tune.Callback):
    """Driver-side: turn each finished or finally-failed Ray trial into one stored row.
    ``stop_if``: called at every step of Tune's loop; what it raises ends the run (the sweep's lock
    lost to another driver: no trial keeps running for rows that could not be written)."""

    _stop_if: Callable[[], None] | None = None  # also for instances unpickled from an older tuner.pkl

    def __init__(self, write: Callable[[TrialResult, str | None, int], None],
                 stop_if: Callable[[], None] | None = None):
        self._write, self._stop_if = write, stop_if

    def __getstate__(self) -> dict:
        # Tune pickles its run config into tuner.pkl; the live sink (store, progress bar) stays out.
        return {"_write": None, "_stop_if": None}

    def on_step_begin(self, iteration, trials, **info):
        if self._stop_if is not None:
            self._stop_if()  # raised out of Tuner.fit: Tune stops its trials (TuneController.step)

    def _sink(self, outcome: TrialResult, node: str | None, attempts: int) -> None:
        if self._write is not None:
            self._write(outcome, node, attempts)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if RESULT_KEY in result:
            outcome = result_from_dict(json.loads(result[RESULT_KEY]))
            self._sink(outcome, result.get("hostname"), trial.num_failures + 1)

    def on_trial_error(self, iteration, trials, trial, **info):
        from trials.run import failed_result

        cfg = trial_config_from_ray(trial.config)
        error, trace = _trial_error(trial)
        self._sink(failed_result(cfg, error, trace=trace), (trial.last_result or {}).get("hostname"),
                   trial.num_failures)


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
