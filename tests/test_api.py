"""The Python API as a user calls it: a notebook-style script that imports only ``freezesweep``, runs a
tiny sweep on Ray with its output going to a file (as a cluster job's does), reads the rows, decides and
writes the report; the file shows a line per trial while the sweep runs."""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
import pickle
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

import freezesweep as fs

NOTEBOOK = textwrap.dedent("""
    import json, sys
    import freezesweep as fs

    spec_path, out = sys.argv[1], sys.argv[2]
    spec = fs.load_spec(spec_path)
    before = fs.plan(spec)
    summary = fs.launch(spec)
    after = fs.plan(spec)
    rows = fs.results_frame(spec)  # the spec names its sweep and store (a walk-through: AttributeError)
    arrow = fs.results_arrow(spec.name, store=spec.store, columns=["trial_id", "status"])
    counted = fs.results_duckdb(spec.name, store=spec.store).sql(
        "SELECT frozen_layers, count(*) AS n FROM results WHERE status = 'ok' GROUP BY 1 ORDER BY 1").fetchall()
    decisions = fs.decide(spec)
    report = fs.report([spec, spec.name], out, store=spec.store)  # one sweep, asked twice: read once
    print("RESULT " + json.dumps({
        "pending_before": len(before.pending), "pending_after": len(after.pending), "done_after": after.done,
        "summary": [summary.total, summary.ran, summary.ok, summary.failed, summary.unfinished],
        "rows": len(rows), "ok": int((rows["status"] == "ok").sum()), "curves": int(rows["eval_curve"].notna().sum()),
        "arrow": [arrow.num_rows, arrow.column_names], "counted": counted,
        "decisions": [[d.dataset, d.train_size, d.learned, d.sentence] for d in decisions],
        "frame": decisions.frame[["train_size", "sentence"]].values.tolist(),
        "report_sentences": report.decisions["sentence"].tolist(),
    }), flush=True)
""")


