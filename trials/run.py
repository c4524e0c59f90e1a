"""One trial: load → subset → tokenize → build → freeze → fit → record. Plain PyTorch, no Ray.

The best evaluation is the one with the highest ``select_metric``; the row records every metric there.
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import gc
import platform
import random
import re
import resource
import sys
import time
import traceback
from pathlib import Path
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata

import numpy as np
import torch

from freezesweep.trials.config import EVALUATED_ROWS, METHOD_FIELDS, METHODS, EvalPoint, TrialConfig, TrialResult
from freezesweep.trials import eval_cache, first_token, graphs, probe, train_cache
from freezesweep.trials.data import TaskData, load_task, resolve_cache_dir
from freezesweep.trials.eval_cache import PrefixStates, exact_prefix
from freezesweep.trials.first_token import Reader
from freezesweep.trials.freezing import FreezeReport, FreezingError, find_encoder_parts, freeze, prefix_names
from freezesweep.trials.lora import apply_lora
from freezesweep.trials.metrics import METRICS, compute_metrics, constant, describe_shape
from freezesweep.trials.model import (
    attention_for,
    attention_kernels,
    attention_of,
    built_model,
    is_decoder_only,
    load_tokenizer,
    resolve_model_path,
    set_padding,
)
from freezesweep.trials.oom import catch_oom, is_oom
from freezesweep.trials.packing import PackedFeed, PaddedFeed, evaluation_feed, training_feed
from freezesweep.trials.placement import where
from freezesweep.trials.precision import PrecisionPlan, resolve_config, resolve_precision, synchronize, trial_device
from freezesweep.trials.subsets import indices_digest, stratified_order, subset_indices
from freezesweep.trials.tokens import Batch, Tokens, collate, eval_batches, padded_tokens, padding_id, tokenize_rows
from freezesweep.trials.train_cache import TrainPrefix, train_prefix
from freezesweep.trials.train import FitContext, FitState, fit, make_schedule
from freezesweep.trials.worker import EvalKey, FeedKey, TemplateKey, TrainKey, WorkerState, process_worker


def run_trial(
    cfg: TrialConfig,
    on_eval: Callable[[EvalPoint], None] | None = None,
    on_checkpoint: Callable[[Path], None] | None = None,
    worker: WorkerState | None = None,
) -> TrialResult:
    """Run one grid cell and return its result; raises on failure (the caller decides retries).
    ``on_eval`` gets every evaluation, ``on_checkpoint`` every checkpoint file as it is saved;
    ``worker``: what this process keeps between trials (trials/worker.py; default: the process's)."""
    started = time.perf_counter()
    worker = worker or process_worker()
    cfg = resolve_config(cfg)  # the id and the row name the precision actually used
    check_method(cfg)
    device, plan = start_trial(cfg)
    data = trial_data(cfg, device, worker)
    model = trial_model(cfg, data, device)
    if cfg.method == "probe":
        return _probe_trial(cfg, model, data, plan, device, started)
    report, lora_targets = adapt(model, cfg)
    eval_prefix, train_prefix, cache_fill_time_s = _fill_caches(cfg, model, data, plan, device)
    reader, feed = feed_of(cfg, model, data, device, packed=train_prefix is None)
    graphed = graphs.cuda_graphs_apply(cfg, device, plan, train_prefix) and model_key(cfg, model) not in (
        data.worker.graph_failures
    )
    eval_graphed, eval_feed = _evaluation(cfg, model, data, (device, plan), reader, graphed)
    ctx = FitContext(
        cfg=cfg,
        plan=plan,
        device=device,
        schedule=make_schedule(len(data.train_rows), cfg),
        eval_batches=data.batches,
        eval_prefix=eval_prefix,
        train_prefix=train_prefix,
        on_eval=on_eval or (lambda point: None),
        feed=feed,
        on_checkpoint=on_checkpoint or (lambda path: None),
        cuda_graphs=graphed,
        eval_graphs=eval_graphed,
        eval_feed=eval_feed,
    )
    with first_token.narrowed(model, reader):
        state = fit(model, data.train_tokens, data.task.train.labels[data.train_rows], data.pad_id, ctx)
    if state.cuda_graphs_failed:  # this worker's later trials of the model run eagerly from the start
        data.worker.graph_failures[model_key(cfg, model)] = state.cuda_graphs_failed
    if state.eval_graphs_failed:  # and its evaluations
        data.worker.graph_failures[(model_key(cfg, model), "evaluation")] = state.eval_graphs_failed
    prefixes = (eval_prefix, train_prefix)
    result = trial_result(
        cfg, data, report, state, device, plan, prefixes, time.perf_counter() - started, cache_fill_time_s
    )
    graphed = graphed and not state.cuda_graphs_failed
    used = optimisations_used(*prefixes, reader, feed, cuda_graphs=graphed, eval_graphs=state.eval_graphs)
    return dataclasses.replace(result, lora_targets=lora_targets, optimisations=used)


def _fill_caches(
    cfg: TrialConfig, model, data: TrialData, plan: PrecisionPlan, device: torch.device
) -> tuple[PrefixStates | None, TrainPrefix | None, float]:
    """The evaluation and train prefix caches, and the seconds their fill took (a worker's first fill of
    them is recorded on its own: ``cache_fill_time_s``)."""
    fill_started = time.perf_counter()
    eval_prefix = evaluation_prefix(cfg, model, data, plan, device)
    train_prefix = _train_prefix(cfg, model, data, plan, device)
    synchronize(device)
    return eval_prefix, train_prefix, time.perf_counter() - fill_started


def start_trial(cfg: TrialConfig) -> tuple[torch.device, PrecisionPlan]:
    """The cell's device and precision, its threads and attention kernels set and the peak memory
    counted from now."""
    device = trial_device(cfg)
    plan = resolve_precision(cfg.precision, device)
    attention_kernels(device)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    reset_peak_memory(device)
    return device, plan


def optimisations_used(
    eval_prefix: PrefixStates | None,
    train_prefix: TrainPrefix | None,
    reader: Reader | None,
    feed: PaddedFeed | PackedFeed,
    cuda_graphs: bool = False,
    eval_graphs: bool = False,
) -> tuple[str, ...]:
    """What the row says the trial used (each one decided by its own check, the rest stepped aside)."""
    used = {
        "eval_cache": eval_prefix is not None,
        "train_cache": train_prefix is not None,
        "narrowed_last_layer": reader is not None,
        "packed_training": isinstance(feed, PackedFeed),
        "cuda_graphs": cuda_graphs,
        "eval_graphs": eval_graphs,
    }
    return tuple(name for name, on in used.items() if on)


def _probe_trial(
    cfg: TrialConfig, model, data: TrialData, plan: PrecisionPlan, device: torch.device, started: float
) -> TrialResult:
    """Features of the frozen model (cached) → C by cross-validation on the train subset → the
    validation set scored once (trials/probe.py)."""
    task, layers = data.task, len(find_encoder_parts(model).layers)
    val_states, train_states, fill_s = _probe_states(cfg, model, data, plan, device, layers)
    pooling = probe.resolve_pooling(
        cfg.probe_pooling, resolve_model_path(cfg.model_files()), is_decoder_only(model.config)
    )

    fit_started = time.perf_counter()
    fitted = probe.select_and_fit(
        probe.train_features(train_states.states, pooling),
        task.train.labels[data.train_rows],
        task.regression,
        cfg.select_metric,
        cfg.probe_folds,
        cfg.probe_cs,
        cfg.seed,
        task.label_names,  # its error names a class as the files write it ("meh", not "class 0")
    )
    eval_started = time.perf_counter()
    point = _probe_point(fitted, val_states, data, pooling)
    state = FitState(
        curve=[point], train_time_s=eval_started - fit_started, eval_time_s=time.perf_counter() - eval_started
    )
    params = FreezeReport(
        frozen_layers=None,
        num_layers=layers,
        trainable_params=fitted.trainable_params,
        total_params=sum(p.numel() for p in model.base_model.parameters()) + fitted.trainable_params,
    )
    result = trial_result(cfg, data, params, state, device, plan, (None, None), time.perf_counter() - started, fill_s)
    return dataclasses.replace(
        result,
        probe_pooling=pooling,
        probe_c=fitted.c,
        train_examples_per_s=None,
        eval_cached_layers=layers,
        train_cached_layers=layers,
    )


def _probe_states(
    cfg: TrialConfig, model, data: TrialData, plan: PrecisionPlan, device: torch.device, layers: int
) -> tuple[PrefixStates, TrainPrefix, float]:
    """Every layer's output for the validation rows and the train subset (the probe's features, cached
    as the frozen prefixes are), and the seconds their fill took."""
    fill_started = time.perf_counter()
    eval_key, train_key = _eval_key(cfg, data, plan, device, model), _train_key(cfg, data, plan, device)
    val_states = eval_cache.prefix_states(model, data.batches, plan, device, layers, eval_key, data.worker)
    train_states = train_prefix(model, data.train_tokens, data.train_rows, plan, device, layers, train_key, data.worker)
    synchronize(device)
    return val_states, train_states, time.perf_counter() - fill_started


def _probe_point(fitted: probe.ProbeFit, val_states, data: TrialData, pooling: str) -> EvalPoint:
    """The probe's one evaluation: the validation set scored once."""
    task = data.task
    features, labels = probe.validation_features(val_states, data.batches, pooling)
    predictions = fitted.predictor.predict(features)
    metrics = compute_metrics(predictions, labels, task.regression, task.num_labels)
    loss = probe.validation_loss(fitted, features, labels, task.regression, task.num_labels)
    return EvalPoint(
        step=0,
        epoch=0.0,
        loss=loss,
        constant_predictions=constant(predictions),
        **{name: metrics.get(name) for name in METRICS},
    )


@dataclass(frozen=True)
class TrialData:
    """What a trial reads, once loaded: the task, its train subset (split indices and tokens), the
    validation batches (on the device) with the key that names those rows for the caches, and the
    constant baseline's metrics on those same rows."""

    task: TaskData
    train_rows: np.ndarray
    train_tokens: Tokens
    batches: list[Batch]
    val_key: tuple[str, str]  # (the validation split's digest, the evaluated rows' digest)
    baseline: dict[str, float]  # every metric of the constant predictor on the evaluated rows
    worker: WorkerState
    pad_id: int = 0  # the id batches are padded with (trials/tokens.py padding_id)


def cell_task(cfg: TrialConfig, worker: WorkerState | None = None) -> TaskData:
    """The cell's dataset, read as the cell says (columns, files, empty texts)."""
    return load_task(
        cfg.dataset,
        cfg.data_dir,
        cfg.text_column,
        cfg.label_column,
        cfg.text_pair_column,
        files=cfg.dataset_files,
        empty_texts=cfg.empty_texts,
        worker=worker,
    )


def eval_cache_tokens(cfg: TrialConfig, worker: WorkerState | None = None) -> int:
    """The token positions one evaluation cache entry of ``cfg``'s cells holds a state for: its
    validation rows tokenized, length-sorted and padded per batch as its evaluation pads them (what
    the memory probe counts: trials/memory_probe.py)."""
    task = cell_task(cfg, worker)
    rows = eval_rows(task, cfg)
    tokenizer = load_tokenizer(cfg.model_files())
    ids = tokenize_rows(tokenizer, task.validation, rows, cfg.max_seq_length, resolve_cache_dir(cfg.cache_dir), worker)
    return padded_tokens(ids, cfg.eval_batch_size)


def trial_data(cfg: TrialConfig, device: torch.device, worker: WorkerState) -> TrialData:
    """What a cell reads: its task, its train subset tokenized, its validation batches on the device
    (once, for every evaluation). Cells that share dataset, train size and split seed read the same."""
    note_held(worker, device)  # before it fills the worker's caches
    task = cell_task(cfg, worker)
    check_select_metric(cfg, task)
    train_rows = subset_indices(task.train.labels, cfg.train_size, cfg.split_seed)
    val_rows = eval_rows(task, cfg)
    tokenizer = load_tokenizer(cfg.model_files())
    cache_dir = resolve_cache_dir(cfg.cache_dir)
    train_ids = tokenize_rows(tokenizer, task.train, train_rows, cfg.max_seq_length, cache_dir, worker)
    val_ids = tokenize_rows(tokenizer, task.validation, val_rows, cfg.max_seq_length, cache_dir, worker)
    pad_id = padding_id(tokenizer)
    batches = [
        b.to(device) for b in eval_batches(val_ids, task.validation.labels[val_rows], cfg.eval_batch_size, pad_id)
    ]  # on the device once, for every evaluation
    val_key = (task.validation.digest, indices_digest(val_rows))
    # the constant baseline on the rows scored: never the whole split when they are a sample
    baseline = task.baseline_metrics(val_rows)
    return TrialData(task, train_rows, train_ids, batches, val_key, baseline, worker, pad_id)


def trial_model(cfg: TrialConfig, data: TrialData, device: torch.device):
    """The cell's initial model on its device, told its batches' padding id, with the device's attention."""
    model = initial_model(cfg, data.task.num_labels, data.worker)
    return attention_for(set_padding(model, data.pad_id).to(device), device)


def check_method(cfg: TrialConfig) -> None:
    """A cell carries its method's own fields and no other method's (the grid builds them so)."""
    if cfg.method not in METHODS:
        raise ValueError(f"unknown method {cfg.method!r} (known: {', '.join(METHODS)})")
    missing = [name for name in METHOD_FIELDS[cfg.method] if getattr(cfg, name) is None and name != "lora_targets"]
    foreign = [
        name
        for method, names in METHOD_FIELDS.items()
        if method != cfg.method
        for name in names
        if getattr(cfg, name) is not None
    ]
    if missing or foreign:
        raise ValueError(
            f"a {cfg.method} cell needs {', '.join(missing) or 'nothing more'} and takes no "
            f"{', '.join(foreign) or 'other method fields'}"
        )


def adapt(model, cfg: TrialConfig) -> tuple[FreezeReport, tuple[str, ...]]:
    """Make the model's trainable part what the method says: frozen layers, or LoRA adapters."""
    if cfg.method == "lora":
        return apply_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets)
    return freeze(model, cfg.frozen_layers), ()


