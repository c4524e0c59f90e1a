"""The driver's fault switch, for tests (trial faults live in ``trials/faults.py``):
- ``FREEZESWEEP_DRIVER_FAULT=kill-in-write@N`` leaves the N-th row file this driver writes half-written
  in the store's staging folder and SIGKILLs the driver, as a power cut in the middle of a write would;
- ``kill-after-round@N`` SIGKILLs it once its N-th round of cells is over, before the next one starts (a
  round: a Tune run, or in settle mode a group's cells whose rows are all in, before its next ones go out).

Read once per launch (``from_env``) and counted by the object the store calls once per write
(``on_staged``) and the launch once per round (``on_round_end``): production writes each file whole.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import pyarrow.fs as pafs

DRIVER_FAULT_ENV = "FREEZESWEEP_DRIVER_FAULT"
_KINDS = {"kill-in-write": "kill_at_write", "kill-after-round": "kill_after_round"}  # rule -> field


@dataclass
class DriverFaults:
    kill_at_write: int | None = None  # the write (1-based) whose staged file is cut and the driver killed
    kill_after_round: int | None = None  # the round (1-based) after which the driver is killed
    writes: int = 0
    rounds: int = 0

    @classmethod
    def from_env(cls) -> "DriverFaults":
        rule = os.environ.get(DRIVER_FAULT_ENV)
        if not rule:
            return cls()
        kind, _, nth = rule.partition("@")
        if kind not in _KINDS or not (nth or "1").isdigit():
            raise ValueError(f"bad {DRIVER_FAULT_ENV} rule {rule!r}: expected kill-in-write@N or kill-after-round@N")
        return cls(**{_KINDS[kind]: int(nth or 1)})

    def on_round_end(self) -> None:
        """The launch's hook: a round's cells all have their outcome, the next round has not started."""
        self.rounds += 1
        if self.rounds == self.kill_after_round:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_staged(self, fs: pafs.FileSystem, staged: str) -> None:
        """The store's hook: a row file is staged whole, not yet moved into place."""
        self.writes += 1
        if self.writes != self.kill_at_write:
            return
        with fs.open_input_stream(staged) as f:
            payload = f.read()
        with fs.open_output_stream(staged) as f:
            f.write(payload[: len(payload) // 2])  # what a crash mid-write leaves
        os.kill(os.getpid(), signal.SIGKILL)
