"""The sweep spec: the bottom layer of orchestrator/. Shapes and values only, no I/O.

``parse`` turns a YAML mapping into a ``SweepSpec`` and lists pydantic's problems; what needs the
model, the data, the store or the cluster is checked one layer up (orchestrator/checks.py), which
reports both kinds together, before Ray starts or the store is touched.

The protocol's defaults are TrialConfig's (trials/config.py): one definition serves a sweep's cells
and ``freezesweep trial`` alike.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections import Counter
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import numpy as np
import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from freezesweep.results.settle import SettleRule
from freezesweep.results.stats import TOLERANCE
from freezesweep.trials.config import LATER_FIELDS, MACHINE_FIELDS, TrialConfig
from freezesweep.trials.metrics import METRICS

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"  # a sweep name is a folder name in the store
# NAME_PATTERN in words: pydantic's message quotes the regex (a walk-through's
# "String should match pattern '^[A-Za-z0-9][A-Za-z0-9_.-]*$'"); the only pattern a field has
_NAME_WORDS = "a folder name in the store: letters, digits, '_', '.' and '-' only, starting with a letter or digit"
DEFAULT_STORE = "./sweeps"  # the store root when neither the spec nor the command names one


class SpecError(ValueError):
    def __init__(self, problems: list[str], source: str = "sweep spec"):
        self.problems, self.source = problems, source
        super().__init__(f"{source}: {len(problems)} problem(s):\n" + "\n".join(f"  - {p}" for p in problems))


class SweepNotFound(SpecError, LookupError):
    """A sweep name the store does not hold (``source``: the store): said in one sentence, with where it
    was looked for and what is there. A LookupError to code that asks for a name (``except LookupError``),
    a SpecError to the CLI and to code written before it (the name is the spec's)."""

    def __init__(self, message: str, store: str):
        super().__init__([message], store)
        self.args = (message,)  # no "1 problem(s)" list: not a spec file's problems

    def __reduce__(self):  # pickled (a Ray task, a process pool) as it was made: args alone lack the store
        return type(self), (self.args[0], self.source)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _not_a_boolean(value: Any) -> Any:
    """pydantic reads True as 1 where a number is asked for; YAML reads yes/no/on/off as booleans, so
    ``seeds: [yes, no]`` would quietly be seeds 1 and 0. A number is never a boolean here."""
    if isinstance(value, (bool, np.bool_)):  # numpy's too: a notebook's mask turned into an axis
        raise ValueError("a number, not a boolean (YAML reads yes/no, true/false and on/off as booleans)")
    return value


# Every number of a spec: a boolean is refused; 200.0 and numpy's integers read as pydantic reads them.
Int = Annotated[int, BeforeValidator(_not_a_boolean)]
Float = Annotated[float, BeforeValidator(_not_a_boolean)]


def _a_depth(value: Any) -> Any:
    """A frozen depth: an integer or ``all``; anything else (``All``, 2.5) is one problem, not one per member
    of the union. A whole float (2.0) is the integer, as pydantic reads it."""
    value = _not_a_boolean(value)
    if isinstance(value, str) and value == "all":
        return value
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    number = as_int(value)
    if number is None:
        raise ValueError("a depth is an integer (-1 embeddings only, 0 nothing, k layers) or all")
    return number


Depth = Annotated[int | Literal["all"], BeforeValidator(_a_depth)]


# The protocol's defaults: TrialConfig's own, so a sweep cell and `freezesweep trial` share them.
_TRIAL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrialConfig)}


COLUMN_KEYS = ("text_column", "text_pair_column", "label_column")


def column_for(value: str | Mapping[str, str] | None, dataset: str | None) -> str | None:
    """A column key's value for ``dataset``: one name for every dataset, or a mapping's for it (None: the
    default, or a GLUE task's own columns)."""
    return value.get(dataset) if isinstance(value, Mapping) else value  # type: ignore[arg-type]


def _default(name: str, **constraints: Any) -> Any:
    return Field(_TRIAL_DEFAULTS[name], **constraints)


