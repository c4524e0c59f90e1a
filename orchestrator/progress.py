"""A sweep's progress, where its output goes: a live bar on a terminal; elsewhere (a file, a cluster
job's log, CI, a notebook) plain lines, which a log shows as they come.

Without a terminal rich's live bar draws only when it stops: a launch whose output went to a file said
nothing for as long as the sweep ran. Lines instead: one when the trials start, one per finished trial
(its cell, status, metric and time) and a summary (ended/total, failed, rate, ETA) at least every
``summary_every_s`` seconds, from a timer of its own, so a log shows the sweep alive while long trials run.

On a terminal the bar puts what matters first (done/total, then ETA), the last cell at the end, cut
where the terminal is narrow.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column

from freezesweep.trials.config import TrialResult
from freezesweep.results.query import first_line
from freezesweep.results.store import FINAL_STATUSES

SUMMARY_EVERY_S = 60.0  # the longest a log goes without a line while a sweep runs


def cell_words(result: TrialResult, model: bool = False) -> str:
    """A trial's cell, status and selected metric: ``glue/sst2 n=200 k=0 s=1 ok accuracy=0.785``; with
    ``model`` (a sweep of several), its model's last path part first (two models' lines looked alike)."""
    cfg = result.config
    named = f"{cfg.model.rstrip('/').rsplit('/', 1)[-1]} " if model else ""
    words = f"{named}{cfg.dataset} n={cfg.train_size} {cfg.variant()} s={cfg.seed} {result.status}"
    if result.best_val_score is not None:
        words += f" {result.select_metric}={result.best_val_score:.3f}"
    return words


def _duration(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


class SweepProgress:
    """Counts a launch's outcomes and shows them: a bar on a terminal, lines elsewhere, nothing when
    not ``enabled``.

    ``models``: how many the sweep has; ``at_most``: the total is a budget (settle mode), said as one
    (a walk-through read "12 to run" and an ETA for 12 where 4 ran); ``out``: where lines go (default
    stdout); ``terminal``: whether it is one (default: ``out.isatty()``);
    ``clock``: seconds, monotonic (tests pass their own); ``console``: the bar's (tests render it)."""

    def __init__(
        self,
        total: int,
        done: int,
        enabled: bool = True,
        *,
        models: int = 1,
        at_most: bool = False,
        out: TextIO | None = None,
        terminal: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        summary_every_s: float = SUMMARY_EVERY_S,
        console: Console | None = None,
    ):
        self.total, self.done, self.failed, self.finished = total, done, 0, 0  # finished: this launch's trials
        self.models = models  # more than one: each line names its model
        self.at_most = at_most  # settle mode: ``total`` is the budget, its rounds run what the rows call for
        self.out = out or sys.stdout
        terminal = self.out.isatty() if terminal is None else terminal
        self.mode = "off" if not enabled else "bar" if terminal else "lines"
        self.clock, self.summary_every_s = clock, summary_every_s
        self.started = self.last_summary = clock()
        self._lock = threading.Lock()  # the timer's summary and a trial's line never interleave
        self._stop = threading.Event()
        self._announced = False  # settle mode enters once per round
        self._timer: threading.Thread | None = None
        self._bar = _bar(console, disable=self.mode != "bar")
        self._task = self._bar.add_task("trials", total=total, completed=done, failed=0, last="-")

    def advance(self, result: TrialResult, replaces: str | None = None) -> None:
        """A cell's outcome; ``replaces``: the status of this cell's earlier row in this launch (its
        retry's row replaces it: the cell is counted once)."""
        # failed: a cell a resume runs again (not diverged: its row is final), as the launch's summary counts
        self.failed += (result.status not in FINAL_STATUSES) - (replaces not in (None, *FINAL_STATUSES))
        if not replaces:
            self.done, self.finished = self.done + 1, self.finished + 1
        last = cell_words(result, self.models > 1)
        self._bar.update(self._task, advance=0 if replaces else 1, failed=self.failed, last=last)
        why = f": {first_line(result.error)}" if result.status != "ok" and result.error else ""
        if self.mode == "lines":
            took = f" {result.wall_time_s:.1f}s" if result.wall_time_s is not None else ""
            self._write(f"trial {self.done}/{self.total}: {last}{took}{why}")
        elif self.mode == "bar" and why:  # above the bar, which shows the last cell only
            self._bar.console.print(f"trial {self.done}/{self.total}: {last}{why}", markup=False, highlight=False)

    def _summary(self) -> None:
        self._write(self.summary_line())
        self.last_summary = self.clock()

    def summary_line(self) -> str:
        """ended/total (failed ones among them: a walk-through read "4/10 done, 1 failed" as 5 of 10, where
        the report's "done" is the ok cells), this launch's rate and the ETA at that rate."""
        elapsed_s = self.clock() - self.started
        rate_per_s = self.finished / elapsed_s if elapsed_s > 0 else 0.0
        left = max(0, self.total - self.done)  # never "-1 day": done counts cells of the grid (sweeps.grid_statuses)
        eta = _duration(left / rate_per_s) if rate_per_s > 0 else ("0:00:00" if left == 0 else "unknown")
        eta = f"at most {eta}" if self.at_most and eta != "unknown" else eta
        return (
            f"progress: {self.done}/{self.total} ended ({self.failed} failed), {rate_per_s * 60:.2f} trials/min, "
            f"elapsed {_duration(elapsed_s)}, ETA {eta}"
        )

    def tick(self) -> None:
        """The timer's call: a summary line once ``summary_every_s`` have passed since the last one."""
        if self.mode == "lines" and self.clock() - self.last_summary >= self.summary_every_s:
            self._summary()

    def _write(self, line: str) -> None:
        with self._lock:
            print(line, file=self.out, flush=True)  # a file is block-buffered: the log shows it now

    def _run_timer(self) -> None:
        poll_s = min(1.0, self.summary_every_s / 10)
        while not self._stop.wait(poll_s):
            self.tick()

    def __enter__(self) -> "SweepProgress":
        if self.mode == "lines" and not self._announced:  # a log says the trials started (a walk-through), once
            self._announced = True
            to_run = (
                f"at most {self.total - self.done} to run (settle mode: its rounds run what the rows call for)"
                if self.at_most
                else f"{self.total - self.done} to run"
            )
            self._write(
                f"started: {self.done}/{self.total} done, {to_run}; a line as each trial ends, a progress line at "
                f"least every {_duration(self.summary_every_s)}"
            )
        if self.mode == "lines" and self._timer is None:  # each settle round enters again: its timer too
            self._stop.clear()
            self._timer = threading.Thread(target=self._run_timer, name="freezesweep-progress", daemon=True)
            self._timer.start()
        self._bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)
        if self._timer is not None:
            self._stop.set()
            self._timer.join()
            self._timer = None
            self._summary()


def _bar(console: Console | None, disable: bool) -> Progress:
    """done/total and ETA first; the last cell last, cut with an ellipsis where the line ends."""
    last = Column(no_wrap=True, overflow="ellipsis", ratio=1, min_width=0)
    return Progress(
        TextColumn("[bold]{task.description}"),
        MofNCompleteColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        BarColumn(bar_width=20),
        TextColumn("failed: {task.fields[failed]}"),
        TimeElapsedColumn(),
        TextColumn("last: {task.fields[last]}", table_column=last),
        console=console,
        disable=disable,
        expand=True,
    )