def _wait_for_lines(proc: subprocess.Popen, log: Path, timeout_s: float) -> list[str]:
    """The log's trial lines as first seen while the script still runs (empty if it ended first)."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        lines = [line for line in log.read_text().splitlines() if line.startswith("trial ")]
        if lines:
            return lines
        time.sleep(0.2)  # polling the log file: the condition is the line itself
    return []


def test_a_notebook_runs_a_sweep_reads_decides_and_reports(write_spec, tmp_path):
    spec_path = write_spec(
        "notebook", train_sizes=[48], frozen_layers=[0, 2], seeds=[0, 1, 2], resources={"max_concurrent_trials": 1}
    )
    script, log, out = tmp_path / "notebook.py", tmp_path / "stdout.log", tmp_path / "report"
    script.write_text(NOTEBOOK)
    with open(log, "w") as stdout:  # a file, not a terminal: the launch must write lines as it goes
        proc = subprocess.Popen(
            [sys.executable, str(script), str(spec_path), str(out)], stdout=stdout, stderr=subprocess.PIPE, text=True
        )
        seen_while_running = _wait_for_lines(proc, log, timeout_s=300)
        _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    assert seen_while_running, "no trial line reached the log before the launch ended"
    assert len(seen_while_running) < 6, "the first lines must be readable before the last trial ends"

    text = log.read_text()
    trial_lines = [line for line in text.splitlines() if line.startswith("trial ")]
    assert [line.split(":")[0] for line in trial_lines] == [f"trial {i}/6" for i in range(1, 7)]
    assert all(" ok " in line and "accuracy=" in line and line.endswith("s") for line in trial_lines), trial_lines
    assert any(line.startswith("progress: 6/6 ended (0 failed)") for line in text.splitlines())

    result = json.loads(text.split("RESULT ", 1)[1])
    assert (result["pending_before"], result["pending_after"], result["done_after"]) == (6, 0, 6)
    assert result["summary"] == [6, 6, 6, 0, 0]
    assert (result["rows"], result["ok"], result["curves"]) == (6, 6, 6)
    assert result["arrow"] == [6, ["trial_id", "status"]]
    assert result["counted"] == [[0, 3], [2, 3]]
    [decision] = result["decisions"]  # one dataset at one train size
    assert decision[1] == 48 and decision[2] in ("learned", "nothing learned", "undecided")
    assert result["frame"] == [[48, decision[3]]] and result["report_sentences"] == [decision[3]]  # once
    assert decision[3] in (out / "report.md").read_text()
    assert (out / "index.html").is_file()


def test_importing_freezesweep_stays_cheap():
    """Ray workers import freezesweep.trials through the top package: the API loads on first use."""
    code = (
        "import sys, freezesweep as fs; heavy = {'ray', 'torch', 'pandas', 'freezesweep.orchestrator.api'}; "
        "print(sorted(heavy & set(sys.modules))); fs.results_frame; "
        "print('freezesweep.orchestrator.api' in sys.modules)"
    )
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert shown[:2] == ["[]", "True"]
    assert fs.results_frame.__module__ == "freezesweep.orchestrator.api"
    assert set(fs.__all__) <= set(dir(fs))
    assert all(getattr(fs, name) is not None for name in fs.__all__)  # each exported name resolves
    assert set(fs.__all__) - {"__version__"} == set(fs._EXPORTS)  # the literal list and the lazy map agree
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        fs.nothing  # noqa: B018


def test_the_old_spelling_fs_results_is_the_subpackage_and_still_reads_rows_with_a_warning(tmp_path):
    """0.3's ``fs.results(...)`` shadowed the subpackage ``freezesweep.results``; the function is now
    ``fs.results_frame`` and, for one release, the subpackage answers the old call with a DeprecationWarning."""
    from freezesweep.results.store import SCHEMA, ResultStore

    assert (
        fs.results is sys.modules["freezesweep.results"]
        and fs.results.store is sys.modules["freezesweep.results.store"]
    )
    store = ResultStore(str(tmp_path), "old")
    store.write_spec("name: old\n")  # a stored sweep is one with a spec; read_rows reads only the rows
    for seed in (0, 1):
        store.write_row(
            {name: None for name in SCHEMA.names} | dict(sweep="old", trial_id=f"old-{seed}", seed=seed, status="ok")
        )
    with pytest.warns(DeprecationWarning, match=r"fs\.results_frame\(") as caught:
        old = fs.results("old", store=str(tmp_path), columns=["trial_id", "seed"])
    assert caught[0].filename == __file__  # the warning names the caller's line
    new = fs.results_frame("old", store=str(tmp_path), columns=["trial_id", "seed"])
    assert sorted(old["trial_id"]) == sorted(new["trial_id"]) == ["old-0", "old-1"]
    code = "import warnings, freezesweep as fs; warnings.simplefilter('error'); fs.results('x')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert "DeprecationWarning: fs.results(...) is now fs.results_frame(...)" in done.stderr  # before any import of it


def test_no_such_sweep_is_an_error_not_empty_rows(tmp_path):
    """A name the store does not hold is a LookupError, said in one sentence. Before: a SpecError whose
    message read as a spec file's ("<store>: 1 problem(s): - no sweep named …"); it is still one."""
    for read in (fs.results_frame, fs.status, fs.decide):
        with pytest.raises(fs.SweepNotFound) as caught:
            read("typo", store=str(tmp_path))
        assert isinstance(caught.value, LookupError) and isinstance(caught.value, fs.SpecError)
        assert str(caught.value).startswith("no sweep named 'typo' in store") and "problem(s)" not in str(caught.value)
    again = pickle.loads(pickle.dumps(caught.value))  # across a process or Ray: the same error
    assert (type(again), str(again), again.source) == (fs.SweepNotFound, str(caught.value), caught.value.source)