def seeded_weights(cfg: TrialConfig, worker: WorkerState | None = None) -> bool:
    """Whether the model's weights below its head are drawn from the cell's seed: a random init's; a
    pretrained model's where its checkpoint lacks one (``worker`` built it and saw: transformers draws
    the weights a checkpoint lacks, so the states after them differ per seed)."""
    return cfg.model_init != "pretrained" or bool(worker and worker.seeded_prefix.get(cfg.model))


def weights_key(cfg: TrialConfig, worker: WorkerState | None = None) -> str:
    """What the model's weights are below its head, for the keys of the states cached after them."""
    return f"{cfg.model_init}-{cfg.derived_seed}" if seeded_weights(cfg, worker) else "pretrained"


def _eval_key(cfg: TrialConfig, data: TrialData, plan: PrecisionPlan, device: torch.device, model) -> EvalKey:
    """The evaluation cache's key: freeze cells and probe cells of the same weights share entries."""
    return EvalKey(
        cfg.model,
        *data.val_key,
        cfg.eval_batch_size,
        cfg.max_seq_length,
        weights_key(cfg, data.worker),
        plan.name,
        str(device),
        attention_of(model),
    )


def _train_key(cfg: TrialConfig, data: TrialData, plan: PrecisionPlan, device: torch.device) -> TrainKey:
    weights = weights_key(cfg, data.worker)
    return TrainKey(cfg.model, weights, data.task.train.digest, cfg.max_seq_length, plan.name, str(device))


