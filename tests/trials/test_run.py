import dataclasses
import math

import pytest
import torch

from freezesweep.trials.config import TrialConfig
from freezesweep.trials.precision import PrecisionError, resolve_precision
from freezesweep.trials.run import collapsed, failed_result, run_trial
from freezesweep.trials.worker import WorkerState
from freezesweep.trials.train import make_schedule


def test_tiny_trial_result_is_complete(tiny_trial, tmp_path):
    seen = []
    result = run_trial(tiny_trial, on_eval=seen.append)
    assert result.status == "ok" and result.trial_id == tiny_trial.trial_id
    # 48 rows / batch 16 = 3 steps per epoch, 6 in all; every ceil(0.5 * 48 / 16) = 2 steps
    assert [p.step for p in result.eval_curve] == [2, 4, 6] == [p.step for p in seen]
    assert result.best_val_accuracy == max(p.accuracy for p in result.eval_curve)
    assert result.final_val_accuracy == result.eval_curve[-1].accuracy
    assert 0.5 <= result.majority_baseline <= 0.75
    # 6 steps on the toy task never leave the majority class: a collapse, recorded as such (settle mode)
    assert result.best_val_score == result.baseline_score and result.collapsed is True
    assert result.trainable_params == result.total_params > 0
    assert result.precision == "fp32" and result.device.startswith("cpu")
    assert len(result.train_indices) == result.n_train == 48 and result.n_eval == 60
    assert result.peak_mem_mb > 0 and result.train_examples_per_s > 0
    assert {"torch", "transformers", "python"} <= set(result.versions)


def test_same_cell_same_result(tiny_trial):
    a, b = run_trial(tiny_trial), run_trial(tiny_trial)
    assert a.eval_curve == b.eval_curve and a.train_loss_curve == b.train_loss_curve


def test_seed_changes_the_run_but_not_the_subset(tiny_trial):
    a = run_trial(tiny_trial)
    b = run_trial(dataclasses.replace(tiny_trial, seed=1))
    assert a.train_indices_digest == b.train_indices_digest
    assert a.train_loss_curve != b.train_loss_curve


# The toy's 36-row evaluation sample (max_eval_examples) of its 60 validation rows: 22 of class 1 (0.611)
# against the split's 36 of 60 (0.6). One class answered on every sampled row scores one of these.
SAMPLE_ONE_CLASS = {
    "majority": {"accuracy": 22 / 36, "f1": 2 * (22 / 36) / (1 + 22 / 36), "matthews": 0.0},
    "minority": {"accuracy": 14 / 36, "f1": 0.0, "matthews": 0.0},
}


@pytest.mark.parametrize("metric", ["accuracy", "f1", "matthews"])
def test_a_collapse_on_a_sample_is_seen_in_every_metric(tiny_trial, metric):
    """The tiny trial answers one class on every row (which one depends on the head's seed, itself drawn
    from the fixtures' paths): collapsed in every metric, against the sample's baseline. Before, the
    whole split's baseline (0.6, F1 0.75) stored it as trained in accuracy and F1."""
    result = run_trial(dataclasses.replace(tiny_trial, max_eval_examples=36, select_metric=metric))
    best = next(p for p in result.eval_curve if p.step == result.best_step)
    assert result.n_eval == 36 and result.baseline_rows == "evaluated"
    assert (
        result.baseline_metrics == pytest.approx(SAMPLE_ONE_CLASS["majority"]) and result.majority_baseline == 22 / 36
    )
    assert any(result.best_val_metrics == pytest.approx(scores) for scores in SAMPLE_ONE_CLASS.values())
    assert best.constant_predictions and result.collapsed is True


def test_a_trained_seed_on_a_sample_is_not_collapsed(tiny_trial):
    result = run_trial(dataclasses.replace(tiny_trial, epochs=10, train_size=120, max_eval_examples=36))
    best = next(p for p in result.eval_curve if p.step == result.best_step)
    assert result.collapsed is False and not best.constant_predictions
    assert not any(collapsed(best, metric, result.baseline_metrics) for metric in ("accuracy", "f1", "matthews"))


