"""The one typed, frozen input of a trial, and the one output.

A `TrialConfig` is a grid cell (dataset, model, train size, frozen layers, seed) plus the protocol
that every cell of a sweep shares. Its `trial_id` hashes exactly the fields that change the result,
so the same cell always gets the same id and the same derived RNG seed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

# Fields that only say *where* things live or how much the machine is used: they never change what a
# trial computes, so they stay out of the cell hash (moving a data dir must not re-run a sweep).
_NOT_HASHED = frozenset(
    {"data_dir", "cache_dir", "checkpoint_dir", "checkpoint_every_epochs", "num_threads", "device"}
)
# The axes of the grid; every other hashed field is the sweep's protocol.
CELL_AXES = ("dataset", "model", "train_size", "frozen_layers", "seed")


@dataclass(frozen=True)
class TrialConfig:
    # --- the cell ---
    dataset: str
    model: str
    train_size: int
    frozen_layers: int
    seed: int = 0
    # --- data and subsets ---
    split_seed: int = 0
    text_column: str | None = None  # None: the dataset's own default ("sentence" for GLUE)
    label_column: str | None = None
    max_eval_examples: int | None = None  # None: the full validation split, as in the reference
    max_seq_length: int = 128
    # --- the protocol (reference defaults) ---
    method: str = "freeze"  # room for "lora" / "probe" without changing the cell hash of old rows
    model_init: str = "pretrained"  # "random": same architecture, fresh weights (a control)
    epochs: float = 10.0
    batch_size: int = 16
    eval_batch_size: int = 128
    learning_rate: float = 5e-5
    weight_decay: float = 0.0
    warmup_epochs: float = 1.0
    eval_every_epochs: float = 0.5
    max_grad_norm: float = 1.0
    precision: str = "auto"  # auto | fp16 | bf16 | fp32
    # --- where things live / machine use (not part of the cell hash) ---
    data_dir: str | None = None
    cache_dir: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every_epochs: float | None = None
    num_threads: int | None = None
    device: str = "auto"  # auto | cpu | cuda | cuda:N

    # ----------------------------------------------------------------------------------------
    def hashed_fields(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in _NOT_HASHED}

    @property
    def trial_id(self) -> str:
        blob = json.dumps(self.hashed_fields(), sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def derived_seed(self) -> int:
        """The RNG seed of this cell: a pure function of the cell and protocol, so two runs of the
        same cell draw the same classifier init, dropout masks and batch order."""
        return int(self.trial_id, 16) % (2**31 - 1)

    def protocol(self) -> dict[str, Any]:
        """The hashed fields that are not grid axes: what every row of a sweep must share."""
        return {k: v for k, v in self.hashed_fields().items() if k not in CELL_AXES}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrialConfig":
        """Build from a plain dict (Ray's trial config, JSON), rejecting unknown keys by name."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown TrialConfig keys: {', '.join(unknown)}")
        return cls(**data)


@dataclass(frozen=True)
class EvalPoint:
    step: int
    epoch: float
    accuracy: float
    loss: float


@dataclass(frozen=True)
class TrialResult:
    trial_id: str
    config: TrialConfig
    status: str  # ok | failed | oom
    best_val_accuracy: float | None = None
    best_step: int | None = None
    best_epoch: float | None = None
    final_val_accuracy: float | None = None
    majority_baseline: float | None = None
    eval_curve: tuple[EvalPoint, ...] = ()
    train_loss_curve: tuple[tuple[int, float], ...] = ()  # (step, mean loss since previous eval)
    trainable_params: int | None = None
    total_params: int | None = None
    train_time_s: float | None = None
    eval_time_s: float | None = None
    wall_time_s: float | None = None
    train_examples_per_s: float | None = None
    peak_mem_mb: float | None = None
    device: str | None = None
    precision: str | None = None  # the resolved one (never "auto")
    train_indices_digest: str | None = None
    train_indices: tuple[int, ...] = ()
    n_train: int | None = None
    n_eval: int | None = None
    error: str | None = None
    versions: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def result_from_dict(data: dict[str, Any]) -> TrialResult:
    """Inverse of ``TrialResult.to_dict`` (results cross Ray as plain JSON)."""
    data = dict(data)
    data["config"] = TrialConfig.from_dict(data["config"])
    data["eval_curve"] = tuple(EvalPoint(**p) for p in data.get("eval_curve", ()))
    data["train_loss_curve"] = tuple(tuple(x) for x in data.get("train_loss_curve", ()))
    data["train_indices"] = tuple(data.get("train_indices", ()))
    return TrialResult(**data)
