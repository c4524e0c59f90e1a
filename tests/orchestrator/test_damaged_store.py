"""A damaged store costs only what is damaged: every command reads what it can and names what it
cannot; ``resume`` sets an unreadable file aside (kept) and runs its cells again; a damaged spec.yaml is
one clear error saying what to do. Nothing good is changed (byte-identical)."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from freezesweep.orchestrator.checks import load_spec
from freezesweep.orchestrator.launch import launch

CLI = [sys.executable, "-m", "freezesweep.orchestrator.cli"]


@pytest.fixture(scope="module", autouse=True)
def _ray_once():
    yield
    import ray

    ray.shutdown()


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=600)


def _parts(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.parquet"))}


@pytest.mark.slow  # a long end-to-end run: `make test-slow` (CI runs both suites)
def test_a_results_file_cut_in_half(write_spec, tmp_path):
    """Before: status, report and resume crashed with a pyarrow traceback, summary and query refused
    the whole sweep, and resume neither ran the damaged cells again nor set the file aside."""
    store, results = str(tmp_path / "store"), tmp_path / "store" / "cut" / "results"
    launch(load_spec(write_spec("cut", train_sizes=[24], frozen_layers=[0, 2])), show_progress=False)
    [good] = _parts(results)
    # a second launch, a second file: a grown size (a fixed grid's seeds may not grow once it may have
    # been decided: orchestrator/checks.py)
    launch(load_spec(write_spec("cut", train_sizes=[24, 48], frozen_layers=[0, 2])), show_progress=False)
    [cut] = set(_parts(results)) - {good}
    damaged = results / cut
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    kept = _parts(results)[good]

    status = _cli("status", "cut", "--store", store)
    assert status.returncode == 0, status.stderr
    assert "warning: skipped 1 unreadable row file(s)" in status.stderr and cut in status.stderr
    assert "`, fs.resume in Python, moves them aside" in status.stderr  # a notebook's words too
    assert "Traceback" not in status.stderr
    for command in (
        ["summary", "cut"],
        ["query", "cut", "--sql", "SELECT count(*) AS n FROM results"],
        ["report", "cut", "--out", str(tmp_path / "report")],
    ):
        done = _cli(*command, "--store", store)
        assert done.returncode == 0 and cut in done.stderr, (command, done.stderr[-2000:])
    assert (
        "n\n2"
        in _cli(
            "query", "cut", "--store", store, "--format", "csv", "--sql", "SELECT count(*) AS n FROM results"
        ).stdout
    )

    resumed = _cli("resume", "cut", "--store", store)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "could not be read; moved to" in resumed.stderr and "2 already done" in resumed.stdout
    # its cells have rows again: taken from Ray's state of the launch that ran them, or run again
    assert "2 recovered from Ray's state" in resumed.stdout or "ran 2: 2 ok" in resumed.stdout
    assert _parts(results)[good] == kept  # the good rows: byte-identical
    [aside] = (tmp_path / "store" / "cut" / "_quarantine").iterdir()
    assert aside.name.endswith(cut) and aside.stat().st_size > 0  # set aside, never deleted
    assert (
        "n\n4"
        in _cli(
            "query", "cut", "--store", store, "--format", "csv", "--sql", "SELECT count(*) AS n FROM results"
        ).stdout
    )


def test_garbage_in_spec_yaml_is_one_clear_error(tmp_path):
    """Before: status and resume crashed with a YAML traceback."""
    sweep = tmp_path / "store" / "garbled"
    sweep.mkdir(parents=True)
    (sweep / "spec.yaml").write_bytes(b"name: [\x00\xff garbage : : {")
    for command in ("status", "resume", "report"):
        extra = ["--out", str(tmp_path / "r")] if command == "report" else []
        done = _cli(command, "garbled", "--store", str(tmp_path / "store"), *extra)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (command, done.stderr)
        assert f"freezesweep {command}: error:" in done.stderr and "damaged" in done.stderr
        assert "relaunch the sweep's original spec file under the same name" in done.stderr


# --- issue 29: compact meets damage as resume does; status names an interrupted compaction ------------
def _stored_sweep(write_spec, tmp_path, name: str = "s", ok: int = 6):
    """A stored sweep with ``ok`` rows, made without running anything (the CLI reads its spec)."""
    from freezesweep.orchestrator.rows import result_row
    from freezesweep.orchestrator.sweeps import resolve_here
    from freezesweep.results.store import ResultStore
    from tests.factories import trial_result

    spec = resolve_here(load_spec(write_spec(name))).spec
    store = ResultStore(spec.store, name)
    store.write_spec(spec.to_yaml())
    for seed in range(ok):
        store.write_row(result_row(name, trial_result(seed)))
    return store


def test_compact_names_and_sets_aside_an_unreadable_row_file(write_spec, tmp_path):
    """Before: `compact` ended in a traceback (ArrowInvalid … magic bytes not found), nothing compacted."""
    from typer.testing import CliRunner

    from freezesweep.orchestrator.cli import app

    store = _stored_sweep(write_spec, tmp_path)
    results = Path(store.results_dir)
    damaged = sorted(results.glob("*.parquet"))[2]
    damaged.write_bytes(damaged.read_bytes()[:100])
    good = store.read().sort_values("trial_id", ignore_index=True)
    done = CliRunner().invoke(app, ["compact", "s", "--store", store.uri])
    assert done.exit_code == 0, done.output
    assert f"warning: {damaged} could not be read; moved to" in done.output and "5 row file(s) compacted" in done.output
    assert [p.name[:5] for p in results.iterdir()] == ["part-"]
    [aside] = Path(store.quarantine_dir).iterdir()
    assert aside.name.endswith(damaged.name)
    assert store.read().sort_values("trial_id", ignore_index=True).equals(good)


def test_status_names_an_interrupted_compaction_and_compact_finishes_it(write_spec, tmp_path):
    """Before: plain readers saw 0 of 6 rows after a compaction killed mid-way, and status said nothing."""
    from typer.testing import CliRunner

    from freezesweep.orchestrator.cli import app

    store = _stored_sweep(write_spec, tmp_path)

    def die(at: str) -> None:
        if at == "absorbed":
            raise SystemExit("killed")

    store.on_compaction_step = die
    with pytest.raises(SystemExit):
        store.compact()
    runner = CliRunner()
    status = runner.invoke(app, ["status", "s", "--store", store.uri])
    assert status.exit_code == 0 and "an interrupted compaction holds 6 row file(s)" in status.output, status.output
    done = runner.invoke(app, ["compact", "s", "--store", store.uri])
    assert (
        "finished an interrupted compaction (6 row file(s)" in done.output and "6 row file(s) compacted" in done.output
    )
    assert "interrupted compaction" not in runner.invoke(app, ["status", "s", "--store", store.uri]).output
    assert len(pd.read_parquet(store.results_dir)) == 6


def test_resume_says_how_many_spooled_rows_it_wrote(tmp_path, capsys):
    """Before: the rows kept while the store was away were written without a word."""
    from freezesweep.orchestrator.launch import flush_or_fail, spool_dir
    from freezesweep.orchestrator.rows import result_row
    from freezesweep.results.store import ResultStore, SpoolingWriter
    from tests.factories import trial_result

    store = ResultStore(str(tmp_path / "store"), "s")
    sink = SpoolingWriter(store, spool_dir(store))
    for seed in range(3):
        sink._spool(result_row("s", trial_result(seed)))
    flush_or_fail(sink, announce=True)
    assert f"note: wrote 3 row(s) kept in the spool ({sink.spool_dir})" in capsys.readouterr().err
    assert len(store.statuses()) == 3
    flush_or_fail(sink, announce=True)
    assert capsys.readouterr().err == ""  # nothing waited: nothing said