def test_it_learns_and_freezing_limits_trainable(tiny_trial):
    full = run_trial(dataclasses.replace(tiny_trial, epochs=10, train_size=120))
    assert full.best_val_accuracy > full.majority_baseline + 0.1 and full.collapsed is False
    frozen = run_trial(dataclasses.replace(tiny_trial, frozen_layers=2))
    assert frozen.trainable_params < frozen.total_params == full.total_params


@pytest.mark.parametrize(
    "n,eval_every,evaluations,warmup",
    [(50, 2, 20, 4), (100, 4, 17, 7), (200, 7, 18, 13), (500, 16, 20, 32), (1000, 32, 19, 63)],
)
def test_schedule_is_the_reference_one(n, eval_every, evaluations, warmup):
    """HF Trainer semantics: eval every ceil(0.5 n / 16) steps, no forced final evaluation, warmup
    ceil(n / 16) steps; the reference's 20, 17, 18, 20, 19 evaluations."""
    s = make_schedule(n, TrialConfig(dataset="d", model="m", train_size=n, frozen_layers=0))
    assert s.total_steps == 10 * math.ceil(n / 16) and s.warmup_steps == warmup
    assert sorted(s.eval_steps) == list(range(eval_every, s.total_steps + 1, eval_every))
    assert len(s.eval_steps) == evaluations and not s.checkpoint_steps


def test_eval_at_end_adds_the_last_step_only():
    cfg = TrialConfig(dataset="d", model="m", train_size=100, frozen_layers=0, eval_at_end=True)
    s = make_schedule(100, cfg)
    assert len(s.eval_steps) == 18 and max(s.eval_steps) == 70 and 68 in s.eval_steps
    short = make_schedule(100, dataclasses.replace(cfg, epochs=0.2, eval_at_end=False))  # 2 steps < one interval
    assert sorted(short.eval_steps) == [2]


def test_learning_rate_warms_up_then_decays_to_zero():
    from transformers import get_linear_schedule_with_warmup

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=5e-5)
    sched = get_linear_schedule_with_warmup(opt, 4, 40)
    lrs = []
    for _ in range(40):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs[0] == 0 and math.isclose(lrs[4], 5e-5) and sched.get_last_lr()[0] == 0


def test_checkpoint_resume_follows_the_same_path(tiny_trial, tmp_path, monkeypatch):
    cfg = dataclasses.replace(tiny_trial, epochs=3, checkpoint_dir=str(tmp_path), checkpoint_every_epochs=1)
    uninterrupted = run_trial(dataclasses.replace(cfg, checkpoint_dir=None))
    monkeypatch.setenv("FREEZESWEEP_FAULT", "crash@4")  # dies after the 2nd epoch's checkpoint
    with pytest.raises(RuntimeError, match="injected crash"):
        run_trial(cfg)
    assert (tmp_path / f"{cfg.trial_id}.pt").exists()
    monkeypatch.delenv("FREEZESWEEP_FAULT")
    resumed = run_trial(cfg)
    assert [p.step for p in resumed.eval_curve] == [p.step for p in uninterrupted.eval_curve]
    assert resumed.eval_curve == uninterrupted.eval_curve


def test_no_checkpoint_written_by_default(tiny_trial, tmp_path, monkeypatch):
    """Not even one written and deleted at the end: nothing is saved and no checkpoint is handed over."""
    saved, handed = [], []
    save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f, *args, **kwargs: (saved.append(f), save(obj, f, *args, **kwargs)))
    run_trial(dataclasses.replace(tiny_trial, checkpoint_dir=str(tmp_path)), on_checkpoint=handed.append)
    assert saved == [] and handed == [] and list(tmp_path.iterdir()) == []
    run_trial(
        dataclasses.replace(tiny_trial, checkpoint_dir=str(tmp_path), checkpoint_every_epochs=1),
        on_checkpoint=handed.append,
    )
    assert len(saved) == len(handed) == 1  # the spy sees checkpoints when there are some (2 epochs: one at epoch 1)


