"""The sweep spec: YAML → a validated ``SweepSpec``, with every problem listed in one error.

Validation runs in two passes that both always run: pydantic checks shapes and ranges; the
semantic pass checks what needs the model and the data (layer counts, split sizes, fp16 without
GPUs, ...). Their problems are reported together, before Ray starts or the store is touched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trials.config import LATER_FIELDS

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"  # a sweep name is a folder name in the store


class SpecError(ValueError):
    def __init__(self, problems: list[str], source: str = "sweep spec"):
        self.problems = problems
        super().__init__(f"{source}: {len(problems)} problem(s):\n" + "\n".join(f"  - {p}" for p in problems))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TrainingSpec(_Strict):
    """The protocol: every cell of a sweep shares it, and it cannot change once rows exist."""

    epochs: float = Field(10.0, gt=0)
    batch_size: int = Field(16, gt=0)
    eval_batch_size: int = Field(64, gt=0, description="length-sorted batches: speed only (64 suits a CPU core, "
                                 "where 128 is ~10% slower; a GPU wants 256 or more)")
    learning_rate: float = Field(5e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_epochs: float = Field(1.0, ge=0)
    eval_every_epochs: float = Field(0.5, gt=0)
    eval_at_end: bool = Field(False, description="also evaluate after the last step (the reference does not)")
    max_grad_norm: float = Field(1.0, gt=0)
    precision: Literal["auto", "fp16", "bf16", "fp32"] = "auto"
    max_eval_examples: int | None = Field(None, gt=0)
    max_seq_length: int = Field(128, gt=0)
    model_init: Literal["pretrained", "random"] = "pretrained"
    text_column: str | None = None
    text_pair_column: str | None = Field(None, description="second text of a sentence pair (GLUE pair tasks: theirs)")
    label_column: str | None = None
    select_metric: str | dict[str, str] | None = Field(
        None, description="the metric that picks each trial's best evaluation: one name for every dataset, or "
        "{dataset: name}; unset: each task's official metric (a launch stores the resolved {dataset: name})")
    checkpoint_every_epochs: float | None = Field(None, gt=0)
    train_cache: bool = Field(False, description="opt-in deviation from the reference: frozen layers run once, "
                              "without dropout, and training starts above them (trials/train_cache.py)")

    @field_validator("select_metric")
    @classmethod
    def _known_metrics(cls, value: str | dict[str, str] | None) -> str | dict[str, str] | None:
        from trials.metrics import METRICS

        names = [value] if isinstance(value, str) else list((value or {}).values())
        unknown = [name for name in names if name not in METRICS]
        if unknown:
            raise ValueError(f"unknown metric {', '.join(map(repr, unknown))} (known: {', '.join(METRICS)})")
        return value


class LoraSpec(_Strict):
    """LoRA's settings, shared by every lora cell (its rank is an axis: ``lora_ranks``)."""

    alpha: float = Field(16.0, gt=0, description="updates are scaled by alpha / rank (peft's examples: 16 at rank 8)")
    dropout: float = Field(0.1, ge=0, lt=1, description="dropout on the adapters' input")
    targets: list[str] | None = Field(None, min_length=1, description="module names (or dotted suffixes) inside "
                                      "each encoder layer; unset: the layer's attention projections")
    learning_rate: float | None = Field(None, gt=0, description="unset: the protocol's (training.learning_rate); "
                                        "LoRA usually wants more (Hu et al. 2021 used 4e-4 to 5e-4 on RoBERTa-base)")


class ProbeSpec(_Strict):
    """The logistic-regression probe's settings, shared by every probe cell."""

    pooling: Literal["auto", "mean", "first"] = Field("auto", description="auto: the model's own pooling "
                                                      "(sentence-transformers config), else mean")
    folds: int = Field(5, ge=2, description="cross-validation folds on the train subset (fewer when a class has fewer rows)")
    cs: int = Field(10, ge=1, description="regularisation strengths tried, log-spaced over 1e-4 … 1e4")


class ResourcesSpec(_Strict):
    gpus_per_trial: float | Literal["auto"] = Field(
        0.0, description="0: CPU trials; (0, 1]: a GPU share; auto: measure one trial's GPU memory at launch and "
        "pack as many per GPU as fit (trials/memory_probe.py)")
    cpus_per_trial: float = Field(1.0, gt=0)
    max_concurrent_trials: int | None = Field(None, gt=0)
    max_failures: int = Field(2, ge=0, description="Ray retries of a crashed trial")

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


