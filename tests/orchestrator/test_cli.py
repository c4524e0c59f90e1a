"""orchestrator/cli.py in units (typer's runner, in process): one trial uses the sweep's own protocol
defaults, and every error names the command that was run."""

import json

import pytest
from typer.testing import CliRunner

from orchestrator.checks import load_spec
from orchestrator.cli import app
from orchestrator.plan import build_grid
from orchestrator.sweeps import resolve_here

runner = CliRunner()


def test_one_trial_is_the_sweeps_cell_with_the_same_axes(write_spec, tiny_bert, toy_dataset):
    """`freezesweep trial` and a sweep build a cell from one definition (TrainingSpec, whose defaults are
    TrialConfig's): the same axes and options give the same cell, trial_id and all."""
    done = runner.invoke(app, ["trial", "--model", tiny_bert, "--dataset", toy_dataset, "--train-size", "24",
                               "--frozen-layers", "0", "--epochs", "1", "--precision", "fp32", "--json"])
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout.strip().splitlines()[-1])
    spec = load_spec(write_spec("one", train_sizes=[24], frozen_layers=[0],
                                training={"epochs": 1, "learning_rate": 5e-5, "eval_batch_size": 64}))
    [cell] = build_grid(resolve_here(spec))
    assert result["status"] == "ok" and result["trial_id"] == cell.trial_id
    protocol = {k: v for k, v in result["config"].items() if k not in ("data_dir", "num_threads")}
    assert protocol == {k: v for k, v in cell.to_dict().items() if k not in ("data_dir", "num_threads")}


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
