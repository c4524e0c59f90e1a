from dataclasses import replace

import duckdb
import pandas as pd
import polars as pl
import pyarrow.dataset as ds
import pytest

from tests.conftest import ok_ids
from tests.factories import trial_result

from freezesweep.orchestrator.launch import RowWriter
from freezesweep.orchestrator.progress import SweepProgress
from freezesweep.results.query import summary
from freezesweep.orchestrator.rows import result_row
from freezesweep.results.store import PLACEMENT_COLUMNS, SCHEMA, ResultStore, SpoolingWriter
from freezesweep.trials.config import EvalPoint, TrialConfig, TrialResult


def test_rows_are_readable_without_freezesweep(tmp_path):
    store = ResultStore(str(tmp_path), "s")
    for seed in range(3):
        store.write_row(result_row("s", trial_result(seed, acc=0.7 + seed / 10)))
    store.write_row(result_row("s", trial_result(9, status="failed")))
    folder = f"{tmp_path}/s/results"
    assert len(pd.read_parquet(folder)) == 4
    assert duckdb.sql(f"SELECT count(*) FROM read_parquet('{folder}/*.parquet') WHERE status='ok'").fetchall() == [(3,)]
    assert pl.read_parquet(f"{folder}/*.parquet").height == 4
    assert ds.dataset(folder).to_table().schema.equals(SCHEMA)
    row = store.read().set_index("seed").loc[0]
    assert list(row["eval_curve"][1].values())[:4] == [4, 1.0, 0.7, 0.5] and list(row["train_indices"]) == [1, 5, 9]
    assert not list((tmp_path / "s" / "_staging").iterdir())  # nothing left behind


def test_one_file_per_cell_and_ok_rows_are_final(tmp_path):
    store = ResultStore(str(tmp_path), "s")
    writer = RowWriter(
        "s",
        SpoolingWriter(store, str(tmp_path / "spool")),
        ok_ids(store),
        SweepProgress(total=1, done=0, enabled=False),
    )
    writer.write(trial_result(status="failed"), 2)
    assert store.statuses() == {trial_result().trial_id: "failed"}
    writer.write(trial_result(acc=0.81), 1)  # the retry's ok replaces the failed row
    writer.write(trial_result(acc=0.99), 1)  # a second ok for the same cell is ignored
    df = store.read()
    assert len(df) == 1 and df.loc[0, "status"] == "ok" and df.loc[0, "best_val_accuracy"] == 0.81
    assert (writer.ok, writer.failed) == (1, 0)  # outcomes are per cell: its last row's


def test_an_oom_row_is_replaced_by_its_retry_and_the_cell_counted_once(tmp_path):
    """The launch's retry with a larger GPU share (orchestrator/launch.py): at every moment one file
    for the cell; the final row is the retry's, marked, with the share it ran at."""
    store = ResultStore(str(tmp_path), "s")
    progress = SweepProgress(total=2, done=0, enabled=False)
    writer = RowWriter("s", SpoolingWriter(store, str(tmp_path / "spool")), set(), progress)
    packed = {"node_id": "n1", "hostname": "h", "gpus_per_trial": 0.25, "trials_per_gpu": 4}
    writer.write(replace(trial_result(status="oom"), placement=packed), 1)
    writer.write(trial_result(seed=1, status="failed"), 3)
    assert store.statuses() == {trial_result().trial_id: "oom", trial_result(seed=1).trial_id: "failed"}
    assert (writer.ok, writer.failed, progress.failed) == (0, 2, 2)
    roomier = {**packed, "gpus_per_trial": 0.5, "trials_per_gpu": 2}
    writer.write(replace(trial_result(acc=0.8), placement=roomier), 1, oom_retry=True)
    rows = store.read().set_index("seed")
    assert len(rows) == 2 and len(list((tmp_path / "s" / "results").glob("*.parquet"))) == 2
    retried = rows.loc[0]
    assert (retried["status"], retried["oom_retry"], retried["gpus_per_trial"], retried["trials_per_gpu"]) == (
        "ok",
        True,
        0.5,
        2,
    )
    assert not rows.loc[1, "oom_retry"]
    assert (writer.ok, writer.failed, progress.failed) == (1, 1, 1)


