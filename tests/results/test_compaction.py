"""The store at scale: final rows compacted into parts that every reader reads once, a compaction
killed at any step, stores from before compaction, and damaged row files that cost only themselves."""

from pathlib import Path

import duckdb
import pandas as pd
import polars as pl
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from tests.conftest import ok_ids

from freezesweep.results import store as store_module

from freezesweep.orchestrator.rows import result_row
from freezesweep.results.query import read_rows, sql
from freezesweep.results.store import ResultStore, SpoolingWriter
from tests.factories import trial_result


def _filled(tmp_path, ok: int = 6, failed: int = 2) -> ResultStore:
    store = ResultStore(str(tmp_path), "s")
    for seed in range(ok):
        store.write_row(result_row("s", trial_result(seed, acc=0.5 + seed / 100)))
    for seed in range(ok, ok + failed):
        store.write_row(result_row("s", trial_result(seed, status="failed")))
    return store


def _each_reader(folder: Path) -> dict[str, int]:
    """The row count each tool reads from results/ as the README shows, with no freezesweep code."""
    return {
        "pandas": len(pd.read_parquet(folder)),
        "duckdb": duckdb.sql(f"SELECT count(*) FROM read_parquet('{folder}/*.parquet')").fetchall()[0][0],
        "polars": pl.read_parquet(f"{folder}/*.parquet").height,
        "pyarrow": ds.dataset(str(folder)).count_rows(),
    }


def test_final_rows_become_one_part_that_every_reader_reads_once(tmp_path):
    store = _filled(tmp_path)
    before = store.read().sort_values("seed", ignore_index=True)
    assert store.compact() == 6
    files = sorted(p.name for p in (tmp_path / "s" / "results").iterdir())
    assert len(files) == 3 and files[-1].startswith("part-")  # one part and the two failed rows, each alone
    assert _each_reader(tmp_path / "s" / "results") == dict.fromkeys(["pandas", "duckdb", "polars", "pyarrow"], 8)
    after = store.read().sort_values("seed", ignore_index=True)
    pd.testing.assert_frame_equal(after, before)
    assert store.compact() == 0  # nothing new
    assert sql(store, "SELECT count(*) AS n FROM results")["n"][0] == 8
    # a failed cell's retry still replaces its row; the compacted ok rows stay as they were
    store.write_row(result_row("s", trial_result(6)))
    assert store.statuses()[trial_result(6).trial_id] == "ok" and len(store.read()) == 8


def _killed_compacting(store: ResultStore, step: str) -> None:
    """A compaction killed at ``step`` (the process gone: nothing after it runs)."""

    def die(at: str) -> None:
        if at == step:
            raise SystemExit(f"killed at {at}")

    store.on_compaction_step = die
    with pytest.raises(SystemExit):
        store.compact()
    store.on_compaction_step = None


@pytest.mark.parametrize("step", ["staged", "half absorbed", "absorbed", "committed"])
def test_a_compaction_killed_at_any_step_loses_nothing_and_doubles_nothing(tmp_path, step):
    store = _filled(tmp_path)
    expected = store.read().sort_values("trial_id", ignore_index=True)
    _killed_compacting(store, step)
    folder = tmp_path / "s" / "results"
    plain = _each_reader(folder)
    assert len(set(plain.values())) == 1 and plain["pandas"] <= 8  # a plain reader may miss rows, never doubles
    pd.testing.assert_frame_equal(store.read().sort_values("trial_id", ignore_index=True), expected)
    store.recover_compaction()  # the next launch (or compact) finishes or undoes it
    assert _each_reader(folder)["pandas"] == 8 and not list((tmp_path / "s" / "_compacting").rglob("*.parquet"))
    store.compact()
    pd.testing.assert_frame_equal(store.read().sort_values("trial_id", ignore_index=True), expected)
    assert _each_reader(folder)["duckdb"] == 8


def test_a_finished_compaction_leaves_no_compacting_folder(tmp_path):
    """A walk-through: every compaction left an empty _compacting/ in the sweep's folder. An interrupted
    one's files stay there for recovery, which the next compaction finishes, folder and all."""
    store = _filled(tmp_path)
    _killed_compacting(store, "absorbed")
    assert list((tmp_path / "s" / "_compacting").rglob("*.parquet"))
    assert store.compact() == 6
    assert not (tmp_path / "s" / "_compacting").exists()
    assert store.compact() == 0 and not (tmp_path / "s" / "_compacting").exists()


