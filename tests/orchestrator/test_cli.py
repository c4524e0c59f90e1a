"""orchestrator/cli.py in units (typer's runner, in process): one trial uses the sweep's own protocol
defaults, and every error names the command that was run."""

import json
import math
import re

import pytest
from typer.testing import CliRunner

from freezesweep.orchestrator.checks import load_spec
from freezesweep.orchestrator.cli import app
from freezesweep.orchestrator.plan import build_grid
from freezesweep.orchestrator.sweeps import resolve_here

runner = CliRunner()


def test_one_trial_is_the_sweeps_cell_with_the_same_axes(write_spec, tiny_bert, toy_dataset):
    """`freezesweep trial` and a sweep build a cell from one definition (TrainingSpec, whose defaults are
    TrialConfig's): the same axes and options give the same cell, trial_id and all."""
    done = runner.invoke(
        app,
        [
            "trial",
            "--model",
            tiny_bert,
            "--dataset",
            toy_dataset,
            "--train-size",
            "24",
            "--frozen-layers",
            "0",
            "--epochs",
            "1",
            "--precision",
            "fp32",
            "--json",
        ],
    )
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout.strip().splitlines()[-1])
    spec = load_spec(
        write_spec(
            "one",
            train_sizes=[24],
            frozen_layers=[0],
            training={"epochs": 1, "learning_rate": 5e-5, "eval_batch_size": 64},
        )
    )
    [cell] = build_grid(resolve_here(spec))
    assert result["status"] == "ok" and result["trial_id"] == cell.trial_id
    machine = ("data_dir", "num_threads", "gpus_per_trial")  # how it runs here, not what it is
    protocol = {k: v for k, v in result["config"].items() if k not in machine}
    assert protocol == {k: v for k, v in cell.to_dict().items() if k not in machine}


def test_one_trial_takes_all_layers_and_a_sequence_length(tiny_bert, toy_dataset):
    """Before: `--frozen-layers all` was refused ("not a valid integer") and there was no --max-seq-length,
    though a spec takes both."""
    args = ["trial", "--model", tiny_bert, "--dataset", toy_dataset, "--train-size", "24", "--epochs", "1"]
    done = runner.invoke(app, [*args, "--frozen-layers", "all", "--max-seq-length", "16", "--json"])
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["config"]["frozen_layers"] == 2 and result["config"]["max_seq_length"] == 16  # tiny_bert: 2 layers
    too_deep = runner.invoke(app, [*args, "--frozen-layers", "3"])  # a diff review: accepted as the text "3"
    assert too_deep.exit_code == 2 and "frozen_layers: [3] exceed the 2 layers" in too_deep.stderr


def test_one_trial_on_a_gpu_machine_is_resolved_for_its_gpu(tiny_bert, toy_dataset, monkeypatch):
    """The trial runs on the GPU where there is one (no device set): its `auto` precision is the GPU's, and
    fp16 is allowed. A diff review caught the one-cell spec resolving both for the CPU (no GPU asked)."""
    import torch

    from freezesweep.orchestrator.cli import trial_cell
    from freezesweep.trials import precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(precision, "auto_precision", lambda device: {"cuda": "fp16", "cpu": "fp32"}[device])
    one = {"name": "trial", "model": tiny_bert, "datasets": [toy_dataset], "train_sizes": [24], "frozen_layers": [0]}
    cell = trial_cell({**one, "seeds": [0]})
    assert cell.gpus_per_trial == 1 and cell.precision == "fp16"
    assert trial_cell({**one, "seeds": [0], "training": {"precision": "fp16"}}).precision == "fp16"


def test_one_trial_names_every_problem_of_its_options_at_once(tmp_path):
    """Before: the first problem only (a bad train size hid the missing model, which hid the dataset's)."""
    done = runner.invoke(
        app,
        [
            "trial",
            "--model",
            str(tmp_path / "no-model"),
            "--dataset",
            "glue/nope",
            "--train-size",
            "0",
            "--frozen-layers",
            "two",
            "--epochs",
            "-1",
        ],
    )
    assert done.exit_code == 2 and "5 problem(s)" in done.stderr
    for said in ("train sizes must be positive", "a depth is an integer", "training.epochs", "no-model", "'nope'"):
        assert said in done.stderr
    assert "--train-size" in done.stderr  # the option each spec key stands for
    assert "data_dir: --data-dir" in done.stderr.replace("\n", "")  # the data layer says data_dir (a walk-through)


@pytest.mark.parametrize("command", ["status", "summary", "query", "report", "resume"])
def test_a_missing_sweep_is_named_by_the_command_that_was_run(command, tmp_path):
    args = [command, "nope", "--store", str(tmp_path)] + (["--out", str(tmp_path / "r")] if command == "report" else [])
    done = runner.invoke(app, args)
    assert done.exit_code == 2
    assert f"freezesweep {command}: error:" in done.stderr and "no sweep named 'nope'" in done.stderr
    assert "resume:" not in done.stderr.replace("freezesweep resume:", "")  # not another command's name


