"""The Parquet results store: ``<store>/<sweep>/{spec.yaml, results/*.parquet}``.

- A cell's outcome lands as ``results/<trial_id>.parquet``, one row, written under ``_staging/`` and
  moved into ``results/`` whole (a rename on a local disk; on object stores each object appears
  whole): readers never see a partial file. A failed row is replaced by its retry's; a final row
  (``ok``, ``diverged``: FINAL_STATUSES) is never written again.
- Final rows are compacted into ``results/part-<id>.parquet`` files (at a launch's round boundaries
  and by ``freezesweep compact``): 100,000 rows are tens of files, not 100,000 footers. ``compact``
  says how it stays crash-safe and never shows a row twice in ``results/``.
- Plain Parquet with one fixed schema, not a table format: pandas, DuckDB
  (``read_parquet('…/results/*.parquet')``), Polars and pyarrow read the folder as it is, with no
  freezesweep code and no extra package (DuckDB's Delta reader is an extension fetched at run time,
  which machines without internet cannot do; pandas and pyarrow would need ``deltalake``).
- A file that cannot be read costs only its row: readers skip it and name it (``unreadable``), and a
  launch moves it to ``_quarantine/`` and runs its cell again.
- Any filesystem pyarrow knows (local, ``s3://…``, …) or, failing that, fsspec.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

RESULTS_DIR, STAGING_DIR, SPEC_FILE = "results", "_staging", "spec.yaml"
COMPACTING_DIR, QUARANTINE_DIR, PART_PREFIX = "_compacting", "_quarantine", "part-"
# Outcomes that no rerun changes: the row is kept for good (a failed or oom row is replaced by a retry).
FINAL_STATUSES = ("ok", "diverged")

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
    ("diverged_at_step", pa.int64()),  # status diverged: the first step whose loss was not finite
    ("best_val_accuracy", pa.float64()), ("best_step", pa.int64()), ("best_epoch", pa.float64()),
    ("final_val_accuracy", pa.float64()), ("majority_baseline", pa.float64()),
    # The metric that picked the best evaluation, its value there and at the end, and the constant
    # baseline's (majority class / train mean); then every metric at the best evaluation and of the baseline.
    ("select_metric", pa.string()), ("best_val_score", pa.float64()), ("final_val_score", pa.float64()),
    ("baseline_score", pa.float64()),
    # the best evaluation is the constant predictor's (scored exactly the constant baseline): a collapsed
    # fine-tune, counted apart by settle mode (results/settle.py); rows stored before it read null
    ("collapsed", pa.bool_()),
    *((f"best_val_{m}", pa.float64()) for m in METRICS[1:]),  # best_val_accuracy is above
    *((f"baseline_{m}", pa.float64()) for m in METRICS),
    ("trainable_params", pa.int64()), ("total_params", pa.int64()),
    ("train_time_s", pa.float64()), ("eval_time_s", pa.float64()), ("wall_time_s", pa.float64()),
    ("train_examples_per_s", pa.float64()), ("peak_mem_mb", pa.float64()),
    ("worker_peak_mem_mb", pa.float64()),  # the process's peak with the worker's caches (peak_mem_mb: without)
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


def store_identity(uri: str, root: str) -> str:
    """The store however it is spelled: a local folder's resolved absolute path (``./sweeps``,
    ``sweeps/`` and the full path are one store), else the URI without its query (endpoint options)."""
    if "://" not in uri:
        return "file://" + os.path.realpath(root)
    parts = urlsplit(uri)
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}{parts.path.rstrip('/')}"


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
        self.identity = store_identity(uri, root)
        self.sweep_dir = f"{root.rstrip('/')}/{sweep}"
        self.results_dir = f"{self.sweep_dir}/{RESULTS_DIR}"
        self.staging_dir = f"{self.sweep_dir}/{STAGING_DIR}"
        self.compacting_dir = f"{self.sweep_dir}/{COMPACTING_DIR}"
        self.quarantine_dir = f"{self.sweep_dir}/{QUARANTINE_DIR}"
        self.unreadable: list[str] = []  # row files the last read skipped
        self.on_compaction_step: Callable[[str], None] | None = None  # tests: a crash at each step

    # --- the spec -------------------------------------------------------------------------------
    def read_spec(self) -> str | None:
        try:
            with self.fs.open_input_stream(f"{self.sweep_dir}/{SPEC_FILE}") as f:
                return f.read().decode(errors="replace")  # damaged bytes: the spec's reader says so
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
        # one row: column statistics and dictionaries would only weigh the footer (a part gets them)
        pq.write_table(table, sink, write_statistics=False, use_dictionary=False)
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

    # --- reading: single-row files, compacted parts, and parts being made ------------------------
    def layout(self) -> "Layout":
        """One listing of the sweep's row files (results/ and, for a compaction under way, _compacting/)."""
        results = self._list(self.results_dir)
        singles = sorted(p for p in results if not _name(p).startswith(PART_PREFIX))
        parts = sorted(p for p in results if _name(p).startswith(PART_PREFIX))
        committed = {_name(p).removeprefix(PART_PREFIX).removesuffix(".parquet") for p in parts}
        compacting = self.fs.get_file_info(pafs.FileSelector(self.compacting_dir, allow_not_found=True, recursive=True))
        absorbed = [i.path for i in compacting if i.type == pafs.FileType.File and i.path.endswith(".parquet")]
        # files of a part not committed yet are still rows; those of a committed part are its rows again
        pending = sorted(p for p in absorbed if p.split("/")[-2] not in committed)
        return Layout(singles, parts, pending)

    def _list(self, folder: str) -> list[str]:
        infos = self.fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
        return [i.path for i in infos if i.path.endswith(".parquet") and i.type == pafs.FileType.File]

    def row_files(self) -> list[str]:
        """Every file holding rows, compacted parts first (a row in two places is read from its part)."""
        return self.layout().files

    def read_table(self, columns: list[str] | None = None) -> pa.Table:
        """The sweep's rows (only ``columns``; None: all), each cell once. A file that cannot be read is
        skipped and named in ``self.unreadable`` (its cell reads as missing; ``resume`` runs it again)."""
        wanted = None if columns is None else list(dict.fromkeys(["trial_id", *columns]))
        files = self.row_files()
        try:
            table = self._read(files, wanted)
            self.unreadable = []
        except (OSError, pa.ArrowException):
            self.unreadable = [f for f in files if not self._readable(f)]
            table = self._read([f for f in files if f not in self.unreadable], wanted)
        table = _first_of_each_cell(table)
        return table if columns is None else table.select(columns)

    def _read(self, files: list[str], columns: list[str] | None) -> pa.Table:
        if not files:
            empty = SCHEMA.empty_table()
            return empty.select(columns) if columns else empty
        return pq.ParquetDataset(files, filesystem=self.fs, schema=SCHEMA).read(columns=columns)

    def _readable(self, path: str) -> bool:
        try:
            with self.fs.open_input_file(path) as f:
                pq.read_table(f, columns=["trial_id", "status"])
            return True
        except (OSError, pa.ArrowException):
            return False

    def read(self) -> pd.DataFrame:
        return self.read_table().to_pandas()

    def scan(self) -> ds.Dataset | pa.Table:
        """The rows for a lazy reader (DuckDB reads only the columns a query needs): a dataset over the
        readable files, or the rows themselves in the moment a compaction shows a cell twice."""
        cells = self.read_table(columns=["trial_id"])  # also names the unreadable files
        files = [f for f in self.row_files() if f not in self.unreadable]
        dataset = ds.dataset(files, schema=SCHEMA, format="parquet", filesystem=self.fs)
        return dataset if dataset.count_rows() == len(cells) else self.read_table()

    def statuses(self) -> dict[str, str]:
        """trial_id → status of every stored row."""
        table = self.read_table(columns=["trial_id", "status"])  # not the curves and indices
        return dict(zip(table.column("trial_id").to_pylist(), table.column("status").to_pylist()))

    def stored(self, trial_id: str) -> tuple[str, Any] | None:
        """(status, finished_at) of the cell's row, or None."""
        path = f"{self.results_dir}/{trial_id}.parquet"
        if self.fs.get_file_info(path).type != pafs.FileType.NotFound:
            with self.fs.open_input_file(path) as f:
                row = pq.read_table(f, columns=["status", "finished_at"]).to_pylist()[0]
            return row["status"], row["finished_at"]
        parts = self.layout().parts  # compacted rows are final: their cells never get another row
        if not parts:
            return None
        table = pq.ParquetDataset(parts, filesystem=self.fs, schema=SCHEMA).read(
            columns=["trial_id", "status", "finished_at"], filter=pc.field("trial_id") == trial_id)
        return (table["status"][0].as_py(), table["finished_at"][0].as_py()) if len(table) else None

    def has_ok_row(self, trial_id: str) -> bool:
        found = self.stored(trial_id)
        return found is not None and found[0] == "ok"

    def ok_ids(self) -> set[str]:
        return {tid for tid, status in self.statuses().items() if status == "ok"}

    def final_ids(self) -> set[str]:
        """Cells whose row is an outcome no rerun changes (FINAL_STATUSES): a launch runs the others."""
        return {tid for tid, status in self.statuses().items() if status in FINAL_STATUSES}

    # --- damage --------------------------------------------------------------------------------------
    def quarantine_unreadable(self) -> list[str]:
        """Move every row file that cannot be read into ``<sweep>/_quarantine/`` (kept, never deleted):
        its cell has no row then, and the launch runs it again. Returns the files moved, as they were."""
        self.read_table(columns=["trial_id"])
        moved = list(self.unreadable)
        for path in moved:
            self.fs.create_dir(self.quarantine_dir, recursive=True)
            self.fs.move(path, f"{self.quarantine_dir}/{uuid.uuid4().hex[:8]}-{_name(path)}")
        self.unreadable = []
        return moved

    # --- compaction ------------------------------------------------------------------------------
    def compact(self) -> int:
        """Final rows (FINAL_STATUSES) in single-row files into one Parquet part; returns how many.
        The caller holds the sweep's lock. Crash-safe, and never a row in two files of ``results/``:
        1. the part is written to _staging/; 2. the rows' files move to _compacting/<part>/ (a plain
        reader of results/ may miss them for that moment, never double them; freezesweep's readers read
        them there); 3. the part moves into results/ (the commit); 4. _compacting/<part>/ is deleted.
        ``recover_compaction`` finishes or undoes an interrupted one."""
        self.recover_compaction()
        singles = self.layout().singles
        if not singles:
            return 0
        table = self._read(singles, None)
        final = pc.is_in(table["status"], pa.array(FINAL_STATUSES))
        absorbed = [path for path, keep in zip(singles, final.to_pylist()) if keep]
        if not absorbed:
            return 0
        part_id = uuid.uuid4().hex[:16]
        staged = f"{self.staging_dir}/{PART_PREFIX}{part_id}.parquet"
        self.fs.create_dir(self.staging_dir, recursive=True)
        with self.fs.open_output_stream(staged) as f:
            pq.write_table(table.filter(final), f)
        self._compaction_step("staged")
        folder = f"{self.compacting_dir}/{part_id}"
        self.fs.create_dir(folder, recursive=True)
        for moved, path in enumerate(absorbed, 1):
            self.fs.move(path, f"{folder}/{_name(path)}")
            if moved == len(absorbed) // 2:
                self._compaction_step("half absorbed")
        self._compaction_step("absorbed")
        if self.guard is not None:
            self.guard()  # a driver that lost the lock stops here: recovery puts the files back
        self.fs.move(staged, f"{self.results_dir}/{PART_PREFIX}{part_id}.parquet")
        self._compaction_step("committed")
        self.fs.delete_dir(folder)
        return len(absorbed)

    def _compaction_step(self, step: str) -> None:
        if self.on_compaction_step is not None:
            self.on_compaction_step(step)

    def recover_compaction(self) -> None:
        """An interrupted compaction: its absorbed files deleted when its part was committed, else
        moved back into results/."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.compacting_dir, allow_not_found=True))
        for folder in (i.path for i in infos if i.type == pafs.FileType.Directory):
            part = f"{self.results_dir}/{PART_PREFIX}{_name(folder)}.parquet"
            if self.fs.get_file_info(part).type == pafs.FileType.NotFound:
                for path in self._list(folder):
                    self.fs.move(path, f"{self.results_dir}/{_name(path)}")
            self.fs.delete_dir(folder)


@dataclass(frozen=True)
class Layout:
    singles: list[str]  # results/<trial_id>.parquet: one row each (new outcomes; failed rows)
    parts: list[str]  # results/part-<id>.parquet: compacted final rows
    compacting: list[str]  # _compacting/<id>/<trial_id>.parquet of a part not committed yet

    @property
    def files(self) -> list[str]:
        return [*self.parts, *self.singles, *self.compacting]


def _name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _first_of_each_cell(table: pa.Table) -> pa.Table:
    """One row per trial_id: the first (a part's) where a compaction under way shows one twice."""
    ids = table["trial_id"]
    if len(pc.unique(ids)) == len(ids):
        return table
    seen = pd.Series(ids.to_numpy(zero_copy_only=False)).duplicated().to_numpy()
    return table.filter(pa.array(~seen))


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
            try:
                if not self._superseded(row):
                    self.store.write_row(row)
            except OSError as exc:
                self.last_error = exc
                break
            os.remove(path)
        return len(self.pending())

    def _superseded(self, row: dict[str, Any]) -> bool:
        """The store already holds this cell's final row, or a newer one: the spooled row is dropped."""
        stored = self.store.stored(row["trial_id"])
        if stored is None:
            return False
        status, finished_at = stored
        return status in FINAL_STATUSES or (finished_at is not None and row["finished_at"] is not None
                                            and finished_at >= row["finished_at"])
