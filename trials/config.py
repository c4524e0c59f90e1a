"""The one typed, frozen input of a trial, and the one output.

A `TrialConfig` is a grid cell (dataset, model, train size, frozen layers, seed) plus the protocol
that every cell of a sweep shares.

Identity: `trial_id` hashes exactly the fields named in `IDENTITY_FIELDS` (in that order), plus each
field of `LATER_FIELDS` only when it differs from the default it was added with. So a field added
later never re-keys a stored sweep: its rows were made at that field's default, and their ids stay.
Fields that say where things live or how the machine is used are not identity at all.

Seeds are paired: the RNG seed of a trial (`derived_seed`) is a function of (seed, split_seed,
dataset, model) only, so cells that differ in frozen layers or train size share the classifier-head
initialisation and the batch-order stream (common random numbers): a contrast across k at fixed n
then sees no head-init noise.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from freezesweep.trials.metrics import METRICS

# The identity of a cell, pinned on 2026-11-21 (tests/trials/test_identity.py holds ids as literals).
# Never add to or reorder this tuple: a new field goes into LATER_FIELDS.
IDENTITY_FIELDS = (
    "dataset",
    "model",
    "model_init",
    "train_size",
    "frozen_layers",
    "seed",
    "split_seed",
    "text_column",
    "label_column",
    "max_eval_examples",
    "max_seq_length",
    "epochs",
    "batch_size",
    "learning_rate",
    "weight_decay",
    "warmup_epochs",
    "eval_every_epochs",
    "max_grad_norm",
    "precision",
)
# Fields hashed only when not at these defaults. A field added after the ids were pinned goes here,
# with the default that reproduces what rows made before it did, so their ids stay (every row made
# before select_metric picked its best evaluation by accuracy, and had no second text).
LATER_FIELDS: dict[str, Any] = {
    "method": "freeze",
    "eval_at_end": False,
    "train_cache": False,
    "text_pair_column": None,
    "select_metric": "accuracy",
    "empty_texts": "refuse",  # rows with an empty text: refused, or dropped (trials/data.py)
    # the methods beyond freezing (trials/lora.py, trials/probe.py): unset on freeze cells
    "lora_rank": None,
    "lora_alpha": None,
    "lora_dropout": None,
    "lora_targets": None,
    "probe_pooling": None,
    "probe_folds": None,
    "probe_cs": None,
}
# How the work is done and where things live: never identity (moving a data dir re-runs nothing).
MACHINE_FIELDS = (
    "eval_batch_size",
    "eval_cache",
    "narrow_last_layer",
    "pack_training",
    "cuda_graphs",
    "trial_array",
    "data_dir",
    "cache_dir",
    "checkpoint_dir",
    "checkpoint_every_epochs",
    "num_threads",
    "device",
    "gpus_per_trial",
    "dataset_files",
    "model_dir",
)
# What the RNG seed derives from: not frozen_layers, train_size or the protocol (paired seeds).
SEED_FIELDS = ("seed", "split_seed", "dataset", "model")
# The axes of the grid; every other identity field is the sweep's protocol. An axis that does not
# apply to a cell's method is None there (frozen_layers of a LoRA or probe cell, lora_rank of others).
CELL_AXES = ("dataset", "model", "method", "train_size", "frozen_layers", "lora_rank", "seed")
METHODS = ("freeze", "lora", "probe")
# Per method, the method's own fields: set on its cells, None on every other cell.
METHOD_FIELDS = {
    "freeze": ("frozen_layers",),
    "lora": ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets"),
    "probe": ("probe_pooling", "probe_folds", "probe_cs"),
}


_ENCODER = json.JSONEncoder(sort_keys=True, default=str)  # json.dumps(values, sort_keys=True, default=str), built once


def _digest(values: dict[str, Any]) -> str:
    return hashlib.sha256(_ENCODER.encode(values).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class TrialConfig:
    # --- the cell ---
    dataset: str
    model: str
    train_size: int
    frozen_layers: int | None  # None: a method without the axis (lora, probe)
    seed: int = 0
    # --- data and subsets ---
    split_seed: int = 0
    text_column: str | None = None  # None: the dataset's own default (GLUE's, else "sentence")
    text_pair_column: str | None = None  # None: the GLUE task's second text (e.g. "sentence2"), else single sentences
    label_column: str | None = None
    max_eval_examples: int | None = None  # None: the full validation split, as in the reference
    max_seq_length: int = 128
    empty_texts: str = "refuse"  # rows with an empty or missing text: refuse (an error naming them) | drop
    # --- the protocol (reference defaults) ---
    method: str = "freeze"  # freeze | lora | probe (METHODS); "freeze" is what every row made before methods did
    lora_rank: int | None = None  # lora: the adapters' rank r
    lora_alpha: float | None = None  # lora: the scale alpha (updates are scaled by alpha / r)
    lora_dropout: float | None = None  # lora: dropout on the adapters' input
    lora_targets: tuple[str, ...] | None = None  # lora: module names in each layer; None: its attention projections
    probe_pooling: str | None = (
        None  # probe: auto | mean | first | last (auto: the model's own, last on a decoder, else mean)
    )
    probe_folds: int | None = None  # probe: cross-validation folds on the train subset
    probe_cs: int | None = None  # probe: regularisation strengths tried, log-spaced over 1e-4 … 1e4
    model_init: str = "pretrained"  # "random": same architecture, fresh weights (a control)
    epochs: float = 10.0
    batch_size: int = 16
    learning_rate: float = 5e-5
    weight_decay: float = 0.0
    warmup_epochs: float = 1.0
    eval_every_epochs: float = 0.5
    eval_at_end: bool = False  # the reference never forces an evaluation at the last step
    select_metric: str = "accuracy"  # picks the best evaluation; the spec resolves the task's official one
    max_grad_norm: float = 1.0
    precision: str = "auto"  # auto | fp16 | bf16 | fp32; resolved (never "auto") before it is hashed
    train_cache: bool = False  # opt-in deviation: frozen layers without dropout, run once (trials/train_cache.py)
    # --- how the work is done, where things live (not identity) ---
    eval_batch_size: int = 64  # length-sorted, masked batches: the batch size changes speed, not results
    eval_cache: bool = True  # reuse the frozen layers' evaluation output (exact: checked per cache entry)
    narrow_last_layer: bool = True  # the last layer past attention for the head's token only (trials/first_token.py)
    pack_training: bool = True  # training batches without their padding (trials/packing.py)
    cuda_graphs: bool = False  # the training step as CUDA graphs over length buckets (trials/graphs.py): opt-in
    # Trains beside the cells that differ only in frozen depth (trials/array.py): None (auto) on a GPU only,
    # where a step is kernel launches more than arithmetic; on a CPU, bound by arithmetic, an array adds to it.
    trial_array: bool | None = None
    data_dir: str | None = None
    cache_dir: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every_epochs: float | None = None
    num_threads: int | None = None
    device: str = "auto"  # auto | cpu | cuda | cuda:N (auto: by gpus_per_trial, trials/precision.py trial_device)
    # The GPU share the scheduler gives the cell (orchestrator/plan.py): 0 runs it on the CPU whatever the
    # node has; None (a trial outside a sweep): the machine's GPU if it has one.
    gpus_per_trial: float | None = None
    # Where this node holds files the driver shipped (orchestrator/local_files.py); None: the dataset's
    # and model's own paths. The (train, validation) files, and the model's folder.
    dataset_files: tuple[str, str] | None = None
    model_dir: str | None = None

    def __post_init__(self):
        for name in (
            "lora_targets",
            "dataset_files",
        ):  # from JSON (Ray's trial config): tuples, so configs compare equal
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))

    def model_files(self) -> str:
        """Where the model is loaded from: this node's copy of a shipped folder, else ``model`` itself."""
        return self.model_dir or self.model

    # ----------------------------------------------------------------------------------------
    def identity(self) -> dict[str, Any]:
        """The fields that make a cell what it is (see the module docstring)."""
        if self.precision == "auto":
            raise ValueError(
                "resolve precision 'auto' before asking for a cell's identity "
                "(trials.precision.resolve_config): ids must name the precision actually used"
            )
        values = {name: getattr(self, name) for name in IDENTITY_FIELDS}
        values.update(
            (name, value)
            for name, default in LATER_FIELDS.items()
            if (value := getattr(self, name)) != default and not self._inert(name)
        )
        # 10 and 10.0 epochs are one protocol: float fields hash as floats whatever the caller passed.
        for name in _HASHED_FLOAT_FIELDS:
            if isinstance(values.get(name), int) and not isinstance(values[name], bool):
                values[name] = float(values[name])
        return values

    def _inert(self, name: str) -> bool:
        """A later field that cannot change this cell's result: hashing it would re-run identical work."""
        # nothing frozen above the embeddings to cache (and no frozen layers at all outside freeze)
        return name == "train_cache" and (self.method != "freeze" or self.frozen_layers < 1)

    def variant(self) -> str:
        """The method with its own axis value, for progress lines and tables: "k=3", "lora r=8", "probe"."""
        if self.method == "freeze":
            return f"k={self.frozen_layers}"
        return f"lora r={self.lora_rank}" if self.method == "lora" else self.method

    @functools.cached_property
    def trial_id(self) -> str:
        """Computed once per config (it is frozen; ``dataclasses.replace`` makes a new one): a launch asks
        each of up to a million cells for it several times."""
        return _digest(self.identity())

    @property
    def derived_seed(self) -> int:
        """The RNG seed of this trial: shared by every cell with the same (seed, split_seed, dataset,
        model), so those cells draw the same head initialisation and batch-order stream."""
        return int(_digest({name: getattr(self, name) for name in SEED_FIELDS}), 16) % (2**31 - 1)

    def protocol(self) -> dict[str, Any]:
        """The identity fields that are not grid axes: what every row of a sweep must share."""
        return {k: v for k, v in self.identity().items() if k not in CELL_AXES}

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


