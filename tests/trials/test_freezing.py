import pytest
import torch
import transformers as tf
from torch import nn

from freezesweep.trials.freezing import FreezingError, find_encoder_parts, freeze

V, H, INTER, P, L = 100, 16, 32, 64, 3


def _bert_layer(h, i):  # q,k,v,o + LN, intermediate, output + LN
    return 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h


def _counts_bert_like(model_type, k):
    """Independent arithmetic from the config, not from the modules, for BERT and RoBERTa."""
    emb = (V + P + 2) * H + 2 * H  # word + position + token type (2) + LayerNorm
    layer = _bert_layer(H, INTER)
    head = (H * H + H) + (H * 2 + 2)  # BERT: pooler + classifier; RoBERTa: dense + out_proj
    total = emb + L * layer + head
    frozen = 0 if k == 0 else emb + max(k, 0) * layer
    return total - frozen, total


def _model(kind):
    common = dict(vocab_size=V, num_hidden_layers=L, num_attention_heads=2, max_position_embeddings=P, num_labels=2)
    config = {
        "bert": lambda: tf.BertConfig(hidden_size=H, intermediate_size=INTER, type_vocab_size=2, **common),
        "roberta": lambda: tf.RobertaConfig(hidden_size=H, intermediate_size=INTER, type_vocab_size=2, **common),
        "distilbert": lambda: tf.DistilBertConfig(
            vocab_size=V, dim=H, n_layers=L, n_heads=2, hidden_dim=INTER, max_position_embeddings=P, num_labels=2
        ),
        "electra": lambda: tf.ElectraConfig(embedding_size=8, hidden_size=H, intermediate_size=INTER, **common),
        "mpnet": lambda: tf.MPNetConfig(hidden_size=H, intermediate_size=INTER, **common),
    }[kind]()
    return tf.AutoModelForSequenceClassification.from_config(config)


@pytest.mark.parametrize("kind", ["bert", "roberta"])
@pytest.mark.parametrize("k", list(range(-1, L + 1)))
def test_trainable_counts_exact(kind, k):
    model = _model(kind)
    report = freeze(model, k)
    assert (report.trainable_params, report.total_params) == _counts_bert_like(kind, k)


@pytest.mark.parametrize("kind", ["distilbert", "electra", "mpnet"])
@pytest.mark.parametrize("k", list(range(-1, L + 1)))
def test_semantics_other_architectures(kind, k):
    model = _model(kind)
    freeze(model, k)
    base = model.base_model
    layers = find_encoder_parts(model).layers
    assert all(p.requires_grad == (k == 0) for p in base.embeddings.parameters())
    for i, layer in enumerate(layers):
        assert all(p.requires_grad == (i >= max(k, 0)) for p in layer.parameters()), (i, k)
    head = [p for n, p in model.named_parameters() if not n.startswith(model.base_model_prefix)]
    assert head and all(p.requires_grad for p in head)  # the head always trains
    if kind == "mpnet":  # shared relative bias sits with the frozen bottom
        assert base.encoder.relative_attention_bias.weight.requires_grad == (k == 0)
    if kind == "electra":
        assert base.embeddings_project.weight.requires_grad == (k == 0)


def test_refreezing_resets_previous_state():
    model = _model("bert")
    freeze(model, L)
    assert freeze(model, 0).trainable_params == freeze(model, 0).total_params


@pytest.mark.parametrize("k", [L + 1, -2])
def test_out_of_range_k_is_an_error(k):
    with pytest.raises(FreezingError, match="out of range"):
        freeze(_model("bert"), k)


def test_unknown_structure_is_an_error():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.config = type("C", (), {"num_hidden_layers": 2})()
            self.a = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
            self.b = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])

    with pytest.raises(FreezingError, match="cannot find the encoder layers"):
        freeze(Odd(), 1)


def test_frozen_prefix_gets_no_gradient():
    model = _model("bert")
    freeze(model, 2)
    out = model(input_ids=torch.randint(0, V, (2, 5)), labels=torch.tensor([0, 1]))
    out.loss.backward()
    layers = find_encoder_parts(model).layers
    assert all(p.grad is None for p in layers[1].parameters())
    assert all(p.grad is not None for p in layers[2].parameters())


@pytest.mark.parametrize("k", list(range(-1, 7)))
def test_real_minilm_counts_exact(k):
    """The pretrained MiniLM-L6 (BERT: V=30522, H=384, INTER=1536, 512 positions, 6 layers)."""
    from freezesweep.trials.model import build_model

    model = build_model("sentence-transformers/all-MiniLM-L6-v2", 2, "pretrained")
    v, h, i, p, layers = 30522, 384, 1536, 512, 6
    emb = (v + p + 2) * h + 2 * h
    layer = _bert_layer(h, i)
    head = (h * h + h) + (h * 2 + 2)
    total = emb + layers * layer + head
    assert total == 22713986
    frozen = 0 if k == 0 else emb + max(k, 0) * layer
    report = freeze(model, k)
    assert (report.trainable_params, report.total_params) == (total - frozen, total)
