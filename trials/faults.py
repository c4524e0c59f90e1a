"""Fault injection for tests: make chosen trials fail the way real ones do.

``FREEZESWEEP_FAULT`` holds rules separated by ``;``, each ``KIND@N[:MATCH][*TIMES]``:
- KIND: ``crash`` (raise RuntimeError), ``exit`` (kill the trial's own process, as a segfault or the
  kernel's OOM killer would), ``oom`` (raise ``torch.cuda.OutOfMemoryError``, also on CPU),
  ``oom<S`` (the same, only while the trial's GPU share is below S: a trial that fits once it has
  S of a GPU; the share is the cell's ``gpus_per_trial``, what its scheduler gave it), or ``hang``
  (block until the process is killed: a long trial caught mid-run, whose node a test then stops),
  or ``meetK`` (wait until K trials have reached this evaluation, at most MEET_TIMEOUT_S: trials
  that must run at the same time, as a test of placement needs; it needs ``FREEZESWEEP_FAULT_DIR``,
  a folder every trial sees, fresh for each launch: marks are never taken back, and members of one
  trial array evaluate one after another, so give single trials);
- N: fire after the N-th evaluation;
- MATCH: ``key=value,...`` over TrialConfig fields, or a trial_id prefix; all trials when absent;
- TIMES: fire at most this many times per trial (needs ``FREEZESWEEP_FAULT_DIR``, where the count
  is kept across processes and retries); unlimited when absent.
Unset, this costs one dict lookup per evaluation.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from pathlib import Path

import torch

from freezesweep.trials.config import TrialConfig

FAULT_ENV = "FREEZESWEEP_FAULT"
FAULT_DIR_ENV = "FREEZESWEEP_FAULT_DIR"
MEET_TIMEOUT_S = 300.0  # bounded: trials that can never all run at once go on (the test then says where they ran)
_KINDS = re.compile(r"crash|exit|oom|hang|meet[1-9][0-9]*")


def maybe_inject(cfg: TrialConfig, evals_done: int) -> None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    for rule in filter(None, (r.strip() for r in spec.split(";"))):
        kind, below, after, match, times = _parse(rule)
        share = cfg.gpus_per_trial or 0.0
        if after == evals_done and share < below and _matches(cfg, match) and _take_shot(cfg, rule, times):
            _fire(kind, cfg)


def _parse(rule: str) -> tuple[str, float, int, str, int | None]:
    rule, _, times = rule.partition("*")
    head, _, match = rule.partition(":")
    kind, _, after = head.partition("@")
    kind, bounded, below = kind.partition("<")
    bad_bound = bounded and (kind != "oom" or not _is_share(below))
    if not _KINDS.fullmatch(kind) or not after.isdigit() or bad_bound:
        raise ValueError(
            f"bad {FAULT_ENV} rule {rule!r}: expected KIND@N[:MATCH][*TIMES], "
            "KIND crash, exit, oom, oom<SHARE, hang or meetK"
        )
    return kind, float(below) if bounded else float("inf"), int(after), match, int(times) if times else None


def _is_share(text: str) -> bool:
    try:
        return 0 < float(text) <= 1
    except ValueError:
        return False


def _matches(cfg: TrialConfig, match: str) -> bool:
    if not match:
        return True
    if "=" not in match:
        return cfg.trial_id.startswith(match)
    fields = cfg.to_dict()
    return all(str(fields.get(k)) == v for k, v in (pair.split("=", 1) for pair in match.split(",")))


def _take_shot(cfg: TrialConfig, rule: str, times: int | None) -> bool:
    if times is None:
        return True
    folder = Path(os.environ[FAULT_DIR_ENV])
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / f"{cfg.trial_id}-{hashlib.sha1(rule.encode()).hexdigest()[:8]}"
    fired = len(marker.read_text()) if marker.exists() else 0
    if fired >= times:
        return False
    marker.write_text("x" * (fired + 1))
    return True


def _fire(kind: str, cfg: TrialConfig) -> None:
    message = f"injected {kind} in trial {cfg.trial_id}"
    if kind == "crash":
        raise RuntimeError(message)
    if kind == "oom":
        raise torch.cuda.OutOfMemoryError(f"CUDA out of memory ({message})")
    if kind == "hang":
        threading.Event().wait()  # nothing sets it: only the end of the process ends the trial
    if kind.startswith("meet"):
        return _meet(cfg, int(kind.removeprefix("meet")))
    os._exit(17)


def _meet(cfg: TrialConfig, count: int) -> None:
    """Each trial leaves a mark, then waits for ``count`` marks (its own included)."""
    folder = Path(os.environ[FAULT_DIR_ENV]) / "meet"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / cfg.trial_id).touch()
    deadline = time.monotonic() + MEET_TIMEOUT_S
    while len(list(folder.iterdir())) < count and time.monotonic() < deadline:
        time.sleep(0.05)
