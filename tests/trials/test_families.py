"""The families people fine-tune (tests/families.py: tiny random models from configs): every
frozen_layers value and a LoRA cell run to an ``ok`` row whose trainable parameters equal a hand count
from the model's own modules; with every optimisation on, the first training step's loss and the first
evaluation equal the plain model's (no cache, no packing, no narrowing); ALBERT and BART are refused
before any trial, with the reason."""

from __future__ import annotations

import dataclasses
import functools
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from tests.families import FAMILIES, LAYERS, REFUSED, save_family
from freezesweep.trials.config import TrialConfig
from freezesweep.trials.model import build_model, set_padding
from freezesweep.trials.run import run_trial
from freezesweep.trials.tokens import padding_id
from freezesweep.trials.worker import WorkerState

CELLS = {"k=-1": -1, "k=0": 0, "k=mid": LAYERS // 2 + 1, "k=all": LAYERS, "lora": None}
RANK = 4


@pytest.fixture(scope="module")
def folders(tmp_path_factory, minilm_tokenizer):
    """family name → its saved tiny model, built on first use."""
    root = tmp_path_factory.mktemp("families")
    return functools.cache(lambda name: save_family(root / name, {**FAMILIES, **REFUSED}[name], minilm_tokenizer))


@pytest.fixture(scope="module")
def trial(folders, toy_dataset):
    """(family, cell, plain) → its result, run once per module (one worker: the caches as in a sweep).
    ``plain``: no evaluation cache, no narrowing, no packing, no training cache; else all of them on."""
    worker = WorkerState()

    @functools.cache
    def run(name: str, cell: str, plain: bool = False):
        k = CELLS[cell]
        method = (
            dict(method="lora", lora_rank=RANK, lora_alpha=8.0, lora_dropout=0.0, frozen_layers=None)
            if k is None
            else dict(frozen_layers=k)
        )
        switches = dict(
            eval_cache=not plain, narrow_last_layer=not plain, pack_training=not plain, train_cache=not plain
        )
        # 2 steps, an evaluation after each: the first step's loss is the first point of the train loss curve
        cfg = TrialConfig(
            dataset=toy_dataset,
            model=folders(name),
            train_size=16,
            seed=0,
            epochs=1,
            batch_size=8,
            eval_every_epochs=0.5,
            learning_rate=1e-3,
            max_eval_examples=16,
            max_seq_length=32,
            num_threads=1,
            precision="fp32",
            **method,
            **switches,
        )
        return run_trial(cfg, worker=worker)

    return run


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _lora_count(layers: nn.ModuleList) -> int:
    """r·(in + out) for every projection under a layer's attention block (Conv1D stores (in, out))."""
    total = 0
    for layer in layers:
        for name, module in layer.named_modules():
            in_attention = any("attn" in part or "attention" in part for part in name.split(".")[:-1])
            if (
                in_attention
                and hasattr(module, "weight")
                and module.weight.dim() == 2
                and not isinstance(module, nn.Embedding)
            ):
                total += RANK * sum(module.weight.shape)
    return total


def hand_count(folder: str, family, cell: str) -> int:
    """Trainable parameters from the family's own modules, named by hand in tests/families.py."""
    model = build_model(folder, 2, "pretrained")
    base = model.base_model
    layers = base.get_submodule(family.layers)
    embeddings = sum(_numel(base.get_submodule(name)) for name in family.embeddings)
    total, k = _numel(model), CELLS[cell]
    if k is None:  # LoRA: the head (everything outside the embeddings and the layers) and the adapters
        return total - embeddings - _numel(layers) + _lora_count(layers)
    frozen = 0 if k == 0 else embeddings + sum(_numel(layer) for layer in layers[: max(k, 0)])
    return total - frozen


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_cell_of_every_family_is_an_ok_row_with_the_hand_counted_trainable_parameters(name, trial, folders):
    for cell in CELLS:
        result = trial(name, cell)
        assert result.status == "ok", (cell, result.error)
        assert result.trainable_params == hand_count(folders(name), FAMILIES[name], cell), cell
    cached = trial(name, "k=mid")
    # DeBERTa and ModernBERT too: the injected layer stands in for theirs
    assert {"eval_cache", "train_cache"} <= set(cached.optimisations)
    assert cached.eval_cached_layers == CELLS["k=mid"]


@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("cell", ["k=-1", "k=mid"])
def test_with_every_optimisation_on_the_first_step_and_evaluation_are_the_plain_model_s(name, cell, trial):
    optimised, plain = trial(name, cell), trial(name, cell, plain=True)
    assert plain.optimisations == ()
    assert optimised.train_loss_curve[0][0] == plain.train_loss_curve[0][0] == 1
    assert optimised.train_loss_curve[0][1] == pytest.approx(plain.train_loss_curve[0][1], rel=1e-5, abs=1e-6)
    first, reference = optimised.eval_curve[0], plain.eval_curve[0]
    assert first.loss == pytest.approx(reference.loss, rel=1e-5, abs=1e-6)
    assert first.accuracy == reference.accuracy and first.f1 == pytest.approx(reference.f1)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_albert_and_bart_are_one_clear_error_before_any_trial(name, folders, write_spec):
    from freezesweep.orchestrator.checks import load_spec
    from freezesweep.orchestrator.spec import SpecError

    reason = {"albert": "one layer shared by every depth", "bart": "encoder-decoder model"}[name]
    with pytest.raises(SpecError) as info:
        load_spec(write_spec(model=folders(name), frozen_layers=[-1, 0, 2]))
    problems = [p for p in info.value.problems if folders(name) in p]
    assert len(problems) == 1 and reason in problems[0] and "frozen_layers: 0" in problems[0], info.value.problems
    load_spec(write_spec(model=folders(name), frozen_layers=[0]))  # full fine-tuning needs no layer stack


def test_a_model_whose_structure_is_found_passes_validation_and_all_is_checked(folders, write_spec):
    from freezesweep.orchestrator.checks import load_spec

    spec = load_spec(
        write_spec(
            model=folders("gpt2"), frozen_layers=[-1, 0, 2, "all"], methods=["freeze", "lora", "probe"], lora_ranks=[4]
        )
    )
    assert spec.models() == [folders("gpt2")]


def test_the_pad_id_is_the_tokenizer_s_else_its_eos():
    assert padding_id(SimpleNamespace(pad_token_id=3, eos_token_id=7)) == 3
    assert padding_id(SimpleNamespace(pad_token_id=None, eos_token_id=7)) == 7
    assert padding_id(SimpleNamespace(pad_token_id=None, eos_token_id=None)) == 0


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_a_decoder_s_head_reads_each_row_s_last_real_token(name, folders):
    """A right-padded row gives the logits of the row alone: the head skips the padding."""
    model = build_model(folders(name), 2, "pretrained")
    model.config.pad_token_id = None  # as most decoder checkpoints ship: the trial tells it the batches' pad id
    model = set_padding(model, pad_id=0).eval()
    short, long = torch.tensor([[5, 6, 7]]), torch.tensor([[5, 6, 7, 8, 9, 10]])
    padded = torch.tensor([[5, 6, 7, 0, 0, 0], [5, 6, 7, 8, 9, 10]])
    mask = (torch.arange(6) < torch.tensor([[3], [6]])).long()
    with torch.no_grad():
        together = model(input_ids=padded, attention_mask=mask).logits
        alone = torch.cat([model(input_ids=short).logits, model(input_ids=long).logits])
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert"])
def test_the_probe_pools_a_decoder_s_last_real_token(name, folders, toy_dataset):
    cfg = TrialConfig(
        dataset=toy_dataset,
        model=folders(name),
        train_size=16,
        frozen_layers=None,
        method="probe",
        probe_pooling="auto",
        probe_folds=2,
        probe_cs=2,
        max_eval_examples=16,
        max_seq_length=32,
        num_threads=1,
        precision="fp32",
    )
    result = run_trial(cfg, worker=WorkerState())
    assert result.status == "ok" and result.probe_pooling == ("mean" if name == "bert" else "last")


def test_last_pooling_reads_each_row_s_last_real_token():
    from freezesweep.trials.probe import pooled

    states = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(2, 3, 2)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert pooled(states, mask, "last").tolist() == [states[0, 1].tolist(), states[1, 2].tolist()]
    assert pooled(states[0, :2], None, "last").tolist() == [states[0, 1].tolist()]  # one unpadded row


def _raises(*args, **kwargs):
    raise RuntimeError("this model's layer loop cannot take the stand-in")


@pytest.mark.parametrize(
    "broken, absent",
    [
        ("freezesweep.trials.eval_cache._Injector.forward", "eval_cache"),
        ("freezesweep.trials.train_cache._feeds_exactly", "train_cache"),
        ("freezesweep.trials.first_token.narrowing_agrees", "narrowed_last_layer"),
    ],
)
def test_an_optimisation_that_raises_steps_aside_and_the_row_is_ok(broken, absent, tiny_trial, monkeypatch, worker):
    cfg = dataclasses.replace(tiny_trial, frozen_layers=1, train_cache=True, epochs=1)
    assert absent in run_trial(cfg, worker=WorkerState()).optimisations  # it applies to this model
    monkeypatch.setattr(broken, _raises)
    result = run_trial(cfg, worker=worker)
    assert result.status == "ok" and absent not in result.optimisations and result.optimisations


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_full_fine_tuning_of_a_family_without_one_layer_stack_runs(name, folders, tiny_trial):
    """k = 0 needs no layer stack (validation lets it through): its trial is an ok row, its weights drawn
    or read whatever the stack (a regression: the check for a checkpoint's missing prefix weights raised)."""
    import dataclasses

    from freezesweep.trials.run import run_trial

    result = run_trial(dataclasses.replace(tiny_trial, model=folders(name), frozen_layers=0, epochs=1))
    assert result.status == "ok", result.error