def evaluation_prefix(
    cfg: TrialConfig, model, data: TrialData, plan, device, room: int | None = None
) -> PrefixStates | None:
    """The cached output of the frozen layers for evaluation, when it is exact: at least one frozen
    layer, and bit-identical to the full model on the first batch; and when it fits ``room`` bytes
    (default: the worker's budget for the cache). A random init is cached too, under its seed
    (``weights_key``): the cells of one seed start from the same weights (``initial_model``)."""
    if not (cfg.eval_cache and cfg.method == "freeze" and cfg.frozen_layers >= 1):
        return None
    key = _eval_key(cfg, data, plan, device, model)
    return exact_prefix(model, data.batches, plan, device, cfg.frozen_layers, key, data.worker, room)


def feed_of(
    cfg: TrialConfig, model, data: TrialData, device: torch.device, packed: bool
) -> tuple[Reader | None, PaddedFeed | PackedFeed]:
    """The last layer narrowed to the head's token, training batches packed: each where exact for this
    model (checked on the first training rows; the opt-in training cache feeds padded states)."""
    check = check_batch(data, device)
    every_layer_frozen = (
        cfg.method == "freeze" and cfg.frozen_layers > 0 and cfg.frozen_layers == len(find_encoder_parts(model).layers)
    )
    return training_feed(
        model,
        check,
        model_key(cfg, model),
        data.worker.feed_verdicts,
        cfg.narrow_last_layer,
        cfg.pack_training and packed,
        narrow_evaluation=not every_layer_frozen,
    )


