"""A trial's result as one row of the store's schema (driver side: it knows both packages)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from freezesweep.results.store import CURVE_FIELDS, PLACEMENT_COLUMNS, SCHEMA
from freezesweep.trials.config import CELL_AXES, TrialResult
from freezesweep.trials.metrics import METRICS


def result_row(sweep: str, result: TrialResult, attempts: int | None = None, oom_retry: bool = False) -> dict[str, Any]:
    """Flatten a TrialResult into one row of ``results.store.SCHEMA``. ``oom_retry``: the launch ran
    this cell again with a larger GPU share after it ran out of memory (orchestrator/launch.py)."""
    cfg = result.config
    row = {name: getattr(result, name, None) for name in SCHEMA.names}
    row.update({name: result.placement.get(name) for name in PLACEMENT_COLUMNS})
    row.update({axis: getattr(cfg, axis) for axis in CELL_AXES})
    # best_val_accuracy is the result's own field; the other metrics come from the best evaluation's.
    row.update({f"best_val_{m}": result.best_val_metrics.get(m) for m in METRICS if m != "accuracy"})
    row.update({f"baseline_{m}": result.baseline_metrics.get(m) for m in METRICS})
    row.update(
        sweep=sweep,
        split_seed=cfg.split_seed,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        lora_targets=list(result.lora_targets) or None,
        attempts=attempts,
        oom_retry=oom_retry,
        optimisations=list(result.optimisations) if result.status in ("ok", "diverged") else None,
        node=result.placement.get("hostname"),  # the column before node ids existed: the host's name
        # the curve's columns by name: dataclasses.asdict's deep copy was two thirds of this function's time
        eval_curve=[{name: getattr(p, name) for name in CURVE_FIELDS} for p in result.eval_curve],
        train_loss_curve=[{"step": s, "loss": loss} for s, loss in result.train_loss_curve],
        train_indices=list(result.train_indices),
        finished_at=datetime.now(timezone.utc),
        config=json.dumps(cfg.to_dict(), sort_keys=True),
        versions=json.dumps(result.versions, sort_keys=True),
    )
    return row