class TrainingSpec(_Strict):
    """The protocol: every cell of a sweep shares it, and it cannot change once rows exist. Every
    default is TrialConfig's (but ``select_metric``: unset means each task's official metric)."""

    epochs: Float = _default("epochs", gt=0)
    batch_size: Int = _default("batch_size", gt=0)
    eval_batch_size: Int = _default(
        "eval_batch_size",
        gt=0,
        description="length-sorted batches: speed only (64 "
        "suits a CPU core, where 128 is ~10% slower; a GPU wants 256 or more)",
    )
    learning_rate: Float = _default("learning_rate", gt=0)
    weight_decay: Float = _default("weight_decay", ge=0)
    warmup_epochs: Float = _default("warmup_epochs", ge=0)
    eval_every_epochs: Float = _default("eval_every_epochs", gt=0)
    eval_at_end: bool = _default(
        "eval_at_end", description="also evaluate after the last step (the reference does not)"
    )
    max_grad_norm: Float = _default("max_grad_norm", gt=0)
    precision: Literal["auto", "fp16", "bf16", "fp32"] = _default("precision")
    max_eval_examples: Int | None = _default("max_eval_examples", gt=0)
    max_seq_length: Int = _default("max_seq_length", gt=0)
    model_init: Literal["pretrained", "random"] = _default("model_init")
    text_column: str | dict[str, str] | None = _default(
        "text_column", description="the text's column: one for every dataset, or {dataset: column} (default: sentence)"
    )
    text_pair_column: str | dict[str, str] | None = _default(
        "text_pair_column",
        description="second text of a sentence pair, or {dataset: column} (GLUE pair tasks: theirs)",
    )
    label_column: str | dict[str, str] | None = _default(
        "label_column", description="the label's column, or {dataset: column} (default: label)"
    )
    empty_texts: Literal["refuse", "drop"] = _default(
        "empty_texts",
        description="rows with an empty or missing text: refuse (an error naming them) or drop (their count said)",
    )
    select_metric: str | dict[str, str] | None = Field(
        None,
        description="the metric that picks each trial's best evaluation: one name for every dataset, or "
        "{dataset: name}; unset: each task's official metric (a launch stores the resolved {dataset: name})",
    )
    checkpoint_every_epochs: Float | None = _default("checkpoint_every_epochs", gt=0)
    trial_array: bool | None = _default(
        "trial_array",
        description="train the cells that differ only in frozen depth as one trial array (trials/array.py): "
        "unset (auto) where the cells run on a GPU; true also on a CPU (which it gives more arithmetic); false never",
    )
    train_cache: bool = _default(
        "train_cache",
        description="opt-in deviation from the reference: frozen layers "
        "run once, without dropout, and training starts above them (trials/train_cache.py)",
    )
    cuda_graphs: bool = _default(
        "cuda_graphs",
        description="GPU trials: the training step as CUDA graphs over a few length buckets "
        "(trials/graphs.py); off until a GPU has measured it",
    )

    def trial_fields(self, dataset: str | None = None) -> dict[str, Any]:
        """The TrialConfig fields this protocol sets (every field but ``select_metric``, resolved per
        dataset), its columns ``dataset``'s (a mapping's value for it; a dataset it does not name: the
        default, its own columns for a GLUE task)."""
        fields = {k: v for k, v in self.model_dump().items() if k != "select_metric"}
        return fields | {k: column_for(fields[k], dataset) for k in COLUMN_KEYS}

    @field_validator("select_metric")
    @classmethod
    def _known_metrics(cls, value: str | dict[str, str] | None) -> str | dict[str, str] | None:
        names = [value] if isinstance(value, str) else list((value or {}).values())
        unknown = [name for name in names if name not in METRICS]
        if unknown:
            raise ValueError(f"unknown metric {', '.join(map(repr, unknown))} (known: {', '.join(METRICS)})")
        return value


class LoraSpec(_Strict):
    """LoRA's settings, shared by every lora cell (its rank is an axis: ``lora_ranks``)."""

    alpha: Float = Field(16.0, gt=0, description="updates are scaled by alpha / rank (peft's examples: 16 at rank 8)")
    dropout: Float = Field(0.1, ge=0, lt=1, description="dropout on the adapters' input")
    targets: list[str] | None = Field(
        None,
        min_length=1,
        description="module names (or dotted suffixes) inside "
        "each layer of the stack; unset: the layer's attention projections",
    )
    learning_rate: Float | None = Field(
        None,
        gt=0,
        description="unset: the protocol's (training.learning_rate); "
        "LoRA usually wants more (Hu et al. 2021 used 4e-4 to 5e-4 on RoBERTa-base)",
    )


class ProbeSpec(_Strict):
    """The logistic-regression probe's settings, shared by every probe cell."""

    pooling: Literal["auto", "mean", "first", "last"] = Field(
        "auto",
        description="auto: the model's own pooling "
        "(sentence-transformers config; the last token on a decoder-only "
        "model), else mean",
    )
    folds: Int = Field(
        5,
        ge=2,
        description="cross-validation folds on the train subset (fewer when a class has fewer rows; "
        "at least 2 rows of each class, checked before any trial)",
    )
    cs: Int = Field(10, ge=1, description="regularisation strengths tried, log-spaced over 1e-4 … 1e4")