def evaluation_graphed(graphed: bool, device: torch.device, key: FeedKey, worker: WorkerState) -> bool:
    """Evaluations as CUDA graphs where the step is graphed on a GPU, unless this worker saw a capture of
    the model's evaluation fail."""
    return graphs.evaluation_graphs_apply(graphed, device) and (key, "evaluation") not in worker.graph_failures


def prebuilt_mask(eval_graphed: bool, device: torch.device, plan: PrecisionPlan) -> bool:
    """Whether evaluations hand the model its padding mask prebuilt (where exact: ``evaluation_feed_of``):
    graphed ones (a capture refuses the model's own mask building), and every other on a GPU but fp16's:
    transformers' own mask building reads the mask on the host once per batch (SDPA's
    ``padding_mask.all()``), a sync the host waits on. fp16 keeps the model's own (the prebuilt mask turns
    -inf in fp16: not yet run on a GPU); a CPU too (a sync there costs nothing)."""
    return eval_graphed or (device.type == "cuda" and plan.name != "fp16")


def evaluation_feed_of(model, check: Batch, pad_id: int, key: FeedKey, worker: WorkerState, reader) -> PaddedFeed:
    """How evaluations feed the model where ``prebuilt_mask`` holds (trials/packing.py ``evaluation_feed``),
    checked on ``check``'s rows as they evaluate: on the last layer narrowed where it will be."""
    with first_token.narrowed(model, reader):
        return evaluation_feed(model, check, pad_id, key, worker.feed_verdicts)