# Smallest allowed value of each integer axis, and the rule as the error states it.
_AXIS_MINIMA = {
    "train_sizes": (1, "train sizes must be positive"),
    "frozen_layers": (-1, "frozen layers must be >= -1 (-1 = embeddings only) or 'all'"),
    "lora_ranks": (1, "LoRA ranks must be positive"),
    "seeds": (0, "seeds must be >= 0"),
}
# Each method's own axis: crossed with that method's cells only.
METHOD_AXES = {"freeze": "frozen_layers", "lora": "lora_ranks"}


def _unique(values: list) -> list:
    dupes = sorted({v for v in values if values.count(v) > 1}, key=str)
    if dupes:
        raise ValueError(f"duplicate values {dupes}")
    return values


class SweepSpec(_Strict):
    name: str = Field(pattern=NAME_PATTERN, max_length=100)
    model: str | list[str] = Field(description="a model, or a list of them (also spelled `models:`): an axis")
    datasets: list[str] = Field(min_length=1)
    train_sizes: list[int] = Field(min_length=1)
    methods: list[Literal["freeze", "lora", "probe"]] = Field(["freeze"], min_length=1)
    frozen_layers: list[int | Literal["all"]] = Field([], description="freeze's axis; 'all': every layer of each model")
    lora_ranks: list[int] = Field([], description="lora's axis")
    seeds: list[int] = Field(min_length=1)
    split_seed: int = 0
    training: TrainingSpec = TrainingSpec()
    lora: LoraSpec = LoraSpec()
    probe: ProbeSpec = ProbeSpec()
    resources: ResourcesSpec = ResourcesSpec()
    data_dir: str | None = None
    local_files: Literal["auto", "ship", "node_local"] = Field(
        "auto", description="how trials on other nodes get the spec's local data files and model folders: ship = "
        "the driver sends them through Ray's object store; node_local = every node has them at the same paths "
        "(checked on every node before the first trial); auto = ship on a cluster (orchestrator/local_files.py)")
    store: str = "./sweeps"
    address: str | None = None

    _check_unique = field_validator("datasets", "train_sizes", "methods", "frozen_layers", "lora_ranks", "seeds")(_unique)

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, raw: Any) -> Any:
        return spec_aliases(raw)

    @field_validator("model", mode="before")
    @classmethod
    def _models(cls, value: Any) -> Any:
        # One message, not pydantic's one per member of the union
        if not (isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))):
            raise ValueError("should be a model name (hub id or folder) or a list of them")
        if isinstance(value, list):
            if not value:
                raise ValueError("the list of models is empty")
            _unique(value)
        return value

    @field_validator("train_sizes", "frozen_layers", "lora_ranks", "seeds")
    @classmethod
    def _axis_ranges(cls, values: list, info) -> list:
        lowest, rule = _AXIS_MINIMA[info.field_name]
        bad = [v for v in values if isinstance(v, int) and v < lowest]
        if bad:
            raise ValueError(f"{rule}, got {bad}")
        return values

    @model_validator(mode="after")
    def _method_axes(self) -> "SweepSpec":
        """A method's axis is given exactly when the method is swept (no axis crossed with a method it
        does not apply to); all problems in one message."""
        problems = [f"{axis} is empty, but methods has {method}" for method, axis in METHOD_AXES.items()
                    if method in self.methods and not getattr(self, axis)]
        problems += [f"{axis} is set, but methods has no {method}" for method, axis in METHOD_AXES.items()
                     if method not in self.methods and getattr(self, axis)]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def models(self) -> list[str]:
        return [self.model] if isinstance(self.model, str) else list(self.model)

    def protocol(self) -> dict[str, Any]:
        """What makes rows comparable: changing any of it on an existing sweep is refused. How the work
        is done (checkpoints, evaluation batch size) may change: it is not part of a cell's identity.
        Axes (models, datasets, sizes, methods, their own axes, seeds) may grow: new cells, new ids."""
        from trials.config import MACHINE_FIELDS

        training = {k: v for k, v in self.training.model_dump().items() if k not in MACHINE_FIELDS}
        training["select_metric"] = self.select_metrics()  # resolved: "official" and a name may mean the same
        return {"split_seed": self.split_seed, "training": training, "lora": self.lora.model_dump(),
                "probe": self.probe.model_dump()}

    def select_metrics(self) -> dict[str, str]:
        """Per dataset, the metric that picks a trial's best evaluation: the spec's, else the task's official one."""
        from trials.data import official_metric

        chosen, t = self.training.select_metric, self.training
        if isinstance(chosen, str):
            return dict.fromkeys(self.datasets, chosen)
        return {d: (chosen or {}).get(d) or official_metric(d, self.data_dir, t.text_column, t.label_column,
                                                           t.text_pair_column)
                for d in self.datasets}

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def trial_template(self) -> dict[str, Any]:
        """TrialConfig fields shared by every cell (the grid adds the axes, each method's own fields
        and each dataset's select_metric)."""
        training = {k: v for k, v in self.training.model_dump().items() if k != "select_metric"}
        return {"split_seed": self.split_seed, "data_dir": self.data_dir, **training}

    def method_fields(self, method: str) -> dict[str, Any]:
        return method_fields(method, self.lora, self.probe)