_FLOAT_FIELDS = frozenset(f.name for f in dataclasses.fields(TrialConfig) if f.type in ("float", "float | None"))
_HASHED_FLOAT_FIELDS = tuple(name for name in (*IDENTITY_FIELDS, *LATER_FIELDS) if name in _FLOAT_FIELDS)


# TrialResult.baseline_rows of every result: the baseline was computed on exactly the rows the scores were
# (results/store.py EVALUATED_ROWS, the store's value; a test holds the two equal).
EVALUATED_ROWS = "evaluated"


@dataclass(frozen=True)
class EvalPoint:
    """One evaluation: every metric of the task (trials/metrics.py; the others stay None)."""

    step: int
    epoch: float
    accuracy: float | None  # None for regression
    loss: float  # mean cross-entropy, or mean squared error for regression
    f1: float | None = None
    matthews: float | None = None
    pearson: float | None = None
    spearman: float | None = None
    # every evaluated row got the same prediction (one class, or one score): the constant predictor's output
    # (trials/metrics.py constant); not a column of the store's curves, the row's ``collapsed`` holds it
    constant_predictions: bool = False

    def metrics(self) -> dict[str, float]:
        """The metrics this evaluation has, by name."""
        return {name: getattr(self, name) for name in METRICS if getattr(self, name) is not None}