def _evaluation(
    cfg: TrialConfig, model, data: TrialData, where: tuple, reader, graphed: bool
) -> tuple[bool, PaddedFeed]:
    """A trial's evaluations: as CUDA graphs or not, and how they feed the model."""
    device, plan = where
    key = model_key(cfg, model)
    eval_graphed = evaluation_graphed(graphed, device, key, data.worker)
    if not prebuilt_mask(eval_graphed, device, plan):
        return eval_graphed, PaddedFeed()
    return eval_graphed, evaluation_feed_of(model, check_batch(data, device), data.pad_id, key, data.worker, reader)


def model_key(cfg: TrialConfig, model) -> FeedKey:
    """What a worker's verdicts on a model are kept under (packing, narrowing, CUDA graphs, arrays)."""
    return FeedKey(cfg.model, type(model).__qualname__, attention_of(model))


def check_batch(data: TrialData, device: torch.device) -> Batch:
    """A few training rows, padded, on the device: what the checks of the optimisations run on."""
    rows = np.arange(min(8, len(data.train_rows)))
    return collate(data.train_tokens.select(rows), data.task.train.labels[data.train_rows[rows]], data.pad_id).to(
        device
    )


def _train_prefix(cfg: TrialConfig, model, data: TrialData, plan, device) -> TrainPrefix | None:
    """The opt-in training cache (a deviation from the reference, see trials/train_cache.py)."""
    if not (cfg.train_cache and cfg.method == "freeze" and cfg.frozen_layers >= 1):
        return None
    return train_cache.usable_prefix(
        model,
        data.train_tokens,
        data.train_rows,
        plan,
        device,
        cfg.frozen_layers,
        _train_key(cfg, data, plan, device),
        data.worker,
    )


def check_select_metric(cfg: TrialConfig, task: TaskData) -> None:
    """A metric the task does not have cannot pick its best evaluation (the spec checks this first)."""
    if cfg.select_metric not in task.metrics:
        raise ValueError(
            f"select_metric {cfg.select_metric!r} does not fit {cfg.dataset} "
            f"({describe_shape(task.regression, task.num_labels)}: {', '.join(task.metrics)})"
        )


def eval_rows(task: TaskData, cfg: TrialConfig) -> np.ndarray:
    """The validation rows a cell is evaluated on: all of them, or the shrink switch's sample."""
    n = len(task.validation)
    if cfg.max_eval_examples is None or cfg.max_eval_examples >= n:
        return np.arange(n)
    # A smaller, still stratified validation sample (shrink switch), the same for every cell.
    return np.sort(stratified_order(task.validation.labels, cfg.split_seed, cfg.max_eval_examples))