def test_precision_rules():
    assert resolve_precision("fp32", torch.device("cpu")).grad_scaler().is_enabled() is False
    with pytest.raises(PrecisionError, match="fp16 needs a CUDA"):
        resolve_precision("fp16", torch.device("cpu"))
    with pytest.raises(PrecisionError, match="unknown precision"):
        resolve_precision("fp8", torch.device("cpu"))


@pytest.mark.parametrize("fault,status", [("crash@1", "failed"), ("oom@1", "oom")])
def test_failures_become_rows(tiny_trial, monkeypatch, fault, status):
    monkeypatch.setenv("FREEZESWEEP_FAULT", fault)
    with pytest.raises(Exception) as info:
        run_trial(tiny_trial)
    row = failed_result(tiny_trial, info.value)
    assert row.status == status and "injected" in row.error and row.best_val_accuracy is None


def test_a_model_that_overflows_bf16_fails_with_the_precision_to_change(tiny_trial, minilm_tokenizer, tmp_path):
    """A walk-through: DeBERTa (v1) failed every trial at precision auto (bf16 here), transformers' attention
    filling its mask with float32's minimum under autocast; the row said neither its precision nor what
    runs it. (The same cell in fp32 is ok.)"""
    from transformers import DebertaConfig

    from tests.conftest import save_tiny, tiny_encoder

    config = DebertaConfig(**tiny_encoder(minilm_tokenizer))
    cell = dataclasses.replace(tiny_trial, model=save_tiny(tmp_path / "deberta", config, minilm_tokenizer), epochs=1)
    assert run_trial(cell).status == "ok"
    bf16 = dataclasses.replace(cell, precision="bf16")
    with pytest.raises(RuntimeError) as info:
        run_trial(bf16)
    row = failed_result(bf16, info.value)
    assert row.precision == "bf16"
    assert row.error.splitlines()[0].endswith(
        "without overflow (under bf16 autocast: this model's code overflows bf16; precision: fp32 runs it)"
    ), row.error


def test_unknown_config_keys_are_rejected(tiny_trial):
    data = tiny_trial.to_dict() | {"lr": 1}
    with pytest.raises(ValueError, match="unknown TrialConfig keys: lr"):
        TrialConfig.from_dict(data)
    assert TrialConfig.from_dict(tiny_trial.to_dict()) == tiny_trial


def test_trial_id_ignores_paths_but_not_protocol(tiny_trial):
    same = dataclasses.replace(tiny_trial, data_dir="/elsewhere", num_threads=2, eval_batch_size=7, checkpoint_dir="x")
    assert same.trial_id == tiny_trial.trial_id
    assert dataclasses.replace(tiny_trial, learning_rate=1e-4).trial_id != tiny_trial.trial_id
    assert dataclasses.replace(tiny_trial, precision="bf16").trial_id != tiny_trial.trial_id


