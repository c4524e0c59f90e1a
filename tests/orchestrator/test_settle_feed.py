"""orchestrator/settle_feed.py without Ray: a settle group's next cells are handed out as soon as its own
rows are in, the cells run are those of round after round, and a group whose cell ended without a final
row waits for the launch's next round."""

import random

import pandas as pd
import pytest

from freezesweep.orchestrator.checks import load_spec
from freezesweep.orchestrator.plan import build_grid, launch_units, settle_group, settle_round
from freezesweep.orchestrator.settle_feed import SettleFeed
from freezesweep.orchestrator.sweeps import SETTLE_COLUMNS, resolve_here


@pytest.fixture
def sweep(write_spec):
    # two groups (n = 24, 48), three arms; learned first: full fine-tuning's seeds alone, then the arms
    path = write_spec(
        "fed", train_sizes=[24, 48], frozen_layers=[0, 1, 2], seeds=[], settle={"tolerance": 0.02, "max_seeds": 6}
    )
    return resolve_here(load_spec(path, semantic=False))


def score(cell) -> float:
    """A score per cell: at n = 24 freezing costs little (undecided for a while), at n = 48 k = 2 costs
    much (decided early); seeds spread, the same every run (drawn from the cell's axes: its trial_id hashes
    the tiny model's temporary folder)."""
    noise = random.Random(f"{cell.train_size}-{cell.frozen_layers}-{cell.seed}").gauss(0, 0.01)
    cost = {24: 0.004, 48: 0.06}.get(cell.train_size, 0.03) * cell.frozen_layers
    return 0.85 - cost + noise


def row(cell, status: str = "ok") -> dict:
    ok = status == "ok"
    return {
        "trial_id": cell.trial_id,
        "status": status,
        "best_val_score": score(cell) if ok else None,
        "baseline_score": 0.5 if ok else None,
        "collapsed": False if ok else None,
    }


def round_by_round(sweep) -> list[str]:
    """What a launch ran before the feed: each round from every group's rows (next_cells' rule)."""
    grid, rows, ran = build_grid(sweep), [], []
    while True:
        frame = pd.DataFrame(rows, columns=SETTLE_COLUMNS)
        pending = [c for c in settle_round(sweep, grid, frame) if c.trial_id not in ran]
        if not pending:
            return ran
        ran += [c.trial_id for c in pending]
        rows += [row(c) for c in pending]


def new_feed(sweep, stored=(), **kwargs) -> tuple[SettleFeed, list]:
    first = launch_units(
        settle_round(sweep, build_grid(sweep), pd.DataFrame(list(stored), columns=SETTLE_COLUMNS)), sweep
    )
    options = {"ran": lambda trial_id: False, "on_step": lambda: None, "limit": 1000, **kwargs}
    return SettleFeed(sweep, pd.DataFrame(list(stored), columns=SETTLE_COLUMNS), first, **options), first


def test_the_feed_runs_the_cells_of_round_after_round_and_no_group_waits_for_another(sweep):
    steps = []
    feed, first = new_feed(sweep, on_step=lambda: steps.append(len(feed.added)))
    in_flight, ran, early = list(first), [], 0
    order = random.Random(0)
    while in_flight:
        unit = in_flight.pop(order.randrange(len(in_flight)))  # Ray trials end in any order
        feed.took([row(c) for c in unit])
        feed.over(unit)
        ran += [c.trial_id for c in unit]
        further = feed.more()
        if further:
            # handed out while cells of another group were still running: that group did not wait
            busy, fed = {settle_group(c) for u in in_flight for c in u}, {settle_group(c) for u in further for c in u}
            assert not busy & fed, "a group's next cells went out before each cell it had sent had its row"
            early += bool(busy - fed)
            in_flight += further
        assert further is not None or in_flight, "waiting with nothing running"
    assert feed.more() == []  # nothing in flight, nothing left: Tune's run ends
    assert sorted(ran) == sorted(round_by_round(sweep)) and len(set(ran)) == len(ran)
    assert early > 0
    assert len(steps) == len(set(steps)) > 1  # the fault switch's "round": each hand-out of further cells
    assert len({settle_group(c) for u in feed.added for c in u}) == 2