def test_a_sweep_is_its_name_its_spec_file_or_its_spec(write_spec, tmp_path):
    from freezesweep.orchestrator.api import located

    spec_path = write_spec("named")
    spec = fs.load_spec(spec_path)
    assert located(spec) == located(str(spec_path)) == located(spec_path) == ("named", spec.store)
    assert located(spec, store="elsewhere") == ("named", "elsewhere")  # a store given still wins
    with pytest.raises(TypeError, match="a sweep is its name, its spec file or its SweepSpec, not a dict"):
        fs.status({"name": "named"})


def test_a_report_names_every_sweep_it_cannot_find(tmp_path):
    """Not only the first: one error, before any sweep's rows are read, each store's names together."""
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(fs.SweepNotFound) as caught:
        fs.report(["nope1", "nope2", "nope1"], tmp_path / "out", store=str(tmp_path))
    assert str(caught.value).startswith("no sweep named 'nope1' or 'nope2' in store")  # each once
    elsewhere = tmp_path / "elsewhere"
    spec_path = elsewhere / "spec.yaml"
    elsewhere.mkdir()
    spec_path.write_text(f"name: theirs\nstore: {elsewhere}/store\n")
    with pytest.raises(fs.SweepNotFound) as caught:  # two stores: still a LookupError, each named
        fs.report(["nope1", str(spec_path)], tmp_path / "out", store=None)
    assert "no sweep named 'nope1' in store" in str(caught.value) and "'theirs'" in str(caught.value)
    (tmp_path / "README.md").write_text("a file")
    for out in ("README.md", "README.md/report"):  # a walk-through: a traceback after every row was read
        with pytest.raises(fs.SpecError, match=f"(?s)^report folder {tmp_path / out}: .*the report is a folder"):
            fs.report(["nope1"], tmp_path / out, store=str(tmp_path))
    if os.path.isdir("/proc"):  # nothing can be made there, root or not (a walk-through: a traceback)
        with pytest.raises(fs.SpecError, match="cannot make the report's folder in /proc"):
            fs.report(["nope1"], "/proc/forbidden", store=str(tmp_path))
    with pytest.raises(fs.SpecError) as caught:  # a path is not a sweep's name: a spec file that is not there
        fs.report(["nope1", f"{other}/spec.yaml", "nope2"], tmp_path / "out", store=str(tmp_path))
    assert caught.value.problems[0] == f"{other}/spec.yaml: no such spec file (looked for from {os.getcwd()})"
    assert caught.value.problems[1].startswith("no sweep named 'nope1' or 'nope2' in store")


def test_a_bad_spec_names_every_problem(tmp_path):
    with pytest.raises(fs.SpecError) as caught:
        fs.build_spec(name="bad name", model="m", datasets=[], train_sizes=[0], seeds=[0], store=str(tmp_path))
    problems = "\n".join(caught.value.problems)
    assert "name" in problems and "datasets" in problems and "train_sizes" in problems


def _stored_spec_and_rows(write_spec, name: str = "stored"):
    """A stored sweep as a launch leaves it: its resolved spec and a row per cell (k = 0 and k = 2 on
    seeds 0-2, the tiny spec's sizes), written directly: no Ray, no training."""
    from freezesweep.orchestrator.plan import build_grid
    from freezesweep.orchestrator.rows import result_row
    from freezesweep.orchestrator.sweeps import resolve_here
    from freezesweep.results.store import ResultStore
    from tests.factories import trial_result

    spec = fs.load_spec(write_spec(name, seeds=[0, 1, 2]))
    resolved = resolve_here(spec)
    store = ResultStore(spec.store, name)
    store.write_spec(resolved.spec.to_yaml())
    for cell in build_grid(resolved):
        acc = 0.8 - 0.001 * cell.frozen_layers + 0.01 * cell.seed
        store.write_row(
            result_row(name, dataclasses.replace(trial_result(acc=acc), config=cell, trial_id=cell.trial_id))
        )
    return spec


