"""The second layer of orchestrator/: what a spec needs of the model, the data, the machine, the store
and the cluster, each problem named.

The checks read the raw mapping defensively (a value of the wrong type is pydantic's to report,
orchestrator/spec.py), so one run lists every problem even when some fields are malformed; ``validate``
runs both layers and raises one SpecError. The cluster is handed in (``ClusterView``: the Ray session,
or a stand-in in tests): nothing here connects to Ray, and a spec is checked against this machine
when no cluster is given.

Deferred on purpose: torch and transformers (trials.model) are imported inside the checks that need
them, so that commands reading a stored sweep (status, summary, report) start in a fraction of a second.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from freezesweep.orchestrator.spec import (
    COLUMN_KEYS,
    DEFAULT_STORE,
    NAME_PATTERN,
    SettleSpec,
    SpecError,
    SweepSpec,
    as_int,
    column_for,
    named_models,
    parse,
    read_stored_spec,
    read_yaml,
)
from freezesweep.results.settle import MIN_PAIRS
from freezesweep.results.stats import TOLERANCE
from freezesweep.results.store import ResultStore, StoreError, check_store_root, open_filesystem
from freezesweep.trials.data import (
    GLUE_PAIR_TASKS,
    SHOWN_VALUES,
    DatasetError,
    cut_value,
    describe_task,
    label_column_hint,
    official_metric,
    shape_words,
)
from freezesweep.trials.metrics import METRICS


class ClusterView(Protocol):
    """Where a sweep's trials run, as the checks see it (orchestrator/ray_session.py's RaySession)."""

    address: str | None  # None: an embedded Ray on this machine

    def nodes(self) -> list[dict[str, float]]:
        """The total resources of each alive node (connecting to the cluster if need be)."""


def validate(
    raw: Any,
    source: str = "sweep spec",
    cluster: ClusterView | None = None,
    semantic: bool = True,
    devices: bool = True,
    stored: bool = True,
    against_stored: bool = True,
    writes: bool = True,
) -> SweepSpec:
    """A parsed YAML mapping as a SweepSpec; one SpecError naming every problem of both layers.
    ``semantic=False``: shapes and values only (a stored spec, for inspection); ``devices=False``: not
    the GPUs and CPUs the trials need (a dry run, planned away from them; what the spec itself rules
    out, such as fp16 on CPU trials, is still checked); ``stored=False``: not the store and tracking it
    would write to (``freezesweep trial``: one cell, written nowhere); ``against_stored=False``: the
    store, but not the sweep of its name stored there (whose protocol, question and seeds a launch may
    not change: a spec that only names what to read is not refused for differing from it); ``writes=False``:
    the store is read, not written (a dry run: ``store_write_note`` says what a launch would meet)."""
    spec, problems = parse(raw)
    if semantic and isinstance(raw, dict):
        problems += semantic_problems(raw, cluster, devices, stored, against_stored, writes)
    if problems:
        raise SpecError(problems, source)
    return spec


def load_spec(
    path: str | Path,
    overrides: Mapping[str, Any] | None = None,
    semantic: bool = True,
    cluster: ClusterView | None = None,
    devices: bool = True,
) -> SweepSpec:
    """A spec file, validated (``overrides``: keys given on the command line, those not None)."""
    return validate(read_yaml(path, overrides), str(path), cluster, semantic, devices)


def semantic_problems(
    raw: dict[str, Any],
    cluster: ClusterView | None = None,
    devices: bool = True,
    stored: bool = True,
    against_stored: bool = True,
    writes: bool = True,
) -> list[str]:
    training = raw.get("training") if isinstance(raw.get("training"), dict) else {}
    resources = raw.get("resources") if isinstance(raw.get("resources"), dict) else {}
    data_dir = raw.get("data_dir") if isinstance(raw.get("data_dir"), str) else None
    problems = _model_problems(raw)
    problems += structure_problems(raw)
    problems += _data_problems(
        _strs(raw.get("datasets")), _ints(raw.get("train_sizes")), data_dir, training, _probe_seed(raw)
    )
    problems += _precision_problems(training.get("precision"), resources.get("gpus_per_trial"))
    if devices:
        problems += _device_problems(resources.get("gpus_per_trial"), resources.get("cpus_per_trial"), cluster)
    if stored:
        problems += _store_problems(raw, against_stored, writes) + _tracking_problems(raw)
    return problems


def _tracking_problems(raw: dict[str, Any]) -> list[str]:
    """``tracking: {mlflow: URI}`` needs MLflow installed, and a URI MLflow 3 takes (not a folder): said
    before anything runs (a server that does not answer is the launch's to say: tracking never fails it)."""
    import importlib.util

    from freezesweep.results.mlflow_export import folder_store_problem  # MLflow itself: not imported

    tracking = raw.get("tracking") if isinstance(raw.get("tracking"), dict) else {}
    uri = tracking.get("mlflow")
    if uri and importlib.util.find_spec("mlflow") is None:
        return [
            "tracking.mlflow: MLflow is not installed (pip install -e '.[mlflow]' in a checkout, or 'freezesweep[mlflow]')"
        ]
    folder = folder_store_problem(uri) if isinstance(uri, str) and uri else None
    return [f"tracking.mlflow: {folder}"] if folder else []


def select_metrics(spec: SweepSpec) -> dict[str, str]:
    """Per dataset, the metric that picks a trial's best evaluation: the spec's, else the task's
    official one (read from the data when the spec does not say)."""
    chosen = spec.training.select_metric
    if isinstance(chosen, str):
        return dict.fromkeys(spec.datasets, chosen)
    return {d: (chosen or {}).get(d) or _official(spec, d) for d in spec.datasets}


def _official(spec: SweepSpec, dataset: str) -> str:
    c = spec.training.trial_fields(dataset)
    return official_metric(
        dataset, spec.data_dir, c["text_column"], c["label_column"], c["text_pair_column"], c["empty_texts"]
    )


def model_depths(spec: SweepSpec) -> dict[str, int]:
    """Each model's encoder layers, where the spec needs them (``frozen_layers: all``); else empty."""
    if "all" not in spec.frozen_layers:
        return {}
    from freezesweep.trials.model import load_model_config  # transformers: seconds to import, see the module docstring

    return {model: load_model_config(model).num_hidden_layers for model in spec.models()}


def _ints(value: Any) -> list[int]:
    """A list's integers as pydantic reads them (lax: the text "9" is 9, so it meets the same checks)."""
    return [n for n in map(as_int, value) if n is not None] if isinstance(value, list) else []


def _strs(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _model_problems(raw: dict[str, Any]) -> list[str]:
    """Per model: it loads, the frozen layers fit its depth, and (when LoRA is swept) the LoRA
    targets exist in its layers."""
    from freezesweep.trials.model import ModelError, load_model_config  # transformers: see the module docstring

    models = named_models(raw)  # model and models both given: each checked, beside that problem
    methods = _strs(raw.get("methods")) or ["freeze"]
    lora = raw.get("lora") if isinstance(raw.get("lora"), dict) else {}
    targets = lora.get("targets") if isinstance(lora.get("targets"), list) else None
    problems = []
    for model in dict.fromkeys(m for m in models if m):  # missing / wrong type: reported by pydantic
        try:
            config = load_model_config(model)
            layers = getattr(config, "num_hidden_layers", None)
        except ModelError as exc:
            problems.append(f"model: {str(exc).splitlines()[0]}")
            continue
        problems += _checkpoint_problems(model, config, raw)
        problems += _sequence_problems(model, raw)
        if getattr(config, "summary_type", None) == "last":
            # XLNet's head reads position -1 whatever the padding (its tokenizer pads on the left); the
            # trials pad on the right, so it would read padding for every shorter text (a walk-through)
            problems.append(
                f"model: {model}: its classifier reads the last position (summary_type 'last', as XLNet's), "
                "which right-padded batches fill with padding: not supported (summary_type 'first' or 'mean' is)"
            )
        too_deep = [k for k in _ints(raw.get("frozen_layers")) if layers is not None and k > layers]
        if too_deep and "freeze" in methods:
            problems.append(
                f"frozen_layers: {too_deep} exceed the {layers} layers of {model} "
                "('all' freezes every layer of each model)"
            )
        if "lora" in methods:
            problems += [f"lora.targets: {model}: {p}" for p in lora_problems(model, _strs(targets) or None)]
            hidden = getattr(config, "hidden_size", None)
            wide = [r for r in _ints(raw.get("lora_ranks")) if isinstance(hidden, int) and r > hidden]
            if wide:  # (narrower projections, a grouped-query attention's keys and values, gain from less)
                problems.append(
                    f"lora_ranks: {wide} exceed the hidden size {hidden} of {model}: the update of a projection "
                    f"{hidden} wide has at most that rank"
                )
    return problems


def structure_problems(raw: dict[str, Any]) -> list[str]:
    """Per model, its skeleton built on the meta device (no weights read): the layer stack, the
    embeddings and the head that the spec's frozen_layers, LoRA or probe need are found (ALBERT's
    shared layer and encoder-decoder models are refused with the reason), before any trial starts."""
    from freezesweep.trials.freezing import structure_problems as model_structure_problems
    from freezesweep.trials.model import ModelError, build_skeleton, load_model_config

    models = named_models(raw)
    methods = _strs(raw.get("methods")) or ["freeze"]
    frozen = raw.get("frozen_layers") if isinstance(raw.get("frozen_layers"), list) else []
    problems = []
    for model in dict.fromkeys(m for m in models if m):
        try:
            load_model_config(model)
        except ModelError:
            continue  # reported by _model_problems
        values = _ints(frozen) + [1] * ("all" in frozen) if "freeze" in methods else []  # "all": some layer frozen
        try:
            skeleton = build_skeleton(model)
        except Exception as exc:  # a config transformers cannot build a sequence classifier from
            problems.append(f"model: {model}: cannot build a sequence classifier from its config: {_built(exc)}")
            continue
        found = model_structure_problems(skeleton, values, needs_layers=bool({"lora", "probe"} & set(methods)))
        problems += [f"model: {model}: {p}" for p in found]
    return problems


def _built(exc: Exception) -> str:
    """Why transformers built no classifier, without the list of every config class it has one for
    (about 4 KB after "Model type should be one of": a walk-through's CodeGen)."""
    text = str(exc).split("\nModel type should be one of", 1)[0]
    unknown = re.match(r"Unrecognized configuration class <class '[\w.]*\.(\w+)'>", text)
    return f"transformers has no sequence-classification class for {unknown[1]}" if unknown else text


# What a pretrained checkpoint's weights are saved as (transformers' save_pretrained; sharded: an index).
_WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin", "*.index.json")


def _checkpoint_problems(model: str, config: Any, raw: dict[str, Any]) -> list[str]:
    """A model folder holds the weights a pretrained init reads (else every trial failed late), and the
    tokenizer knows the model's vocabulary: for a folder without tokenizer files transformers 5 builds
    a tokenizer of a few special tokens, every word [UNK], and trials ended "ok" having learned nothing."""
    from freezesweep.orchestrator.ray_session import first_line
    from freezesweep.trials.model import load_tokenizer, resolve_model_path

    problems = []
    training = raw.get("training") if isinstance(raw.get("training"), dict) else {}
    folder = Path(resolve_model_path(model))
    weights = any(next(folder.glob(pattern), None) for pattern in _WEIGHT_FILES)
    if folder.is_dir() and training.get("model_init", "pretrained") == "pretrained" and not weights:
        problems.append(
            f"model: {model}: the folder holds no weights (model.safetensors or pytorch_model.bin, or shards "
            "with their index); save them with model.save_pretrained(folder), or set training.model_init: random"
        )
    vocabulary = getattr(config, "vocab_size", None)
    try:
        known = len(load_tokenizer(model))
    except Exception as exc:  # transformers 4 raises for a folder without tokenizer files (5 builds a stub)
        return [*problems, f"model: {model}: its tokenizer cannot be loaded ({first_line(exc)}); save it beside "
                "the weights: tokenizer.save_pretrained(folder)"]  # fmt: skip
    if isinstance(vocabulary, int) and known < vocabulary / 2:
        where = " (the folder has no tokenizer files?)" if folder.is_dir() else ""
        problems.append(
            f"model: {model}: its tokenizer knows {known} tokens, its embeddings {vocabulary}{where}; save the "
            "tokenizer beside the weights: tokenizer.save_pretrained(folder)"
        )
    return problems


def _sequence_problems(model: str, raw: dict[str, Any]) -> list[str]:
    """A max_seq_length that leaves no room for text after the tokenizer's special tokens (two texts of
    a pair take more of them)."""
    from freezesweep.trials.model import load_tokenizer  # transformers: see the module docstring

    training = raw.get("training") if isinstance(raw.get("training"), dict) else {}
    length = training.get("max_seq_length", 128)
    if not isinstance(length, int) or isinstance(length, bool) or length <= 0:
        return []  # pydantic's to report
    tokenizer = load_tokenizer(model)
    pair_column = training.get("text_pair_column")
    pair_column = pair_column if isinstance(pair_column, (str, dict)) else None  # pydantic's to report
    pair = any(_is_pair(d, pair_column) for d in _strs(raw.get("datasets")))
    special = tokenizer.num_special_tokens_to_add(pair=pair)
    if length <= special:
        return [
            f"training.max_seq_length: {length} leaves no room for text: {model}'s tokenizer adds {special} special "
            f"tokens{' to a sentence pair' if pair else ''} (at least {special + 1}; the reference uses 128)"
        ]
    limit, whose = position_limit(model, tokenizer)
    if limit is not None and length > limit:  # a longer text failed every trial late ("expanded size … 512")
        return [f"training.max_seq_length: {length} is more than {model} takes ({limit} tokens: {whose})"]
    return []


# Models whose position ids start after the padding index (transformers' create_position_ids_from_input_ids):
# max_position_embeddings - (pad_token_id + 1) positions are left for tokens (roberta-base: 514 → 512).
_OFFSET_POSITIONS = frozenset(
    {
        "roberta",
        "roberta-prelayernorm",
        "xlm-roberta",
        "xlm-roberta-xl",
        "camembert",
        "data2vec-text",
        "longformer",
        "xmod",
        "ibert",
        "luke",
        "esm",
    }
)
_MPNET_OFFSET = 2  # MPNet's padding index is fixed at 1 whatever pad_token_id says (modeling_mpnet.py)
_NO_LIMIT = 1_000_000  # transformers' tokenizers say 1e30 (VERY_LARGE_INTEGER) where no limit was saved


def position_limit(model: str, tokenizer: Any) -> tuple[int | None, str]:
    """The most tokens ``model`` takes, and whose limit it is: its tokenizer's model_max_length or its
    absolute position embeddings, the lesser (a tiny test model may have fewer positions than its
    tokenizer says). DeBERTa without absolute positions (``position_biased_input: false``, v3's) has
    relative buckets only: no table to run past."""
    from freezesweep.trials.model import load_model_config

    config = load_model_config(model)
    limits = []
    if 0 < (tokenizer.model_max_length or 0) < _NO_LIMIT:
        limits.append((int(tokenizer.model_max_length), "its tokenizer's model_max_length"))
    positions = getattr(config, "max_position_embeddings", None)
    relative_only = config.model_type.startswith("deberta") and not getattr(config, "position_biased_input", True)
    if isinstance(positions, int) and positions > 0 and not relative_only:
        limits.append((positions - _position_offset(config), "its position embeddings"))
    return min(limits) if limits else (None, "")


def _position_offset(config: Any) -> int:
    if config.model_type == "mpnet":
        return _MPNET_OFFSET
    return (getattr(config, "pad_token_id", None) or 0) + 1 if config.model_type in _OFFSET_POSITIONS else 0


def lora_problems(model: str, targets: list[str] | None) -> list[str]:
    """LoRA targets that do not exist in ``model``'s layers (its structure, built without weights)."""
    from freezesweep.trials.freezing import FreezingError
    from freezesweep.trials.lora import LoraError, resolve_targets
    from freezesweep.trials.model import build_skeleton

    try:
        skeleton = build_skeleton(model)  # the module tree only: no memory, no weights read
    except Exception:
        return []  # no classifier from its config: structure_problems names it (a walk-through's traceback)
    try:
        resolve_targets(skeleton, tuple(targets) if targets else None)  # as the trial will
    except LoraError as exc:
        return exc.problems
    except FreezingError:
        return []  # no layer stack: structure_problems names it
    return []


def _with_near(stray: str, datasets: list[str]) -> str:
    """A mapping's key that names no dataset, with the one it likely means (a walk-through: the datasets
    said `data/reviews/`, the mapping `data/reviews`)."""
    same = [d for d in datasets if os.path.normpath(d) == os.path.normpath(stray)]
    near = same or difflib.get_close_matches(stray, datasets, n=1)
    return f"{stray} (did you mean {near[0]!r}, as datasets spells it?)" if near else stray


def _one_for_all(problems: list[str], marks: list[tuple[int, str]], training: dict, loaded: list[str]) -> None:
    """A missing column that one spec value named for every dataset (a walk-through: `text_column: text`
    for a local file beside a GLUE task): how to name it for only some, with a dataset read with it
    (``marks``: each such problem's index and key; nothing said where no dataset was read)."""
    for index, key in marks if loaded else []:
        problems[index] += (
            f"; one training.{key} names every dataset's column: give {{dataset: column}} to name it for "
            f"some only (e.g. {key}: {{{loaded[0]}: {training[key]}}})"
        )


def _missing_column_key(problem: str, training: dict) -> str | None:
    """The column key whose single value (one name for every dataset) this missing column is."""
    named = [k for k in COLUMN_KEYS if isinstance(training.get(k), str) and f"(training.{k} in a spec" in problem]
    return named[0] if named else None


def _probe_seed(raw: dict[str, Any]) -> int | None:
    """The split seed the probe's train subsets are drawn with, where methods has probe (else None: no
    probe cell, nothing of its subsets to check); an invalid one is pydantic's to report (0 here)."""
    if "probe" not in _strs(raw.get("methods")):
        return None
    return as_int(raw.get("split_seed", 0)) or 0


def _data_problems(
    datasets: list[str], sizes: list[int], data_dir: str | None, training: dict, probe_seed: int | None = None
) -> list[str]:
    """Per dataset: it loads, its columns exist, its labels fit its shape, the train sizes fit its
    train split (and, with ``probe_seed``, the probe's train subsets drawn with it), and the metric chosen
    to select the best evaluation is one the task has."""
    problems: list[str] = []
    marks: list[tuple[int, str]] = []  # a column one value named for every dataset, missing here
    loaded: list[str] = []  # datasets read without a problem
    chosen = training.get("select_metric")
    for dataset in dict.fromkeys(datasets):  # duplicates are pydantic's to report
        try:
            shape = describe_task(dataset, data_dir, **_data_options(training, dataset))
        except (DatasetError, OSError) as exc:
            each = getattr(exc, "problems", None) or [str(exc).splitlines()[0]]
            named = (f"{dataset}: ", f"dataset {dataset!r}: ")  # the dataset said once
            for problem in each:
                key = _missing_column_key(problem, training)
                marks += [(len(problems), key)] if key else []
                problems.append(f"datasets: {dataset}: {problem.removeprefix(named[0]).removeprefix(named[1])}")
            # the files were read: the train sizes are said beside their problems, not after their fix
            problems += _size_problems(dataset, sizes, (getattr(exc, "rows", None) or {}).get("train"))
            problems += _class_problems(dataset, sizes, getattr(exc, "classes", None) or {})
            problems += _probe_problems(dataset, sizes, getattr(exc, "classes", None) or {}, None, probe_seed)
            continue
        problems += _size_problems(dataset, sizes, shape.rows["train"])
        problems += _class_problems(dataset, sizes, shape.class_counts)
        regression_rows = shape.rows["train"] if shape.regression else None
        problems += _probe_problems(dataset, sizes, shape.class_counts, regression_rows, probe_seed)
        loaded.append(dataset)
        metric = chosen.get(dataset) if isinstance(chosen, dict) else chosen
        if metric in METRICS and metric not in shape.metrics:  # an unknown name is pydantic's to report
            problems.append(f"training.select_metric: {metric} does not fit {dataset} ({shape_words(shape)})")
    _one_for_all(problems, marks, training, loaded)
    for key in ("select_metric", *COLUMN_KEYS):
        strays = (
            [d for d in training.get(key) or {} if d not in datasets] if isinstance(training.get(key), dict) else []
        )
        if strays:
            problems.append(
                f"training.{key}: {', '.join(map(_with_near, strays, [datasets] * len(strays)))} not among the datasets"
            )
    return problems


def _size_problems(dataset: str, sizes: list[int], train_rows: int | None) -> list[str]:
    """Train sizes larger than the train split (None: its rows are unknown, the files unread)."""
    too_big = [s for s in sizes if train_rows is not None and s > train_rows]
    return [f"train_sizes: {too_big} exceed the {train_rows} train rows of {dataset}"] if too_big else []


def _class_problems(dataset: str, sizes: list[int], class_counts: Mapping[str, int]) -> list[str]:
    """Train sizes too small to hold a row of every class (``class_counts``: train rows per class, empty
    for regression; a stratified subset of at least as many rows as classes always does, trials/subsets.py):
    named with the classes it would leave out, rarest first. A size below 1 is pydantic's to report."""
    classes = len(class_counts)
    too_small = sorted(s for s in sizes if 0 < s < classes)
    if not too_small:
        return []
    missing = classes - too_small[0]
    rarest = sorted(class_counts.items(), key=lambda item: item[1])[:missing]
    # a text column read as the labels has hundreds: the rarest few say what is left out
    left_out = ", ".join(f"{cut_value(name)!r} ({count} train rows)" for name, count in rarest[:SHOWN_VALUES])
    more = f", … and {missing - SHOWN_VALUES} more" if missing > SHOWN_VALUES else ""
    return [
        f"train_sizes: {too_small} below the {classes} classes of {dataset} (a stratified subset holds "
        f"at least one row of each class; n = {too_small[0]} leaves out {missing} class(es), the rarest: "
        f"{left_out}{more})" + label_column_hint(dict(class_counts))
    ]


def _probe_problems(
    dataset: str, sizes: list[int], class_counts: Mapping[str, int], regression_rows: int | None, seed: int | None
) -> list[str]:
    """Train sizes whose subset gives the probe too few rows to cross-validate (``seed``: the split seed, None
    without probe cells; ``regression_rows``: the train rows of a regression task, else None): it failed
    inside each probe trial, was retried, and failed again on every resume. The subset is drawn as the trial
    draws it (trials/subsets.py), and a class named as the files spell it."""
    if seed is None:
        return []
    from freezesweep.trials.probe import MIN_FOLD_ROWS  # torch, with it: only for a sweep with probe cells

    what = "a larger train size, or methods without probe for this dataset"
    if regression_rows is not None:
        small = sorted(s for s in sizes if 0 < s < MIN_FOLD_ROWS)
        needs = f"the probe needs at least {MIN_FOLD_ROWS} train rows of {dataset} to cross-validate ({what})"
        return [f"train_sizes: {small}: {needs}"] if small else []
    short = _probe_short_classes(sizes, class_counts, seed, MIN_FOLD_ROWS)
    if not short:
        return []
    scarce = [repr(cut_value(name)) for name, count in class_counts.items() if count < MIN_FOLD_ROWS]
    if scarce:  # no train size helps such a class
        what = (
            f"{', '.join(scarce[:SHOWN_VALUES])} {'has' if len(scarce) == 1 else 'have'} fewer than {MIN_FOLD_ROWS} "
            "train rows in all: more rows of it, or methods without probe for this dataset"
        )
    said = "; ".join(
        f"n = {size}: " + ", ".join(f"{cut_value(name)!r} ({count} row{'s' * (count != 1)})" for name, count in held)
        for size, held in short.items()
    )
    return [
        f"train_sizes: {list(short)} give the probe fewer than {MIN_FOLD_ROWS} rows of a class in the stratified "
        f"train subset of {dataset} ({said}), where its cross-validation needs {MIN_FOLD_ROWS} of each ({what})"
    ]


def _probe_short_classes(
    sizes: list[int], class_counts: Mapping[str, int], seed: int, fewest: int
) -> dict[int, list[tuple[str, int]]]:
    """Per train size, the classes its stratified subset holds fewer than ``fewest`` rows of (the first few),
    and how many. A subset's classes depend on the class counts alone (the split seed only orders rows within
    a class), so labels rebuilt from the counts, in class-id order, draw the trial's subset's classes."""
    import numpy as np

    from freezesweep.trials.subsets import subset_indices

    names = list(class_counts)
    labels = np.repeat(np.arange(len(names)), list(class_counts.values()))
    short = {}
    for size in sorted(s for s in sizes if len(names) <= s <= len(labels)):  # others are refused already
        held = np.bincount(labels[subset_indices(labels, size, seed)], minlength=len(names))
        few = [(names[c], int(held[c])) for c in np.flatnonzero(held < fewest)]
        if few:
            short[size] = few[:SHOWN_VALUES]
    return short


def _data_options(training: dict, dataset: str) -> dict[str, str]:
    """The training keys that say how ``dataset`` is read (a column mapping's value for it), where they are
    strings (else pydantic reports them)."""
    options = {k: column_for(training.get(k), dataset) for k in COLUMN_KEYS}
    return {k: v for k, v in {**options, "empty_texts": training.get("empty_texts")}.items() if isinstance(v, str)}


def data_notes(spec: SweepSpec) -> list[str]:
    """What validation did to the data that the user should hear of: rows dropped for empty texts, and
    what the reader noted of a dataset (whole-number float labels, read as a regression task)."""
    notes = []
    for dataset in spec.datasets:
        options = _data_options(spec.training.model_dump(), dataset)
        shape = describe_task(dataset, spec.data_dir, **options)
        dropped = {split: n for split, n in shape.dropped.items() if n}
        notes += [f"{dataset}: {note}" for note in shape.notes]
        if dropped:
            counts = " and ".join(f"{n} {split}" for split, n in dropped.items())
            notes.append(
                f"{dataset}: dropped {counts} row(s) with an empty or missing text (training.empty_texts: drop)"
            )
    return notes


def _is_pair(dataset: str, text_pair_column: str | Mapping[str, str] | None) -> bool:
    """Whether ``dataset``'s rows are two texts: a pair column named for it, or a GLUE pair task's own."""
    glue_pair = dataset.startswith("glue/") and dataset.split("/", 1)[1] in GLUE_PAIR_TASKS
    return glue_pair or bool(column_for(text_pair_column, dataset))


def pair_notes(spec: SweepSpec) -> list[str]:
    """Models whose tokenizer puts nothing between a pair's two texts (GPT-2's, Qwen's: no pair template),
    beside pair datasets: the model reads the two as one text, as transformers' own pipelines and Trainer
    would feed them (a walk-through's MRPC on GPT-2: said, not changed)."""
    from freezesweep.trials.model import load_tokenizer  # transformers: see the module docstring

    pairs = [d for d in spec.datasets if _is_pair(d, spec.training.text_pair_column)]
    notes = []
    for model in spec.models() if pairs else []:
        tokenizer = load_tokenizer(model)
        if tokenizer.num_special_tokens_to_add(pair=True) == tokenizer.num_special_tokens_to_add(pair=False):
            notes.append(
                f"{model}: its tokenizer marks nowhere where a pair's second text starts ({', '.join(pairs)}): the "
                "model reads the two as one text (to mark it, write the pair as one text column with a separator)"
            )
    return notes


def few_seeds_note(spec: SweepSpec) -> str | None:
    """A fixed grid that cannot advise: below MIN_PAIRS paired seeds no claim can be shown (a new user's
    walk-through learned it from the report, after the run), and without full fine-tuning (frozen layers 0)
    no depth has what it is compared with (settle mode refuses such a spec; a fixed grid may be read
    otherwise, with ``summary`` and ``query``)."""
    if spec.settle is not None:
        return None
    if not ("freeze" in spec.methods and 0 in spec.frozen_layers):
        return (
            "a fixed grid without full fine-tuning (methods: freeze with frozen_layers 0) gives no freezing advice: "
            "every depth, LoRA and the probe are compared with it (summary and query still read the rows)"
        )
    seeds = len(spec.seeds)
    if not 0 < seeds < MIN_PAIRS:
        return None
    return (
        f"a fixed grid of {seeds} seed{'s' * (seeds > 1)} gives no freezing advice: a decision needs {MIN_PAIRS} "
        f"paired seeds (seeds may be added later, while no group has {MIN_PAIRS}; or let settle mode choose them: "
        "settle:)"
    )


def schedule_note(spec: SweepSpec) -> str | None:
    """Settings valid alone that together do less than they seem to (a walk-through's `warmup_epochs: 5`
    and `eval_every_epochs: 2` beside `epochs: 1` passed without a word): said, not refused."""
    training, said = spec.training, []
    if training.warmup_epochs > training.epochs:
        said.append(
            f"training.warmup_epochs {training.warmup_epochs:g} is longer than epochs {training.epochs:g}: the "
            "learning rate rises for the whole run and never reaches learning_rate (a linear warmup, as HF's)"
        )
    if training.eval_every_epochs > training.epochs:
        said.append(
            f"training.eval_every_epochs {training.eval_every_epochs:g} is longer than epochs {training.epochs:g}: "
            "each trial is evaluated once, at its end (trials/train.py's schedule)"
        )
    return "; ".join(said) or None


# ``gpus_per_trial: auto`` measures one trial on a whole GPU (trials/memory_probe.py): it needs one.
_AUTO = "resources.gpus_per_trial: auto measures a trial's memory on a GPU"


def _gpu_share(gpus_per_trial: Any) -> float:
    """The GPUs a trial asks for (``auto`` measures on a whole one; a malformed value is pydantic's to report)."""
    return 1 if gpus_per_trial == "auto" else gpus_per_trial if isinstance(gpus_per_trial, (int, float)) else 0


def _local_cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS says it), as the embedded Ray counts them."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _precision_problems(precision: Any, gpus_per_trial: Any) -> list[str]:
    """What the spec itself rules out wherever it runs (so ``plan``, which skips the devices, says it too)."""
    if precision == "fp16" and _gpu_share(gpus_per_trial) <= 0:
        return [
            "training.precision: fp16 needs GPU trials (resources.gpus_per_trial > 0); on CPU use auto (bf16 where "
            "the CPU has it natively, else fp32)"
        ]
    return []


def _device_problems(gpus_per_trial: Any, cpus_per_trial: Any, cluster: ClusterView | None) -> list[str]:
    """Resources are checked where the trials will run: the cluster's nodes when there is one, else
    this machine's CPUs and CUDA (a trial asking for more CPUs than the embedded Ray has never starts:
    the launch waited, silently, until interrupted)."""
    auto = gpus_per_trial == "auto"
    gpus = _gpu_share(gpus_per_trial)
    cpus = cpus_per_trial if isinstance(cpus_per_trial, (int, float)) else 1
    problems: list[str] = []
    if cluster is not None and cluster.address:
        return problems + cluster_problems(cluster, cpus, gpus, auto)
    here = _local_cpus()
    if cpus > here:
        problems.append(
            f"resources.cpus_per_trial: {cpus:g} CPUs per trial, but this machine has {here}: no trial could "
            f"start on its embedded Ray (set at most {here}, or pass --address of a cluster whose nodes have them)"
        )
    if gpus > 0:
        import torch  # deferred: see the module docstring

        if not torch.cuda.is_available():
            needs = _AUTO if auto else f"resources.gpus_per_trial: {gpus} GPU per trial"
            problems.append(
                f"{needs}, but this machine has no CUDA GPU (set a share, 0 for CPU trials, or pass "
                "--address of a cluster with GPUs)"
            )
    return problems


def cluster_problems(cluster: ClusterView, cpus: float, gpus: float, auto: bool = False) -> list[str]:
    """A trial runs on one node: some alive node must hold its CPUs and GPUs."""
    try:
        nodes = cluster.nodes()
    except Exception as exc:  # unreachable cluster: one problem, named, instead of a traceback
        from freezesweep.orchestrator.ray_session import (
            ADDRESS_SOURCES,
            RayStartFailed,
            RayUnreachable,
            first_line,
            unreached_why,
        )

        # nothing listens there: its message says where to look; something does: most likely a token
        why = "" if isinstance(exc, RayUnreachable) else f"{unreached_why()} ({ADDRESS_SOURCES})"
        cause = exc.__cause__ if isinstance(exc, RayStartFailed) and exc.__cause__ else exc  # said once
        return [f"address: cannot reach the Ray cluster at {cluster.address!r}: {first_line(cause)}{why}"]
    if any(n.get("CPU", 0) >= cpus and n.get("GPU", 0) >= gpus for n in nodes):
        return []
    has = "; ".join(f"{n.get('CPU', 0):g} CPU, {n.get('GPU', 0):g} GPU" for n in nodes) or "no alive node"
    needs = (
        f"{_AUTO} ({cpus:g} CPU and 1 GPU on one node)"
        if auto
        else f"resources: a trial needs {cpus:g} CPU and {gpus:g} GPU on one node"
    )
    return [f"{needs}, but no node of the cluster at {cluster.address!r} has them (its nodes: {has})"]


def _store_problems(raw: dict[str, Any], against_stored: bool = True, writes: bool = True) -> list[str]:
    name, store = raw.get("name"), raw.get("store", DEFAULT_STORE)
    if not isinstance(store, str):
        return []  # pydantic reports it
    if not isinstance(name, str) or not re.match(NAME_PATTERN, name):
        return _store_root_problems(store) if writes else []  # the name is pydantic's; no folder under it
    try:
        target = ResultStore(store, name)
        if writes:
            target.check_writable()
        stored = stored_spec_mapping(target) if against_stored else None
    except StoreError as exc:
        return [f"store: {exc}"]
    except SpecError as exc:  # a damaged spec.yaml: named with what to do, beside the other problems
        return [f"store: {exc.source}: {p}" for p in exc.problems]
    return (
        []
        if stored is None
        else _protocol_changes(stored, raw)
        + _settle_changes(stored, raw)
        + _tolerance_change(stored, raw, target)
        + _seed_changes(stored, raw, target)
    )


def store_write_note(spec: SweepSpec) -> str | None:
    """A store a dry run may read but a launch could not write (a colleague's results, a read-only mount):
    said as a note where ``plan`` reads it, since reading is all a plan does."""
    try:
        ResultStore(spec.store, spec.name).check_writable()
    except StoreError as exc:
        return f"store: {exc}: plan only reads it; a launch from here would refuse it"
    return None


def stored_spec_mapping(store: ResultStore) -> dict[str, Any] | None:
    """The spec.yaml a sweep's store holds, read and parsed as a mapping (spec.read_stored_spec: a
    damaged one is a SpecError saying what to do); None when the store has no such sweep."""
    text = store.read_spec()
    return None if text is None else read_stored_spec(text, f"{store.uri}/{store.sweep}/spec.yaml")


def _store_root_problems(store: str) -> list[str]:
    """The store itself, where the sweep's name is invalid: it takes files (said beside the name's problem)."""
    try:
        fs, root = open_filesystem(store)
        check_store_root(fs, root, store)
    except StoreError as exc:
        return [f"store: {exc}"]
    except Exception as exc:  # pyarrow cannot open such a URI at all
        return [f"store: cannot open store {store!r}: {exc}"]
    return []


def _protocol_changes(stored: dict[str, Any], raw: dict[str, Any]) -> list[str]:
    """Rows of one sweep must be comparable: the protocol may not change (axes may grow)."""
    protocol_keys = ("split_seed", "training", "lora", "probe")
    # The new protocol on its own: the stored spec's other keys stand in for the new spec's, so a
    # protocol change is reported even when other parts of the new spec are invalid.
    overlay = {k: v for k, v in stored.items() if k not in protocol_keys} | {
        k: raw[k] for k in protocol_keys if k in raw
    }
    # "auto" is resolved on the trials' hardware at launch, which refuses a mismatch naming both.
    training = overlay.get("training") if isinstance(overlay.get("training"), dict) else {}
    if training.get("precision", "auto") == "auto":
        overlay["training"] = {**training, "precision": (stored.get("training") or {}).get("precision", "auto")}
    # select_metric is compared per dataset, on the datasets both specs have (a grown spec may add some).
    new_datasets = raw.get("datasets") if isinstance(raw.get("datasets"), list) else []
    common = [d for d in stored.get("datasets") or [] if d in new_datasets]
    try:
        old_protocol, new_protocol = _protocols(stored, overlay, common)
    except ValidationError as exc:
        # the new protocol's own problems are pydantic's to report; the changes of its valid values are
        # said beside them, not only once they are mended (a changed rate beside a misspelt key: two rounds)
        try:
            old_protocol, new_protocol = _protocols(stored, _stored_where_invalid(overlay, stored, exc), common)
        except Exception:
            return []
    except Exception:
        return []
    old_flat, new_flat = flatten(old_protocol), flatten(new_protocol)
    changed = sorted(k for k in old_flat.keys() | new_flat.keys() if old_flat.get(k) != new_flat.get(k))
    return [
        f"{k}: changed from {old_flat.get(k)!r} to {new_flat.get(k)!r}, but sweep {raw['name']!r} already has rows "
        "with the old protocol (start a new sweep name to compare protocols)"
        for k in changed
    ]


def _protocols(stored: dict[str, Any], overlay: dict[str, Any], common: list[str]) -> tuple[dict, dict]:
    """The stored and the new protocol, each validated on the datasets both have (the stored ones where
    none is common: then select_metric is left out, never resolved from the data)."""
    old, new = (SweepSpec.model_validate({**s, "datasets": common or stored["datasets"]}) for s in (stored, overlay))
    return old.protocol(select_metrics(old) if common else {}), new.protocol(select_metrics(new) if common else {})


def _stored_where_invalid(overlay: dict[str, Any], stored: dict[str, Any], exc: ValidationError) -> dict[str, Any]:
    """``overlay`` with each value pydantic refused replaced by the stored spec's (left out where that has
    none): what is left of the new protocol is compared."""
    fixed = copy.deepcopy(overlay)
    for error in exc.errors():
        *parents, leaf = error["loc"] or ("",)
        holder: Any = fixed
        source: Any = stored
        for key in parents:
            holder = holder.get(key) if isinstance(holder, dict) else None
            source = source.get(key) if isinstance(source, dict) else None
        if isinstance(holder, dict):
            holder.pop(leaf, None)
            if isinstance(source, dict) and leaf in source:
                holder[leaf] = copy.deepcopy(source[leaf])
    return fixed


FRESH_SWEEP = (
    "a new sweep name with another split_seed: fresh subsets and run seeds, not the rows already seen (the "
    "same split_seed would rerun them); a settle sweep pays for its own looks; `freezesweep plan` prices it"
)


def _seed_changes(stored: dict[str, Any], raw: dict[str, Any], store: ResultStore) -> list[str]:
    """A fixed grid is decided at one look, all its seeds at once: once a group may have been decided,
    seeds added would look at its rows a second time (results/settle.py), at a level paid once, and so
    would a depth added below its deepest (the sequence of depths tested again with one more claim in
    it; a deeper one only extends it); a settle sweep's depth too, once its group has had a look. So
    would a fixed grid turned into a settle sweep (its rows a first look) or the other way round, and seeds
    or depths removed (a decision on fewer seeds, a sequence without a depth). Before
    any group may have been decided, both are new cells as before."""
    old_settle, new_settle = isinstance(stored.get("settle"), dict), isinstance(raw.get("settle"), dict)
    new_seeds = raw.get("seeds") if isinstance(raw.get("seeds"), list) else []
    where = f"sweep {raw.get('name')!r} already has rows"
    if old_settle != new_settle and (new_settle or new_seeds) and _has_rows(store):
        was, now = ("a settle sweep", "a fixed grid of seeds") if old_settle else ("a fixed grid", "a settle sweep")
        return [f"settle: {where} as {was}; as {now} its decisions would look at them again ({FRESH_SWEEP})"]
    # A settle sweep grows its seeds by its own rule; a depth inserted into its sequence is the same
    # second test as a fixed grid's (each report's first false claim another depth: 7.7 % false "within"
    # over four reports against 2.25 %, a review's simulation, 1,500 groups).
    added = [] if old_settle else sorted({s for s in new_seeds if isinstance(s, int)} - set(stored.get("seeds") or []))
    # values removed are the same second look: a decision on fewer seeds, or a sequence without a depth
    # (a walk-through removed k = 2 and the report's sequence went on past it)
    fixed = not old_settle and isinstance(raw.get("seeds"), list)
    dropped = sorted(set(stored.get("seeds") or []) - set(new_seeds)) if fixed else []
    removed = _removed_depths(stored, raw)
    if not (added or dropped or removed or _new_depths(stored, raw)):
        return []
    decided = decided_group(stored, store)
    if decided is None:
        return []
    group, deepest = decided
    # a depth deeper than any decided group's deepest was in no sequence looked at: removed, it only
    # shortens what is still to come, as one added there only extends it
    removed = [k for k in removed if k == "all" or _sequence_order(k) <= _sequence_order(deepest)]
    inserted = [k for k in _new_depths(stored, raw) if _sequence_order(k) < _sequence_order(deepest)]
    looked = "has had a look" if old_settle else "may have been decided"
    at_every = "at every seed of its first look" if old_settle else "at every seed"
    problems = [
        f"seeds: {_listed(added)} added, but {where} and its group {group} may have been decided (full fine-tuning "
        "and a frozen depth in at every seed): a decision on more seeds would be a second look its confidence "
        f"was not shared by ({FRESH_SWEEP})"
    ] * bool(added)
    problems += [
        f"frozen_layers: {inserted} added below the deepest depth ({deepest}), but {where} and its group {group} "
        f"{looked} (full fine-tuning and a frozen depth in {at_every}): its sequence of depths would be tested "
        f"again with more claims in it (a depth deeper than {deepest} extends it and may be added; else {FRESH_SWEEP})"
    ] * bool(inserted)
    problems += [
        f"seeds: {_listed(dropped)} removed, but {where} and its group {group} may have been decided: a decision on "
        f"fewer seeds would be a second look its confidence was not shared by (keep them; else {FRESH_SWEEP})"
    ] * bool(dropped)
    problems += [
        f"frozen_layers: {removed} removed, but {where} and its group {group} {looked}: its sequence of depths would "
        f"be tested again without {'them' if len(removed) > 1 else 'it'}, a second test its confidence was not shared "
        f"by (keep {'them' if len(removed) > 1 else 'it'}; else {FRESH_SWEEP})"
    ] * bool(removed)
    return problems


def _tolerance_change(stored: dict[str, Any], raw: dict[str, Any], store: ResultStore) -> list[str]:
    """A fixed grid's question (``tolerance``, 0.01 unless given) is fixed once it has rows, as a settle
    sweep's is: each tolerance makes another depth the first false claim of its sequence, and the error
    over the readings adds up (a review's simulation: 2.4 % false "within" at one tolerance, 4.3 % at two,
    8.7 % at five, against 2.25 %)."""
    if isinstance(stored.get("settle"), dict) or isinstance(raw.get("settle"), dict):
        return []  # a settle sweep's question: _settle_changes
    before, after = stored.get("tolerance"), raw.get("tolerance")
    if not all(
        v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1) for v in (before, after)
    ):
        return []  # pydantic reports the value (SweepSpec.tolerance: gt=0, lt=1), once
    asked, now = (TOLERANCE if v is None else float(v) for v in (before, after))
    if asked == now or not _has_rows(store):
        return []
    return [
        f"tolerance: sweep {raw.get('name')!r} already has rows asked at tolerance {asked:g}; {now:g} chosen after "
        f"seeing them voids the confidence ({FRESH_SWEEP})"
    ]