def test_cpu_peak_memory_is_per_trial(tiny_trial):
    """A reused worker's earlier, larger allocation must not count as this trial's peak."""
    import numpy as np

    first = run_trial(tiny_trial).peak_mem_mb
    ballast = np.ones(400 * 2**20 // 8)  # 400 MiB touched, then freed: the process's lifetime peak grows
    del ballast
    second = run_trial(tiny_trial).peak_mem_mb
    assert second < first + 200, (first, second)


def test_step_counts_ignore_float_noise():
    from freezesweep.trials.train import steps_for

    assert 1.1 * 800 / 16 > 55 and steps_for(1.1, 800, 16) == 55  # not 56
    assert steps_for(0.5, 50, 16) == 2 and steps_for(0.5, 1000, 16) == 32


def _pairs(cfg, dataset, **changes):
    return dataclasses.replace(cfg, dataset=dataset, text_column="sentence1", text_pair_column="sentence2", **changes)


def test_a_sentence_pair_regression_trial_selects_by_pearson(tiny_trial, toy_scores):
    result = run_trial(
        _pairs(tiny_trial, toy_scores, select_metric="pearson", train_size=64, epochs=3, max_eval_examples=24)
    )
    assert result.status == "ok" and result.select_metric == "pearson" and result.n_eval == 24
    assert result.best_val_accuracy is None and result.majority_baseline is None
    assert all(p.accuracy is None and p.pearson is not None for p in result.eval_curve)
    best = max(result.eval_curve, key=lambda p: p.pearson)
    assert (result.best_step, result.best_val_score) == (best.step, best.pearson)
    assert result.best_val_metrics == {"pearson": best.pearson, "spearman": best.spearman}
    assert result.final_val_score == result.eval_curve[-1].pearson
    assert result.baseline_metrics == {"pearson": 0.0, "spearman": 0.0} and result.baseline_score == 0.0
    assert result.collapsed is False and not any(p.constant_predictions for p in result.eval_curve)
    assert result.trainable_params == result.total_params  # one output: a 32 → 1 head
    with pytest.raises(
        ValueError, match="select_metric 'accuracy' does not fit .* \\(a regression task: pearson, spearman\\)"
    ):
        run_trial(_pairs(tiny_trial, toy_scores, select_metric="accuracy"))


def test_classification_rows_hold_every_metric_and_select_by_the_chosen_one(tiny_trial, toy_pairs):
    by_mcc = run_trial(_pairs(tiny_trial, toy_pairs, select_metric="matthews", epochs=3))
    assert set(by_mcc.best_val_metrics) == {"accuracy", "f1", "matthews"}
    best = max(by_mcc.eval_curve, key=lambda p: p.matthews)
    assert by_mcc.best_val_score == best.matthews and by_mcc.best_val_accuracy == best.accuracy
    assert (
        by_mcc.baseline_metrics["matthews"] == 0.0 and by_mcc.baseline_metrics["accuracy"] == by_mcc.majority_baseline
    )
    by_accuracy = run_trial(_pairs(tiny_trial, toy_pairs, epochs=3))
    assert by_accuracy.eval_curve == by_mcc.eval_curve  # the metric picks among the same evaluations
    assert by_accuracy.best_val_score == max(p.accuracy for p in by_accuracy.eval_curve)


def test_segment_ids_reach_the_model_on_every_path(tiny_trial, toy_pairs, monkeypatch):
    """Training steps, evaluation, the evaluation cache's prefix and its check, the training cache's rows:
    every forward pass of a pair task on a BERT-like model carries the second segment's ids."""
    from freezesweep.trials import run as run_module

    seen = []
    original = run_module.initial_model

    def hooked(cfg, num_labels, worker=None):
        model = original(cfg, num_labels, worker)
        model.base_model.embeddings.register_forward_pre_hook(
            lambda module, args, kwargs: seen.append(kwargs.get("token_type_ids")), with_kwargs=True
        )
        return model

    monkeypatch.setattr(run_module, "initial_model", hooked)
    result = run_trial(_pairs(tiny_trial, toy_pairs, frozen_layers=1, train_cache=True), worker=WorkerState())
    assert result.eval_cached_layers == 1 and result.train_cached_layers == 1
    assert len(seen) > result.n_train  # one pass per train row for the training cache, and all the rest
    assert all(t is not None and int(t.max()) == 1 for t in seen)


def test_a_diverging_trial_is_diverged_never_ok(tiny_trial):
    """Before: learning rate 1e30 (train and validation loss NaN) was stored ok, its "best" accuracy
    taken at a NaN-loss evaluation."""
    import math

    result = run_trial(dataclasses.replace(tiny_trial, learning_rate=1e30))
    assert result.status == "diverged" and result.diverged_at_step >= 1
    assert all(math.isfinite(p.loss) for p in result.eval_curve)  # nothing non-finite entered the curve
    assert result.best_val_score is None or result.best_step < result.diverged_at_step
    assert run_trial(tiny_trial).diverged_at_step is None


def test_what_a_worker_holds_counts_each_array_once_and_rows_of_text_as_nothing(monkeypatch):
    """A split's rows (a tuple of arrays, a tuple of strings) are summed without a call per row; an
    array reached twice (a subset's rows are its split's) still counts once, and none on a GPU."""
    import numpy as np

    from freezesweep.trials import worker as workers
    from freezesweep.trials.tokens import Tokens
    from freezesweep.trials.worker import Lru

    calls = []
    walk = workers._bytes
    monkeypatch.setattr(workers, "_bytes", lambda *args: calls.append(1) or walk(*args))
    rows = tuple(np.zeros(n, dtype=np.int64) for n in (10, 20, 30)) + tuple(np.zeros(0) for _ in range(1000))
    worker = WorkerState(token_splits=Lru(4), tasks=Lru(4))
    worker.token_splits.put("split", Tokens(rows))
    worker.token_splits.put("subset", Tokens(rows[1:]))  # the same arrays again
    worker.tasks.put("texts", (("a", "b"), [1, 2.0, None], [torch.ones(8)]))  # 32 bytes in a tensor
    assert worker.held_mib(torch.device("cpu")) * 2**20 == 480 + 32
    assert worker.held_mib(torch.device("cuda")) == 0
    assert len(calls) < 100  # not one call per row: two walks of 2,000 rows


def test_a_trials_peak_memory_excludes_its_workers_caches(tiny_trial):
    """Before: a trial's peak counted everything its worker had kept (caches grow over a worker's life),
    so freezing appeared to cost memory. The trial's own peak leaves them out; the process's is beside it."""
    from freezesweep.trials.eval_cache import PrefixStates
    from freezesweep.trials.worker import EvalKey, PrefixKey, WorkerState

    cold = run_trial(tiny_trial, worker=WorkerState())
    warm = WorkerState()
    big = torch.ones(60_000_000)  # 229 MiB that the worker keeps, resident
    warm.eval_states.put(
        PrefixKey(EvalKey("other", "d", "r", 1, 1, "w", "fp32", "cpu"), 1),
        PrefixStates(layer=1, states=(big,), tuple_output=False),
    )
    result = run_trial(tiny_trial, worker=warm)
    assert warm.held_mib(torch.device("cpu")) >= 228
    assert result.worker_peak_mem_mb - result.peak_mem_mb >= 228  # the worker's caches, left out
    assert abs(result.peak_mem_mb - cold.peak_mem_mb) < 150  # what the cell itself costs, as on a cold worker


def test_a_checkpoint_saved_with_a_head_for_other_labels_gets_a_new_head(tiny_bert, toy_dataset, tmp_path):
    """A fine-tuned classifier (its head saved for 3 labels) on a 2-class task: the head is drawn anew from
    the trial's seed, as the Trainer's ignore_mismatched_sizes does (before: every trial failed)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from freezesweep.trials.model import built_model

    folder = tmp_path / "three-labels"
    AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=3).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(folder)
    net, drawn = built_model(str(folder), num_labels=2, model_init="pretrained")
    assert net.classifier.out_features == 2 and {"classifier.weight", "classifier.bias"} <= drawn
    cfg = TrialConfig(dataset=toy_dataset, model=str(folder), train_size=48, frozen_layers=0, seed=0, epochs=1)
    assert run_trial(dataclasses.replace(cfg, precision="fp32")).status == "ok"


def test_a_checkpoint_that_does_not_fit_its_own_config_is_refused(tiny_bert, tmp_path):
    """Only the output layer is drawn anew where shapes differ: a checkpoint whose position embeddings are
    longer than its config says would otherwise train from random ones, without a word (a review)."""
    import json
    import shutil

    from freezesweep.trials.model import ModelError, built_model

    folder = tmp_path / "edited"
    shutil.copytree(tiny_bert, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    with pytest.raises(ModelError, match="position_embeddings.weight have other shapes than its config"):
        built_model(str(folder), num_labels=2, model_init="pretrained")