def test_every_entry_point_given_a_store_that_is_a_file_raises_store_error(write_spec, tmp_path):
    """Issue 36: the API's store error is exported, and a file where a store should be is said as one."""
    afile = tmp_path / "results.csv"
    afile.write_text("a,b\n")
    store = str(afile)
    spec_path = write_spec("tiny")
    calls = {
        "results_arrow": lambda: fs.results_arrow("tiny", store=store),
        "results_duckdb": lambda: fs.results_duckdb("tiny", store=store),
        "query": lambda: fs.query("tiny", "SELECT 1", store=store),
        "status": lambda: fs.status("tiny", store=store),
        "summary": lambda: fs.summary("tiny", store=store),
        "decide": lambda: fs.decide("tiny", store=store),
        "report": lambda: fs.report("tiny", tmp_path / "r", store=store),
        "compact": lambda: fs.compact("tiny", store=store),
        "export_mlflow": lambda: fs.export_mlflow("tiny", store=store, tracking_uri="sqlite:///unused.db"),
        "resume": lambda: fs.resume("tiny", store=store),
        "budget_prices": lambda: fs.budget_prices(pd.DataFrame(), "tiny", store=store),
    }
    for name, call in calls.items():
        with pytest.raises(fs.StoreError, match="is a file, not a folder"):
            call()
        assert not (tmp_path / "unused.db").exists(), name  # found out before MLflow is touched
    # a spec's store: one problem among the spec's, before anything runs
    for call in (lambda: fs.load_spec(spec_path, store=store), lambda: fs.plan(spec_path, store=store)):
        with pytest.raises(fs.SpecError, match="is a file, not a folder"):
            call()
    assert issubclass(fs.StoreError, RuntimeError) and "StoreError" in fs.__all__


def test_what_a_notebook_prints_stays_short(write_spec, tmp_path):
    """Issue 36: repr(fs.report(...)) was 313,540 characters of PNG bytes. Every object the API returns
    prints in a few hundred characters, and the decisions print as their sentences."""
    spec = _stored_spec_and_rows(write_spec)
    report = fs.report("stored", tmp_path / "r", store=spec.store)
    decisions = fs.decide("stored", store=spec.store)
    returned = {
        "load_spec": spec,
        "plan": fs.plan(spec),
        "status": fs.status("stored", store=spec.store),
        "decide": decisions,
        "a decision": decisions[0],
        "report": report,
    }
    for name, value in returned.items():
        assert len(repr(value)) < 1500, (name, len(repr(value)), repr(value)[:300])
    assert "figures" in repr(report) and "<DataFrame" in repr(report)
    assert str(report).splitlines()[0] == report.decisions["sentence"].iloc[0]
    assert str(decisions).splitlines() == [d.sentence for d in decisions]
    # (a new name: seeds added to the stored fixed grid, whose groups may have been decided, are refused)
    big_spec = fs.build_spec({**spec.model_dump(), "name": "big", "seeds": list(range(2_000))}, store=spec.store)
    big = fs.plan(big_spec)
    assert len(big.cells) == 8_000 and len(repr(big)) < 1500 and len(repr(big_spec)) < 1500
    assert "seeds=[2,000 values: 0, 1, …, 1999]" in repr(big_spec)


