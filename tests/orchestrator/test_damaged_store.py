"""A damaged store costs only what is damaged: every command reads what it can and names what it
cannot; ``resume`` sets an unreadable file aside (kept) and runs its cells again; a damaged spec.yaml is
one clear error saying what to do. Nothing good is changed (byte-identical)."""

import subprocess
import sys
from pathlib import Path

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


def test_a_results_file_cut_in_half(write_spec, tmp_path):
    """Before: status, report and resume crashed with a pyarrow traceback, summary and query refused
    the whole sweep, and resume neither ran the damaged cells again nor set the file aside."""
    store, results = str(tmp_path / "store"), tmp_path / "store" / "cut" / "results"
    launch(load_spec(write_spec("cut", train_sizes=[24], frozen_layers=[0, 2])), show_progress=False)
    [good] = _parts(results)
    launch(load_spec(write_spec("cut", train_sizes=[24], frozen_layers=[0, 2], seeds=[0, 1])), show_progress=False)
    [cut] = set(_parts(results)) - {good}
    damaged = results / cut
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    kept = _parts(results)[good]

    status = _cli("status", "cut", "--store", store)
    assert status.returncode == 0, status.stderr
    assert f"warning: skipped 1 unreadable row file(s)" in status.stderr and cut in status.stderr
    assert "Traceback" not in status.stderr
    for command in (["summary", "cut"], ["query", "cut", "--sql", "SELECT count(*) AS n FROM results"],
                    ["report", "cut", "--out", str(tmp_path / "report")]):
        done = _cli(*command, "--store", store)
        assert done.returncode == 0 and cut in done.stderr, (command, done.stderr[-2000:])
    assert "n\n2" in _cli("query", "cut", "--store", store, "--format", "csv", "--sql",
                          "SELECT count(*) AS n FROM results").stdout

    resumed = _cli("resume", "cut", "--store", store)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "could not be read; moved to" in resumed.stderr and "2 already done" in resumed.stdout
    # its cells have rows again: taken from Ray's state of the launch that ran them, or run again
    assert "2 recovered from Ray's state" in resumed.stdout or "ran 2: 2 ok" in resumed.stdout
    assert _parts(results)[good] == kept  # the good rows: byte-identical
    [aside] = (tmp_path / "store" / "cut" / "_quarantine").iterdir()
    assert aside.name.endswith(cut) and aside.stat().st_size > 0  # set aside, never deleted
    assert "n\n4" in _cli("query", "cut", "--store", store, "--format", "csv", "--sql",
                          "SELECT count(*) AS n FROM results").stdout


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
