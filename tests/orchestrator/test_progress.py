"""A sweep's progress without a terminal (lines, a summary at least every minute, from a timer) and on
a narrow one (done/total and ETA first)."""

from __future__ import annotations

import io
import threading

from rich.console import Console

from freezesweep.orchestrator.progress import SweepProgress
from freezesweep.trials.config import TrialConfig, TrialResult


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def _result(seed: int, status: str = "ok", k: int = 0, error: str | None = None) -> TrialResult:
    cfg = TrialConfig(dataset="glue/sst2", model="m", train_size=200, frozen_layers=k, seed=seed, precision="fp32")
    score = 0.785 if status == "ok" else None
    return TrialResult(
        trial_id=cfg.trial_id,
        config=cfg,
        status=status,
        select_metric="accuracy",
        best_val_score=score,
        wall_time_s=12.34,
        error=error,
    )


def test_without_a_terminal_one_line_per_trial_and_a_summary_every_minute():
    out, clock = io.StringIO(), FakeClock()
    progress = SweepProgress(total=10, done=2, out=out, terminal=False, clock=clock)
    clock.now_s += 30
    progress.advance(_result(0))
    progress.advance(_result(1, status="failed", k=2, error="DatasetError: no folder x\n  File trials/data.py"))
    assert out.getvalue().splitlines() == [
        "trial 3/10: glue/sst2 n=200 k=0 s=0 ok accuracy=0.785 12.3s",
        "trial 4/10: glue/sst2 n=200 k=2 s=1 failed 12.3s: DatasetError: no folder x",  # why, in a line
    ]
    clock.now_s += 29.9
    progress.tick()  # 59.9 s since the start: no summary yet
    assert len(out.getvalue().splitlines()) == 2
    clock.now_s += 0.1
    progress.tick()
    # 2 trials in 60 s: 2 per minute, the 6 left take 3 minutes
    assert out.getvalue().splitlines()[-1] == (
        "progress: 4/10 ended (1 failed), 2.00 trials/min, elapsed 0:01:00, ETA 0:03:00"
    )
    progress.tick()  # the next one a minute after the last, not at every tick
    assert len(out.getvalue().splitlines()) == 3
    clock.now_s += 60
    progress.tick()
    assert out.getvalue().splitlines()[-1].startswith("progress: 4/10 ended (1 failed), 1.00 trials/min")


def test_the_summary_comes_from_a_timer_while_no_trial_finishes():
    """No trial ends, yet the log gets its summary: the timer thread, on the real clock (a short period)."""
    written = threading.Event()

    class Log(io.StringIO):
        def write(self, text: str) -> int:
            if text.startswith("progress:"):
                written.set()
            return super().write(text)

    out = Log()
    with SweepProgress(total=3, done=0, out=out, terminal=False, summary_every_s=0.05):
        assert written.wait(timeout=30), "no summary line from the timer"
        started, summary = out.getvalue().splitlines()[:2]
        # the first line comes as the trials start (before: nothing until one ended, up to a minute)
        assert (
            started == "started: 0/3 done, 3 to run; a line as each trial ends, a progress line at least every 0:00:00"
        )
        assert summary.startswith("progress: 0/3 ended (0 failed), 0.00 trials/min")
        assert "ETA unknown" in out.getvalue()


def test_a_retry_replacing_an_oom_row_is_one_line_of_the_same_cell_count():
    out = io.StringIO()
    progress = SweepProgress(total=2, done=0, out=out, terminal=False)
    progress.advance(_result(0, status="oom"))
    progress.advance(_result(0), replaces="oom")
    assert [line.split(":")[0] for line in out.getvalue().splitlines()] == ["trial 1/2", "trial 1/2"]
    assert (progress.done, progress.failed) == (1, 0)


def test_a_diverged_cell_is_not_counted_failed():
    """Its row is final (resume does not run it again), as the launch's own summary counts it."""
    out = io.StringIO()
    progress = SweepProgress(total=2, done=0, out=out, terminal=False)
    progress.advance(_result(0, status="diverged"))
    progress.advance(_result(1, status="failed"))
    assert (progress.done, progress.failed) == (2, 1)
    assert progress.summary_line().startswith("progress: 2/2 ended (1 failed)")