def test_a_store_from_before_compaction_is_read_and_compacted(tmp_path):
    """One file per cell, as every store was before: read as it is, then compacted to one part."""
    store = _filled(tmp_path, ok=40, failed=0)
    assert len(list((tmp_path / "s" / "results").iterdir())) == 40
    assert len(read_rows(store)) == 40
    assert store.compact() == 40
    assert [p.name[:5] for p in (tmp_path / "s" / "results").iterdir()] == ["part-"]
    assert len(read_rows(store)) == 40 and ok_ids(store) == {trial_result(s).trial_id for s in range(40)}


def test_many_single_row_files_are_read_and_compacted_a_batch_at_a_time(tmp_path, monkeypatch):
    """Memory holds one batch of files, not the store (a dataset over 20,000 files held every footer):
    readers get the rows batch by batch, and compact writes its part one row group per batch."""
    monkeypatch.setattr(store_module, "FILES_PER_BATCH", 4)
    store = _filled(tmp_path, ok=10, failed=2)
    whole = ds.dataset(str(tmp_path / "s" / "results")).to_table().to_pandas()
    batches = list(store.read_batches(store.row_files(), ["trial_id", "status"]))
    assert [len(files) for files, _ in batches] == [4, 4, 4]
    before = store.read().sort_values("trial_id", ignore_index=True)
    pd.testing.assert_frame_equal(before, whole.sort_values("trial_id", ignore_index=True), check_dtype=False)
    query = "SELECT count(*) AS n, sum(best_val_accuracy) AS total FROM results"
    total = before["best_val_accuracy"].sum()
    assert sql(store, query).to_dict("records") == [{"n": 12, "total": pytest.approx(total)}]
    assert store.compact() == 10
    [part] = (tmp_path / "s" / "results").glob("part-*.parquet")
    assert pq.ParquetFile(part).metadata.num_row_groups == 3  # every batch holds final rows
    pd.testing.assert_frame_equal(store.read().sort_values("trial_id", ignore_index=True), before)
    for seed in range(12, 17):  # more rows than a batch beside the part: the part's dataset and these rows
        store.write_row(result_row("s", trial_result(seed, acc=0.6)))
    assert sql(store, query).to_dict("records") == [{"n": 17, "total": pytest.approx(total + 3)}]


def test_a_damaged_row_file_costs_only_its_row(tmp_path):
    """A file cut in half: readers skip it and name it, the other rows stay readable and unchanged;
    quarantine moves it aside (kept) so its cell runs again."""
    store = _filled(tmp_path, ok=4, failed=0)
    damaged = tmp_path / "s" / "results" / f"{trial_result(2).trial_id}.parquet"
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    good = {p.name: p.read_bytes() for p in (tmp_path / "s" / "results").iterdir() if p != damaged}
    assert set(store.statuses()) == {trial_result(s).trial_id for s in (0, 1, 3)}
    assert store.unreadable == [str(damaged)]
    assert sql(store, "SELECT count(*) AS n FROM results")["n"][0] == 3 and store.unreadable == [str(damaged)]
    assert store.quarantine_unreadable() == [str(damaged)]
    [kept] = (tmp_path / "s" / "_quarantine").iterdir()
    assert kept.name.endswith(damaged.name) and kept.stat().st_size > 0
    assert {p.name: p.read_bytes() for p in (tmp_path / "s" / "results").iterdir()} == good  # byte-identical