def test_plan_prints_no_warning_of_transformers(write_spec, tmp_path, minilm_tokenizer):
    """Before: plan of a checkpoint saved with a 3-class label map, on 2-class data, printed transformers'
    "You passed `num_labels=2` which is incompatible to the `id2label` map of length `3`" (a walk-through):
    the trial draws a head of the data's classes, as a launch (which said nothing) does."""
    import transformers
    from transformers import BertConfig

    from tests.conftest import save_tiny, tiny_encoder

    config = BertConfig(**tiny_encoder(minilm_tokenizer, num_labels=3))
    model = save_tiny(tmp_path / "three-labels", config, minilm_tokenizer)
    # transformers' own handler writes to the stderr of its import, not one pytest captures: a handler here
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    root = transformers.utils.logging.get_logger("transformers")
    root.addHandler(handler)
    try:
        transformers.logging.set_verbosity_warning()  # as a fresh process has it (another test may quieten it)
        fs.plan(write_spec(model=model))
    finally:
        root.removeHandler(handler)
    assert not [r for r in records if "num_labels" in r.getMessage()]
    assert transformers.logging.get_verbosity() == logging.WARNING  # the caller's own, given back (a review)


def test_compact_on_a_store_it_cannot_write_is_a_store_error(write_spec, monkeypatch):
    """A walk-through's read-only store: `compact` was a raw OSError traceback from the lock file (the
    readers, launch and resume said it in one line)."""
    import errno

    spec = _stored_spec_and_rows(write_spec)
    real_open = os.open

    def read_only(path, *args, **kwargs):
        if str(path).endswith("_lock.json"):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(fs.StoreError, match=r"cannot compact sweep 'stored' in .*: \[Errno 30\] Read-only"):
        fs.compact("stored", store=spec.store)


def test_plan_reads_a_store_it_cannot_write_and_says_a_launch_would_refuse_it(write_spec, monkeypatch):
    """A walk-through's read-only store (a colleague's results): `plan`, which only reads, refused it as a
    problem; it plans it now, saying so in a note, while a launch's checks still refuse it."""
    from freezesweep.orchestrator.checks import validate
    from freezesweep.results.store import ResultStore

    spec = _stored_spec_and_rows(write_spec)

    def read_only(self):
        raise fs.StoreError(f"cannot write to {self.uri!r}: [Errno 30] Read-only file system")

    monkeypatch.setattr(ResultStore, "check_writable", read_only)
    planned = fs.plan(write_spec("stored", seeds=[0, 1, 2]))
    assert planned.done == len(planned.cells) and not planned.pending
    assert [n for n in planned.notes if "plan only reads it; a launch from here would refuse it" in n]
    with pytest.raises(fs.SpecError) as info:
        validate(yaml.safe_load(spec.to_yaml()), devices=False)
    assert any("Read-only file system" in p for p in info.value.problems), info.value.problems


def test_an_interrupted_launch_says_so_where_the_caller_looks(write_spec, monkeypatch):
    """Issue 36: fs.launch interrupted returned quietly (the CLI printed the resume hint): the summary's
    repr leads with it, and a warning says it with the call that goes on."""
    from freezesweep.orchestrator import launch as launch_module

    def interrupted(spec, show_progress, session):
        return launch_module.LaunchSummary(8, 0, 3, 3, 0, unfinished=5, sweep=spec.name, store=spec.store)

    monkeypatch.setattr(launch_module, "launch", interrupted)
    spec = fs.load_spec(write_spec("cut"))
    with pytest.warns(fs.UnfinishedCellsWarning) as warned:
        summary = fs.launch(spec, progress=False)
    [warning] = warned
    resume = f"fs.resume('cut', store={spec.store!r}) runs them"
    assert "interrupted: 5 of 8 cells not finished (nothing was lost)" in str(warning.message)
    assert resume in str(warning.message)
    assert repr(summary).startswith("LaunchSummary(outcome=") and "interrupted: 5 of 8" in repr(summary)[:60]
    assert summary.unfinished == 5


def _tiny_store(root: Path, name: str = "api1") -> str:
    """A stored sweep as readers see it, without Ray or a model: a spec and two rows."""
    from freezesweep.results.store import SCHEMA, ResultStore

    store = ResultStore(str(root), name)
    store.write_spec(f"name: {name}\n")
    for seed in (0, 1):
        row = dict(sweep=name, trial_id=f"{name}-{seed}", seed=seed, frozen_layers=0, status="ok")
        store.write_row({column: None for column in SCHEMA.names} | row)
    return str(root)