class SettleSpec(_Strict):
    """Settle mode (results/settle.py): the sweep runs in rounds, each arm compared with full fine-tuning
    on paired seeds, seeds added only where a comparison is undecided, until all are decided or the
    budget is spent. The seeds are settle mode's to choose (0, 1, …): the spec gives no ``seeds``."""

    # below 1: at 1 or more nearly every depth would count as as good (accuracy and f1 differ by at most 1,
    # and a depth 1 below full fine-tuning on matthews or a correlation has learned nothing; a walk-through asked 2)
    tolerance: Float = Field(0.01, gt=0, lt=1, description="how much below full fine-tuning still counts as as good")
    confidence: Float = Field(0.95, gt=0, lt=1, description="that every decision of a group holds at once")
    initial_seeds: Int = Field(3, ge=3, description="paired seeds every arm gets before the first look")
    max_seeds: Int = Field(10, ge=3, description="the budget: no arm gets more seeds")
    seeds_per_round: Int = Field(2, ge=1, description="seeds added to each undecided arm per round")
    learned_first: bool = Field(
        True,
        description="run the arms only once full fine-tuning is known to beat the "
        "constant baseline (fewest trials); false: every arm from the first round (fewest rounds)",
    )

    @model_validator(mode="after")
    def _budget(self) -> "SettleSpec":
        problems = settle_budget(vars(self))
        if problems:
            raise ValueError(problems[0])
        return self

    def rule(self) -> SettleRule:
        return SettleRule(
            self.tolerance,
            self.confidence,
            self.initial_seeds,
            self.max_seeds,
            self.seeds_per_round,
            self.learned_first,
        )


class ResourcesSpec(_Strict):
    gpus_per_trial: float | Literal["auto"] = Field(
        0.0,
        description="0: CPU trials; (0, 1]: a GPU share; auto: measure one trial's GPU memory at launch and "
        "pack as many per GPU as fit (trials/memory_probe.py)",
    )
    cpus_per_trial: Float = Field(1.0, gt=0)
    max_concurrent_trials: Int | None = Field(None, gt=0)
    max_failures: Int = Field(2, ge=0, description="Ray retries of a crashed trial")
    array_width: Int = Field(
        8,
        ge=1,
        description="the most cells one trial array trains at once (one Ray trial each; with "
        "gpus_per_trial auto, the memory probe may halve it until one array fits its GPU)",
    )
    # 1,000: on 2 cores, 10,000 instant trials took 19 ms of driver CPU each and 1.2 GB at most in rounds of
    # 1,000, 2.5 GB in rounds of 5,000 (Tune keeps every trial of a run; ray#64231) (benchmarks/scale.py).
    # Counted in Ray trials, not cells: what grows in a Tune run is its trials, and a trial array is one
    # (cells counted, a round's fixed start was paid per 1,000 cells with arrays or without: docs/scale.md).
    trials_per_round: Int = Field(
        1000,
        gt=0,
        description="a launch runs its cells in rounds of at most this many Ray trials (a trial array is "
        "one), each one Tune run: Tune's state and bookkeeping grow with the trials of a run "
        "(cells_per_round: its name until 0.3.0, still read)",
    )

    @model_validator(mode="before")
    @classmethod
    def _old_name(cls, raw: Any) -> Any:
        """``cells_per_round``: ``trials_per_round``'s name until 0.3.0 (specs, stored spec.yaml files).
        Here, not in ``spec_aliases``: a conflict is then one problem among the spec's others."""
        if isinstance(raw, dict) and "cells_per_round" in raw:
            if "trials_per_round" in raw:
                raise ValueError("give trials_per_round or its old name cells_per_round, not both")
            raw = {("trials_per_round" if k == "cells_per_round" else k): v for k, v in raw.items()}
        return raw

    @field_validator("gpus_per_trial", mode="before")
    @classmethod
    def _share_or_auto(cls, value: Any) -> Any:
        # One message per problem, at the field itself (a union's own errors name each member type).
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("a GPU share in [0, 1], or auto")
        if value < 0:
            raise ValueError("Input should be greater than or equal to 0")
        if value > 1:
            raise ValueError("Input should be less than or equal to 1")
        return value


class TrackingSpec(_Strict):
    mlflow: str | None = Field(
        None,
        description="an MLflow tracking URI: the launch logs each row as a run as it "
        "lands (needs the extra: pip install 'freezesweep[mlflow]'); a tracking failure "
        "never fails the sweep",
    )
    experiment: str | None = Field(None, description="the MLflow experiment (default: the sweep's name)")


# Smallest allowed value of each integer axis, and the rule as the error states it.
_AXIS_MINIMA = {
    "train_sizes": (1, "train sizes must be positive"),
    "frozen_layers": (-1, "frozen layers must be >= -1 (-1 = embeddings only) or 'all'"),
    "lora_ranks": (1, "LoRA ranks must be positive"),
    "seeds": (0, "seeds must be >= 0"),
}
# Grids larger than this are refused (split them into sweeps); larger than LARGE_GRID, announced.
MAX_CELLS = 1_000_000
LARGE_GRID = 100_000
# Each method's own axis: crossed with that method's cells only.
METHOD_AXES = {"freeze": "frozen_layers", "lora": "lora_ranks"}