def test_a_bad_spec_is_refused_naming_launch(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    done = runner.invoke(app, ["launch", str(bad)])
    assert done.exit_code == 2 and "freezesweep launch: error:" in done.stderr and "malformed YAML" in done.stderr


def test_malformed_yaml_is_said_by_the_files_lines_with_its_brackets(tmp_path):
    """Before: "while parsing a flow sequence   in "<unicode string>", line 2, column 8: … ', but got ':'":
    line breaks flattened, and "expected ',' or ']'" read as rich markup and dropped."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: [a, b\ndatasets: [glue/sst2]\n")
    done = runner.invoke(app, ["plan", str(bad)])
    assert done.exit_code == 2
    assert (
        "malformed YAML: line 3, column 9: expected ',' or ']', but got ':' (while parsing a flow sequence from "
        "line 2, column 8)" in done.stderr
    )
    assert "<unicode string>" not in done.stderr


def _tree(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_plan_counts_cells_against_the_store_and_prices_the_rest_without_running(write_spec, tmp_path, monkeypatch):
    import ray

    from freezesweep.orchestrator.rows import result_row
    from freezesweep.results.store import ResultStore
    from freezesweep.trials.config import TrialResult

    monkeypatch.setattr(ray, "init", lambda *args, **kwargs: pytest.fail("plan started Ray"))
    path = write_spec("planned", seeds=[0, 1])  # 2 sizes × 2 depths × 2 seeds
    cells = build_grid(resolve_here(load_spec(path)))
    store = ResultStore(str(tmp_path / "store"), "planned")
    for cell, wall_s in zip(cells[:3], (10.0, 20.0, 30.0)):  # 3 done: two of one kind (n=24, k=0), one of another
        store.write_row(
            result_row("planned", TrialResult(trial_id=cell.trial_id, config=cell, status="ok", wall_time_s=wall_s))
        )
    before = _tree(tmp_path / "store")
    done = runner.invoke(app, ["plan", str(path)])
    assert done.exit_code == 0, done.output
    assert (
        "sweep planned: 8 cells (1 model × 1 dataset × 2 train sizes × 2 variants × 2 seeds), 3 done, 5 to run "
        "in 1 round(s)" in done.stdout
    )
    # pending: (24, k=2, s=1) priced at its own kind's 30 s; the 4 cells of n = 48 at the median of all, 20 s
    assert (
        "work: about 2 min of trials (from 3 measured rows: 1 of 5 pending cells priced by rows of their own kind; "
        "the other 4 by their model, dataset and train size, else every measured row); about 55 s at 2 trial(s) at once"
        in done.stdout.replace("\n", "")
    )
    # one cell left takes one slot: an AVX2 walk-through's one-cell round was priced at half its time
    one = runner.invoke(app, ["plan", str(write_spec("planned", seeds=[0, 1], train_sizes=[24]))])
    assert "1 of 1 pending cells priced" in one.stdout.replace("\n", "")
    assert "about 30 s at 1 of 2 trial(s) at once" in one.stdout.replace("\n", ""), one.stdout
    assert "nothing was started" in done.stdout and _tree(tmp_path / "store") == before
    shrunk = runner.invoke(app, ["plan", str(write_spec("planned", seeds=[0, 1], train_sizes=[24], frozen_layers=[0]))])
    # a walk-through: "work: about 0 s of trials (… 0 of 0 pending cells priced by rows of their own kind)"
    assert "2 done, 0 to run" in shrunk.stdout and "work: none, every cell of the grid is done" in shrunk.stdout


def test_plan_prices_a_new_sweep_by_another_sweeps_rows_of_the_same_kind_and_protocol(
    write_spec, tmp_path, monkeypatch
):
    """A new sweep under another name and split_seed (what an open group's answer asks for) is priced
    before its first trial by the earlier sweep's rows of its kinds; a sweep under another protocol
    (more epochs) prices nothing, and one of another model is passed over by its stored spec alone."""
    import yaml

    from freezesweep.trials import hub

    monkeypatch.setattr(hub, "offline", lambda: False)  # online: a model not here would be asked for
    monkeypatch.setattr(hub, "hub_problem", lambda *a, **k: pytest.fail(f"the hub was asked for {a}"))
    from freezesweep.orchestrator.rows import result_row
    from freezesweep.results.store import ResultStore
    from freezesweep.trials.config import TrialResult

    for name, epochs, wall_s in (("earlier", 2, 10.0), ("longer", 4, 1000.0)):
        sweep = resolve_here(load_spec(write_spec(name, train_sizes=[24], training={"epochs": epochs})))
        store = ResultStore(str(tmp_path / "store"), name)
        store.write_spec(sweep.spec.to_yaml())
        for cell in build_grid(sweep):
            row = TrialResult(trial_id=cell.trial_id, config=cell, status="ok", wall_time_s=wall_s)
            store.write_row(result_row(name, row))
    unrelated = yaml.safe_load(write_spec("unrelated", frozen_layers=[0, "all"]).read_text())
    unrelated["model"] = "some-org/unrelated-model"  # resolving it would ask the hub: never done for pricing
    ResultStore(str(tmp_path / "store"), "unrelated").write_spec(yaml.safe_dump(unrelated))
    path = write_spec("again", split_seed=7, seeds=[0, 1])  # n = 24 and 48, k = 0 and 2, 2 seeds
    done = runner.invoke(app, ["plan", str(path)])
    assert done.exit_code == 0, done.output
    assert "8 cells" in done.stdout and "0 done" in done.stdout
    # n = 24's 4 cells at earlier's 10 s each kind; n = 48's 4 at the median of every priced row, 10 s
    assert (
        "work: about 80 s of trials (from 2 measured rows, with rows of sweep(s) earlier run under the same "
        "protocol: 4 of 8 pending cells priced by rows of their own kind; the other 4 by their model, dataset and "
        "train size, else every measured row)" in done.stdout.replace("\n", "")
    )


def test_a_large_grid_is_announced_with_its_count_before_it_starts(write_spec, tmp_path):
    """Over 100,000 cells: said before the launch goes on (here it stops at the lock another driver holds)."""
    import subprocess
    import sys

    path = write_spec("large", seeds=list(range(30_000)))  # 2 × 2 × 30,000 = 120,000 cells
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"""
import sys, pyarrow.fs as pafs
from freezesweep.results.lock import SweepLock
with SweepLock(pafs.LocalFileSystem(), {str(tmp_path / "store" / "large")!r}):
    print("held", flush=True)
    sys.stdin.read()
""",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        done = runner.invoke(app, ["launch", str(path)])
    finally:
        holder.communicate("")
    assert done.exit_code == 2, done.output
    assert (
        "a large grid: 120,000 cells (1 model × 1 dataset × 2 train sizes × 2 variants × 30,000 seeds)" in done.stderr
    )
    assert "already running" in done.stderr


def test_plan_of_a_settle_sweep_names_its_next_round(write_spec):
    path = write_spec("settled", seeds=[], frozen_layers=[0, 1, 2], settle={"initial_seeds": 3, "max_seeds": 6})
    done = runner.invoke(app, ["plan", str(path)])
    assert done.exit_code == 0, done.output
    # 2 sizes × 3 depths × 6 seeds at most; the first round, learned first: full fine-tuning's 3 initial
    # seeds per size; every arm's from the first round with learned_first false
    assert "settle mode, at most 36 cells" in done.stdout and "the next round runs 6\n" in done.stdout
    together = write_spec(
        "together",
        seeds=[],
        frozen_layers=[0, 1, 2],
        settle={"initial_seeds": 3, "max_seeds": 6, "learned_first": False},
    )
    assert "the next round runs 18\n" in runner.invoke(app, ["plan", str(together)]).stdout


def test_status_on_many_single_row_files_says_to_compact(write_spec, tmp_path, monkeypatch):
    from freezesweep.orchestrator.rows import result_row
    from freezesweep.results import store as store_module
    from freezesweep.trials.config import TrialResult

    monkeypatch.setattr(store_module, "COMPACT_ADVICE_FILES", 2)
    sweep = resolve_here(load_spec(write_spec("many")))
    store = store_module.ResultStore(str(tmp_path / "store"), "many")
    store.write_spec(sweep.spec.to_yaml())
    cells = build_grid(sweep)
    for cell in cells[:3]:
        store.write_row(result_row("many", TrialResult(trial_id=cell.trial_id, config=cell, status="ok")))
    error = "DatasetError: no folder x\nTraceback …"
    store.write_row(
        result_row("many", TrialResult(trial_id=cells[3].trial_id, config=cells[3], status="failed", error=error))
    )
    args = ["status", "many", "--store", str(tmp_path / "store")]
    done = runner.invoke(app, args)
    assert done.exit_code == 0, done.output
    assert (
        "why the failed cells failed" in done.stdout and "DatasetError: no folder x" in done.stdout
    )  # why, not a count
    assert "note: 3 small files hold final rows" in done.stderr
    assert f"`freezesweep compact many --store {tmp_path / 'store'}`" in done.stderr.replace("\n", "")
    assert runner.invoke(app, ["compact", *args[1:]]).exit_code == 0
    assert "compact" not in runner.invoke(app, args).stderr  # the failed row's file alone: nothing to compact


def test_status_on_a_part_of_an_earlier_version_says_to_compact_and_compact_rewrites_it(write_spec, tmp_path):
    """An upgrade walk-through: plain readers met two schemas in results/ and nothing said why or what to do."""
    import pyarrow.parquet as pq

    from freezesweep.orchestrator.rows import result_row
    from freezesweep.results import store as store_module
    from freezesweep.trials.config import TrialResult

    sweep = resolve_here(load_spec(write_spec("old")))
    store = store_module.ResultStore(str(tmp_path / "store"), "old")
    store.write_spec(sweep.spec.to_yaml())
    for cell in build_grid(sweep)[:3]:
        store.write_row(result_row("old", TrialResult(trial_id=cell.trial_id, config=cell, status="ok")))
    store.compact()
    (part,) = (tmp_path / "store" / "old" / "results").glob("part-*.parquet")
    pq.write_table(pq.read_table(part).drop_columns(["gpu_mps", "optimisations"]), part)
    args = ["status", "old", "--store", str(tmp_path / "store")]
    said = runner.invoke(app, args).stderr.replace("\n", " ")
    assert "note: 1 part(s) of results/ were written by an earlier freezesweep" in said, said
    assert "`freezesweep compact old --store" in said
    assert "1 row file(s) compacted" in runner.invoke(app, ["compact", *args[1:]]).stdout
    assert "earlier freezesweep" not in runner.invoke(app, args).stderr


def _settled_rows(write_spec, name: str, settle: dict):
    """A stored settle sweep of 3 seeds whose k = 2 differs from k = 0 by +0.004, +0.015, 0."""
    from freezesweep.results.store import ResultStore
    from tests.results.test_report import row

    spec = load_spec(write_spec(name, seeds=[], train_sizes=[24], frozen_layers=[0, 2], settle=settle), semantic=False)
    sweep = resolve_here(spec)
    store = ResultStore(spec.store, name)
    store.write_spec(sweep.spec.to_yaml())
    acc = {0: [0.70, 0.80, 0.75], 2: [0.704, 0.815, 0.75]}
    for cell in build_grid(sweep):
        k, seed = cell.frozen_layers, cell.seed
        store.write_row(
            row(
                name,
                dataset=cell.dataset,
                n=24,
                k=k,
                seed=seed,
                acc=acc[k][seed],
                trial_id=cell.trial_id,
                cost=(10, 5.0, 1.0),
                wall_time_s=60.0,
            )
        )
    return spec


def test_a_settle_sweeps_report_draws_and_says_its_own_tolerance(write_spec, tmp_path):
    """Before: the demo asked 0.02, and its report's figure shaded "±0.01" and its words said −0.01."""
    spec = _settled_rows(write_spec, "asked", {"initial_seeds": 3, "max_seeds": 3, "tolerance": 0.05})
    done = runner.invoke(app, ["report", "asked", "--store", spec.store, "--out", str(tmp_path / "out")])
    assert done.exit_code == 0, done.output
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert (
        "the shaded band is ±0.05" in markdown
        and "(−0.05, the question the sweep asked" in markdown
        and "±0.01" not in markdown
    )


def test_report_of_an_open_settle_sweep_names_the_budget_that_would_decide_it_and_its_price(write_spec, tmp_path):
    """The demo before: "no k is shown within 0.01", and nothing on what would decide it. And a report at
    another tolerance than the sweep asked was accepted (the question chosen after seeing the rows)."""
    spec = _settled_rows(write_spec, "open", {"initial_seeds": 3, "max_seeds": 3})
    done = runner.invoke(app, ["report", "open", "--store", spec.store, "--out", str(tmp_path / "out")])
    assert done.exit_code == 0, done.output
    assert "4 seeds per arm would decide it if the spread stays as it is" in done.stdout
    out = " ".join(done.stdout.split())  # a walk-through: the report never said its own budget had run out
    assert "this sweep's own rounds are over (at most settle.max_seeds 3 seeds per arm); 4 seeds per arm" in out
    assert (
        "n = 24: a new settle sweep with settle.max_seeds 4 runs at most 8 trials for this size, about 0.13 "
        "trial-hours at the measured times" in done.stdout
    )
    refused = runner.invoke(
        app, ["report", "open", "--store", spec.store, "--out", str(tmp_path / "o"), "--tolerance", "0.5"]
    )
    assert refused.exit_code == 2 and "a tolerance chosen after seeing the rows voids the confidence" in refused.output


def test_plan_of_a_settle_sweep_prices_its_next_round_and_its_whole_budget(write_spec, tmp_path):
    """Before: a report's open group said "a new settle sweep with settle.max_seeds 4 runs at most 8 trials
    for this size, about 0.13 trial-hours … (`freezesweep plan` on its spec prices the whole sweep)", but
    plan of that spec priced its next round alone (3 trials, 3 min). Now both, at the report's numbers."""
    from freezesweep.orchestrator import api

    spec = _settled_rows(write_spec, "open", {"initial_seeds": 3, "max_seeds": 3})  # 6 rows of 60 s
    said = runner.invoke(app, ["report", "open", "--store", spec.store, "--out", str(tmp_path / "out")]).stdout
    assert "settle.max_seeds 4 runs at most 8 trials for this size, about 0.13 trial-hours" in said
    grown = write_spec("grown", seeds=[], train_sizes=[24], frozen_layers=[0, 2], split_seed=1, settle={"max_seeds": 4})
    done = runner.invoke(app, ["plan", str(grown)])
    assert done.exit_code == 0, done.output
    out = " ".join(done.stdout.split())  # rich wraps the lines where a space was
    assert "settle mode, at most 8 cells" in out and "the next round runs 3" in out  # full fine-tuning's 3 seeds
    assert (
        "work of the next round: about 3 min of trials (from 3 measured rows, with rows of sweep(s) open run under "
        "the same protocol: 3 of 3 pending cells priced by rows of their own kind); about "
    ) in out
    assert (
        "work of the whole budget left: at most about 8 min of trials, were every open group to run to "
        "settle.max_seeds (each stops once decided) (from 6 measured rows, with rows of sweep(s) open run under the "
        "same protocol: 8 of 8 cells not done of the open groups priced by rows of their own kind); at most about "
    ) in out
    planned = api.plan(grown)
    assert (planned.work.trial_s, len(planned.budget), planned.budget_work.trial_s) == (180.0, 8, 480.0)
    assert f"{planned.budget_work.trial_s / 3600:.2f}" == "0.13" and planned.budget_priced_from == ("open",)
    # the stored sweep itself is at its budget (max_seeds 3): nothing left to run or price
    spent = runner.invoke(app, ["plan", str(tmp_path / "open.yaml")])
    assert "work: none, the sweep is settled or at its budget" in spent.stdout and "budget left" not in spent.stdout
    assert api.plan(tmp_path / "open.yaml").budget == []
    fixed = api.plan(write_spec("fixed", seeds=[0, 1], train_sizes=[24], frozen_layers=[0, 2], split_seed=1))
    assert fixed.budget is None and fixed.budget_work is None and fixed.work.trial_s == 240.0


def test_export_of_an_unknown_sweep_is_the_commands_own_error_not_mlflows(tmp_path):
    """Before: the store lookup ran inside the export's catch-all and read as an MLflow failure."""
    pytest.importorskip("mlflow")
    (tmp_path / "store").mkdir()
    done = runner.invoke(app, ["export", "mlflow", "nope", "--store", str(tmp_path / "store")])
    assert done.exit_code == 2
    assert "no sweep named 'nope'" in done.output and "MLflow export" not in done.output
    assert "freezesweep export mlflow: error:" in done.stderr  # the command run, not its group
    assert "A sweep's rows to another tool" in runner.invoke(app, ["export", "--help"]).stdout


# A stored sweep's commands, each as (its words, options it needs beside SWEEP).
STORED_SWEEP_COMMANDS = [
    (["status"], []),
    (["summary"], []),
    (["query"], []),
    (["report"], ["--out", "REPORT"]),
    (["resume"], []),
    (["compact"], []),
    (["export", "mlflow"], []),
]


@pytest.mark.parametrize(
    "command", [*STORED_SWEEP_COMMANDS, (["plan"], []), (["launch"], [])], ids=lambda c: " ".join(c[0])
)
@pytest.mark.parametrize("under", [False, True], ids=["the-file", "under-a-file"])
def test_a_store_that_is_a_file_is_one_line_for_every_command(command, under, write_spec, tmp_path):
    """Issue 36: `--store` at a regular file was a traceback (exit 1) from status and report."""
    words, options = command
    afile = tmp_path / "results.csv"
    afile.write_text("a,b\n")
    store = str(afile / "sweeps") if under else str(afile)
    target = str(write_spec("tiny")) if words[0] in ("plan", "launch") else "tiny"
    options = [str(tmp_path / "r") if o == "REPORT" else o for o in options]
    done = runner.invoke(app, [*words, target, *options, "--store", store])
    assert done.exit_code == 2, done.output
    assert done.exception is None or isinstance(done.exception, SystemExit)  # no traceback
    assert f"freezesweep {' '.join(words)}: error:" in done.stderr
    assert f"{str(afile)!r}" in done.stderr and "a file, not a folder" in done.stderr


def test_status_of_a_sweep_in_its_specs_store_says_where_it_looked_and_reads_the_spec(write_spec, tmp_path):
    """Issue 36: with `store:` in a spec, `status NAME` looked in ./sweeps and said only "no sweep named"."""
    spec_path = write_spec("elsewhere", store=str(tmp_path / "team-store"))
    spec = load_spec(spec_path)
    from freezesweep.results.store import ResultStore

    ResultStore(spec.store, "elsewhere").write_spec(resolve_here(spec).spec.to_yaml())
    ResultStore(spec.store, "other").write_spec(resolve_here(spec).spec.to_yaml())
    looked = runner.invoke(app, ["status", "elsewhere", "--store", str(tmp_path / "sweeps")])
    assert looked.exit_code == 2
    assert f"in store {str(tmp_path / 'sweeps')!r}" in looked.stderr and "which does not exist" in looked.stderr
    assert "--store ROOT" in looked.stderr and "spec file" in looked.stderr  # how to point it
    wrong = runner.invoke(app, ["status", "elsewher", "--store", spec.store])
    assert "which holds elsewhere, other (did you mean 'elsewhere'?)" in wrong.stderr  # a typo shows itself
    for args in (["status", str(spec_path)], ["status", "elsewhere", "--store", spec.store]):
        found = runner.invoke(app, args)
        assert found.exit_code == 0, found.output
        assert "sweep elsewhere" in found.stdout
    assert "the spec file" in runner.invoke(app, ["status", "--help"]).stdout
    assert "the spec's" not in runner.invoke(app, ["status", "--help"]).stdout  # a name knows no spec


@pytest.mark.parametrize(
    "fields, not_needed",
    [
        ({"settle": True}, 1),  # the demo: 11 of its 12 cells ran, and the launch said nothing of the 12th
        ({"settle": True, "unfinished": 1}, 0),  # interrupted: resume runs it
        ({"settle": True, "ok": 10, "failed": 1}, 0),  # a failed cell stopped the rounds, undecided
        ({}, 0),  # a fixed grid runs every cell
    ],
)
def test_a_settled_launch_counts_the_cells_its_answer_did_not_need(fields, not_needed):
    """What the launch's summary line says after "ran 11: 11 ok" (settle mode: 1 of the grid's cells not needed)."""
    from freezesweep.orchestrator.launch import LaunchSummary

    counts = {"total": 12, "already_ok": 0, "ran": 11, "ok": 11, "failed": 0}
    assert LaunchSummary(**{**counts, **fields}, sweep="demo", store="sweeps").not_needed == not_needed


def test_plan_says_where_all_and_a_listed_depth_are_one_cell(write_spec, tiny_bert):
    """Before: "2 cells (… × 3 variants × …)" for [0, 2, all] on a 2-layer model, and not a word on why."""
    done = runner.invoke(app, ["plan", str(write_spec("same", train_sizes=[24], frozen_layers=[0, 2, "all"]))])
    assert done.exit_code == 0, done.output
    assert f"one cell per depth ({tiny_bert}: all is k = 2, also listed)" in done.stdout.replace("\n", "")
    # its factors multiply to its cells (before: "× 3 variants ×", one more than the grid's 2)
    cells, factors = re.search(r"(\d+) cells \(([^;)]*)", done.stdout.replace("\n", "")).groups()
    assert math.prod(int(f.split()[0]) for f in factors.split(" × ")) == int(cells), factors
    plain = runner.invoke(app, ["plan", str(write_spec("plain", train_sizes=[24], frozen_layers=[0, "all"]))])
    assert "one cell per depth" not in plain.stdout


def test_an_interrupt_before_the_trials_says_what_goes_on(write_spec, monkeypatch, tmp_path):
    """Before: Ctrl-C while validating or starting Ray said "`freezesweep resume` continues the sweep",
    without the name resume needs, and where the spec was not stored yet no resume could. Now: the launch
    again where nothing was stored, else resume given the spec file (its name and store), --store kept."""
    import yaml

    from freezesweep.orchestrator import api
    from freezesweep.results.store import ResultStore

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "launch", interrupted)
    monkeypatch.setattr(api, "resume", interrupted)
    path = write_spec("stopped")
    done = runner.invoke(app, ["launch", str(path)])
    assert done.exit_code == 130
    assert f"nothing was stored yet: `freezesweep launch {path}` starts it" in done.stderr
    raw = yaml.safe_load(path.read_text())
    ResultStore(raw["store"], "stopped").write_spec(path.read_text())  # as a launch stores it
    stored = runner.invoke(app, ["launch", str(path)])
    assert stored.exit_code == 130 and f"`freezesweep resume {path}` continues the sweep" in stored.stderr
    elsewhere = runner.invoke(app, ["launch", str(path), "--store", str(tmp_path / "other")])
    assert f"`freezesweep launch {path} --store {tmp_path / 'other'}` starts it" in elsewhere.stderr
    again = runner.invoke(app, ["resume", "stopped", "--store", raw["store"]])
    assert again.exit_code == 130 and f"`freezesweep resume stopped --store {raw['store']}` continues" in again.stderr


def test_a_relative_store_read_from_another_folder_says_it_is_the_current_folders(write_spec, tmp_path, monkeypatch):
    """A walk-through: `status path/to/spec.yaml` from another folder looked in that folder's ./sweeps and
    said only to give the spec file, which it had been given."""
    spec_path = write_spec("moved", store="./sweeps")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    looked = runner.invoke(app, ["status", str(spec_path)])
    assert looked.exit_code == 2
    assert f"in store './sweeps' ({tmp_path / 'elsewhere' / 'sweeps'})" in looked.stderr
    assert "a relative store is read from the current folder" in looked.stderr
    assert "run this where the sweep was launched" in looked.stderr
    # given the spec file already, it is not told to give it (a second walk-through)
    said = looked.stderr.replace("\n", "")
    assert "in place of the name" not in said and f"the store is the one spec file {spec_path} names" in said


def test_a_sweeps_own_folder_reads_as_the_sweep_and_as_a_store_says_so(write_spec, tmp_path):
    """A walk-through: `status sweeps/demo` looked for a sweep named 'sweeps/demo' in ./sweeps, and
    `--store sweeps/demo` said only that it holds no sweep."""
    from freezesweep.results.store import ResultStore

    spec = load_spec(write_spec("mine"))
    ResultStore(spec.store, "mine").write_spec(resolve_here(spec).spec.to_yaml())
    folder = f"{spec.store}/mine"
    read = runner.invoke(app, ["status", folder + "/"])
    assert read.exit_code == 0 and "sweep mine" in read.stdout
    deep = runner.invoke(app, ["status", "mine", "--store", folder])
    assert deep.exit_code == 2
    assert f"(it is the folder of sweep 'mine': its store is the folder above, {spec.store!r})" in deep.stderr
    (tmp_path / "mine-too").mkdir()
    (tmp_path / "mine-too" / "spec.yaml").write_text("name: another\n")  # a user's own spec, not a stored sweep
    neither = runner.invoke(app, ["status", str(tmp_path / "mine-too")])
    assert neither.exit_code == 2 and "not a sweep's name (a name has no /)" in neither.stderr
    missing = runner.invoke(app, ["status", "nosuch.yaml", "--store", spec.store])  # read as a sweep's name
    assert missing.exit_code == 2 and "no such spec file (looked for from" in missing.stderr
    assert f"nor a sweep of that name in store {spec.store!r}" in missing.stderr.replace("\n", "")


def test_a_sweep_whose_spec_file_was_deleted_is_not_a_missing_sweep(write_spec):
    """A walk-through: with spec.yaml deleted, `status` said the store "holds no sweep" beside its rows."""
    from freezesweep.results.store import ResultStore

    spec = load_spec(write_spec("lost"))
    store = ResultStore(spec.store, "lost")
    store.write_rows([{"trial_id": "a" * 16, "status": "failed"}])
    looked = runner.invoke(app, ["status", "lost", "--store", spec.store])
    assert looked.exit_code == 2
    assert "has rows but no spec.yaml (deleted?): launch its spec file again" in looked.stderr
    assert "holds no sweep" not in looked.stderr


def test_csv_cells_holding_lists_are_json():
    """A walk-through: `query --format csv` wrote a row's eval_curve as Python's repr (None, single quotes)."""
    import csv
    import io
    import json

    import numpy as np
    import pandas as pd

    from freezesweep.orchestrator.cli import nested_as_json

    curve = np.array([{"step": 7, "accuracy": 0.5, "pearson": None}], dtype=object)
    frame = pd.DataFrame({"trial_id": ["a", "b"], "eval_curve": [curve, None], "seed": [0, 1]})
    (first, second) = csv.DictReader(io.StringIO(nested_as_json(frame).to_csv(index=False)))
    assert json.loads(first["eval_curve"]) == [{"step": 7, "accuracy": 0.5, "pearson": None}]
    assert (second["eval_curve"], second["seed"]) == ("", "1")


def test_query_as_json_writes_each_value_as_stored(write_spec, tmp_path):
    """A walk-through: `query --format json` cut floats to 10 digits (0.6666666667), wrote finished_at as
    epoch milliseconds where CSV writes ISO text, and every '/' as '\\/'; non-finite values are null."""
    import pandas as pd

    from freezesweep.orchestrator.rows import result_row
    from freezesweep.results.store import ResultStore
    from tests.factories import trial_result

    store = ResultStore(str(tmp_path / "store"), "exact")
    store.write_spec(write_spec("exact").read_text())
    store.write_row(result_row("exact", trial_result(acc=2 / 3)))
    every = "SELECT *, 'inf'::DOUBLE AS far, ['nan'::DOUBLE, 1.5] AS nested FROM results"
    done = runner.invoke(app, ["query", "exact", "--store", store.uri, "--sql", every, "--format", "json"])
    assert done.exit_code == 0, done.output
    [row] = json.loads(done.stdout)
    stored = store.read().iloc[0]
    assert row["best_val_accuracy"] == 2 / 3 and row["model"] == "m" and "\\/" not in done.stdout
    assert pd.Timestamp(row["finished_at"]) == stored["finished_at"]
    assert row["best_val_pearson"] is None and row["eval_curve"][1]["accuracy"] == 2 / 3
    # strict JSON: no NaN or Infinity at any depth (the review: json writes them, no strict reader takes them)
    assert (row["far"], row["nested"]) == (None, [None, 1.5])
    json.loads(done.stdout, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))