def initial_model(cfg: TrialConfig, num_labels: int, worker: WorkerState | None = None):
    """The model before training. Seeded with the paired seed first, so every cell with the same
    (seed, split_seed, dataset, model) starts from the same classifier head, whatever k or n.

    The last two such (model, init, labels, seed) built in this worker are kept and copied per trial:
    the copy, and the RNG state restored beside it, are bit for bit what building it again would
    give, minus the load (or the random initialisation of a whole model, ~1.4 s for a base-size one
    on a CPU). It pays where a worker meets the cells of one seed in a row (a one-seed grid)."""
    worker = worker or process_worker()
    key = TemplateKey(cfg.model, cfg.model_init, num_labels, cfg.derived_seed)
    seed_everything(cfg.derived_seed)
    if key not in worker.templates:
        model, drawn = built_model(cfg.model_files(), num_labels, cfg.model_init)
        # once per model: a checkpoint lacks the same weights whatever the seed (a random init: all of them)
        if cfg.model_init == "pretrained" and cfg.model not in worker.seeded_prefix:
            worker.seeded_prefix[cfg.model] = drawn_in_prefix(model, drawn)
        worker.templates.put(key, (model, _host_rng_states()))
    template, states = worker.templates.fresh(key)
    _set_host_rng_states(states)  # as if the model had just been built (dropout draws continue from here)
    return copy.deepcopy(template)


def drawn_in_prefix(model, drawn: frozenset[str]) -> bool:
    """Whether a weight drawn from the seed (``built_model``) lies in the embeddings or the encoder
    layers: what the cached states after a frozen layer depend on. A model without one layer stack
    (ALBERT's shared layer, an encoder-decoder) runs full fine-tuning alone: nothing of it is cached."""
    try:
        return bool(drawn & prefix_names(model))
    except FreezingError:
        return False


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def _host_rng_states() -> tuple:
    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def _set_host_rng_states(states: tuple) -> None:
    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])  # models are built on the CPU: the CUDA generators are as seeded


COLLAPSE_ATOL = 1e-9  # metrics are computed in float64: an equal score is the same predictions' score
# A best score at most this share of the way from the constant baseline's to a perfect one (every metric tops
# out at 1) is the constant predictor's or a near miss of it: results/settle.py COLLAPSE_SHARE says why; the
# two rules are one (tests/trials/test_collapse.py holds them together).
COLLAPSE_SHARE = 0.1


def collapsed(best: EvalPoint, metric: str, baseline: dict[str, float]) -> bool:
    """A fine-tune that did not leave the constant predictor, or barely: its best evaluation gave every
    evaluated row the same prediction, or scored at most COLLAPSE_SHARE of the way from the constant
    baseline's score on those rows (``baseline``: computed on the rows the scores were) to a perfect score.
    The score alone misses one class that is not the rows' majority (a minority class 1 answered everywhere
    scores F1 2p / (1 + p) against its baseline's 0; the train majority answered on a sample whose majority
    is the other class); the score test stays beside it, as settle mode reads rows stored before the
    prediction was looked at (results/settle.py)."""
    base = baseline[metric]
    return best.constant_predictions or bool(
        getattr(best, metric) - base <= max(COLLAPSE_SHARE * (1 - base), COLLAPSE_ATOL)
    )