def _listed(values: list[int], shown: int = 10) -> str:
    """A list as it is said in an error: whole when short, else its count and ends."""
    return str(values) if len(values) <= shown else f"{len(values):,} ({values[0]}, …, {values[-1]})"


def _new_depths(stored: dict[str, Any], raw: dict[str, Any]) -> list[int]:
    new = raw.get("frozen_layers") if isinstance(raw.get("frozen_layers"), list) else []
    old = stored.get("frozen_layers") or []
    return sorted(k for k in new if isinstance(k, int) and not isinstance(k, bool) and k not in old)


def _removed_depths(stored: dict[str, Any], raw: dict[str, Any]) -> list:
    """The stored sweep's depths the new spec leaves out, ``all`` among them (a model's every layer: the
    deepest of its sequence)."""
    new = raw.get("frozen_layers")
    if not isinstance(new, list):
        return []
    return [k for k in stored.get("frozen_layers") or [] if k not in new and (k == "all" or isinstance(k, int))]


def _sequence_order(k: int) -> float:
    return 0.5 if k == -1 else float(k)  # k = -1 (embeddings only) between 0 and 1: results/settle.py


def _has_rows(store: ResultStore) -> bool:
    return bool(store.row_files())


def decided_group(stored: dict[str, Any], store: ResultStore) -> tuple[str, int] | None:
    """A (model, dataset, train size) of a stored fixed grid that may have been decided — full fine-tuning
    and some frozen depth final at every stored seed (a read decision needs no more; a group judged by the
    spec's depths alone could be made incomplete by adding a depth first); of a settle sweep, that has had
    its first look (the same at every initial seed) — named, with its deepest depth in the rows (of several,
    the one whose deepest is deepest); None if there is none."""
    columns = ["model", "dataset", "train_size", "method", "frozen_layers", "seed", "status"]
    rows = store.read_table(columns=columns).to_pandas()
    rows = rows[(rows["method"] == "freeze") & rows["status"].isin(("ok", "diverged"))]
    settle = stored.get("settle")
    # a settle sweep's first look: its initial seeds (SettleSpec's default 3 where the stored spec omits it)
    seeds = (
        set(range(int(settle.get("initial_seeds") or 3)))
        if isinstance(settle, dict)
        else set(stored.get("seeds") or [])
    )
    if not isinstance(settle, dict) and len(seeds) < MIN_PAIRS:
        return None  # a fixed grid's one look at fewer paired seeds shows no claim (results/settle.py)
    decided = []
    several = rows["model"].nunique() > 1  # one model needs no naming; several, each by its last path part
    for (model, dataset, size), group in rows.groupby(["model", "dataset", "train_size"]):
        by_depth = group.groupby(group["frozen_layers"].astype(int))["seed"].agg(lambda s: set(s.astype(int)))
        complete = [k for k, done in by_depth.items() if seeds <= done]
        if 0 in complete and len(complete) > 1:
            named = f"{model.rstrip('/').rsplit('/', 1)[-1]} · " if several else ""
            decided.append((f"{named}{dataset}, n = {int(size)}", max(by_depth.index, key=_sequence_order)))
    # the deepest of every decided group's deepest: a depth below any one's is inserted into its sequence
    return max(decided, key=lambda found: _sequence_order(found[1]), default=None)