def test_a_spec_that_differs_from_its_stored_sweep_still_reads_it(write_spec):
    """A walk-through: fs.results_frame(fs.build_spec(name='api1', …)) with the defaults' 10 epochs against a
    sweep stored at 2 was the launch's "changed from 2.0 to 10.0 … start a new sweep name": a spec made to read
    a sweep reads it as stored; plan (and launch) still refuse the changed protocol."""
    spec = _stored_spec_and_rows(write_spec)
    other = fs.build_spec({**spec.model_dump(), "training": {"epochs": 10}})  # refused before
    assert len(fs.results_frame(other)) == 12 and len(fs.decide(other)) == 2  # 2 sizes × 2 depths × 3 seeds
    with pytest.raises(fs.SpecError, match=r"training.epochs: changed from 2.0 to 10.0.*start a new sweep name"):
        fs.plan(other)
    with pytest.raises(fs.SpecError, match="is a file, not a folder"):  # the store's own problems still count
        fs.build_spec({**spec.model_dump(), "store": str(write_spec("tiny"))})


def test_a_stored_sweeps_name_or_yaml_text_given_as_a_spec_says_what_to_do(tmp_path, monkeypatch):
    """A walk-through: fs.launch("api1") said "no such file: api1"; YAML text was echoed whole as a missing
    file; bytes were a bare TypeError."""
    monkeypatch.chdir(tmp_path)
    store = _tiny_store(tmp_path / "store")
    for call in (fs.plan, fs.launch, fs.load_spec):
        with pytest.raises(fs.SpecError) as caught:
            call("api1", store=store)
        (problem,) = caught.value.problems
        assert f"sweep 'api1' is in store {store!r}" in problem
        assert (
            f"fs.resume('api1', store={store!r})" in problem and f"freezesweep resume api1 --store {store}" in problem
        )
        assert problem.endswith("that spec file is a spec like any other (plan it by its path)")  # a walk-through
    with pytest.raises(fs.SpecError, match="no such file: nope"):  # neither: as before
        fs.plan("nope", store=store)
    text = "name: x\nmodel: m\ndatasets: [glue/sst2]\n"
    with pytest.raises(fs.SpecError, match=r"looks like YAML text, not a file's path") as caught:
        fs.load_spec(text)
    assert "datasets" not in str(caught.value) and "yaml.safe_load(text)" in str(caught.value)
    with pytest.raises(TypeError, match="a spec is a YAML file's path .*, not bytes"):
        fs.load_spec(text.encode())


def test_columns_are_a_name_or_names_the_rows_have(tmp_path):
    """A walk-through: columns="frozen_layers" read as its letters ("Column f does not exist"); an unknown
    column was pyarrow's KeyError without the columns there are."""
    store = _tiny_store(tmp_path)
    assert fs.results_arrow("api1", store=store, columns="frozen_layers").column_names == ["frozen_layers"]
    frame = fs.results_frame("api1", store=store, columns="seed")  # with the columns it derives
    assert "seed" in frame and "frozen_layers" not in frame and len(frame) == 2
    for read in (fs.results_arrow, fs.results_frame):
        with pytest.raises(ValueError, match=r"no column 'nope', 'neither' in a sweep's rows; their columns: sweep, "):
            read("api1", store=store, columns=["seed", "nope", "neither"])
    with pytest.raises(TypeError, match="columns is a column's name or a list of names"):
        fs.results_arrow("api1", store=store, columns=[1])