def trial_result(
    cfg,
    data: TrialData,
    report: FreezeReport,
    state: FitState,
    device: torch.device,
    plan: PrecisionPlan,
    cached: tuple[PrefixStates | None, TrainPrefix | None],
    wall_time_s: float,
    cache_fill_time_s: float,
) -> TrialResult:
    train_rows, n_eval = data.train_rows, sum(len(b.labels) for b in data.batches)
    metric = cfg.select_metric
    worker_peak_mb = peak_memory_mb(device)  # the process's, with everything the worker keeps
    # the curve holds finite evaluations only (a diverged fit stops before its first non-finite one)
    best = max(state.curve, key=lambda p: getattr(p, metric)) if state.curve else None  # first of equals: the earliest
    last = state.curve[-1] if state.curve else None
    baseline = data.baseline  # on the evaluated rows, as every score below
    return TrialResult(
        trial_id=cfg.trial_id,
        config=cfg,
        status="ok" if state.diverged_at_step is None else "diverged",
        diverged_at_step=state.diverged_at_step,
        best_val_accuracy=best.accuracy if best else None,
        best_step=best.step if best else None,
        best_epoch=best.epoch if best else None,
        final_val_accuracy=last.accuracy if last else None,
        majority_baseline=baseline.get("accuracy"),  # None for regression
        select_metric=metric,
        best_val_score=getattr(best, metric) if best else None,
        final_val_score=getattr(last, metric) if last else None,
        baseline_score=baseline[metric],
        collapsed=None if best is None else collapsed(best, metric, baseline),
        best_val_metrics=best.metrics() if best else {},
        baseline_metrics=baseline,
        baseline_rows=EVALUATED_ROWS,
        eval_curve=tuple(state.curve),
        train_loss_curve=tuple(state.train_loss_curve),
        trainable_params=report.trainable_params,
        total_params=report.total_params,
        train_time_s=state.train_time_s,
        eval_time_s=state.eval_time_s,
        wall_time_s=wall_time_s,
        cache_fill_time_s=cache_fill_time_s,
        train_examples_per_s=state.step * cfg.batch_size / max(state.train_time_s, 1e-9),
        peak_mem_mb=own_peak_mb(device, worker_peak_mb, data.worker.held_mib(device)),  # the trial's own
        worker_peak_mem_mb=worker_peak_mb,
        device=device_name(device),
        precision=plan.name,
        train_indices_digest=indices_digest(train_rows),
        resumed_from_step=state.resumed_from_step,
        eval_cached_layers=cached[0].layer if cached[0] is not None else None,
        train_cached_layers=cached[1].layer if cached[1] is not None else None,
        train_indices=tuple(int(i) for i in train_rows),
        n_train=len(train_rows),
        n_eval=n_eval,
        versions=library_versions(),
        placement=where(device),
    )


# torch's words for a value past a reduced type's range ("value cannot be converted to type c10::BFloat16
# without overflow"): a walk-through's DeBERTa (v1) failed so in every trial at precision auto (bf16),
# transformers' attention filling its mask with float32's minimum
OVERFLOW = "without overflow"


def failed_result(
    cfg: TrialConfig,
    exc: BaseException,
    wall_time_s: float | None = None,
    trace: str | None = None,
    placement: dict | None = None,
) -> TrialResult:
    """The row of a trial that raised: ``oom`` for out-of-memory (whichever CUDA call ran out,
    trials/oom.py), else ``failed``, with the message and the last frames of the traceback
    (``trace``: a text traceback from elsewhere, e.g. Ray's, when ``exc`` crossed a process and
    lost its own); ``placement``: where it ran, when known."""
    status = "oom" if is_oom(exc) else "failed"
    message = f"{type(exc).__name__}: {exc}"
    if OVERFLOW in message and cfg.precision in ("bf16", "fp16"):
        message += (
            f" (under {cfg.precision} autocast: this model's code overflows {cfg.precision}; precision: fp32 runs it)"
        )
    if trace:
        frames = "\n".join(trace.strip().splitlines()[-10:]) + "\n"
    else:
        frames = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-4:])
    return TrialResult(
        trial_id=cfg.trial_id,
        config=cfg,
        status=status,
        error=f"{message}\n{frames}",
        select_metric=cfg.select_metric,
        wall_time_s=wall_time_s,
        precision=None if cfg.precision == "auto" else cfg.precision,
        versions=library_versions(),
        placement=placement or {},
    )


def run_trial_or_oom(
    cfg: TrialConfig,
    on_eval: Callable[[EvalPoint], None] | None = None,
    on_checkpoint: Callable[[Path], None] | None = None,
    worker: WorkerState | None = None,
) -> TrialResult:
    """``run_trial``, except that running out of GPU memory gives the cell's ``oom`` row, after this
    process has given the memory back (so the next trial it takes starts clean). Other errors
    propagate: whoever runs the trial decides on retries."""
    cfg = resolve_config(cfg)  # the oom row's id names the precision actually used
    worker = worker or process_worker()
    return catch_oom(
        lambda: run_trial(cfg, on_eval, on_checkpoint, worker),
        lambda exc: failed_result(cfg, exc, placement=where(trial_device(cfg))),
        free=lambda: free_memory(worker),
    )


def free_memory(worker: WorkerState) -> None:
    """Give this process's memory back: what the worker keeps (states and initial models may sit on
    the GPU beside the trials packed there), then reference cycles, then the CUDA allocator's unused
    blocks (only where CUDA is in use: initialising it here would cost a context for nothing)."""
    worker.clear()
    gc.collect()
    _empty_cuda_cache()


