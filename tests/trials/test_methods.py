"""LoRA and the probe as methods of a trial: exact parameter counts, where adapters go, the probe's
determinism and its blindness to validation labels."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModelForSequenceClassification, BertConfig, RobertaConfig

from freezesweep.trials.config import TrialConfig
from freezesweep.trials.lora import LoraError, apply_lora, attention_projections, resolve_targets
from freezesweep.trials.probe import ProbeError, resolve_pooling, select_and_fit
from freezesweep.trials.run import check_method, run_trial
from freezesweep.trials.worker import process_worker

H, C = 32, 2  # hidden size and classes of the skeletons below


def _skeleton(config):
    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_config(config)


ARCHITECTURES = {
    # BERT: a pooler (h·h + h) under a linear classifier (h·c + c)
    "bert": (
        BertConfig(
            vocab_size=100,
            hidden_size=H,
            num_hidden_layers=3,
            num_attention_heads=2,
            intermediate_size=64,
            num_labels=C,
        ),
        H * H + H + H * C + C,
    ),
    # RoBERTa: no pooler; the head is dense (h·h + h) then out_proj (h·c + c)
    "roberta": (
        RobertaConfig(
            vocab_size=100,
            hidden_size=H,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=40,
            num_labels=C,
        ),
        H * H + H + H * C + C,
    ),
}


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("rank", [1, 4])
def test_lora_trainable_parameters_are_exact(arch, rank):
    """Each adapted h→h projection adds A (r·h) and B (h·r); the head trains in full; nothing else trains."""
    config, head = ARCHITECTURES[arch]
    model = _skeleton(config)
    report, targets = apply_lora(model, rank=rank, alpha=16, dropout=0.1, targets=None)
    assert targets == ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense")
    expected = config.num_hidden_layers * len(targets) * rank * (H + H) + head
    assert report.trainable_params == expected
    assert report.total_params == sum(p.numel() for p in _skeleton(config).parameters()) + expected - head


def test_lora_named_targets_and_their_count():
    config, head = ARCHITECTURES["bert"]
    model = _skeleton(config)
    report, targets = apply_lora(model, rank=2, alpha=4, dropout=0.0, targets=("query", "value"))
    assert targets == ("attention.self.query", "attention.self.value")
    assert report.trainable_params == config.num_hidden_layers * 2 * 2 * (H + H) + head
    adapted = {n.rsplit(".lora_A", 1)[0] for n, _ in model.named_parameters() if ".lora_A" in n}
    assert len(adapted) == 2 * config.num_hidden_layers and all("encoder.layer." in n for n in adapted)


def test_lora_unknown_target_names_what_exists():
    model = _skeleton(ARCHITECTURES["bert"][0])
    with pytest.raises(LoraError, match=r"'qkv_proj' matches no Linear.*attention\.self\.query"):
        resolve_targets(model, ("query", "qkv_proj"))
    assert attention_projections(model)[0] == "attention.self.query"


def test_lora_starts_as_the_pretrained_model():
    """B starts at zero: the adapted model computes what the model did before adapters were added."""
    config, _ = ARCHITECTURES["bert"]
    model = _skeleton(config).eval()
    ids = torch.randint(0, 100, (3, 7))
    before = model(input_ids=ids).logits
    apply_lora(model, rank=4, alpha=16, dropout=0.1, targets=None)
    assert torch.equal(model.eval()(input_ids=ids).logits, before)


@pytest.fixture
def lora_trial(tiny_trial):
    return dataclasses.replace(
        tiny_trial, method="lora", frozen_layers=None, lora_rank=4, lora_alpha=8.0, lora_dropout=0.0, learning_rate=1e-2
    )


def test_lora_gradients_reach_adapters_and_head_only():
    config, head = ARCHITECTURES["bert"]
    model = _skeleton(config)
    apply_lora(model, rank=2, alpha=4, dropout=0.0, targets=None)
    model(input_ids=torch.randint(0, 100, (2, 5))).logits.sum().backward()
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert all(".lora_" in n or n.startswith(("classifier.", "bert.pooler.")) for n in trained)
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    # B starts at zero, so at the first step only B and the head get a gradient (A's is B^T · ...)
    assert with_grad == {n for n in trained if ".lora_A." not in n}
    assert all(p.grad is None for n, p in model.named_parameters() if n not in trained)


def test_lora_trial_runs_and_records_its_targets(lora_trial):
    result = run_trial(lora_trial)
    assert result.status == "ok" and result.lora_targets[0] == "attention.self.query"
    assert 0 < result.trainable_params < result.total_params
    assert result.eval_cached_layers is None  # every layer is adapted: nothing to cache
    assert len(result.eval_curve) == 3 and result.train_loss_curve


@pytest.fixture
def probe_trial(tiny_trial):
    return dataclasses.replace(
        tiny_trial, method="probe", frozen_layers=None, probe_pooling="auto", probe_folds=4, probe_cs=6
    )


def test_probe_is_deterministic_and_recorded(probe_trial):
    first = run_trial(probe_trial)
    process_worker().clear()  # features recomputed from scratch: the same features, the same choice
    second = run_trial(probe_trial)
    assert first.status == "ok" and first.eval_curve == second.eval_curve and first.probe_c == second.probe_c
    assert first.probe_c in np.logspace(-4, 4, 6) and first.probe_pooling == "mean"
    assert first.trainable_params == 32 + 1  # one logistic output over 32 features, and its intercept
    assert first.eval_cached_layers == first.train_cached_layers == 2  # features after the last layer, cached


def test_probe_never_sees_validation_labels(probe_trial, toy_dataset, tmp_path):
    """Flipping every validation label changes nothing in the selection: the same C and the same
    predictions, so accuracy becomes exactly 1 − accuracy."""
    folder = tmp_path / "flipped"
    folder.mkdir()
    pd.read_csv(f"{toy_dataset}/train.csv").to_csv(folder / "train.csv", index=False)
    validation = pd.read_csv(f"{toy_dataset}/validation.csv")
    validation.assign(label=1 - validation["label"]).to_csv(folder / "validation.csv", index=False)
    honest = run_trial(probe_trial)
    flipped = run_trial(dataclasses.replace(probe_trial, dataset=str(folder)))
    assert flipped.probe_c == honest.probe_c
    assert flipped.best_val_accuracy == pytest.approx(1 - honest.best_val_accuracy)


def test_probe_selection_uses_only_the_rows_it_is_given():
    rng = np.random.default_rng(0)
    features, labels = rng.normal(size=(40, 5)), np.repeat([0, 1], 20)
    features[:, 0] += 2 * labels  # one informative feature
    fit = select_and_fit(features, labels, regression=False, metric="accuracy", folds=5, cs=5, seed=0)
    again = select_and_fit(features, labels, regression=False, metric="accuracy", folds=5, cs=5, seed=0)
    assert fit.c == again.c and np.array_equal(fit.predictor.predict(features), again.predictor.predict(features))
    with pytest.raises(ProbeError, match="at least 2 rows of each"):
        select_and_fit(features[:21], labels[:21], regression=False, metric="accuracy", folds=5, cs=5, seed=0)


def test_a_regression_probe_on_collinear_features_is_quiet():
    """A walk-through: a regression probe printed scipy's "ill-conditioned matrix" for each weak penalty
    (features of a small model's states: collinear, of a lower rank than their width)."""
    import warnings

    rng = np.random.default_rng(0)
    features = (rng.standard_normal((60, 4)) @ rng.standard_normal((4, 40))).astype(np.float32)
    labels = features[:, 0] * 2.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the fit
        fit = select_and_fit(features, labels, regression=True, metric="pearson", folds=3, cs=10, seed=0)
    assert np.corrcoef(fit.predictor.predict(features), labels)[0, 1] > 0.99  # quiet, and still fitted: a linear target


def test_probe_pooling_follows_the_models_own(tmp_path):
    assert resolve_pooling("auto", str(tmp_path)) == "mean"  # no sentence-transformers config: mean
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(
        '{"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}'
    )
    assert resolve_pooling("auto", str(tmp_path)) == "first"
    assert resolve_pooling("mean", str(tmp_path)) == "mean"


def test_a_cell_carries_its_own_methods_fields_only(tiny_trial):
    with pytest.raises(ValueError, match="a lora cell needs lora_rank"):
        check_method(dataclasses.replace(tiny_trial, method="lora", frozen_layers=None))
    with pytest.raises(ValueError, match="takes no frozen_layers"):
        check_method(dataclasses.replace(tiny_trial, method="probe", probe_pooling="mean", probe_folds=5, probe_cs=3))
    with pytest.raises(ValueError, match="unknown method 'adapter'"):
        check_method(dataclasses.replace(tiny_trial, method="adapter"))


def test_method_fields_never_rekey_freeze_cells(tiny_trial):
    cfg = dataclasses.replace(tiny_trial, precision="fp32")
    assert TrialConfig.from_dict(cfg.to_dict()).trial_id == cfg.trial_id
    lora = dataclasses.replace(
        cfg, method="lora", frozen_layers=None, lora_rank=8, lora_alpha=16, lora_dropout=0.1, lora_targets=["query"]
    )
    assert TrialConfig.from_dict(lora.to_dict()) == lora  # a list from JSON comes back a tuple
    assert lora.trial_id != dataclasses.replace(lora, lora_rank=4).trial_id != cfg.trial_id
    assert lora.identity()["lora_alpha"] == 16.0 and isinstance(lora.identity()["lora_alpha"], float)