def test_rows_stored_before_the_run_count_and_cells_run_this_launch_do_not_run_again(sweep):
    grid = build_grid(sweep)
    stored = [row(c) for c in settle_round(sweep, grid, pd.DataFrame(columns=SETTLE_COLUMNS))]  # round one, done
    feed, first = new_feed(sweep, stored)
    sent = {c.trial_id for u in first for c in u}
    second = [c.trial_id for c in settle_round(sweep, grid, pd.DataFrame(stored + [row(c) for u in first for c in u]))]
    ran_before = {next(t for t in second if t not in sent)}  # say the launch ran it already (its row spooled)
    feed, first = new_feed(sweep, stored, ran=ran_before.__contains__)
    for unit in first:
        feed.took([row(c) for c in unit])
    further = [c.trial_id for u in feed.more() or [] for c in u]
    assert further and set(further) == set(second) - sent - ran_before


def test_a_group_whose_cell_failed_or_ended_without_a_row_waits_for_the_next_round(write_spec):
    spec = write_spec("held", train_sizes=[24, 48, 96], frozen_layers=[0, 1, 2], seeds=[], settle={"max_seeds": 6})
    sweep = resolve_here(load_spec(spec, semantic=False))
    feed, first = new_feed(sweep)
    by_group = {settle_group(u[0]): u[0] for u in first}
    failed, silent, _ = by_group.values()  # the third group's cells all end ok
    for unit in first:
        feed.took([row(c, "failed" if c is failed else "ok") for c in unit if c is not silent])
        feed.over(unit)  # the silent cell's trial ended with no row: its group is held too
    fed = {settle_group(c) for u in feed.more() for c in u}
    assert fed == set(by_group) - {settle_group(failed), settle_group(silent)}


def test_a_group_with_a_row_not_final_from_an_earlier_run_of_the_launch_waits_for_its_retry(sweep):
    """A launch of more than trials_per_round runs feeds only its last run: a group whose cell ran out of
    memory in an earlier one waits for the launch's retry (round by round, the retry came first)."""
    grid = build_grid(sweep)
    first_round = launch_units(settle_round(sweep, grid, pd.DataFrame(columns=SETTLE_COLUMNS)), sweep)
    earlier, last = first_round[:1], first_round[1:]  # the earlier run's cell ran out of memory
    stored = [row(c, "oom") for u in earlier for c in u]
    feed = SettleFeed(sweep, pd.DataFrame(stored, columns=SETTLE_COLUMNS), last, lambda t: False, lambda: None, 1000)
    for unit in last:
        feed.took([row(c) for c in unit])
    held = settle_group(earlier[0][0])
    assert held not in {settle_group(c) for u in feed.more() or [] for c in u}


def test_a_launch_whose_rows_wait_in_the_spool_runs_a_tune_run_a_round(sweep, tmp_path):
    """The store then lacks rows the launch wrote: the rounds read it after each run, as before the feed."""
    from types import SimpleNamespace

    from freezesweep.orchestrator.driver_faults import DriverFaults
    from freezesweep.orchestrator.launch import settle_feed
    from freezesweep.results.store import ResultStore, SpoolingWriter

    spool = tmp_path / "spool"
    sink = SpoolingWriter(ResultStore(sweep.spec.store, sweep.name), str(spool))
    writer = SimpleNamespace(sink=sink, outcomes={}, final_ids=set())
    launch = SimpleNamespace(sweep=sweep, writer=writer, feed=True, faults=DriverFaults())
    first = launch_units(settle_round(sweep, build_grid(sweep), pd.DataFrame(columns=SETTLE_COLUMNS)), sweep)
    assert isinstance(settle_feed(launch, first), SettleFeed)
    spool.mkdir()
    (spool / "cell.parquet").write_bytes(b"")
    assert settle_feed(launch, first) is None


def test_a_run_takes_no_more_ray_trials_than_its_limit(sweep):
    feed, first = new_feed(sweep, limit=len(launch_units(build_grid(sweep), sweep)) + 100)
    tight, first = new_feed(sweep, limit=len(first))  # room for the first round only: the rest waits
    for unit in first:
        feed.took([row(c) for c in unit])
        tight.took([row(c) for c in unit])
    assert feed.more() and tight.more() == [] and tight.added == []
