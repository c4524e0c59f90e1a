
import duckdb
import pandas as pd
import polars as pl
import pyarrow.dataset as ds
import pytest

from orchestrator.launch import RowWriter
from orchestrator.progress import SweepProgress
from results.query import summary
from orchestrator.rows import result_row
from results.store import SCHEMA, ResultStore, SpoolingWriter
from trials.config import EvalPoint, TrialConfig, TrialResult


def _result(seed=0, status="ok", acc=0.8, train_size=50):
    cfg = TrialConfig(dataset="glue/sst2", model="m", train_size=train_size, frozen_layers=2, seed=seed, precision="fp32")
    if status != "ok":
        return TrialResult(trial_id=cfg.trial_id, config=cfg, status=status, error="boom")
    curve = (EvalPoint(2, 0.5, acc - 0.1, 0.6), EvalPoint(4, 1.0, acc, 0.5))
    return TrialResult(trial_id=cfg.trial_id, config=cfg, status="ok", best_val_accuracy=acc, best_step=4,
                       best_epoch=1.0, final_val_accuracy=acc, majority_baseline=0.509, eval_curve=curve,
                       train_loss_curve=((2, 0.7), (4, 0.6)), trainable_params=10, total_params=20,
                       train_indices=(1, 5, 9), versions={"torch": "x"})


def test_rows_are_readable_without_freezesweep(tmp_path):
    store = ResultStore(str(tmp_path), "s")
    for seed in range(3):
        store.write_row(result_row("s", _result(seed, acc=0.7 + seed / 10)))
    store.write_row(result_row("s", _result(9, status="failed")))
    folder = f"{tmp_path}/s/results"
    assert len(pd.read_parquet(folder)) == 4
    assert duckdb.sql(f"SELECT count(*) FROM read_parquet('{folder}/*.parquet') WHERE status='ok'").fetchall() == [(3,)]
    assert pl.read_parquet(f"{folder}/*.parquet").height == 4
    assert ds.dataset(folder).to_table().schema.equals(SCHEMA)
    row = store.read().set_index("seed").loc[0]
    assert list(row["eval_curve"][1].values()) == [4, 1.0, 0.7, 0.5] and list(row["train_indices"]) == [1, 5, 9]
    assert not list((tmp_path / "s" / "_staging").iterdir())  # nothing left behind


def test_one_file_per_cell_and_ok_rows_are_final(tmp_path):
    store = ResultStore(str(tmp_path), "s")
    writer = RowWriter("s", SpoolingWriter(store, str(tmp_path / "spool")), store.ok_ids(),
                       SweepProgress(total=1, done=0, enabled=False))
    writer.write(_result(status="failed"), "node-a", 2)
    assert store.statuses() == {_result().trial_id: "failed"}
    writer.write(_result(acc=0.81), "node-a", 1)  # the retry's ok replaces the failed row
    writer.write(_result(acc=0.99), "node-b", 1)  # a second ok for the same cell is ignored
    df = store.read()
    assert len(df) == 1 and df.loc[0, "status"] == "ok" and df.loc[0, "best_val_accuracy"] == 0.81
    assert (writer.ok, writer.failed) == (1, 1)


def test_leftover_partial_writes_are_invisible_and_cleaned(tmp_path):
    store = ResultStore(str(tmp_path), "s")
    store.write_row(result_row("s", _result()))
    staging = tmp_path / "s" / "_staging"
    staging.mkdir(exist_ok=True)
    (staging / "crashed.tmp").write_bytes(b"PAR1 half a file")
    assert len(pd.read_parquet(tmp_path / "s" / "results")) == 1
    assert store.clean_staging() == 1 and not list(staging.iterdir())


def test_summary_over_seeds():
    rows = [result_row("s", _result(seed, acc=acc)) for seed, acc in enumerate([0.7, 0.8, 0.9])]
    rows.append(result_row("s", _result(7, status="failed")))
    table = summary(pd.DataFrame(rows))
    assert len(table) == 1
    got = table.iloc[0]
    assert got["n"] == 3 and got["mean"] == pytest.approx(0.8) and got["median"] == pytest.approx(0.8)
    assert got["std"] == pytest.approx(0.1) and (got["min"], got["max"]) == (0.7, 0.9)
    assert got["majority"] == 0.509


def test_any_fsspec_filesystem_works(tmp_path):
    """A URI pyarrow does not know (here fsspec's in-memory filesystem) goes through fsspec."""
    store = ResultStore("memory://fsspec-store", "s")
    store.check_writable()
    store.write_row(result_row("s", _result(0)))
    store.write_row(result_row("s", _result(1)))
    assert len(store.read()) == 2 and store.has_ok_row(_result(1).trial_id)
    store.write_spec("name: s\n")
    assert store.read_spec() == "name: s\n"
    assert store.clean_staging() == 0


def test_status_table_counts_per_axis_in_spec_order():
    from results.query import status_table

    cells = [TrialConfig(dataset="glue/sst2", model="m", train_size=n, frozen_layers=k, seed=0, precision="fp32")
             for n in (200, 50) for k in (-1, 4)]
    statuses = {cells[0].trial_id: "ok", cells[1].trial_id: "failed", cells[2].trial_id: "oom"}
    table = status_table(cells, statuses).set_index(["axis", "value"])
    assert list(table.loc["train_size"].index) == ["200", "50"]  # the spec's order, not sorted
    assert table.loc[("train_size", "200")].tolist() == [1, 1, 0]
    assert table.loc[("train_size", "50")].tolist() == [0, 1, 1]
    assert table.loc[("frozen_layers", "-1")].tolist() == [1, 1, 0]
    assert table.loc[("total", "")].tolist() == [1, 2, 1]