SETTLE_QUESTION = ("tolerance", "confidence", "initial_seeds", "seeds_per_round", "max_seeds")


def _settle_changes(stored: dict[str, Any], raw: dict[str, Any]) -> list[str]:
    """A settle sweep's question and looks are fixed once it has rows: its past looks were paid at the old
    rule's level (results/settle.py), and a tolerance chosen after seeing the data voids the confidence."""
    if not (isinstance(stored.get("settle"), dict) and isinstance(raw.get("settle"), dict)):
        return []  # a fixed grid on either side: the seeds axis (and its protocol) say the rest
    try:
        old, new = (SettleSpec.model_validate(s) for s in (stored["settle"], raw["settle"]))
    except Exception:
        return []  # the new section's own problems are reported by pydantic
    problems = []
    for key in SETTLE_QUESTION:
        before, after = getattr(old, key), getattr(new, key)
        if before == after:
            continue
        why = (
            f"it would take {new.rule().looks} looks where the stored rows' confidence was shared by {old.rule().looks}"
            if key in ("initial_seeds", "seeds_per_round", "max_seeds") and new.rule().looks != old.rule().looks
            else "its looks so far were paid for at the old rule's level"
            if key != "tolerance"
            else "a tolerance chosen after seeing the rows voids the confidence"
        )
        problems.append(
            f"settle.{key}: changed from {before!r} to {after!r}, but sweep {raw['name']!r} already has "
            f"rows: {why} (a new question: start a new sweep name and another split_seed, whose subsets, seeds and "
            "looks are its own; under the same split_seed it would rerun the rows already seen; `freezesweep plan` "
            "prices it)"
        )
    return problems


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """A nested mapping's values by dotted key (``training.epochs``; lists whole, an empty mapping none)."""
    out = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out