def test_an_interrupted_launch_exits_130_whatever_comes_after(monkeypatch):
    """A walk-through: a second Ctrl-C while Ray shut down at exit ended the process 1 (failed cells).
    From the interpreter's exit on, Ctrl-C is ignored (before Ray's own atexit shutdown runs)."""
    import atexit
    import signal

    import typer

    from freezesweep.orchestrator.cli import exit_interrupted

    at_exit = []
    monkeypatch.setattr(atexit, "register", lambda *call: at_exit.append(call))
    with pytest.raises(typer.Exit) as exited:
        exit_interrupted(130)
    assert exited.value.exit_code == 130 and at_exit == [(signal.signal, signal.SIGINT, signal.SIG_IGN)]


def test_an_interrupt_while_the_launch_imports_says_nothing_was_written(write_spec, monkeypatch):
    """A walk-through: Ctrl-C in a launch's first seconds (Ray's and torch's imports) exited 130 silently.
    The CLI imports Ray's errors before it starts; the launcher's own imports wait for a valid spec."""
    import atexit
    import sys
    import types

    class Interrupted(types.ModuleType):
        def __getattr__(self, name):
            raise KeyboardInterrupt

    monkeypatch.setitem(sys.modules, "freezesweep.orchestrator.ray_session", Interrupted("ray_session"))
    monkeypatch.setattr(atexit, "register", lambda *call: None)
    done = runner.invoke(app, ["launch", str(write_spec("early"))])
    assert done.exit_code == 130
    assert "interrupted before anything started: nothing was written" in done.stderr