def _empty_cuda_cache() -> None:
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@dataclass
class _HostStart:
    """Where the running trial's host memory started: the process's RSS at the reset (the imports,
    the worker's caches, what the allocator kept) and its file-backed part, and what the worker's
    caches held then, noted when the trial first reads its data (``note_held``: the reset does not
    know the worker)."""

    rss_mib: float = 0.0
    file_mib: float = 0.0
    held_mib: float | None = None


_HOST_START = _HostStart()  # one per process, as VmHWM: a worker process runs one trial (or array) at a time


def reset_peak_memory(device: torch.device) -> None:
    """Start this trial's peak from now: a reused worker's earlier trials must not count."""
    if device.type == "cuda":
        # CUDA initialised first: on a fresh process the statistics of cuda:N do not exist yet ("Invalid
        # device argument ... did you call init?"), which only an earlier CUDA call used to hide.
        torch.cuda.init()
        torch.cuda.reset_peak_memory_stats(device)
        return
    # no gc.collect() here: a full collection in a process with torch loaded costs ~0.2 s a trial (the default
    # suite's trials went from 14 s to 19 s a file); an earlier trial's cycles go when Python's gc next runs
    _trim_heap()
    try:  # Linux >= 4.0: writing 5 to clear_refs resets the process's peak RSS (VmHWM) to its RSS, see proc(5)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # elsewhere the peak is the process's since it started
    _HOST_START.rss_mib, _HOST_START.file_mib = _status_mib("VmRSS") or 0.0, _status_mib("RssFile") or 0.0
    _HOST_START.held_mib = None


def _trim_heap() -> None:
    """Give the memory glibc's malloc keeps after frees back to the OS (malloc_trim(3): since glibc
    2.8 every arena's free pages, not only the heap's top): else RSS at the reset carries an earlier
    trial's freed memory, which this trial then reuses unseen by VmHWM. Elsewhere (no glibc) skipped."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError, TypeError):  # TypeError: Windows' CDLL wants a name
        pass


def note_held(worker: WorkerState, device: torch.device) -> None:
    """The worker's caches as the trial found them (host memory only: CUDA counts from its allocator)."""
    if device.type != "cuda" and _HOST_START.held_mib is None:
        _HOST_START.held_mib = worker.held_mib(device)


def peak_memory_mb(device: torch.device) -> float:
    """The process's peak since the reset, in MiB (the store's ``_mb`` columns count 2**20 bytes, as
    nvidia-smi and torch do): CUDA's allocator's; on the host VmHWM, the peak RSS (proc(5))."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = _status_mib("VmHWM")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 if peak is None else peak  # Linux: KiB


def own_peak_mb(device: torch.device, worker_peak_mb: float, held_mib: float) -> float:
    """The trial's own peak (``peak_memory_mb``'s, ``held_mib``: the worker's caches now). CUDA's:
    the allocator's peak since the reset less the worker's tensors. The host's: VmHWM above the RSS
    at the reset, less what the worker's caches grew by since (filled for later trials) and the
    file-backed pages the process mapped since and keeps (proc(5): RssFile, part of the RSS: a
    model's weights file, libraries imported; the first trial of a worker would count them)."""
    if device.type == "cuda":
        return max(0.0, worker_peak_mb - held_mib)
    start = _HOST_START
    grown = held_mib - (held_mib if start.held_mib is None else start.held_mib)
    mapped = max(0.0, (_status_mib("RssFile") or 0.0) - start.file_mib)
    return max(0.0, worker_peak_mb - start.rss_mib - grown - mapped)


def _status_mib(field: str) -> float | None:
    """A memory line of /proc/self/status in MiB (proc(5): ``VmRSS``, ``VmHWM``, ``RssFile``), None where none."""
    try:
        with open("/proc/self/status") as f:
            return int(re.search(rf"{field}:\s+(\d+) kB", f.read()).group(1)) / 1024
    except (OSError, AttributeError):
        return None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return f"cpu:{platform.processor() or platform.machine()}"


def library_versions() -> dict[str, str]:
    versions = {"python": sys.version.split()[0]}
    for name in ("freezesweep", "torch", "transformers", "numpy", "pyarrow", "ray"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    if torch.version.cuda:
        versions["cuda"] = torch.version.cuda
    return versions