def method_fields(method: str, lora: LoraSpec = LoraSpec(), probe: ProbeSpec = ProbeSpec()) -> dict[str, Any]:
    """The TrialConfig fields of ``method`` shared by its cells (its axis aside)."""
    if method == "lora":
        targets = tuple(lora.targets) if lora.targets else None
        rate = {"learning_rate": lora.learning_rate} if lora.learning_rate is not None else {}
        return {"lora_alpha": lora.alpha, "lora_dropout": lora.dropout, "lora_targets": targets, **rate}
    if method == "probe":
        return {"probe_pooling": probe.pooling, "probe_folds": probe.folds, "probe_cs": probe.cs}
    return {}


def spec_aliases(raw: Any) -> Any:
    """Spellings a spec may use: ``models:`` for a list of models, and ``training.method`` (specs
    written before the methods axis, stored ones included) for ``methods: [that one]``."""
    if not isinstance(raw, dict):
        return raw
    raw = dict(raw)
    if "models" in raw:
        if raw.get("model") is not None:
            raise ValueError("give model or models, not both")
        raw["model"] = raw.pop("models")
    training = raw.get("training")
    if isinstance(training, dict) and "method" in training:
        raw["training"] = {k: v for k, v in training.items() if k != "method"}
        raw.setdefault("methods", [training["method"]])
    return raw


def parse_spec(raw: Any, source: str = "sweep spec", semantic: bool = True) -> SweepSpec:
    """Validate a parsed YAML mapping; raise one SpecError naming every problem."""
    if not isinstance(raw, dict):
        raise SpecError([f"the spec must be a mapping of keys, got {type(raw).__name__}"], source)
    problems: list[str] = []
    spec = None
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as exc:
        problems += [_format_pydantic(err) for err in exc.errors()]
    if semantic:
        from orchestrator.checks import semantic_problems

        problems += semantic_problems(raw)
    if problems:
        raise SpecError(problems, source)
    return spec


# Rows of a sweep stored before select_metric existed picked their best evaluation by accuracy: the
# default TrialConfig gives the field for exactly that reason.
LEGACY_SELECT_METRIC = LATER_FIELDS["select_metric"]


def read_stored_spec(text: str) -> Any:
    """A stored spec.yaml as a mapping. One written before ``select_metric`` existed has no such key;
    it reads as accuracy (what its rows used), not as the official metric a new spec defaults to, so
    the sweep resumes with its cell ids unchanged."""
    raw = yaml.safe_load(text)
    training = (raw.get("training") or {}) if isinstance(raw, dict) else None
    if isinstance(training, dict) and "select_metric" not in training:
        raw = {**raw, "training": {**training, "select_metric": LEGACY_SELECT_METRIC}}
    return raw


def load_spec(path: str | Path, overrides: dict[str, Any] | None = None, semantic: bool = True) -> SweepSpec:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SpecError([f"no such file: {path}"], str(path)) from None
    except yaml.YAMLError as exc:
        raise SpecError([f"malformed YAML: {exc}".replace("\n", " ")], str(path)) from None
    if isinstance(raw, dict) and overrides:
        raw = {**raw, **{k: v for k, v in overrides.items() if v is not None}}
    return parse_spec(raw, str(path), semantic=semantic)


def _format_pydantic(err: dict) -> str:
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        return f"{where}: unknown key"
    message = err["msg"].removeprefix("Value error, ")
    if not err["loc"]:  # a check across keys: its message names them (the input is the whole spec)
        return message
    return f"{where}: {message} (got {err.get('input')!r})"
