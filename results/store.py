"""The Parquet results store: ``<store>/<sweep>/{spec.yaml, results/<trial_id>.parquet}``.

- One file per cell, named by its trial_id: a cell can never have two rows, and an ``ok`` row is
  never overwritten (a failed row is replaced by the retry's outcome).
- Atomic: a row is written under ``_staging/`` and then moved into ``results/`` (a rename on a
  local disk; on object stores each object appears whole), so readers never see a partial file.
- One fixed schema, so pandas, DuckDB (``read_parquet('…/results/*.parquet')``), Polars and
  pyarrow read the folder as it is, with no freezesweep code.
- Any filesystem pyarrow knows (local, ``s3://…``, …) or, failing that, fsspec.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

RESULTS_DIR, STAGING_DIR, SPEC_FILE = "results", "_staging", "spec.yaml"

# Every metric a row can hold (trials.metrics.METRICS; a test checks the two agree): a task records its own.
METRICS = ("accuracy", "f1", "matthews", "pearson", "spearman")
_CURVE = pa.list_(pa.struct([("step", pa.int64()), ("epoch", pa.float64()), ("accuracy", pa.float64()),
                             ("loss", pa.float64()), *((m, pa.float64()) for m in METRICS[1:])]))
PLACEMENT_TYPES = {"node_id": pa.string(), "node_ip": pa.string(), "hostname": pa.string(), "gpu_index": pa.int64(),
                   "gpu_name": pa.string(), "gpu_uuid": pa.string(), "gpus_per_trial": pa.float64(),
                   "trials_per_gpu": pa.int64()}
PLACEMENT_COLUMNS = tuple(PLACEMENT_TYPES)
SCHEMA = pa.schema([
    ("sweep", pa.string()), ("trial_id", pa.string()),
    ("dataset", pa.string()), ("model", pa.string()), ("train_size", pa.int64()), ("frozen_layers", pa.int64()),
    ("seed", pa.int64()), ("split_seed", pa.int64()), ("method", pa.string()),
    # A method's own parameters (null on other methods' rows): LoRA's rank (an axis), scale, dropout and
    # the module names adapted in each layer; the probe's pooling and the C cross-validation chose.
    ("lora_rank", pa.int64()), ("lora_alpha", pa.float64()), ("lora_dropout", pa.float64()),
    ("lora_targets", pa.list_(pa.string())), ("probe_pooling", pa.string()), ("probe_c", pa.float64()),
    ("status", pa.string()),
    ("best_val_accuracy", pa.float64()), ("best_step", pa.int64()), ("best_epoch", pa.float64()),
    ("final_val_accuracy", pa.float64()), ("majority_baseline", pa.float64()),
    # The metric that picked the best evaluation, its value there and at the end, and the constant
    # baseline's (majority class / train mean); then every metric at the best evaluation and of the baseline.
    ("select_metric", pa.string()), ("best_val_score", pa.float64()), ("final_val_score", pa.float64()),
    ("baseline_score", pa.float64()),
    *((f"best_val_{m}", pa.float64()) for m in METRICS[1:]),  # best_val_accuracy is above
    *((f"baseline_{m}", pa.float64()) for m in METRICS),
    ("trainable_params", pa.int64()), ("total_params", pa.int64()),
    ("train_time_s", pa.float64()), ("eval_time_s", pa.float64()), ("wall_time_s", pa.float64()),
    ("train_examples_per_s", pa.float64()), ("peak_mem_mb", pa.float64()),
    ("precision", pa.string()), ("device", pa.string()), ("node", pa.string()), ("attempts", pa.int64()),
    # Where it ran (rows stored before these columns read them as null): Ray's node (two nodes on one
    # host differ here, not in ``node``, the host's name), the CUDA device (null on CPU), the GPU share
    # the trial was scheduled with and how many trials that share packs per GPU, and whether the row
    # is the retry at the larger share of a cell that ran out of GPU memory.
    *PLACEMENT_TYPES.items(), ("oom_retry", pa.bool_()),
    ("eval_curve", _CURVE),
    ("train_loss_curve", pa.list_(pa.struct([("step", pa.int64()), ("loss", pa.float64())]))),
    ("train_indices_digest", pa.string()), ("train_indices", pa.list_(pa.int64())),
    ("resumed_from_step", pa.int64()), ("eval_cached_layers", pa.int64()),
    ("train_cached_layers", pa.int64()), ("cache_fill_time_s", pa.float64()),
    ("n_train", pa.int64()), ("n_eval", pa.int64()),
    ("error", pa.string()), ("finished_at", pa.timestamp("us", tz="UTC")),
    ("config", pa.string()),  # the full resolved TrialConfig, JSON
    ("versions", pa.string()),  # library versions, JSON
])


class StoreError(RuntimeError):
    pass


def open_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(uri))
    try:
        return pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        import fsspec

        fs, path = fsspec.core.url_to_fs(uri)
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


class ResultStore:
    """``on_staged``: called with (filesystem, path) once per row file, staged whole but not yet moved
    into place (the driver's fault switch in tests: orchestrator/driver_faults.py).
    ``guard``: called before every write; raises to stop it (the sweep's lock check, ``SweepLock.check``)."""

    def __init__(self, uri: str, sweep: str, on_staged: Callable[[pafs.FileSystem, str], None] | None = None):
        self.uri, self.sweep, self.on_staged = uri, sweep, on_staged
        self.guard: Callable[[], None] | None = None
        try:
            self.fs, root = open_filesystem(uri)
        except Exception as exc:
            raise StoreError(f"cannot open store {uri!r}: {exc}") from exc
        self.sweep_dir = f"{root.rstrip('/')}/{sweep}"
        self.results_dir = f"{self.sweep_dir}/{RESULTS_DIR}"
        self.staging_dir = f"{self.sweep_dir}/{STAGING_DIR}"

    # --- the spec -------------------------------------------------------------------------------
    def read_spec(self) -> str | None:
        try:
            with self.fs.open_input_stream(f"{self.sweep_dir}/{SPEC_FILE}") as f:
                return f.read().decode()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read {self.uri}/{self.sweep}/{SPEC_FILE}: {exc}") from exc

    def write_spec(self, text: str) -> None:
        self._write_atomic(f"{self.sweep_dir}/{SPEC_FILE}", text.encode())

    def exists(self) -> bool:
        return self.fs.get_file_info(f"{self.sweep_dir}/{SPEC_FILE}").type != pafs.FileType.NotFound

    def check_writable(self) -> None:
        """Write and delete a probe file at the store's root, never inside an existing sweep; a local
        root that does not exist yet is not created here, only its nearest existing parent checked."""
        root = self.sweep_dir.rsplit("/", 1)[0]
        if isinstance(self.fs, pafs.LocalFileSystem) and not os.path.isdir(root):
            parent = root
            while not os.path.exists(parent):
                parent = os.path.dirname(parent)
            if not (os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK)):
                raise StoreError(f"cannot create {root!r}: {parent!r} is not a writable folder")
            return
        probe = f"{root}/.freezesweep-probe-{uuid.uuid4().hex}"
        try:
            self.fs.create_dir(root, recursive=True)
            with self.fs.open_output_stream(probe) as f:
                f.write(b"probe")
            self.fs.delete_file(probe)
        except Exception as exc:
            raise StoreError(f"cannot write to {self.uri!r}: {exc}") from exc

    # --- rows -----------------------------------------------------------------------------------
    def write_row(self, row: dict[str, Any]) -> str:
        table = pa.Table.from_pylist([row], schema=SCHEMA)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        final = f"{self.results_dir}/{row['trial_id']}.parquet"
        self._write_atomic(final, sink.getvalue().to_pybytes(), on_staged=self.on_staged)
        return final

    def _write_atomic(self, final: str, payload: bytes,
                      on_staged: Callable[[pafs.FileSystem, str], None] | None = None) -> None:
        if self.guard is not None:
            self.guard()
        staged = f"{self.staging_dir}/{uuid.uuid4().hex}.tmp"
        self.fs.create_dir(self.staging_dir, recursive=True)
        self.fs.create_dir(final.rsplit("/", 1)[0], recursive=True)
        with self.fs.open_output_stream(staged) as f:
            f.write(payload)
        if on_staged is not None:
            on_staged(self.fs, staged)
        self.fs.move(staged, final)

    def clean_staging(self) -> int:
        """Remove leftovers of writes that a crash interrupted; they were never visible to readers."""
        try:
            leftovers = self.fs.get_file_info(pafs.FileSelector(self.staging_dir, allow_not_found=True))
        except FileNotFoundError:
            return 0
        for info in leftovers:
            self.fs.delete_file(info.path)
        return len(leftovers)

    def row_files(self) -> list[str]:
        infos = self.fs.get_file_info(pafs.FileSelector(self.results_dir, allow_not_found=True))
        return sorted(i.path for i in infos if i.path.endswith(".parquet") and i.type == pafs.FileType.File)

    def read_table(self, columns: list[str] | None = None) -> pa.Table:
        files = self.row_files()
        if not files:
            empty = SCHEMA.empty_table()
            return empty.select(columns) if columns else empty
        return pq.ParquetDataset(files, filesystem=self.fs, schema=SCHEMA).read(columns=columns)

    def read(self) -> pd.DataFrame:
        return self.read_table().to_pandas()

    def statuses(self) -> dict[str, str]:
        """trial_id → status of every stored row."""
        table = self.read_table(columns=["trial_id", "status"])  # not the curves and indices
        return dict(zip(table.column("trial_id").to_pylist(), table.column("status").to_pylist()))

    def has_ok_row(self, trial_id: str) -> bool:
        path = f"{self.results_dir}/{trial_id}.parquet"
        if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
            return False
        with self.fs.open_input_file(path) as f:
            return pq.read_table(f, columns=["status"]).column("status")[0].as_py() == "ok"

    def ok_ids(self) -> set[str]:
        return {tid for tid, status in self.statuses().items() if status == "ok"}


class SpoolingWriter:
    """Rows go to the store; while the store is unreachable they wait in a local spool folder and
    are flushed, oldest first, at the next write, the end of the launch, or the next launch. A
    finished result is never dropped: what cannot be flushed is named in a clear error."""

    def __init__(self, store: ResultStore, spool_dir: str):
        self.store, self.spool_dir = store, spool_dir
        self.last_error: Exception | None = None

    def write_row(self, row: dict[str, Any]) -> bool:
        """True when the row reached the store now; False when it was spooled. Anything but an
        ``OSError`` (e.g. the sweep's lock was lost) is raised, with the row spooled first."""
        try:
            if self.flush() == 0:  # older rows first: a row never overtakes one still waiting
                self.store.write_row(row)
                return True
        except OSError as exc:
            self.last_error = exc
        except Exception:  # e.g. the sweep's lock was lost: the finished row is kept, not dropped
            self._spool(row)
            raise
        self._spool(row)
        return False

    def _spool(self, row: dict[str, Any]) -> None:
        os.makedirs(self.spool_dir, exist_ok=True)
        tmp = os.path.join(self.spool_dir, f".{row['trial_id']}.tmp")
        pq.write_table(pa.Table.from_pylist([row], schema=SCHEMA), tmp)
        os.replace(tmp, os.path.join(self.spool_dir, f"{row['trial_id']}.parquet"))

    def pending(self) -> list[str]:
        if not os.path.isdir(self.spool_dir):
            return []
        files = [os.path.join(self.spool_dir, n) for n in os.listdir(self.spool_dir) if n.endswith(".parquet")]
        return sorted(files, key=os.path.getmtime)

    def flush(self) -> int:
        """Move spooled rows into the store; returns how many are still waiting."""
        for path in self.pending():
            table = pq.read_table(path)
            row = table.to_pylist()[0]
            try:  # an older failure never overwrites an ok row
                if row["status"] == "ok" or not self.store.has_ok_row(row["trial_id"]):
                    self.store.write_row(row)
            except OSError as exc:
                self.last_error = exc
                break
            os.remove(path)
        return len(self.pending())