def test_the_spool_is_the_stores_however_it_is_spelled_and_never_overwrites_a_newer_row(tmp_path, monkeypatch):
    """Before: spooled under the store's spelling, a resume spelled differently ran the cells again,
    and a later one wrote the older spooled rows over the newer ones."""
    from freezesweep.orchestrator.launch import spool_dir

    monkeypatch.chdir(tmp_path)
    absolute, relative = ResultStore(str(tmp_path / "full"), "s"), ResultStore("full/", "s")
    assert spool_dir(absolute) == spool_dir(relative)
    old = result_row("s", trial_result(0, status="failed"))
    SpoolingWriter(absolute, spool_dir(absolute))._spool(old)  # the store was full when this row came
    newer = result_row("s", trial_result(0, status="failed"))  # a later attempt of the same cell, stored
    relative.write_row(newer)
    stored = (tmp_path / "full" / "s" / "results" / f"{trial_result(0).trial_id}.parquet").read_bytes()
    sink = SpoolingWriter(relative, spool_dir(relative))
    assert sink.flush() == 0  # flushed: the spool is empty
    assert (tmp_path / "full" / "s" / "results" / f"{trial_result(0).trial_id}.parquet").read_bytes() == stored
    final = result_row("s", trial_result(1))
    relative.write_row(final)
    SpoolingWriter(absolute, spool_dir(absolute))._spool(result_row("s", trial_result(1, status="failed")))
    assert sink.flush() == 0 and relative.statuses()[trial_result(1).trial_id] == "ok"  # ok rows stay final


# --- issue 29: damaged files and interrupted compactions meet compact as they meet resume ---------------
def _rows(store: ResultStore) -> pd.DataFrame:
    return store.read().sort_values("trial_id", ignore_index=True)


def test_compact_sets_an_unreadable_row_file_aside_and_compacts_the_rest(tmp_path):
    """Before: ArrowInvalid (magic bytes not found), a traceback, and nothing compacted."""
    store = _filled(tmp_path, ok=4, failed=0)
    damaged = tmp_path / "s" / "results" / f"{trial_result(2).trial_id}.parquet"
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    good = _rows(store)
    assert store.compact() == 3  # the damaged file stays where it is, named by every reader
    pd.testing.assert_frame_equal(_rows(store), good)
    notes = store.make_ready().notes()  # what `compact` and `resume` run first, under the lock
    assert notes == [
        f"warning: {damaged} could not be read; moved to {store.quarantine_dir} (kept) and its cell runs again"
    ]
    [kept] = (tmp_path / "s" / "_quarantine").iterdir()
    assert kept.name.endswith(damaged.name) and kept.stat().st_size > 0
    pd.testing.assert_frame_equal(_rows(store), good)  # the good rows: the same values
    assert _each_reader(tmp_path / "s" / "results")["duckdb"] == 3


def test_an_interrupted_compaction_is_named_then_finished(tmp_path):
    """Before: plain readers missed the absorbed rows until the next compact or resume, and nothing said so."""
    from freezesweep.results.lock import store_notes

    store = _filled(tmp_path, ok=8, failed=2)
    expected = _rows(store)

    def die(at: str) -> None:
        if at == "absorbed":
            raise SystemExit("killed")

    store.on_compaction_step = die
    with pytest.raises(SystemExit):
        store.compact()
    store.on_compaction_step = None
    assert _each_reader(tmp_path / "s" / "results")["pandas"] == 2  # the final rows moved out of results/
    [note] = store_notes(store)
    assert note.startswith("note: an interrupted compaction holds 8 row file(s) in ") and "compact s" in note
    assert store.make_ready().notes() == [
        "note: finished an interrupted compaction (8 row file(s) back in view of every reader of results/)"
    ]
    assert store_notes(store) == [] and _each_reader(tmp_path / "s" / "results")["pandas"] == 10
    pd.testing.assert_frame_equal(_rows(store), expected)


def test_a_lock_whose_holder_is_gone_is_named(tmp_path):
    import json
    import subprocess
    import sys

    from freezesweep.results.lock import SweepLock, store_notes

    store = _filled(tmp_path, ok=1, failed=0)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    holder = {
        "host": __import__("socket").gethostname(),
        "pid": int(gone.stdout),
        "token": "t",
        "started_at": 0.0,
        "heartbeat_at": 0.0,
    }
    (tmp_path / "s" / "_lock.json").write_text(json.dumps(holder))
    (tmp_path / "s" / "_lock.t.tmp").write_bytes(b"")  # its heartbeat was cut by the kill
    [note] = store_notes(store)
    assert note.startswith(f"note: a stale lock: {tmp_path}/s/_lock.json names pid {holder['pid']}")
    with SweepLock(store.fs, store.sweep_dir):
        assert not (tmp_path / "s" / "_lock.t.tmp").exists()  # the dead holder's temp file goes with its lock
    assert store_notes(store) == [] and not list((tmp_path / "s").glob("_lock.*.tmp"))
    # a walk-through's status mid-launch showed missing cells, not that a launch holds the sweep: a live
    # process (this test's parent) holds it, its heartbeat fresh
    live = holder | {"pid": __import__("os").getppid(), "heartbeat_at": __import__("time").time()}
    (tmp_path / "s" / "_lock.json").write_text(json.dumps(live))
    [held] = store_notes(store)
    assert held.startswith(f"note: the sweep is running now (pid {live['pid']} on host ")