def _unique(values: list) -> list:
    dupes = sorted((v for v, n in Counter(values).items() if n > 1), key=str)  # linear in the axis
    if dupes:
        raise ValueError(f"duplicate values {dupes}")
    return values


class SweepSpec(_Strict):
    name: str = Field(pattern=NAME_PATTERN, max_length=100)
    model: str | list[str] = Field(description="a model, or a list of them (also spelled `models:`): an axis")
    datasets: list[str] = Field(min_length=1)
    train_sizes: list[Int] = Field(min_length=1)
    methods: list[Literal["freeze", "lora", "probe"]] = Field(["freeze"], min_length=1)
    frozen_layers: list[Depth] = Field([], description="freeze's axis; 'all': every layer of each model")
    lora_ranks: list[Int] = Field([], description="lora's axis")
    seeds: list[Int] = Field([], description="an axis; settle mode chooses them instead (settle:)")
    settle: SettleSpec | None = None
    tolerance: Float | None = Field(
        None,
        gt=0,
        lt=1,
        description="a fixed grid's question, asked before its rows are seen: how much below full fine-tuning "
        "still counts as as good (default 0.01); a settle sweep asks settle.tolerance",
    )
    split_seed: Int = 0
    training: TrainingSpec = TrainingSpec()
    lora: LoraSpec = LoraSpec()
    probe: ProbeSpec = ProbeSpec()
    resources: ResourcesSpec = ResourcesSpec()
    data_dir: str | None = None
    local_files: Literal["auto", "ship", "node_local"] = Field(
        "auto",
        description="how trials on other nodes get the spec's local data files and model folders: ship = "
        "the driver sends them through Ray's object store; node_local = every node has them at the same paths "
        "(checked on every node before the first trial); auto = ship on a cluster (orchestrator/local_files.py)",
    )
    store: str = DEFAULT_STORE
    address: str | None = None
    tracking: TrackingSpec = TrackingSpec()

    _check_unique = field_validator("datasets", "train_sizes", "methods", "frozen_layers", "lora_ranks", "seeds")(
        _unique
    )

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, raw: Any) -> Any:
        return spec_aliases(raw)

    @field_validator("model", mode="before")
    @classmethod
    def _models(cls, value: Any) -> Any:
        return _model_names(value)

    @field_validator("train_sizes", "frozen_layers", "lora_ranks", "seeds")
    @classmethod
    def _axis_ranges(cls, values: list, info) -> list:
        lowest, rule = _AXIS_MINIMA[info.field_name]
        bad = [v for v in values if isinstance(v, int) and v < lowest]
        if bad:
            raise ValueError(f"{rule}: {bad} {'is' if len(bad) == 1 else 'are'} not")
        return values

    @model_validator(mode="after")
    def _across_keys(self) -> "SweepSpec":
        """Every problem across keys in one error (pydantic stops at the first after-validator that raises:
        seeds + settle was said, then tolerance + settle on the next run): the methods' axes, seeds or
        settle, and the grid's size; one line each (``parse`` splits them). Where a key fails on its own,
        pydantic runs none of this: ``parse`` asks ``across_keys`` of the keys that passed."""
        problems = across_keys({name: getattr(self, name) for name in type(self).model_fields}) + self._grid_size()
        if problems:
            raise ValueError(ACROSS_KEYS_SEPARATOR.join(problems))
        return self

    def __repr_args__(self):
        """A notebook prints a spec: an axis of thousands of values is shown by its length and ends."""
        for name, value in super().__repr_args__():
            yield name, _LongAxis(value) if isinstance(value, list) and len(value) > _SHOWN_AXIS_VALUES else value

    def question_tolerance(self) -> float:
        """The tolerance the sweep's decisions answer, fixed before its rows are seen: a tolerance chosen
        after reading them makes each a different depth's test (the error over the readings adds up)."""
        if self.settle is not None:
            return self.settle.tolerance
        return TOLERANCE if self.tolerance is None else self.tolerance

    def seed_values(self) -> list[int]:
        """The seeds axis: the spec's, or every seed settle mode may run."""
        return list(range(self.settle.max_seeds)) if self.settle else list(self.seeds)

    def _grid_size(self) -> list[str]:
        if self.cell_count() > MAX_CELLS:
            return [
                f"the grid has {self.cell_count():,} cells ({self.cell_count_words()}), over the limit "
                f"of {MAX_CELLS:,}: split it into several sweeps"
            ]
        return []

    def models(self) -> list[str]:
        return [self.model] if isinstance(self.model, str) else list(self.model)

    def variants(self) -> int:
        """Cells per (model, dataset, train size, seed): each method's own axis, the probe one."""
        return sum(len(getattr(self, METHOD_AXES[m])) if m in METHOD_AXES else 1 for m in self.methods)

    def cell_count(self) -> int:
        """The grid's size, from the axes alone (``frozen_layers: all`` counted as one more depth)."""
        return (
            len(self.models()) * len(self.datasets) * len(self.train_sizes) * self.variants() * len(self.seed_values())
        )

    def cell_count_words(self, variants: Mapping[str, int] | None = None) -> str:
        """E.g. "1 model × 2 datasets × 5 train sizes × 7 variants × 30,000 seeds". ``variants``: each model's
        count where its depth is known (orchestrator/plan.py ``grid_size_words``); models of unequal counts
        are one factor, their sum ("5 model variants (a: 3, b: 2)"), so the factors multiply to the grid."""
        per_model = variants or dict.fromkeys(self.models(), self.variants())
        rest = ((len(self.datasets), "dataset"), (len(self.train_sizes), "train size"))
        seeds = (len(self.seed_values()), "seed")
        if len(set(per_model.values())) == 1:
            return _product_words(
                ((len(per_model), "model"), *rest, (next(iter(per_model.values())), "variant"), seeds)
            )
        each = ", ".join(f"{model}: {n:,}" for model, n in per_model.items())
        return f"{sum(per_model.values()):,} model variants ({each}) × {_product_words((*rest, seeds))}"

    def protocol(self, select_metrics: Mapping[str, str]) -> dict[str, Any]:
        """What makes rows comparable: changing any of it on an existing sweep is refused. How the work
        is done (checkpoints, evaluation batch size) may change: it is not part of a cell's identity.
        Axes (models, datasets, sizes, methods, their own axes, seeds) may grow: new cells, new ids.
        ``select_metrics``: per dataset, resolved ("official" and a name may mean the same)."""
        training = {k: v for k, v in self.training.model_dump().items() if k not in MACHINE_FIELDS}
        # each dataset's columns, as its cells read them: a mapping that names a new dataset, or one name
        # spelled as a mapping, changes no cell
        training |= {k: {d: column_for(training[k], d) for d in self.datasets} for k in COLUMN_KEYS}
        training["select_metric"] = dict(select_metrics)
        return {
            "split_seed": self.split_seed,
            "training": training,
            "lora": self.lora.model_dump(),
            "probe": self.probe.model_dump(),
        }

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def trial_template(self, dataset: str | None = None) -> dict[str, Any]:
        """TrialConfig fields shared by every cell of ``dataset`` (the plan adds the axes, each method's
        own fields and each dataset's select_metric)."""
        return {"split_seed": self.split_seed, "data_dir": self.data_dir, **self.training.trial_fields(dataset)}

    def method_fields(self, method: str) -> dict[str, Any]:
        return method_fields(method, self.lora, self.probe)