def test_old_stores_read_and_append_with_the_placement_columns(tmp_path):
    """A row file written before node ids and GPUs were recorded reads with those columns null beside
    new rows; nodes are counted by Ray node id (two nodes on one host are two), old rows by host."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from freezesweep.results.query import NODE_COLUMNS, placement

    store = ResultStore(str(tmp_path), "s")
    old = {**result_row("s", trial_result(seed=0)), "node": "old-host"}
    old_names = [n for n in SCHEMA.names if n not in PLACEMENT_COLUMNS and n != "oom_retry"]
    (tmp_path / "s" / "results").mkdir(parents=True)
    old_schema = pa.schema([SCHEMA.field(n) for n in old_names])
    pq.write_table(
        pa.Table.from_pylist([{n: old[n] for n in old_names}], schema=old_schema),
        tmp_path / "s" / "results" / f"{old['trial_id']}.parquet",
    )
    for seed, node in ((1, "n1"), (2, "n2"), (3, "n2")):  # two Ray nodes on one host
        where = {
            "node_id": node,
            "node_ip": "10.0.0.5",
            "hostname": "gpu-host",
            "gpu_index": seed % 2,
            "gpu_name": "H100",
            "gpu_uuid": f"GPU-{node}-{seed % 2}",
            "gpus_per_trial": 0.5,
            "trials_per_gpu": 2,
        }
        store.write_row(result_row("s", replace(trial_result(seed=seed), placement=where), attempts=1))
    rows = store.read().set_index("seed")
    assert rows.loc[0, "node"] == "old-host" and pd.isna(rows.loc[0, "node_id"]) and pd.isna(rows.loc[0, "gpu_index"])
    assert (rows.loc[1, "node_id"], rows.loc[1, "node"], rows.loc[1, "gpu_index"]) == ("n1", "gpu-host", 1)
    nodes = placement(store.read_table(columns=NODE_COLUMNS).to_pandas()).set_index("node")
    assert sorted(nodes.index) == ["host old-host", "n1", "n2"]
    assert nodes.loc["n2", "rows"] == 2 and nodes.loc["n2", "gpus"] == 2 and nodes.loc["n2", "hostname"] == "gpu-host"
    assert nodes.loc["host old-host", "hostname"] == "old-host" and nodes.loc["host old-host", "gpus"] == 0


def test_leftover_partial_writes_are_invisible_and_cleaned(tmp_path):
    store = ResultStore(str(tmp_path), "s")
    store.write_row(result_row("s", trial_result()))
    staging = tmp_path / "s" / "_staging"
    staging.mkdir(exist_ok=True)
    (staging / "crashed.tmp").write_bytes(b"PAR1 half a file")
    assert len(pd.read_parquet(tmp_path / "s" / "results")) == 1
    assert store.clean_staging() == 1 and not list(staging.iterdir())


def test_summary_over_seeds():
    rows = [result_row("s", trial_result(seed, acc=acc)) for seed, acc in enumerate([0.7, 0.8, 0.9])]
    rows.append(result_row("s", trial_result(7, status="failed")))
    table = summary(pd.DataFrame(rows))
    assert len(table) == 1
    got = table.iloc[0]
    assert got["n"] == 3 and got["mean"] == pytest.approx(0.8) and got["median"] == pytest.approx(0.8)
    assert got["std"] == pytest.approx(0.1) and (got["min"], got["max"]) == (0.7, 0.9)
    assert got["baseline"] == 0.509 and got["metric"] == "accuracy"  # a row with no select_metric picked by accuracy


def test_any_fsspec_filesystem_works(tmp_path):
    """A URI pyarrow does not know (here fsspec's in-memory filesystem) goes through fsspec."""
    store = ResultStore("memory://fsspec-store", "s")
    store.check_writable()
    store.write_row(result_row("s", trial_result(0)))
    store.write_row(result_row("s", trial_result(1)))
    assert len(store.read()) == 2 and trial_result(1).trial_id in ok_ids(store)
    store.write_spec("name: s\n")
    assert store.read_spec() == "name: s\n"
    assert store.clean_staging() == 0


def test_status_table_counts_per_axis_in_spec_order():
    from freezesweep.results.query import status_table

    cells = [
        TrialConfig(dataset="glue/sst2", model="m", train_size=n, frozen_layers=k, seed=0, precision="fp32")
        for n in (200, 50)
        for k in (-1, 4)
    ]
    statuses = {cells[0].trial_id: "ok", cells[1].trial_id: "failed", cells[2].trial_id: "oom"}
    table = status_table(cells, statuses).set_index(["axis", "value"])[["done", "failed", "missing"]]
    assert list(table.loc["train_size"].index) == ["200", "50"]  # the spec's order, not sorted
    assert table.loc[("train_size", "200")].tolist() == [1, 1, 0]
    assert table.loc[("train_size", "50")].tolist() == [0, 1, 1]
    assert table.loc[("frozen_layers", "-1")].tolist() == [1, 1, 0]
    assert table.loc[("total", "")].tolist() == [1, 2, 1]


def test_a_long_axis_shows_its_unfinished_values_and_sums_the_rest():
    from freezesweep.results.query import OUTCOMES, collapse_long_axes, status_table

    cells = [
        TrialConfig(dataset="glue/sst2", model="m", train_size=n, frozen_layers=0, seed=seed, precision="fp32")
        for n in (50, 100)
        for seed in range(30)
    ]
    statuses = {c.trial_id: "ok" for c in cells if c.seed not in (7, 21)} | {cells[21].trial_id: "failed"}
    full = status_table(cells, statuses)
    table = collapse_long_axes(full, max_values=20).set_index(["axis", "value"])
    seeds = table.loc["seed"]
    assert list(seeds.index) == ["7", "21", "28 other values"]  # grid order, then the rest in one row
    assert seeds.loc["21", ["done", "failed", "missing"]].tolist() == [0, 1, 1]
    assert seeds.loc["28 other values", "done"] == 56 and seeds[list(OUTCOMES)].to_numpy().sum() == len(cells)
    assert list(table.loc["train_size"].index) == ["50", "100"]  # short axes as they were
    assert table.loc[("total", "")].tolist() == full.set_index(["axis", "value"]).loc[("total", "")].tolist()
    done = collapse_long_axes(status_table(cells, {c.trial_id: "ok" for c in cells}), max_values=20)
    assert done[done["axis"] == "seed"]["value"].tolist() == ["all 30 values"]


def _scored(seed: int, metric: str, score: float, dataset: str = "glue/stsb") -> TrialResult:
    cfg = TrialConfig(
        dataset=dataset, model="m", train_size=50, frozen_layers=2, seed=seed, precision="fp32", select_metric=metric
    )
    best = {"pearson": score, "spearman": score - 0.05} if metric == "pearson" else {"accuracy": 0.7, "matthews": score}
    point = EvalPoint(4, 1.0, best.get("accuracy"), 0.5, **{k: v for k, v in best.items() if k != "accuracy"})
    baseline = {"pearson": 0.0, "spearman": 0.0} if metric == "pearson" else {"accuracy": 0.69, "matthews": 0.0}
    return TrialResult(
        trial_id=cfg.trial_id,
        config=cfg,
        status="ok",
        best_val_accuracy=best.get("accuracy"),
        select_metric=metric,
        best_val_score=score,
        baseline_score=0.0,
        best_val_metrics=best,
        baseline_metrics=baseline,
        eval_curve=(point,),
        majority_baseline=baseline.get("accuracy"),
    )


def test_rows_record_every_metric_and_the_selected_one(tmp_path):
    store = ResultStore(str(tmp_path), "s")
    for seed, score in enumerate([0.80, 0.84]):
        store.write_row(result_row("s", _scored(seed, "pearson", score)))
    store.write_row(result_row("s", _scored(0, "matthews", 0.4, dataset="glue/cola")))
    rows = store.read().set_index(["dataset", "seed"])
    stsb = rows.loc[("glue/stsb", 1)]
    assert (stsb["select_metric"], stsb["best_val_score"], stsb["best_val_pearson"]) == ("pearson", 0.84, 0.84)
    assert stsb["best_val_spearman"] == pytest.approx(0.79) and pd.isna(stsb["best_val_accuracy"])
    assert (stsb["baseline_pearson"], stsb["baseline_score"]) == (0.0, 0.0)
    assert stsb["eval_curve"][0]["pearson"] == 0.84 and stsb["eval_curve"][0]["accuracy"] is None
    cola = rows.loc[("glue/cola", 0)]
    assert (cola["best_val_matthews"], cola["best_val_accuracy"], cola["baseline_accuracy"]) == (0.4, 0.7, 0.69)

    table = summary(store.read()).set_index("dataset")
    assert table.loc["glue/stsb", "metric"] == "pearson" and table.loc["glue/stsb", "mean"] == pytest.approx(0.82)
    assert table.loc["glue/cola", "metric"] == "matthews" and table.loc["glue/cola", "baseline"] == 0.0
    spearman = summary(store.read(), metric="spearman").set_index("dataset")
    assert (
        spearman.loc["glue/stsb", "mean"] == pytest.approx(0.77) and spearman.loc["glue/stsb", "metric"] == "spearman"
    )
    accuracy = summary(store.read(), metric="accuracy").set_index("dataset")
    assert accuracy.loc["glue/cola", "mean"] == 0.7 and accuracy.loc["glue/cola", "baseline"] == 0.69
    with pytest.raises(ValueError, match="unknown metric 'mse'"):
        summary(store.read(), metric="mse")
    cola_only = store.read().query("dataset == 'glue/cola'")  # a classifier's rows: no correlation recorded
    with pytest.raises(ValueError, match=r"'pearson' is not recorded in these rows \(they record accuracy, matthews\)"):
        summary(cola_only, metric="pearson")


def test_rows_stored_before_select_metric_read_as_accuracy(tmp_path):
    """An old row file lacks the new columns (and the curve's new fields): it reads as picked by accuracy,
    in SQL, in the summary and in the report's rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from freezesweep.results.query import read_rows, sql

    store = ResultStore(str(tmp_path), "old")
    row = result_row("old", trial_result(acc=0.75))
    old_names = [
        n
        for n in SCHEMA.names
        if n not in {"select_metric", "best_val_score", "final_val_score", "baseline_score"}
        and not n.startswith("baseline_")
        and n not in {"best_val_f1", "best_val_matthews", "best_val_pearson", "best_val_spearman"}
    ]
    old_schema = pa.schema([SCHEMA.field(n) for n in old_names])
    (tmp_path / "old" / "results").mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pylist([{n: row[n] for n in old_names}], schema=old_schema),
        tmp_path / "old" / "results" / f"{row['trial_id']}.parquet",
    )
    store.write_row(result_row("old", _scored(1, "pearson", 0.9)))  # a new row beside it
    got = sql(
        store,
        "SELECT dataset, select_metric, best_val_score, baseline_score, baseline_accuracy FROM results "
        "ORDER BY dataset",
    ).values.tolist()
    assert got[0] == ["glue/sst2", "accuracy", 0.75, 0.509, 0.509]
    assert got[1][:4] == ["glue/stsb", "pearson", 0.9, 0.0]
    rows = read_rows(store).set_index("dataset")
    assert (rows.loc["glue/sst2", "select_metric"], rows.loc["glue/sst2", "best_val_score"]) == ("accuracy", 0.75)
    assert summary(store.read()).set_index("dataset").loc["glue/sst2", "mean"] == 0.75


def _sampled(seed: int, max_eval_examples: int | None, n_eval: int, baseline_rows: str | None) -> TrialResult:
    """The demo's k = 6 seed 2 as stored before baselines were measured on the evaluated rows: 130 of 256
    sampled rows (the sample's majority share) against the whole split's 0.5092, collapsed false."""
    result = trial_result(seed=seed, acc=130 / 256)
    cfg = replace(result.config, max_eval_examples=max_eval_examples)
    return replace(
        result,
        trial_id=cfg.trial_id,
        config=cfg,
        n_eval=n_eval,
        select_metric="accuracy",
        best_val_score=130 / 256,
        baseline_score=0.5092,
        majority_baseline=0.5092,
        collapsed=False,
        baseline_rows=baseline_rows,
    )


def test_rows_stored_before_baseline_rows_name_a_whole_split_baseline(tmp_path):
    """A row file without ``baseline_rows`` computed its baseline on the whole validation split: where its
    scores came from a max_eval_examples sample it reads "whole split" (in SQL, in the report's rows), and
    the report names the sweep's such rows; scored on the whole split, or written since, "evaluated"."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from freezesweep.results.query import read_rows, sql, whole_split_rows
    from freezesweep.results.report import SweepRows, build_report

    store = ResultStore(str(tmp_path), "old")
    (tmp_path / "old" / "results").mkdir(parents=True)
    old_schema = pa.schema([f for f in SCHEMA if f.name != "baseline_rows"])
    olds = {0: _sampled(0, 256, 256, None), 1: _sampled(1, None, 872, None), 2: _sampled(2, 1000, 872, None)}
    for result in olds.values():
        row = result_row("old", result)
        pq.write_table(
            pa.Table.from_pylist([row], schema=old_schema), tmp_path / "old" / "results" / f"{row['trial_id']}.parquet"
        )
    store.write_row(result_row("old", _sampled(3, 256, 256, "evaluated")))  # written since: its own word
    store.write_row(result_row("old", trial_result(seed=4, status="failed")))  # no baseline, nothing to say
    expected = {0: "whole split", 1: "evaluated", 2: "evaluated", 3: "evaluated", 4: "null"}
    got = sql(store, "SELECT seed, coalesce(baseline_rows, 'null') FROM results ORDER BY seed").values.tolist()
    assert got == [[seed, rows] for seed, rows in expected.items()]
    assert read_rows(store).set_index("seed")["baseline_rows"].fillna("null").to_dict() == expected
    assert whole_split_rows(read_rows(store)).to_dict() == {"old": 1}
    report = build_report([SweepRows.from_store(store)])
    assert any("old: 1 ok row was scored on a max_eval_examples sample" in p for p in report.sections[0].paragraphs)


def test_diverged_cells_are_counted_apart_and_left_out(tmp_path):
    from freezesweep.results.query import status_table
    from freezesweep.results.report import SweepRows, write_report

    store = ResultStore(str(tmp_path), "s")
    for seed in range(3):
        store.write_row(result_row("s", trial_result(seed, acc=0.7)))
    cfg = trial_result(3).config
    store.write_row(
        result_row(
            "s",
            TrialResult(
                trial_id=cfg.trial_id, config=cfg, status="diverged", diverged_at_step=3, select_metric="accuracy"
            ),
        )
    )
    cells = [trial_result(s).config for s in range(4)]
    status = status_table(cells, store.statuses()).set_index(["axis", "value"])
    assert status.loc[("total", ""), ["done", "diverged", "failed", "missing"]].tolist() == [3, 1, 0, 0]
    assert summary(store.read())["n"].tolist() == [3]  # the diverged row is no result
    report = write_report([SweepRows.from_store(store, status.reset_index())], str(tmp_path / "out"))
    assert report.completeness == [
        "s: complete, 3 cells done; 1 diverged (a non-finite loss: left out of every statistic, not run again)."
    ]


# --- issue 29: a full disk leaves no temporary file behind -------------------------------------------------
def _full_disk():
    """The local filesystem, but every write fails as on a full disk (the file is created, empty)."""
    import errno
    import io

    import pyarrow.fs as pafs
    from fsspec.implementations.local import LocalFileSystem

    class Full(io.RawIOBase):
        def __init__(self, f):
            self.f = f

        def writable(self) -> bool:
            return True

        def write(self, data) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self) -> None:
            self.f.close()
            super().close()

    class FullDisk(LocalFileSystem):
        cachable = False

        def _open(self, path, mode="rb", **kwargs):
            opened = super()._open(path, mode, **kwargs)
            return Full(opened) if "w" in mode else opened

    return pafs.PyFileSystem(pafs.FSSpecHandler(FullDisk()))


def _leftovers(folder) -> list[str]:
    return sorted(
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file() and (p.name.endswith(".tmp") or p.name.startswith(".freezesweep-probe-"))
    )


def test_a_full_disk_leaves_no_temporary_file(tmp_path):
    """Before: an empty .freezesweep-probe-* file at the store's root, an empty staged row file, and an
    empty _lock.<token>.tmp beside the lock."""
    from freezesweep.results.lock import SweepLock
    from freezesweep.results.store import StoreError, check_store_root

    store = ResultStore(str(tmp_path), "s")
    store.write_row(result_row("s", trial_result(0)))
    store.fs = _full_disk()
    with pytest.raises(StoreError, match="No space left on device"):
        check_store_root(store.fs, str(tmp_path), str(tmp_path))
    with pytest.raises(OSError, match="No space left"):
        store.write_row(result_row("s", trial_result(1)))
    lock = SweepLock(ResultStore(str(tmp_path), "s").fs, store.sweep_dir).acquire()
    try:
        lock.fs = store.fs
        with pytest.raises(OSError, match="No space left"):
            lock._beat_once()
    finally:
        lock.fs = ResultStore(str(tmp_path), "s").fs
        lock.release()
    assert _leftovers(tmp_path) == []
    assert set(ResultStore(str(tmp_path), "s").statuses()) == {trial_result(0).trial_id}  # the good row as it was


def test_an_arrays_rows_reach_the_store_as_one_file_and_replace_failed_rows(tmp_path):
    """RowWriter.write_all (what Tune's callback hands over: an array's members over at one step): the
    final rows as one file, each counted and tracked; a cell whose stored row failed (read at the
    launch's start, or written by this launch) has that row replaced, never shown twice."""
    store = ResultStore(str(tmp_path), "s")
    store.write_row(result_row("s", trial_result(0, status="failed")))  # an earlier launch's
    tracked: list[dict] = []
    progress = SweepProgress(total=4, done=0, enabled=False)
    sink = SpoolingWriter(store, str(tmp_path / "spool"))
    writer = RowWriter("s", sink, set(), progress, on_row=tracked.append, unfinished={trial_result(0).trial_id})
    writer.write(trial_result(1, status="oom"), 1)  # this launch's
    writer.write_all([trial_result(seed) for seed in range(3)] + [trial_result(3, status="failed")], 1)
    files = sorted(p.name for p in (tmp_path / "s" / "results").iterdir())
    assert len(files) == 2 and files[1].startswith("rows-")  # seed 3's failed row alone, the three ok together
    assert duckdb.sql(f"SELECT count(*) FROM read_parquet('{tmp_path}/s/results/*.parquet')").fetchall() == [(4,)]
    assert store.statuses() == {
        **{trial_result(s).trial_id: "ok" for s in range(3)},
        trial_result(3).trial_id: "failed",
    }
    assert (writer.ok, writer.failed, progress.failed) == (3, 1, 1)
    assert [row["seed"] for row in tracked] == [1, 0, 1, 2, 3]
    writer.write_all([trial_result(seed, acc=0.99) for seed in range(3)], 2)  # final rows are never written again
    assert len(list((tmp_path / "s" / "results").iterdir())) == 2 and len(tracked) == 5


def test_a_gcs_store_bounds_its_retries_unless_its_uri_sets_them():
    """Before: `status` of a gs:// store this machine cannot reach hung (pyarrow's GCS client retries a
    request for 15 minutes); the URI's own retry_limit_seconds is kept."""
    import datetime

    from freezesweep.results.store import GCS_RETRY_LIMIT_S, open_filesystem

    def limit(uri: str) -> datetime.timedelta:
        fs, root = open_filesystem(uri)
        assert root == "bucket/sweeps"
        return fs.__reduce__()[1][0]["retry_time_limit"]  # pyarrow's own record of the option

    assert limit("gs://bucket/sweeps") == datetime.timedelta(seconds=GCS_RETRY_LIMIT_S)
    assert limit("gs://bucket/sweeps?retry_limit_seconds=120") == datetime.timedelta(seconds=120)
    assert limit("gs://bucket/sweeps?scheme=https") == datetime.timedelta(seconds=GCS_RETRY_LIMIT_S)
