"""Settle mode's rounds inside one Tune run: a group's next seeds start as soon as its own rows are in.

A settle group (model, dataset, train size) chooses its next cells from its own rows alone
(``plan.group_round``). Run as one Tune run per round, every group waited for the round's slowest trial
(an n = 1000 group's beside an n = 50 one's: the slots that ended first stood idle), and every round
started its trial processes afresh (each imports torch and transformers: about 13 s on a 2-core
AVX2-only CPU, docs/scale.md). The feed is the run's source of further cells (``tune_adapter.Feed``):
once each cell it sent of a group has its row, the group's next cells are handed to Tune at once, while
the other groups' trials run on, and Tune's trial processes stay (``reuse_actors``).

The same cells run as round by round: a group's choice reads only its rows, and a group one of whose
cells ended without a final row (failed, out of memory: the launch retries some of them once its run is
over) or without a row at all is left for the launch's next round, which reads the store as before.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from freezesweep.orchestrator.plan import ResolvedSweep, build_grid, group_round, launch_units, settle_groups
from freezesweep.orchestrator.sweeps import SETTLE_COLUMNS
from freezesweep.results.store import FINAL_STATUSES
from freezesweep.trials.config import TrialConfig


class SettleFeed:
    """``stored``: the store's rows (``SETTLE_COLUMNS``) when the run begins; ``first``: the units the run
    starts with; ``ran``: whether the launch ran a cell already (a cell runs once per launch); ``on_step``:
    called before each batch of further cells is handed out (the driver's fault switch); ``limit``: the
    most Ray trials the run may have (``resources.trials_per_round``)."""

    def __init__(
        self,
        sweep: ResolvedSweep,
        stored: pd.DataFrame,
        first: list[list[TrialConfig]],
        ran: Callable[[str], bool],
        on_step: Callable[[], None],
        limit: int,
    ):
        self.sweep, self.rule, self.ran, self.on_step = sweep, sweep.spec.settle.rule(), ran, on_step
        self.members = settle_groups(build_grid(sweep))
        self.group_of = {c.trial_id: group for group, cells in self.members.items() for c in cells}
        self.rows: dict[tuple, dict[str, dict]] = {group: {} for group in self.members}
        for row in stored.reindex(columns=SETTLE_COLUMNS).to_dict("records"):
            if row["trial_id"] in self.group_of:
                self.rows[self.group_of[row["trial_id"]]][row["trial_id"]] = row
        self.waiting: dict[tuple, set[str]] = {group: set() for group in self.members}  # sent, no row yet
        self.sent: set[str] = set()
        self.in_flight = 0  # cells sent without a row, all groups
        # left for the launch's next round: also a group with a row not final that this run does not run
        # again (an earlier run's of this launch: the launch retries it once the runs are over)
        firsts = {c.trial_id for unit in first for c in unit}
        self.held: set[tuple] = {
            self.group_of[t]
            for group_rows in self.rows.values()
            for t, row in group_rows.items()
            if row["status"] not in FINAL_STATUSES and t not in firsts
        }
        self.ready: set[tuple] = set()
        self.added: list[list[TrialConfig]] = []  # the units handed out after ``first``
        self.trials_left = limit - len(first)
        self._send(first)

    def _send(self, units: list[list[TrialConfig]]) -> None:
        for cell in (c for unit in units for c in unit):
            self.sent.add(cell.trial_id)
            self.waiting[self.group_of[cell.trial_id]].add(cell.trial_id)
            self.in_flight += 1

    def _arrived(self, group: tuple, trial_id: str, final: bool) -> None:
        waiting = self.waiting[group]
        if trial_id not in waiting:
            return
        waiting.discard(trial_id)
        self.in_flight -= 1
        if not final:
            self.held.add(group)
        if not waiting:
            self.ready.add(group)

    def sink(self, write: Callable[..., list[dict]]) -> Callable[..., None]:
        """The launch's row writer (``RowWriter.write_all``), telling the feed of the rows it wrote."""
        return lambda results, attempts: self.took(write(results, attempts))

    def took(self, rows: list[dict]) -> None:
        """The rows the launch just wrote (the run's outcomes, as stored)."""
        for row in rows:
            group = self.group_of.get(row["trial_id"])
            if group is not None:
                self.rows[group][row["trial_id"]] = {name: row.get(name) for name in SETTLE_COLUMNS}
                self._arrived(group, row["trial_id"], row["status"] in FINAL_STATUSES)

    def over(self, unit: list[TrialConfig]) -> None:
        """A Ray trial is over: a cell of it still without a row holds its group (it never got one)."""
        for cell in unit:
            self._arrived(self.group_of[cell.trial_id], cell.trial_id, final=False)

    def more(self) -> list[list[TrialConfig]] | None:
        """The next cells of the groups whose rows are all in; None while rows are still to come."""
        ready, self.ready = sorted(self.ready - self.held), set()
        cells = [
            c
            for group in ready
            for c in group_round(
                self.members[group], pd.DataFrame(list(self.rows[group].values()), columns=SETTLE_COLUMNS), self.rule
            )
            if c.trial_id not in self.sent and not self.ran(c.trial_id)
        ]
        units = launch_units(cells, self.sweep) if cells else []
        if units and len(units) <= self.trials_left:
            self.on_step()
            self.trials_left -= len(units)
            self._send(units)
            self.added += units
            return units
        self.held.update(ready if units else ())  # past the run's size: the launch's next round runs them
        return None if self.in_flight else []