@pytest.mark.parametrize("damage", ["pages", "footer"])
def test_a_damaged_part_says_how_many_cells_run_again(tmp_path, damage):
    """Issue 36: a compacted part of 4 rows set aside was said as "its cell runs again"."""
    store = _filled(tmp_path, ok=4, failed=0)
    assert store.compact() == 4
    [part] = (tmp_path / "s" / "results").glob("part-*.parquet")
    payload = bytearray(part.read_bytes())
    if damage == "pages":  # every byte of the rows overwritten, the footer (which counts them) intact
        rows_end = len(payload) - 8 - int.from_bytes(payload[-8:-4], "little")  # footer, its length, PAR1
        payload[4:rows_end] = b"\xff" * (rows_end - 4)
    else:  # cut in half: the footer is gone with the rest
        del payload[len(payload) // 2 :]
    part.write_bytes(bytes(payload))
    [note] = store.make_ready().notes()
    again = (
        "the 4 cells whose rows it held run again"
        if damage == "pages"
        else "the cells whose rows it held (a compacted part: several, its footer lost too) run again"
    )
    assert note == f"warning: {part} could not be read; moved to {store.quarantine_dir} (kept) and {again}"
    assert store.statuses() == {}  # all four cells are missing now: a launch runs them again


# --- issue 35: an array's final rows, written together as one file -----------------------------------
def test_rows_written_together_are_one_file_every_reader_reads_once(tmp_path):
    """An array's members over at one step: their final rows as one file (one footer, one staged write,
    one rename: the driver's cost per row divided), any other row alone; compact absorbs the file."""
    store = ResultStore(str(tmp_path), "s")
    rows = [result_row("s", trial_result(seed, acc=0.6 + seed / 100)) for seed in range(3)]
    rows += [result_row("s", trial_result(3, status="failed"))]
    written = store.write_rows(rows)
    folder = tmp_path / "s" / "results"
    together = [p for p in folder.iterdir() if p.name.startswith(store_module.ROWS_PREFIX)]
    assert len(written) == 2 and len(together) == 1 and pq.ParquetFile(together[0]).metadata.num_rows == 3
    assert _each_reader(folder) == dict.fromkeys(["pandas", "duckdb", "polars", "pyarrow"], 4)
    assert store.statuses() == {
        **{trial_result(s).trial_id: "ok" for s in range(3)},
        trial_result(3).trial_id: "failed",
    }
    assert store.stored(trial_result(1).trial_id)[0] == "ok"  # the spool's check finds a row written together
    assert store.compactable(store.statuses()) == 1
    before = _rows(store)
    assert sql(store, "SELECT count(*) AS n FROM results")["n"][0] == 4
    assert store.compact() == 1  # the file of three rows, absorbed whole
    assert store.stored(trial_result(1).trial_id)[0] == "ok"  # and in a part (this raised TypeError before)
    assert sorted(p.name[:5] for p in folder.iterdir()) == sorted(["part-", f"{trial_result(3).trial_id}"[:5]])
    pd.testing.assert_frame_equal(_rows(store), before)


def test_a_final_row_written_together_replaces_the_cells_failed_row(tmp_path):
    """A cell whose earlier attempt failed (its single-row file) and whose retry ran in an array: the
    failed file goes as the array's file comes, so no reader sees the cell twice; a write killed before
    its rename leaves the failed row where it was (nothing lost)."""
    store = ResultStore(str(tmp_path), "s")
    store.write_row(result_row("s", trial_result(0, status="failed")))
    rows = [result_row("s", trial_result(seed)) for seed in (0, 1)]

    def killed(fs, staged):
        raise SystemExit("killed before the rename")

    store.on_staged = killed
    with pytest.raises(SystemExit):
        store.write_rows(rows, replacing={trial_result(0).trial_id})
    store.on_staged = None
    assert store.statuses() == {trial_result(0).trial_id: "failed"}
    store.clean_staging()
    store.write_rows(rows, replacing={trial_result(0).trial_id})
    assert _each_reader(tmp_path / "s" / "results") == dict.fromkeys(["pandas", "duckdb", "polars", "pyarrow"], 2)
    assert store.statuses() == {trial_result(0).trial_id: "ok", trial_result(1).trial_id: "ok"}


def test_rows_written_together_while_the_store_is_away_wait_in_the_spool(tmp_path, monkeypatch):
    """The store unreachable: each row waits in the spool, then reaches the store once; a row the store
    took before it went away is not written twice."""
    store = ResultStore(str(tmp_path / "store"), "s")
    sink = SpoolingWriter(store, str(tmp_path / "spool"))
    rows = [result_row("s", trial_result(seed)) for seed in range(3)]

    def away(*args, **kwargs):
        raise OSError("store unreachable")

    monkeypatch.setattr(store, "write_rows", away)
    assert not sink.write_rows(rows)
    assert len(sink.pending()) == 3
    monkeypatch.undo()
    store.write_row(rows[0])  # the first reached the store before it went away
    assert sink.flush() == 0 and sorted(store.statuses()) == sorted(trial_result(s).trial_id for s in range(3))
    assert _each_reader(tmp_path / "store" / "s" / "results")["duckdb"] == 3


def test_a_spooled_row_reaches_a_store_that_has_a_part(tmp_path):
    """Before: the spool's check (``stored``) read the parts with a filter ParquetDataset.read does not
    take, so a resume after an outage raised TypeError wherever a round had been compacted."""
    from freezesweep.orchestrator.launch import spool_dir

    store = _filled(tmp_path, ok=3, failed=0)
    assert store.compact() == 3
    sink = SpoolingWriter(store, spool_dir(store))
    sink._spool(result_row("s", trial_result(7)))  # the store was away when this row came
    sink._spool(result_row("s", trial_result(1, status="failed")))  # an older attempt of a compacted cell
    assert sink.flush() == 0
    assert store.statuses() == {trial_result(s).trial_id: "ok" for s in (0, 1, 2, 7)}


class _Undeletable:
    """The store's filesystem, where no file can be deleted (permissions, an object store's passing
    error)."""

    def __init__(self, fs):
        self._fs = fs

    def __getattr__(self, name):
        return getattr(self._fs, name)

    def delete_file(self, path):
        raise PermissionError(f"cannot delete {path}")


def test_a_failed_row_that_cannot_be_deleted_stops_the_write_and_the_rows_wait(tmp_path):
    """The rows' file would hold a cell whose failed single-row file stays: a plain reader would see the
    cell twice for good. The write stops instead; its rows wait in the spool and replace the file later."""
    store = ResultStore(str(tmp_path / "store"), "s")
    store.write_row(result_row("s", trial_result(0, status="failed")))
    sink = SpoolingWriter(store, str(tmp_path / "spool"))
    real, store.fs = store.fs, _Undeletable(store.fs)
    assert not sink.write_rows(
        [result_row("s", trial_result(seed)) for seed in (0, 1)], replacing={trial_result(0).trial_id}
    )
    store.fs = real
    assert store.statuses() == {trial_result(0).trial_id: "failed"} and len(sink.pending()) == 2
    assert sink.flush() == 0
    assert _each_reader(tmp_path / "store" / "s" / "results")["duckdb"] == 2
    assert store.statuses() == {trial_result(0).trial_id: "ok", trial_result(1).trial_id: "ok"}


def test_a_driver_that_lost_the_sweep_while_staging_deletes_and_moves_nothing(tmp_path):
    """The lock is checked again between the staged write and the delete and move it makes."""
    from freezesweep.results.lock import LockLost

    store = ResultStore(str(tmp_path), "s")
    store.write_row(result_row("s", trial_result(0, status="failed")))
    checks = []

    def guard():
        checks.append(1)
        if len(checks) > 1:
            raise LockLost("the sweep was taken over")

    store.guard = guard
    with pytest.raises(LockLost):
        store.write_rows([result_row("s", trial_result(seed)) for seed in (0, 1)], replacing={trial_result(0).trial_id})
    assert len(checks) == 2 and store.statuses() == {trial_result(0).trial_id: "failed"}
    assert not list((tmp_path / "s" / "_staging").iterdir())


def _an_earlier_versions_part(tmp_path, dropped: tuple[str, ...]) -> ResultStore:
    """A store whose part an earlier freezesweep wrote: the same rows without columns added since."""
    store = _filled(tmp_path, ok=4, failed=0)
    store.compact()
    (part,) = (tmp_path / "s" / "results").glob("part-*.parquet")
    pq.write_table(pq.read_table(part).drop_columns(list(dropped)), part)
    return store


def test_parts_of_an_earlier_version_are_rewritten_in_todays_columns(tmp_path):
    """An upgrade walk-through: today's rows beside an earlier version's part left results/ in two schemas;
    DuckDB's and Polars' globs refused the column the old part lacks, pandas dropped it from every row."""
    dropped = ("collapsed", "baseline_rows", "optimisations", "gpu_mps")
    store = _an_earlier_versions_part(tmp_path, dropped)
    before = store.read().set_index("trial_id").drop(columns=list(dropped))
    for seed in (4, 5):
        store.write_row(result_row("s", trial_result(seed, acc=0.6)))
    assert store.compact() == 3  # the old part (rewritten on its own) and the two new rows' files
    folder = tmp_path / "s" / "results"
    parts = list(folder.glob("*.parquet"))
    assert len(parts) == 2 and all(pq.read_schema(p).names == list(store_module.SCHEMA.names) for p in parts)
    assert len(pd.read_parquet(folder, columns=["trial_id", "collapsed"])) == 6
    assert duckdb.sql(f"SELECT count(*) FROM read_parquet('{folder}/*.parquet') WHERE collapsed").fetchall() == [(0,)]
    assert pl.read_parquet(f"{folder}/*.parquet").select("collapsed").height == 6
    after = store.read().set_index("trial_id")
    pd.testing.assert_frame_equal(after.loc[before.index, before.columns], before)
    assert after.loc[before.index, "collapsed"].isna().all()  # what the old rows never said stays unsaid


def test_compact_alone_brings_an_earlier_versions_part_to_todays_columns(tmp_path):
    store = _an_earlier_versions_part(tmp_path, ("gpu_mps",))
    assert store.compact() == 1
    (part,) = (tmp_path / "s" / "results").glob("*.parquet")
    assert "gpu_mps" in pq.read_schema(part).names and len(store.read()) == 4
    assert store.compact() == 0  # today's part is left as it is


@pytest.mark.parametrize("step", ["staged", "absorbed", "committed"])  # one file each: no half-way
def test_an_upgrade_killed_at_any_step_loses_nothing_and_doubles_nothing(tmp_path, step):
    """A review: an earlier version's part is rewritten on its own (streamed by row group), with the same
    crash-safe steps as any compaction."""
    store = _an_earlier_versions_part(tmp_path, ("gpu_mps",))
    store.write_row(result_row("s", trial_result(4, acc=0.6)))
    expected = store.read().sort_values("trial_id", ignore_index=True)
    _killed_compacting(store, step)
    assert len(pd.read_parquet(tmp_path / "s" / "results", columns=["trial_id"])) <= 5  # may miss, never doubles
    pd.testing.assert_frame_equal(store.read().sort_values("trial_id", ignore_index=True), expected)
    store.recover_compaction()
    store.compact()
    pd.testing.assert_frame_equal(store.read().sort_values("trial_id", ignore_index=True), expected)
    assert _each_reader(tmp_path / "s" / "results") == dict.fromkeys(["pandas", "duckdb", "polars", "pyarrow"], 5)


def test_a_reader_whose_listing_a_compaction_overtook_reads_every_row(tmp_path, monkeypatch):
    """A review: a reader that listed the files, then met a compaction's commit, called the moved files
    unreadable and their cells missing (status, report or plan beside a launch's rounds)."""
    writer = _filled(tmp_path, ok=4, failed=0)
    reader = ResultStore(str(tmp_path), "s")
    listed = reader.row_files()
    writer.compact()  # between the reader's listing and its reading
    calls = iter([listed])
    monkeypatch.setattr(reader, "row_files", lambda: next(calls, None) or ResultStore.row_files(reader))
    assert len(reader.read_table(columns=["trial_id"])) == 4 and reader.unreadable == []
