"""The driver's fault switch, for tests: ``FREEZESWEEP_DRIVER_FAULT=kill-in-write@N`` SIGKILLs the
driver while the N-th row file is half written (trial faults live in ``trials/faults.py``)."""

from __future__ import annotations

import os

DRIVER_FAULT_ENV = "FREEZESWEEP_DRIVER_FAULT"
_events: dict[str, int] = {}


def maybe_kill_driver(event: str) -> None:
    """SIGKILL this (driver) process at the N-th ``event`` when the switch names it."""
    spec = os.environ.get(DRIVER_FAULT_ENV)
    if not spec:
        return
    _events[event] = _events.get(event, 0) + 1
    kind, _, nth = spec.partition("@")
    if kind == f"kill-in-{event}" and _events[event] == int(nth or 1):
        os.kill(os.getpid(), 9)


def in_write() -> None:
    """The store's ``mid_write`` hook."""
    maybe_kill_driver("write")
