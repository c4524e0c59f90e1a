"""A sweep's rows as MLflow runs: ``freezesweep export mlflow`` (every stored row) and a launch's live
tracking (``tracking: {mlflow: URI}`` in the spec: each row as it lands).

One run per cell, keyed by the tag ``freezesweep.trial_id`` and looked up with MLflow's own search:
an export run twice adds nothing, new rows are added, and a row that replaced an earlier one of its
cell (a failed cell's retry) replaces that cell's run. A run holds the row's axes and protocol as
params, its best and final metrics, its evaluation curve and training loss as stepped metrics, and
its status, node and precision as tags. MLflow is an optional extra: ``pip install 'freezesweep[mlflow]'``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from freezesweep.results.store import METRICS, ResultStore

TRIAL_TAG, SWEEP_TAG, FINISHED_TAG = "freezesweep.trial_id", "freezesweep.sweep", "freezesweep.finished_at"
AXES = ("dataset", "model", "method", "train_size", "frozen_layers", "lora_rank", "seed", "split_seed")
METHOD_PARAMS = ("lora_alpha", "lora_dropout", "probe_pooling", "probe_c")
# One value per run: the best evaluation (selected metric, then every recorded one), the end, the baselines, cost.
SCALARS = (
    "best_val_score",
    "final_val_score",
    "baseline_score",
    "best_val_accuracy",
    "final_val_accuracy",
    "majority_baseline",
    *(f"best_val_{m}" for m in METRICS[1:]),
    *(f"baseline_{m}" for m in METRICS),
    "best_step",
    "best_epoch",
    "trainable_params",
    "total_params",
    "train_time_s",
    "eval_time_s",
    "wall_time_s",
    "train_examples_per_s",
    "peak_mem_mb",
    "worker_peak_mem_mb",
)
TAGS = ("status", "node", "precision", "device", "hostname", "node_id", "gpu_name", "select_metric", "error")
# What an export reads: not the train indices, which dominate a row's size.
COLUMNS = [
    "sweep",
    "trial_id",
    *AXES,
    *METHOD_PARAMS,
    *SCALARS,
    *TAGS,
    "eval_curve",
    "train_loss_curve",
    "finished_at",
    "config",
    "attempts",
]
# MLflow's limits per request (mlflow.utils.validation): 100 params and tags, 1,000 metrics; a tag value's length.
PARAMS_PER_REQUEST, METRICS_PER_REQUEST, MAX_TAG_CHARS, MAX_PARAM_CHARS = 100, 1000, 5000, 6000


# The probe of a tracking server before any row: connecting and answering, in seconds (MLflow's own client
# retries an unreachable server 7 times with backoff, about 4 minutes, before it gives up: issue 36).
PROBE_CONNECT_S, PROBE_READ_S = 5, 10
# A live launch's calls (the driver waits on each): a server that dies mid-sweep is given up in seconds,
# not minutes; a user's own MLFLOW_* settings win. MLflow prints two "View run" lines per run it ends on
# a server; the export says where the runs went once instead.
LIVE_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
QUIET_ENV = {"MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}


class TrackingError(RuntimeError):
    """The tracking URI cannot take runs: said in one sentence, with what to use instead."""


@dataclass(frozen=True)
class Exported:
    added: int  # runs created for rows MLflow did not have
    replaced: int  # runs of cells whose row changed since (a failed cell's retry)
    unchanged: int  # rows already there as they are
    experiment_id: str
    tracking_uri: str = ""  # where they went (the default resolved: MLflow's sqlite:///mlflow.db)


def resolve_tracking_uri(uri: str | None) -> str:
    """``uri``, or MLflow's own default: ``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db`` in the
    current folder (MLflow 3; MLflow 2's was the folder ./mlruns)."""
    import mlflow  # the optional extra: imported only when asked for

    return uri or mlflow.get_tracking_uri()


def folder_store_problem(uri: str) -> str | None:
    """MLflow 3 refuses a folder as its tracking store (its file store is in maintenance mode) unless
    MLFLOW_ALLOW_FILE_STORE is set: the sentence saying what to use instead, or None."""
    scheme = urlsplit(uri).scheme
    if scheme not in ("", "file") or uri in ("databricks", "databricks-uc", "uc"):
        return None
    if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() in ("true", "1"):
        return None
    folder = uri.removeprefix("file://")
    # (a folder that holds no runs yet has none to move: a walk-through was told to migrate an empty path)
    migrate = f"; `mlflow migrate-filestore` moves {folder}'s runs into one" if os.path.isdir(folder) else ""
    return (
        f"{uri} is a folder, and MLflow 3 no longer tracks into one: use a SQLite file "
        f"(sqlite:///mlflow.db, MLflow's default when no URI is given{migrate}) or a tracking server "
        "(http://host:5000); MLFLOW_ALLOW_FILE_STORE=true keeps the folder store, in maintenance mode"
    )


def check_tracker(uri: str) -> None:
    """TrackingError unless ``uri`` can take runs: a folder store said with what to use; a server asked
    once, in seconds, before any row (any HTTP answer, even an error status, means it is there)."""
    problem = folder_store_problem(uri)
    if problem:
        raise TrackingError(problem)
    if urlsplit(uri).scheme not in ("http", "https"):
        return  # a database or a managed service: MLflow's client opens it and says its own errors
    import requests  # MLflow's own HTTP client library

    try:
        requests.get(f"{uri.rstrip('/')}/health", timeout=(PROBE_CONNECT_S, PROBE_READ_S), allow_redirects=False)
    except requests.RequestException as exc:
        raise TrackingError(f"no MLflow tracking server answers at {uri} ({_reason(exc)})") from None


def _reason(exc: BaseException) -> str:
    """The innermost cause of a requests error (DNS, refused, timed out), without urllib3's wrapping."""
    while exc.__context__ is not None or exc.__cause__ is not None:
        exc = exc.__cause__ or exc.__context__
    return f"{type(exc).__name__}: {exc}"


@contextlib.contextmanager
def mlflow_env(defaults: dict[str, str]) -> Iterator[None]:
    """MLflow's settings (read at each request) set to ``defaults`` where the user set none, then restored."""
    added = {k: v for k, v in defaults.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


class MlflowRuns:
    """The runs of one sweep in one MLflow experiment (created when missing), by trial_id."""

    def __init__(self, tracking_uri: str | None, experiment: str, sweep: str):
        import logging

        from mlflow.tracking import MlflowClient  # the optional extra: imported only when asked for

        # a new SQLite store's set-up ("Creating initial MLflow database tables...", alembic's migrations)
        # logs at INFO into the sweep's own lines; its warnings and errors still show
        for name in ("mlflow.store.db.utils", "alembic"):
            logging.getLogger(name).setLevel(logging.WARNING)
        self.client, self.sweep = MlflowClient(tracking_uri=tracking_uri), sweep
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)

    def existing(self, trial_id: str | None = None) -> dict[str, Any]:
        """trial_id → the run already logged for it (MLflow's search, page by page); ``trial_id``: that
        cell's only."""
        query = f"tags.`{SWEEP_TAG}` = '{self.sweep}'" + (f" and tags.`{TRIAL_TAG}` = '{trial_id}'" if trial_id else "")
        runs: dict[str, Any] = {}
        token = None
        while True:
            page = self.client.search_runs([self.experiment_id], query, max_results=1000, page_token=token)
            runs.update((run.data.tags[TRIAL_TAG], run) for run in page if TRIAL_TAG in run.data.tags)
            token = page.token
            if not token:
                return runs

    def log(self, row: dict[str, Any]) -> str:
        """One row as a new finished (or failed) run; returns its id."""
        from mlflow.entities import Metric, Param

        started_ms = _ms(row.get("finished_at"))
        run = self.client.create_run(
            self.experiment_id, start_time=started_ms, run_name=run_name(row), tags=run_tags(row)
        )
        run_id = run.info.run_id
        params = [Param(k, v) for k, v in run_params(row).items()]
        metrics = [Metric(k, v, started_ms or 0, step) for k, v, step in run_metrics(row)]
        for chunk in _chunks(params, PARAMS_PER_REQUEST):
            self.client.log_batch(run_id, params=chunk)
        for chunk in _chunks(metrics, METRICS_PER_REQUEST):
            self.client.log_batch(run_id, metrics=chunk)
        self.client.set_terminated(
            run_id, "FINISHED" if row.get("status") in ("ok", "diverged") else "FAILED", end_time=started_ms
        )
        return run_id

    def sync(self, rows: Iterable[dict[str, Any]], known: dict[str, Any] | None = None) -> Exported:
        """Every row MLflow lacks as a run; a cell whose row is not the one its run holds gets a new run.
        ``known``: the runs already there (default: the sweep's, searched)."""
        known, counts = self.existing() if known is None else known, {"added": 0, "replaced": 0, "unchanged": 0}
        for row in rows:
            run = known.get(row["trial_id"])
            if run is not None and run.data.tags.get(FINISHED_TAG) == _stamp(row.get("finished_at")):
                counts["unchanged"] += 1
                continue
            if run is not None:
                self.client.delete_run(run.info.run_id)
            self.log(row)
            counts["replaced" if run is not None else "added"] += 1
        return Exported(counts["added"], counts["replaced"], counts["unchanged"], self.experiment_id)


def export_store(store: ResultStore, uri: str | None = None, experiment: str | None = None) -> Exported:
    """Every row of ``store``'s sweep as an MLflow run in ``experiment`` (default: the sweep's name), at
    ``uri`` (default: MLflow's own); TrackingError, before any row, where it cannot take runs."""
    uri = resolve_tracking_uri(uri)
    check_tracker(uri)
    with mlflow_env(QUIET_ENV):
        runs = MlflowRuns(uri, experiment or store.sweep, store.sweep)
        return dataclasses.replace(runs.sync(_rows(store)), tracking_uri=uri)


def _rows(store: ResultStore) -> Iterator[dict[str, Any]]:
    yield from store.read_table(columns=COLUMNS).to_pylist()


class LiveTracker:
    """A launch's rows to MLflow as they land. Tracking never fails the sweep: the tracker is asked
    once before the first row (``check_tracker``, seconds), and the first error, then or later, is said
    once on stderr and tracking stops (``export mlflow`` adds the rows later)."""

    def __init__(self, tracking_uri: str, experiment: str, sweep: str):
        self.tracking_uri, self.experiment, self.sweep = tracking_uri, experiment, sweep
        self.runs: MlflowRuns | None = None
        self.failed = False
        try:
            check_tracker(tracking_uri)
        except TrackingError as exc:
            self._stop(f"before the first row: {exc}")

    def __call__(self, row: dict[str, Any]) -> None:
        if self.failed:
            return
        try:
            with mlflow_env({**LIVE_ENV, **QUIET_ENV}):
                self.runs = self.runs or MlflowRuns(self.tracking_uri, self.experiment, self.sweep)
                self.runs.sync([row], self.runs.existing(row["trial_id"]))
        except Exception as exc:  # any failure of the tracker (unreachable, refused, a bug): warn once, go on
            self._stop(f"({type(exc).__name__}: {exc})")

    def _stop(self, why: str) -> None:
        self.failed = True
        print(
            f"warning: MLflow tracking at {self.tracking_uri} stopped {why}; the sweep goes on; "
            f"`freezesweep export mlflow {self.sweep}` adds its rows later",
            file=sys.stderr,
        )


def run_name(row: dict[str, Any]) -> str:
    axis = (
        f"k={row.get('frozen_layers')}"
        if row.get("method") in (None, "freeze")
        else (f"lora r={row.get('lora_rank')}" if row.get("method") == "lora" else str(row.get("method")))
    )
    return f"{row.get('dataset')} n={row.get('train_size')} {axis} s={row.get('seed')}"


def run_params(row: dict[str, Any]) -> dict[str, str]:
    """The cell's axes and method parameters, then the full protocol it ran with (its resolved config)."""
    config = json.loads(row["config"]) if row.get("config") else {}
    protocol = {k: v for k, v in config.items() if k not in AXES and not isinstance(v, (dict, list))}
    ran = {k: row.get(k) for k in (*AXES, *METHOD_PARAMS)}
    # what the row says it ran wins over the config it was asked with (probe_pooling "auto" ran as "mean")
    values = {**ran, **{k: v for k, v in protocol.items() if ran.get(k) is None}}
    return {k: str(v)[:MAX_PARAM_CHARS] for k, v in values.items() if v is not None}


def run_metrics(row: dict[str, Any]) -> list[tuple[str, float, int]]:
    """(key, value, step): the row's scalars at step 0, then each evaluation (``eval_<metric>``) and
    each logged training loss (``train_loss``) at its training step."""
    metrics = [(k, float(row[k]), 0) for k in SCALARS if row.get(k) is not None]
    for point in row.get("eval_curve") or []:
        metrics += [
            (f"eval_{k}", float(v), int(point["step"]))
            for k, v in point.items()
            if k not in ("step", "epoch") and v is not None
        ]
    metrics += [
        ("train_loss", float(p["loss"]), int(p["step"]))
        for p in row.get("train_loss_curve") or []
        if p.get("loss") is not None
    ]
    return metrics


def run_tags(row: dict[str, Any]) -> dict[str, str]:
    tags = {k: str(row[k])[:MAX_TAG_CHARS] for k in TAGS if row.get(k) is not None}
    return {**tags, TRIAL_TAG: row["trial_id"], SWEEP_TAG: row["sweep"], FINISHED_TAG: _stamp(row.get("finished_at"))}


def _stamp(finished_at: datetime | None) -> str:
    return finished_at.isoformat() if finished_at is not None else ""


def _ms(finished_at: datetime | None) -> int | None:
    return int(finished_at.timestamp() * 1000) if finished_at is not None else None


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
