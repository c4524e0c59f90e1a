"""Settle mode through Ray: rounds chosen from the stored rows, every trial stored once, a driver killed
between rounds resumes to the same decisions, and a grown budget continues from what is stored."""

import subprocess
import sys

import pandas as pd
import pytest
import yaml

from freezesweep.orchestrator.checks import load_spec
from freezesweep.orchestrator.spec import SpecError
from freezesweep.orchestrator import tune_adapter
from freezesweep.orchestrator.launch import launch
from freezesweep.orchestrator.plan import build_grid, sweep_arms
from freezesweep.orchestrator.sweeps import resolve_here
from freezesweep.results.query import read_rows
from freezesweep.results.report import SweepRows, build_report
from freezesweep.results.store import ResultStore
from tests.conftest import REPO, killed_launch

CLI = [sys.executable, "-m", "freezesweep.orchestrator.cli"]
# Two settle sweeps of a dozen tiny trials each and a killed driver: about 5 minutes on 2 cores.
pytestmark = pytest.mark.slow
# The toy task at n = 48 and 3 epochs: every depth stays at the majority class on every seed, so the
# differences are identical (their spread unknown) and nothing is decided: the rounds run to the budget.
# Learned first would then run full fine-tuning alone (the grown-budget test checks that); the kill test
# runs every arm from the first round, to resume rounds of several arms.
SETTLE = {"tolerance": 0.002, "initial_seeds": 3, "max_seeds": 5, "seeds_per_round": 1}


@pytest.fixture(scope="module", autouse=True)
def _ray_once():
    yield
    import ray

    ray.shutdown()


def _settle_spec(write_spec, name, **settle):
    # tiny BERT, toy data; k = 2 (every layer frozen) trains the head alone
    return write_spec(
        name, train_sizes=[48], frozen_layers=[0, 1, 2], seeds=[], settle={**SETTLE, **settle}, training={"epochs": 3}
    )


def _decisions(store: ResultStore, spec) -> list[tuple]:
    rule = spec.settle.rule()
    report = build_report([SweepRows.from_store(store, rule=(rule, rule.looks, sweep_arms(resolve_here(spec))))])
    return (
        report.decisions[["train_size", "learned", "frozen_layers", "within", "worse", "undecided"]]
        .astype(str)
        .to_records(index=False)
        .tolist()
    )


def _runs(store: ResultStore) -> pd.DataFrame:
    rows = read_rows(store, columns=["trial_id", "frozen_layers", "seed", "status", "finished_at"])
    assert not rows["trial_id"].duplicated().any(), "a cell ran twice"
    return rows


def test_a_settle_sweep_killed_between_rounds_resumes_to_the_same_decisions(write_spec, tmp_path, monkeypatch):
    from freezesweep.orchestrator import launch as launching

    runs = []
    monkeypatch.setattr(launching, "run_tune", lambda *a, **k: runs.append(tune_adapter.run_tune(*a, **k)))
    whole = load_spec(_settle_spec(write_spec, "whole", learned_first=False))
    summary = launch(whole, show_progress=False)
    assert len(runs) == 1  # its rounds within one Tune run: each next seed as the rows came in (settle_feed.py)
    store = ResultStore(whole.store, "whole")
    rows = _runs(store)
    grid = {c.trial_id for c in build_grid(resolve_here(whole))}
    assert set(rows["trial_id"]) <= grid and summary.ran == len(rows) > 9  # more than the first round
    assert sorted(set(rows.loc[rows["frozen_layers"] == 0, "seed"]))[:3] == [0, 1, 2]  # the initial seeds
    expected = _decisions(store, whole)
    settled = launch(whole, show_progress=False)  # nothing left: no Ray, and still said to be a settle sweep
    assert settled.ran == 0 and settled.settle  # before: settle=False where nothing ran

    path = _settle_spec(write_spec, "killed", learned_first=False)
    killed_launch(path, "kill-after-round@1")
    killed = ResultStore(whole.store, "killed")
    assert len(_runs(killed)) == 9  # the first round whole: 3 arms × 3 initial seeds, nothing of a second
    resumed = subprocess.run(
        CLI + ["resume", "killed", "--store", whole.store], capture_output=True, text=True, timeout=900
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = _runs(killed)
    assert sorted(zip(again["frozen_layers"], again["seed"])) == sorted(zip(rows["frozen_layers"], rows["seed"]))
    assert _decisions(killed, load_spec(path, semantic=False)) == expected


def test_a_grown_budget_is_refused_and_learned_first_runs_full_fine_tuning_alone(write_spec, tmp_path):
    """Learned first through Ray: while it is open whether full fine-tuning learns, no arm runs. A grown
    budget on the stored rows would take looks their confidence was not shared by: refused, with the count."""
    small = load_spec(_settle_spec(write_spec, "grown", max_seeds=3))
    summary = launch(small, show_progress=False)
    assert (summary.total, summary.ran, summary.not_needed) == (9, 3, 6)  # said: the answer needed 3 of the 9
    store = ResultStore(small.store, "grown")
    first = _runs(store).set_index("trial_id")["finished_at"]
    assert len(first) == 3 and set(_runs(store)["frozen_layers"]) == {0}
    from freezesweep.orchestrator import api

    # the depths no round ran while it was open whether full fine-tuning learns: not tested, in the table
    # too (a walk-through: the sentence said so, the table's column was empty)
    (group,) = api.decide("grown", store=small.store).frame.to_dict("records")
    assert group["learned"] != "learned" and group["not_tested"] == "k=1, k=2"
    with pytest.raises(SpecError) as info:
        load_spec(_settle_spec(write_spec, "grown", max_seeds=5))
    assert any(
        "settle.max_seeds" in p and "3 looks where the stored rows' confidence was shared by 1" in p
        for p in info.value.problems
    )
    spec = yaml.safe_load((tmp_path / "store" / "grown" / "spec.yaml").read_text())
    assert spec["settle"]["max_seeds"] == 3 and spec["seeds"] == []


def test_groups_go_on_at_their_own_pace_in_one_tune_run_and_run_the_cells_of_round_after_round():
    """benchmarks/settle_rounds.py, shrunk: two groups (n = 24, 96) through Ray both ways, a run a round and
    one fed run; it exits 1 where they ran different cells. Some arms are decided before the budget, so
    the groups' rounds differ (the cells compared are not simply every cell). The trials' scores are drawn
    from the cells' axes, so which those are is the same every run (n = 24 takes a second round)."""
    import re

    import ray

    ray.shutdown()  # the benchmark starts its own: one Ray on the machine at a time
    command = [
        str(REPO / "benchmarks" / "settle_rounds.py"),
        "--train-sizes",
        "24",
        "96",
        "--max-seeds",
        "5",
        "--s-per-row",
        "0.002",
    ]
    done = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    found = re.findall(
        r"(one run, fed|a run a round): +[\d.]+ s, (\d+) Tune run\(s\), (\d+) cells, (\d+) trial", done.stdout
    )
    ways = {way: tuple(map(int, counts)) for way, *counts in found}
    (fed_runs, fed_cells, fed_processes), (runs, cells, processes) = ways["one run, fed"], ways["a run a round"]
    assert fed_runs == 1 < runs
    assert fed_cells == cells != 30  # 2 groups × 3 arms × 5 seeds: the budget
    # a new Tune run starts its trial processes afresh (each slot's at least: 2 a run); the fed run keeps its own
    assert fed_processes < processes