_SHOWN_AXIS_VALUES = 10


class _LongAxis:
    """An axis in a spec's repr: ``[2,000 values: 0, 1, …, 1999]``."""

    def __init__(self, values: list) -> None:
        self.values = values

    def __repr__(self) -> str:
        v = self.values
        return f"[{len(v):,} values: {v[0]!r}, {v[1]!r}, …, {v[-1]!r}]"


def _product_words(counts: tuple[tuple[int, str], ...]) -> str:
    return " × ".join(f"{n:,} {word}{'' if n == 1 else 's'}" for n, word in counts)


def method_fields(method: str, lora: LoraSpec | None = None, probe: ProbeSpec | None = None) -> dict[str, Any]:
    """The TrialConfig fields of ``method`` shared by its cells (its axis aside); unset settings: the defaults."""
    lora, probe = lora or LoraSpec(), probe or ProbeSpec()
    if method == "lora":
        targets = tuple(lora.targets) if lora.targets else None
        rate = {"learning_rate": lora.learning_rate} if lora.learning_rate is not None else {}
        return {"lora_alpha": lora.alpha, "lora_dropout": lora.dropout, "lora_targets": targets, **rate}
    if method == "probe":
        return {"probe_pooling": probe.pooling, "probe_folds": probe.folds, "probe_cs": probe.cs}
    return {}


def _model_names(value: Any) -> Any:
    """``model:`` (or ``models:``) checked: one message, not pydantic's one per member of the union."""
    if not (isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))):
        raise ValueError("should be a model name (hub id or folder) or a list of them")
    if isinstance(value, list):
        if not value:
            raise ValueError("the list of models is empty")
        _unique(value)
    return value


def settle_budget(settle: Mapping[str, Any]) -> list[str]:
    """settle's rule across its own keys (``settle``: its values by field); not asked when either key is
    absent (one that failed on its own: its default would be a budget nobody gave)."""
    if not {"initial_seeds", "max_seeds"} <= settle.keys() or settle["max_seeds"] >= settle["initial_seeds"]:
        return []
    return [f"settle.max_seeds ({settle['max_seeds']}) is below settle.initial_seeds ({settle['initial_seeds']})"]