def test_a_spec_launched_into_another_store_is_read_with_that_store(write_spec, tmp_path):
    """docs/api.md promised fs.decide(spec) after fs.launch(spec); after fs.launch(spec, store=ROOT) the spec
    still names its own store, and SweepNotFound said nothing of store=."""
    spec = fs.load_spec(write_spec("moved"))
    for read in (fs.decide, fs.results_frame, lambda s: fs.report(s, tmp_path / "out")):
        with pytest.raises(fs.SweepNotFound, match=r"this SweepSpec names store .*the same store=ROOT"):
            read(spec)
    with pytest.raises(fs.SweepNotFound) as caught:  # a name: no word of a SweepSpec
        fs.decide("moved", store=spec.store)
    assert "SweepSpec" not in str(caught.value)


def test_the_api_surface_says_what_the_cli_and_the_docs_say(tmp_path):
    """A walk-through's nits: `annotations` in dir(freezesweep); the reference list lacking names; fs.query
    without the CLI's default SQL; Report's repr printing a Series whole."""
    from freezesweep.orchestrator import cli
    from freezesweep.results.report import Report
    from tests.conftest import FOLDERS, REPO

    assert {n for n in dir(fs) if not n.startswith("_")} - set(fs.__all__) <= set(FOLDERS)
    reference = (REPO / "docs" / "api.md").read_text().split("## Reference", 1)[1]
    assert [n for n in fs.__all__ if n != "__version__" and f"`fs.{n}`" not in reference] == []
    store = _tiny_store(tmp_path)
    assert inspect.signature(cli.query).parameters["sql"].default == fs.query.__defaults__[0]
    assert fs.query("api1", store=store)["seed"].tolist() == [0, 1]
    empty = pd.DataFrame()
    report = Report(empty, empty, empty, empty, empty, [], [], {}, whole_split=pd.Series({"s": 2}))
    assert "whole_split=<Series 1 value>" in repr(report) and "dtype" not in repr(report)


def test_resume_given_an_edited_spec_file_says_it_runs_the_stored_one(write_spec, monkeypatch, capsys):
    """A walk-through: `resume FILE` after editing FILE (epochs 1 -> 2, a seed more) ran the stored sweep
    and said nothing of the edit."""
    from freezesweep.orchestrator import api
    from freezesweep.orchestrator.sweeps import resolve_here

    from freezesweep.results.store import ResultStore

    spec = fs.load_spec(write_spec("edited"))
    ResultStore(spec.store, "edited").write_spec(resolve_here(spec).spec.to_yaml())
    monkeypatch.setattr(api, "_launch", lambda raw, source, progress: raw)  # what would run, not run
    ran = fs.resume(write_spec("edited"))
    assert ran["training"]["epochs"] == 2 and "note:" not in capsys.readouterr().err  # the same: no word
    # as a launch resolves it (a review: one select metric for all, a model as a list, read as differing)
    fs.resume(write_spec("edited", model=[spec.model], training={"select_metric": "accuracy"}))
    assert "note:" not in capsys.readouterr().err
    ran = fs.resume(write_spec("edited", seeds=[0, 1], training={"epochs": 3}))
    said = capsys.readouterr().err
    assert ran["training"]["epochs"] == 2 and ran["seeds"] == [0]  # the stored sweep runs
    assert "note: resume runs sweep 'edited' as stored; its spec file differs (" in said
    assert "training.epochs: stored 2.0, the file 3.0" in said and "seeds: stored [0], the file [0, 1]" in said


def test_a_resume_run_from_the_launch_folder_keeps_the_callers_relative_environment(tmp_path, monkeypatch):
    """A review: inside the launch's folder a relative FREEZESWEEP_CACHE_DIR (its spool) named another folder."""
    from freezesweep.orchestrator import api

    (tmp_path / "launched").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FREEZESWEEP_CACHE_DIR", ".cache")
    with api._working_folder(str(tmp_path / "launched")):
        assert os.getcwd() == str(tmp_path / "launched")
        assert os.environ["FREEZESWEEP_CACHE_DIR"] == str(tmp_path / ".cache")
    assert os.getcwd() == str(tmp_path) and os.environ["FREEZESWEEP_CACHE_DIR"] == ".cache"
