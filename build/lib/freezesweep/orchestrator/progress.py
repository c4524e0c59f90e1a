"""A progress bar for a sweep: done/total, failures, elapsed and ETA (rich)."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from freezesweep.trials.config import TrialResult


class SweepProgress:
    def __init__(self, total: int, done: int, enabled: bool = True):
        self.failed = 0
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("failed: {task.fields[failed]}"), TextColumn("last: {task.fields[last]}"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), disable=not enabled,
        )
        self._task = self._progress.add_task("trials", total=total, completed=done, failed=0, last="-")

    def advance(self, result: TrialResult, replaces: str | None = None) -> None:
        """A cell's outcome; ``replaces``: the status of this cell's earlier row in this launch (its
        retry's row replaces it: the cell is counted once)."""
        self.failed += (result.status != "ok") - (replaces not in (None, "ok"))
        cfg = result.config
        last = f"{cfg.dataset} n={cfg.train_size} {cfg.variant()} s={cfg.seed} {result.status}"
        if result.best_val_score is not None:
            last += f" {result.select_metric}={result.best_val_score:.3f}"
        self._progress.update(self._task, advance=0 if replaces else 1, failed=self.failed, last=last)

    def __enter__(self) -> "SweepProgress":
        self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.__exit__(*exc)