HEAVY = ("torch", "transformers", "ray.tune", "freezesweep.orchestrator.launch")


@pytest.mark.parametrize("sweep", ["garbled", "nosuch"])
def test_a_resume_refused_is_said_before_the_launchers_imports(sweep, tmp_path):
    """A walk-through: `resume` of a sweep whose spec.yaml was damaged took 16 s on 2 cores to say so (the
    launcher's torch, transformers and Ray Tune imports came first); a sweep that does not exist likewise.
    Now each is said before them (the stored spec is read first; Ray's own import, about a second, is the
    CLI's)."""
    import subprocess
    import sys

    store = tmp_path / "store"
    if sweep == "garbled":
        (store / sweep).mkdir(parents=True)
        (store / sweep / "spec.yaml").write_bytes(b"name: [\x00\xff garbage : : {")
    code = (
        "import sys\nfrom typer.testing import CliRunner\nfrom freezesweep.orchestrator.cli import app\n"
        f"done = CliRunner().invoke(app, ['resume', {sweep!r}, '--store', {str(store)!r}])\n"
        f"print(done.exit_code, [m for m in {HEAVY!r} if m in sys.modules])\nprint(done.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    code_and_modules, said = done.stdout.split("\n", 1)
    assert code_and_modules == "2 []", (done.stdout, done.stderr[-2000:])
    assert (
        "freezesweep resume: error:" in said and {"garbled": "damaged", "nosuch": "no sweep"}[sweep] in said.lower()
    ), said


def test_a_launch_with_failed_cells_says_how_to_run_them_again_in_its_store(capsys):
    """A walk-through: a launch that ended with failed cells named no next step, and the resume hint of
    an interrupted one left out the store the spec named (`resume NAME` then found no sweep)."""
    import typer

    from freezesweep.orchestrator import cli
    from freezesweep.orchestrator.launch import LaunchSummary

    failed = LaunchSummary(2, 0, 2, 0, 2, sweep="clfail", store="/data/sweeps")
    with pytest.raises(typer.Exit) as ended:
        cli._print_summary(failed, stopped=130)
    said = capsys.readouterr().out.replace("\n", " ")
    assert ended.value.exit_code == 1
    assert "`freezesweep resume clfail --store /data/sweeps` runs the failed cells again" in said
    assert "`freezesweep status clfail --store /data/sweeps` lists why each failed" in said


def test_a_table_too_wide_to_read_says_how_to_get_it_whole(capsys):
    """A walk-through: `query --sql "SELECT * FROM results"` printed 74 columns squeezed to nothing."""
    import pandas as pd

    from freezesweep.orchestrator import cli

    cli._print_frame(pd.DataFrame([range(20)], columns=[f"c{i}" for i in range(20)]), cli.OutputFormat.table, "t")
    assert "(20 columns: --format csv or json writes them whole)" in capsys.readouterr().out
    cli._print_frame(pd.DataFrame([range(3)], columns=["a", "b", "c"]), cli.OutputFormat.table, "t")
    assert "columns:" not in capsys.readouterr().out


@pytest.mark.parametrize("group", [[], ["export"]])
def test_the_command_list_gives_each_summary_as_one_line(group):
    """The command list kept every line break of a docstring's first paragraph (typer's rich help), so on a
    wide terminal a summary still broke mid-sentence ("… under the same protocol); a settle" / "sweep's …")."""
    import inspect

    import typer

    command = typer.main.get_command(app)
    for name in group:
        command = command.commands[name]
    result = runner.invoke(app, [*group, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    lines = [" ".join(line.strip("│ ").split()) for line in result.output.splitlines()]
    for name, sub in command.commands.items():
        summary = " ".join(inspect.cleandoc(sub.callback.__doc__ or sub.help or "").split("\n\n")[0].split())
        assert f"{name} {summary}" in lines, (name, summary)


def test_plan_says_what_precision_cpu_trials_run_here(write_spec, monkeypatch):
    """An AVX2 walk-through: bf16 asked for on a CPU that emulates it ran 3-9x slower, said nowhere; auto's
    choice was in the rows alone. A cluster's trials run on its nodes' CPUs: nothing said of this one's."""
    from freezesweep.orchestrator.sweeps import cpu_precision_note
    from freezesweep.trials import precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    done = runner.invoke(app, ["plan", str(write_spec("emulated", training={"precision": "bf16"}))])
    assert done.exit_code == 0, done.output
    said = " ".join(done.stdout.split())
    assert "note: precision bf16 on CPU trials: this machine's CPU has no native bf16" in said
    assert "auto runs fp32 here" in said
    auto = load_spec(write_spec("auto", training={"precision": "auto"}))
    assert cpu_precision_note(auto).startswith("precision auto runs fp32 on this machine's CPU")
    assert cpu_precision_note(auto.model_copy(update={"address": "ray://head:10001"})) is None
    assert cpu_precision_note(load_spec(write_spec("fp32", training={"precision": "fp32"}))) is None