@dataclass(frozen=True)
class TrialResult:
    trial_id: str
    config: TrialConfig
    status: str  # ok | diverged (a non-finite loss: final, as ok) | failed | oom
    diverged_at_step: int | None = None  # diverged: the first step with a non-finite train (or validation) loss
    best_val_accuracy: float | None = None  # accuracy at the best evaluation (None for regression)
    best_step: int | None = None
    best_epoch: float | None = None
    final_val_accuracy: float | None = None
    majority_baseline: float | None = None  # accuracy of always answering the evaluated rows' majority class
    select_metric: str | None = None  # the metric that picked the best evaluation (config.select_metric)
    best_val_score: float | None = None  # that metric at the best evaluation
    final_val_score: float | None = None  # that metric at the last evaluation
    # The constant baseline (the evaluated rows' majority class / the train mean) on exactly the rows the scores
    # are computed on (``baseline_rows``: EVALUATED_ROWS; the max_eval_examples sample where one is drawn).
    baseline_score: float | None = None  # that metric of the constant baseline
    # the best evaluation is the constant predictor's or a near miss of it: one prediction for every evaluated
    # row, or a score at most a tenth of the way from the constant baseline's to a perfect one (run.collapsed;
    # None: no evaluation)
    collapsed: bool | None = None
    best_val_metrics: dict[str, float] = field(default_factory=dict)  # every metric at the best evaluation
    baseline_metrics: dict[str, float] = field(default_factory=dict)  # every metric of the constant baseline
    baseline_rows: str | None = None  # which rows the baseline was computed on: EVALUATED_ROWS (None: no baseline)
    eval_curve: tuple[EvalPoint, ...] = ()
    train_loss_curve: tuple[tuple[int, float], ...] = ()  # (step, mean loss since previous eval)
    trainable_params: int | None = None
    total_params: int | None = None
    train_time_s: float | None = None
    eval_time_s: float | None = None
    wall_time_s: float | None = None
    train_examples_per_s: float | None = None
    # the trial's own: CUDA, the allocator's peak less what its worker keeps (caches); CPU, the peak RSS above
    # the RSS at the trial's start (freed memory given back first), less caches and files it mapped (run.py)
    peak_mem_mb: float | None = None
    worker_peak_mem_mb: float | None = None  # the process's peak, the worker's caches included
    device: str | None = None
    precision: str | None = None  # the resolved one (never "auto")
    train_indices_digest: str | None = None
    resumed_from_step: int | None = None  # > 0 when a retry continued from a trial checkpoint
    eval_cached_layers: int | None = None  # evaluation reused the cached output of this many frozen layers
    train_cached_layers: int | None = None  # training started above this many cached frozen layers (opt-in)
    cache_fill_time_s: float | None = None  # filling this worker's caches for this cell (0 when they were warm)
    # The optimisations this trial used, each where its check showed it exact for the model
    # (OPTIMISATIONS; docs/models.md): the others stepped aside and the model ran in full there.
    optimisations: tuple[str, ...] = ()
    lora_targets: tuple[str, ...] = ()  # lora: the module names adapted in each layer (resolved)
    probe_pooling: str | None = None  # probe: the pooling used (auto resolved)
    probe_c: float | None = None  # probe: the inverse regularisation strength cross-validation chose
    train_indices: tuple[int, ...] = ()
    n_train: int | None = None
    n_eval: int | None = None
    error: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    # Where it ran: host and CUDA device (trials/placement.py), plus the scheduler's node and GPU share
    # (orchestrator/tune_adapter.py); the store's columns of the same names.
    placement: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def result_from_dict(data: dict[str, Any]) -> TrialResult:
    """Inverse of ``TrialResult.to_dict`` (results cross Ray as plain JSON)."""
    data = dict(data)
    data["config"] = TrialConfig.from_dict(data["config"])
    data["eval_curve"] = tuple(EvalPoint(**p) for p in data.get("eval_curve", ()))
    data["train_loss_curve"] = tuple(tuple(x) for x in data.get("train_loss_curve", ()))
    data["train_indices"] = tuple(data.get("train_indices", ()))
    data["lora_targets"] = tuple(data.get("lora_targets", ()))
    data["optimisations"] = tuple(data.get("optimisations", ()))
    return TrialResult(**data)