ACROSS_KEYS_SEPARATOR = "\n"  # between the problems of one check across keys (a problem is one line)


def across_keys(values: Mapping[str, Any]) -> list[str]:
    """The problems across keys of a spec's values by field (the methods' axes, seeds or settle); a rule
    that reads a key not in ``values`` (one that failed on its own) is not asked."""
    return _method_axes(values) + _seeds_or_settle(values)


def _method_axes(v: Mapping[str, Any]) -> list[str]:
    """A method's axis is given exactly when the method is swept (no axis crossed with a method it does
    not apply to)."""
    if "methods" not in v:
        return []
    methods, axes = v["methods"], {m: axis for m, axis in METHOD_AXES.items() if axis in v}
    problems = [f"{axis} is empty, but methods has {m}" for m, axis in axes.items() if m in methods and not v[axis]]
    problems += [f"{axis} is set, but methods has no {m}" for m, axis in axes.items() if m not in methods and v[axis]]
    problems += [  # (a stored spec names every setting: as the defaults, they are no one's choice)
        f"{method} is set, but methods has no {method}: its settings would change nothing"
        for method in ("lora", "probe")
        if method in v and method not in methods and v[method] != type(v[method])()
    ]
    return problems


def _seeds_or_settle(v: Mapping[str, Any]) -> list[str]:
    if "settle" not in v:
        return []
    settle, problems = v["settle"], []
    if "seeds" in v and settle is None and not v["seeds"]:
        problems.append("seeds: give at least one seed, or a settle section (settle mode chooses them)")
    if "seeds" in v and settle is not None and v["seeds"]:
        problems.append(
            "seeds and settle both given: settle mode chooses the seeds (0, 1, … up to settle.max_seeds); drop seeds"
        )
    if "tolerance" in v and settle is not None and v["tolerance"] is not None:
        problems.append("tolerance and settle both given: a settle sweep asks settle.tolerance; drop tolerance")
    if {"methods", "frozen_layers"} <= v.keys() and settle is not None:
        if not ("freeze" in v["methods"] and 0 in v["frozen_layers"]):
            problems.append("settle compares every arm with full fine-tuning: frozen_layers must hold 0")
    return problems


def _passed_keys(raw: dict[str, Any], errors: list[Any]) -> dict[str, Any]:
    """The spec's fields that passed on their own, as pydantic made them (a default where not given, and
    not misspelt: an unknown key's near match is that key, given): what ``across_keys`` can check beside
    the fields' own errors."""
    try:
        given = spec_aliases(dict(raw))
    except Exception:  # an alias of the wrong shape: its own error says so
        return {}
    failed = _failed_keys(errors, ())
    values = _passed_fields(SweepSpec, given, failed)
    for name, field in SweepSpec.model_fields.items():  # a section that failed is still given (settle + seeds)
        section = _section_of(field.annotation)
        if name in failed and section and isinstance(given.get(name), dict):
            values[name] = section.model_construct(
                **_passed_fields(section, given[name], _failed_keys(errors, (name,)))
            )
    return values


def _failed_keys(errors: list[Any], loc: tuple) -> set[str]:
    """The keys of the mapping at ``loc`` that failed on their own, a misspelt key's near match among them
    (`frozen_layer:` is frozen_layers given, not frozen_layers' default)."""
    failed = {
        str(err["loc"][len(loc)]) for err in errors if len(err["loc"]) > len(loc) and err["loc"][: len(loc)] == loc
    }
    for err in errors:
        if err["type"] == "extra_forbidden" and len(err["loc"]) == len(loc) + 1 and err["loc"][:-1] == loc:
            failed.update(difflib.get_close_matches(str(err["loc"][-1]), _known_keys(loc), n=1, cutoff=0.75))
    return failed


def _passed_fields(model: type[BaseModel], given: dict[str, Any], failed: set[str]) -> dict[str, Any]:
    """``model``'s fields not in ``failed``, as pydantic makes them (a default where not given)."""
    values: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if name in failed or (name not in given and field.is_required()):
            continue
        try:
            values[name] = (
                TypeAdapter(field.annotation).validate_python(given[name])
                if name in given
                else field.get_default(call_default_factory=True)
            )
        except ValidationError:
            continue
    return values


def _section_of(annotation: Any) -> type[BaseModel] | None:
    """The section a field holds (``settle: SettleSpec | None``: SettleSpec), else None."""
    return next((t for t in (annotation, *get_args(annotation)) if _is_section(t)), None)


def spec_aliases(raw: Any) -> Any:
    """Spellings a spec may use: ``models:`` for a list of models, and ``training.method`` (specs
    written before the methods axis, stored ones included) for ``methods: [that one]`` (and
    ``ResourcesSpec``'s own: ``cells_per_round``)."""
    if not isinstance(raw, dict):
        return raw
    raw = dict(raw)
    if "models" in raw:
        if raw.get("model") is not None:
            raise ValueError(MODEL_AND_MODELS)
        raw["model"] = raw.pop("models")
    training = raw.get("training")
    if isinstance(training, dict) and "method" in training:
        raw["training"] = {k: v for k, v in training.items() if k != "method"}
        raw.setdefault("methods", [training["method"]])
    return raw