def test_the_started_line_comes_once_though_each_settle_round_enters_again():
    out = io.StringIO()
    progress = SweepProgress(total=2, done=0, out=out, terminal=False, summary_every_s=3600)
    for _ in range(2):  # two rounds
        with progress:
            pass
    assert sum(line.startswith("started:") for line in out.getvalue().splitlines()) == 1


def test_every_settle_round_keeps_its_periodic_lines_and_ends_with_one():
    """An AVX2 walk-through's demo: from its second round on, no progress line came for minutes (the timer
    started once, with the started: line) and no round ended with one."""
    out = io.StringIO()
    progress = SweepProgress(total=2, done=0, out=out, terminal=False, summary_every_s=3600)
    for _ in range(3):  # three rounds
        with progress:
            assert progress._timer is not None and progress._timer.is_alive()
    assert sum(line.startswith("progress:") for line in out.getvalue().splitlines()) == 3


def test_a_sweep_of_several_models_names_each_lines_model():
    """A walk-through: two models' lines read alike (`trial 1/8: glue/sst2 n=50 k=-1 s=0` and `trial 5/8: …`)."""
    import dataclasses

    out = io.StringIO()
    progress = SweepProgress(total=2, done=0, out=out, terminal=False, models=2)
    result = _result(0)
    hub = dataclasses.replace(result.config, model="sentence-transformers/all-MiniLM-L6-v2")
    progress.advance(dataclasses.replace(result, config=hub))
    assert out.getvalue().startswith("trial 1/2: all-MiniLM-L6-v2 glue/sst2 n=200 k=0 s=0 ok")
    one = io.StringIO()
    SweepProgress(total=1, done=0, out=one, terminal=False).advance(result)
    assert one.getvalue().startswith("trial 1/1: glue/sst2 n=200")  # one model: as before


def test_a_settle_sweeps_total_is_said_as_its_budget():
    """A walk-through: "started: 0/12 done, 12 to run" and an ETA for 12 cells, where its rounds ran 4."""
    out, clock = io.StringIO(), FakeClock()
    progress = SweepProgress(total=12, done=0, out=out, terminal=False, clock=clock, at_most=True, summary_every_s=60)
    with progress:
        clock.now_s += 60
        progress.advance(_result(0))
        progress.tick()
    started, _, summary, *_ = out.getvalue().splitlines()
    assert started.startswith("started: 0/12 done, at most 12 to run (settle mode: its rounds run what the rows")
    assert summary.endswith("ETA at most 0:11:00")


def test_disabled_writes_nothing():
    out = io.StringIO()
    with SweepProgress(total=2, done=0, enabled=False, out=out, terminal=False) as progress:
        progress.advance(_result(0))
    assert out.getvalue() == ""


def _bar_line(width: int) -> str:
    console = Console(width=width, file=io.StringIO(), force_terminal=True, color_system=None)
    progress = SweepProgress(total=96, done=30, out=io.StringIO(), terminal=True, console=console)
    progress.advance(_result(1))
    console.print(progress._bar.get_renderable())
    return console.file.getvalue().rstrip("\n")


def test_on_a_terminal_a_failed_trial_says_why_above_the_bar():
    console = Console(width=200, file=io.StringIO(), force_terminal=True, color_system=None)
    progress = SweepProgress(total=96, done=30, out=io.StringIO(), terminal=True, console=console)
    progress.advance(_result(1))  # an ok trial: the bar's last cell only
    progress.advance(_result(2, status="failed", error="DatasetError: no folder [x]\n  File trials/data.py"))
    assert console.file.getvalue().strip().splitlines() == [
        "trial 32/96: glue/sst2 n=200 k=0 s=2 failed: DatasetError: no folder [x]"
    ]


def test_on_a_terminal_of_80_columns_done_total_and_eta_come_first():
    line = _bar_line(80)
    assert len(line) <= 80 and "\n" not in line
    assert line.startswith("trials 31/96 ETA ")
    assert "failed: 0" in line and "last: glue/sst2" in line and line.endswith("…")  # cut where it ends
    assert "accuracy=0.785" in _bar_line(200)  # the whole last cell where it fits