def parse(raw: Any) -> tuple[SweepSpec | None, list[str]]:
    """A parsed YAML mapping as a SweepSpec, and the problems of its shapes and values (the spec is
    None when there are any). What needs the model, data, store or cluster: orchestrator/checks.py."""
    if not isinstance(raw, dict):
        return None, [f"the spec must be a mapping of keys, got {type(raw).__name__}"]
    raw, problems = _one_model_key(raw)
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        problems += [line for err in errors for line in _format_pydantic(err).split(ACROSS_KEYS_SEPARATOR)]
        if all(err["loc"] for err in errors):  # a key failed on its own: the checks across keys did not run
            problems += across_keys(_passed_keys(raw, errors))
        return None, problems + _settle_unchecked(raw, errors) + _ranges_unchecked(raw, errors)
    return (None, problems) if problems else (spec, [])


MODEL_AND_MODELS = "give model or models, not both"


def named_models(raw: dict[str, Any]) -> list[str]:
    """The model names of ``model:`` and of ``models:``, both where both are given (one problem: the checks
    that load a model speak of every name meanwhile); other shapes are pydantic's to report."""
    names: list[str] = []
    for value in (raw.get("model"), raw.get("models")):
        names += [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str)]
    return list(dict.fromkeys(names))


def _one_model_key(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``model:`` and ``models:`` both given: that problem, and the spec without ``models:`` for the rest
    (``spec_aliases`` refuses the pair, before pydantic has checked any key: it was the only problem said).
    ``models:``'s own problem is named too; checks.py checks the models of both keys."""
    if "models" not in raw or raw.get("model") is None:
        return raw, []
    problems = [MODEL_AND_MODELS]
    try:
        _model_names(raw["models"])
    except ValueError as exc:
        problems.append(
            _format_pydantic({"loc": ("models",), "type": "value_error", "msg": str(exc), "input": raw["models"]})
        )
    return {k: v for k, v in raw.items() if k != "models"}, problems


def _settle_unchecked(raw: dict[str, Any], errors: list[Any]) -> list[str]:
    """settle's budget where a key of settle failed on its own (pydantic then runs no check of settle's)."""
    settle, failed = raw.get("settle"), _failed_keys(errors, ("settle",))
    if not isinstance(settle, dict) or not failed:
        return []
    return settle_budget(_passed_fields(SettleSpec, settle, failed))


def _ranges_unchecked(raw: dict[str, Any], errors: list[Any]) -> list[str]:
    """The range rule of each axis a member of the wrong type kept pydantic from checking (its field
    validator runs after its members): `frozen_layers: [0, al, -2]` named `al` alone, then `-2` after the fix."""
    problems = []
    for axis, (lowest, rule) in _AXIS_MINIMA.items():
        values = raw.get(axis)
        if not isinstance(values, list) or not any(len(e["loc"]) > 1 and e["loc"][0] == axis for e in errors):
            continue
        bad = [n for n in map(as_int, values) if n is not None and n < lowest]
        if bad:
            problems.append(f"{axis}: {rule}: {bad} {'is' if len(bad) == 1 else 'are'} not")
    return problems


def as_int(value: Any) -> int | None:
    """A number of a spec as pydantic reads an integer (a text of one too: "9" meets the checks 9 meets),
    else None (a boolean is never one)."""
    if isinstance(value, (bool, np.bool_)):
        return None
    try:
        number = int(value) if isinstance(value, str) else value
    except ValueError:
        return None
    return int(number) if isinstance(number, (int, np.integer)) else None


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, keeping every key given twice in one mapping (at any depth) with both lines:
    a plain load keeps the last one silently (a second ``seeds:`` or ``store:`` would quietly win)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self.duplicates: list[tuple[int, str]] = []  # (the second line, the problem)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first_lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, Hashable) and key in first_lines:
                self.duplicates.append(
                    (
                        line,
                        f"duplicate key {key!r} on lines {first_lines[key]} and {line} "
                        "(YAML keeps only the last; give it once)",
                    )
                )
            elif isinstance(key, Hashable):
                first_lines[key] = line
        return super().construct_mapping(node, deep)


def load_yaml_text(text: str) -> tuple[Any, list[str]]:
    """The document's value and its duplicate keys, each named with both lines (yaml.YAMLError when malformed)."""
    loader = _UniqueKeyLoader(text)
    try:
        data = loader.get_single_data()
        return data, [problem for _, problem in sorted(loader.duplicates)]  # in the file's order
    finally:
        loader.dispose()


def _yaml_words(exc: yaml.YAMLError) -> str:
    """PyYAML's error on one line, by the file's lines: "line 3, column 9: did not find expected ',' or
    ']' (while parsing a flow sequence from line 2, column 8)" (its own text names "<unicode string>")."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return " ".join(str(exc).split())
    where = f"line {exc.problem_mark.line + 1}, column {exc.problem_mark.column + 1}"
    context = ""
    if exc.context:
        start = exc.context_mark
        since = f" from line {start.line + 1}, column {start.column + 1}" if start is not None else ""
        context = f" ({exc.context}{since})"
    return f"{where}: {exc.problem}{context}"


def read_yaml(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Any:
    """A spec file's mapping, with ``overrides`` (those not None) on top; SpecError naming the file
    (every key given twice, with both lines)."""
    path = Path(path)
    try:
        raw, duplicates = load_yaml_text(path.read_text())
    except FileNotFoundError:
        raise SpecError([f"no such file: {path}"], str(path)) from None
    except IsADirectoryError:
        raise SpecError(["a folder, not a spec file (a sweep spec is one YAML file)"], str(path)) from None
    except UnicodeDecodeError as exc:  # a binary file, or text in another encoding
        raise SpecError(
            [f"not a text file in UTF-8 (byte {exc.start}): a spec is a YAML text file"], str(path)
        ) from None
    except OSError as exc:  # unreadable: permissions, a broken mount
        raise SpecError([f"cannot read it: {exc.strerror or exc}"], str(path)) from None
    except yaml.YAMLError as exc:
        raise SpecError([f"malformed YAML: {_yaml_words(exc)}"], str(path)) from None
    if duplicates:
        raise SpecError(duplicates, str(path))
    if isinstance(raw, dict) and overrides:
        raw = {**raw, **{k: v for k, v in overrides.items() if v is not None}}
    return raw


# Rows of a sweep stored before select_metric existed picked their best evaluation by accuracy: the
# default TrialConfig gives the field for exactly that reason.
LEGACY_SELECT_METRIC = LATER_FIELDS["select_metric"]


# What to do about a stored spec.yaml that cannot be read: ids are content hashes of the cells, so the
# spec the sweep was launched with, launched again under the same name, finds every row it made.
DAMAGED_SPEC_HINT = (
    "relaunch the sweep's original spec file under the same name (`freezesweep launch SPEC`): "
    "cell ids are stable, so it continues the sweep and rewrites spec.yaml"
)


def read_stored_spec(text: str, source: str = "spec.yaml") -> dict[str, Any]:
    """A stored spec.yaml as a mapping. One written before ``select_metric`` existed has no such key;
    it reads as accuracy (what its rows used), not as the official metric a new spec defaults to, so
    the sweep resumes with its cell ids unchanged. A damaged one is one SpecError saying what to do."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError([f"damaged: not YAML ({str(exc).splitlines()[0]}); {DAMAGED_SPEC_HINT}"], source) from None
    if not isinstance(raw, dict):
        raise SpecError([f"damaged: not a mapping of keys; {DAMAGED_SPEC_HINT}"], source)
    training = raw.get("training") or {}
    if isinstance(training, dict) and "select_metric" not in training:
        raw = {**raw, "training": {**training, "select_metric": LEGACY_SELECT_METRIC}}
    return raw


def _format_pydantic(err: Mapping[str, Any]) -> str:
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        near = difflib.get_close_matches(str(err["loc"][-1]), _known_keys(err["loc"][:-1]), n=1, cutoff=0.75)
        return f"{where}: unknown key" + (f" (did you mean {near[0]}?)" if near else "")
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "string_pattern_mismatch":
        message = _NAME_WORDS if err.get("ctx", {}).get("pattern") == NAME_PATTERN else message
    if not err["loc"]:  # a check across keys: its message names them (the input is the whole spec)
        return message
    if err["type"] == "missing":  # its input is the mapping the key is missing from: nothing to show
        return f"{where}: {message}"
    shown = repr(err.get("input"))
    if len(shown) > _SHOWN_INPUT_CHARS:  # an axis of 100,000 seeds is named, not printed
        shown = shown[:_SHOWN_INPUT_CHARS] + f"… ({len(shown):,} characters)"
    return f"{where}: {message} (got {shown})"


_SHOWN_INPUT_CHARS = 200


def _known_keys(loc: tuple) -> list[str]:
    """The keys a spec's mapping at ``loc`` takes (its section's fields and their aliases), for a hint."""
    model: type[BaseModel] = SweepSpec
    for part in loc:
        field = model.model_fields.get(str(part))
        sections = [t for t in (field.annotation, *get_args(field.annotation)) if _is_section(t)] if field else []
        if not sections:
            return []
        model = sections[0]
    return [alias or name for name, f in model.model_fields.items() for alias in {None, f.alias}]


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)
