"""The structure trace of trials/freezing.py on the families it used to refuse or misplace: tiny random
models built here from a config (hidden 32, 2 layers, a small vocabulary)."""

import logging

import pytest
import torch
import transformers as tf
from torch import nn

from freezesweep.trials import freezing
from freezesweep.trials.freezing import FreezingError, find_encoder_parts, freeze, prefix_names, structure_problems
from tests.families import FAMILIES

V, H, L = 100, 32, 2
ENCODER = dict(vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=2, intermediate_size=64)
DECODER = dict(ENCODER, num_key_value_heads=1, head_dim=16, pad_token_id=0)
EXPERTS = dict(num_local_experts=2, num_experts_per_tok=1)

# Each of these crashed the trace on the meta device: transformers' mask code asks whether a mask
# holds padding (padding_mask.all()), the default experts' grouped matmul wants bf16, XLNet builds a
# weight on the CPU, I-BERT's quantizer checks its range in training mode, CANINE names no input
# embeddings.
TRACED = {
    "roformer": lambda: tf.RoFormerConfig(**ENCODER),
    "convbert": lambda: tf.ConvBertConfig(**ENCODER, embedding_size=H),
    "rembert": lambda: tf.RemBertConfig(**ENCODER, input_embedding_size=16, output_embedding_size=16),
    "megatron-bert": lambda: tf.MegatronBertConfig(**ENCODER),
    "nystromformer": lambda: tf.NystromformerConfig(**ENCODER),
    "ibert": lambda: tf.IBertConfig(**ENCODER),
    "luke": lambda: tf.LukeConfig(**ENCODER, entity_vocab_size=10, entity_emb_size=16),
    "big_bird": lambda: tf.BigBirdConfig(**ENCODER, attention_type="original_full"),
    "canine": lambda: tf.CanineConfig(
        **{k: v for k, v in ENCODER.items() if k != "vocab_size"}, num_hash_buckets=8, num_hash_functions=2
    ),
    "biogpt": lambda: tf.BioGptConfig(**ENCODER),
    "xlnet": lambda: tf.XLNetConfig(vocab_size=V, d_model=H, n_layer=L, n_head=2, d_inner=64),
    "mixtral": lambda: tf.MixtralConfig(**DECODER, **EXPERTS),
    "qwen2_moe": lambda: tf.Qwen2MoeConfig(
        **DECODER, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32, shared_expert_intermediate_size=32
    ),
    "qwen3_moe": lambda: tf.Qwen3MoeConfig(**DECODER, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32),
    "phimoe": lambda: tf.PhimoeConfig(**DECODER, **EXPERTS),
    "gpt_oss": lambda: tf.GptOssConfig(**DECODER, **EXPERTS),
}


def _model(config):
    return tf.AutoModelForSequenceClassification.from_config(config)


def _trainable(params) -> set[bool]:
    return {p.requires_grad for p in params}


@pytest.mark.parametrize("family", sorted(TRACED))
def test_families_the_meta_trace_crashed_on_are_traced_and_frozen(family):
    model = _model(TRACED[family]())
    assert structure_problems(model, [-1, 1], needs_layers=True) == []
    parts = find_encoder_parts(model)
    embeddings = list(model.get_input_embeddings().parameters()) if family != "canine" else list(parts.bottom)
    head = [p for n, p in model.named_parameters() if not n.startswith(model.base_model_prefix)]
    freeze(model, 1)
    assert _trainable(embeddings) == _trainable(parts.layers[0].parameters()) == {False}
    assert _trainable(parts.layers[1].parameters()) == _trainable(head) == {True}
    freeze(model, -1)
    assert _trainable(embeddings) == {False} and _trainable(parts.layers.parameters()) == {True}


@pytest.mark.parametrize(
    "config",
    [
        lambda: tf.LongformerConfig(**ENCODER, attention_window=4),  # asks whether any token attends globally
        lambda: tf.JetMoeConfig(**DECODER, **EXPERTS, kv_channels=16),  # routes by the experts' token counts
    ],
)
def test_a_family_whose_skeleton_cannot_run_is_refused_in_words(config):
    with torch.device("meta"):
        model = _model(config())
    [problem] = structure_problems(model, [1])
    assert problem.startswith(f"cannot trace the structure of {type(model).__name__}") and "frozen_layers: 0" in problem
    assert structure_problems(model, [0]) == []


def test_a_shape_the_fake_run_cannot_compute_is_one_error_and_no_logged_traceback():
    class Broken(nn.Module):  # its forward broadcasts two shapes that do not fit
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])

        def forward(self, input_ids):
            return torch.ones(2, 3, device=input_ids.device) * torch.ones(4, device=input_ids.device)

    logged: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = logged.append  # type: ignore[method-assign]
    torch_log = logging.getLogger("torch._subclasses.fake_tensor")  # it writes to stderr, not to the root
    torch_log.addHandler(handler)
    try:
        with pytest.raises(FreezingError, match="cannot trace the structure of Broken"):
            freezing._trace(Broken(), "layers")
    finally:
        torch_log.removeHandler(handler)
    assert logged == []


@pytest.mark.skipif(not hasattr(tf, "ModernBertDecoderConfig"), reason="no ModernBERT-decoder in this transformers")
def test_a_config_whose_pad_id_cannot_be_none_is_traced():
    """ModernBERT-decoder's config is a strict dataclass: setting pad_token_id to None raised."""
    config = tf.ModernBertDecoderConfig(**ENCODER, pad_token_id=0, global_attn_every_n_layers=2, local_attention=16)
    model = _model(config)
    assert structure_problems(model, [-1], needs_layers=True) == []
    freeze(model, -1)
    assert _trainable(model.get_input_embeddings().parameters()) == {False}


def _deberta_with_conv():
    return _model(
        tf.DebertaV2Config(
            **{**FAMILIES["deberta-v2"].options, **ENCODER},
            conv_kernel_size=3,  # encoder.conv runs after layer 0, inside the layer loop
        )
    )


@pytest.mark.parametrize("k", [-1, 0, 1, 2])
def test_a_module_run_between_two_layers_freezes_with_the_layer_before_it(k):
    model = _deberta_with_conv()
    encoder = model.deberta.encoder

    def count(*modules):
        return sum(p.numel() for m in modules for p in m.parameters())

    bottom = count(model.deberta.embeddings, encoder.rel_embeddings, encoder.LayerNorm)
    conv, total = count(encoder.conv), count(model)
    frozen = {-1: bottom, 0: 0}.get(k, bottom + count(*encoder.layer[:k]) + conv)
    report = freeze(model, k)
    assert (report.trainable_params, report.total_params) == (total - frozen, total)
    conv_names = {f"deberta.encoder.conv.{n}" for n, _ in encoder.conv.named_parameters()}
    assert conv_names <= prefix_names(model, k) if k >= 1 else not conv_names & prefix_names(model, k)


def test_lora_keeps_a_module_run_between_layers_frozen():
    """Before: the conv, no longer frozen with the embeddings, was trained in full under LoRA (the encoder
    was the bottom and the layers only)."""
    from freezesweep.trials.lora import apply_lora

    model = _deberta_with_conv()
    apply_lora(model, rank=2, alpha=4.0, dropout=0.0, targets=None)
    assert _trainable(model.deberta.encoder.conv.parameters()) == {False}
    assert _trainable(model.classifier.parameters()) == {True}


def test_a_shared_inner_layer_is_refused_with_what_was_seen():
    """ALBERT with one group of two inner layers: its list has num_hidden_layers modules, but the group
    runs at every depth, so each inner layer ran twice."""
    with torch.device("meta"):
        model = _model(tf.AlbertConfig(**ENCODER, embedding_size=16, num_hidden_groups=1, inner_group_num=2))
    [problem] = structure_problems(model, [1])
    assert "layer 0 of" in problem and "ran 2 times in one forward pass" in problem and "frozen_layers: 0" in problem


def test_albert_with_a_group_per_depth_is_frozen_layer_by_layer():
    model = _model(tf.AlbertConfig(**ENCODER, embedding_size=16, num_hidden_groups=L))
    groups = model.albert.encoder.albert_layer_groups
    assert find_encoder_parts(model).layers is groups
    freeze(model, 1)
    assert _trainable(model.albert.encoder.embedding_hidden_mapping_in.parameters()) == {False}
    assert _trainable(groups[0].parameters()) == {False} and _trainable(groups[1].parameters()) == {True}


@pytest.mark.parametrize("blocks", [[1, 1], [2, 2]])
def test_layers_in_nested_lists_are_refused_as_nested_not_as_shared(blocks):
    """Funnel's blocks: [1, 1] was taken as the stack (a list of lists, whose hooks never fire), [2, 2]
    was refused as ALBERT's shared layer."""
    config = tf.FunnelConfig(vocab_size=V, block_sizes=blocks, d_model=H, n_head=2, d_head=16, d_inner=64)
    with torch.device("meta"):
        model = _model(config)
    [problem] = structure_problems(model, [1])
    assert "nested lists (encoder.blocks: 2 lists of layers" in problem and "ALBERT" not in problem


def test_albert_s_one_shared_layer_is_still_refused_as_shared():
    with torch.device("meta"):
        model = _model(tf.AlbertConfig(**dict(ENCODER, num_hidden_layers=3), embedding_size=16))
    [problem] = structure_problems(model, [1])
    assert "one layer shared by every depth" in problem


class _Toy(nn.Module):
    """Embeddings, then two layers run in ``order``."""

    def __init__(self, order):
        super().__init__()
        self.embed, self.order = nn.Embedding(10, 4), order
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids):
        hidden = self.embed(input_ids)
        for index in self.order:
            hidden = self.layers[index](hidden)
        return hidden


@pytest.mark.parametrize(
    "order, said", [((1, 0), "ran out of their order"), ((0,), "layer 1 of _Toy's layers was not seen running")]
)
def test_layers_that_do_not_run_once_in_order_name_no_prefix(order, said):
    assert freezing._trace(_Toy((0, 1)), "layers").bottom_modules == ("embed",)
    with pytest.raises(FreezingError, match=said):
        freezing._trace(_Toy(order), "layers")


# The bottom of the families people fine-tune, named by hand (as tests/families.py does).
BOTTOMS = {
    "gpt2": (lambda: tf.GPT2Config(vocab_size=V, n_embd=H, n_layer=L, n_head=2), ("wte", "wpe")),
    "llama": (lambda: tf.LlamaConfig(**DECODER), ("embed_tokens",)),
    "qwen2": (lambda: tf.Qwen2Config(**DECODER), ("embed_tokens",)),
    "deberta-v2": (lambda: tf.DebertaV2Config(**ENCODER), ("embeddings",)),
    "deberta-v2-relative": (
        lambda: tf.DebertaV2Config(**ENCODER, relative_attention=True, norm_rel_ebd="layer_norm", position_buckets=16),
        ("embeddings", "encoder.rel_embeddings", "encoder.LayerNorm"),
    ),
}


@pytest.mark.parametrize("family", sorted(BOTTOMS))
def test_the_bottom_of_common_families_is_the_hand_named_one(family):
    config, named = BOTTOMS[family]
    with torch.device("meta"):
        model = _model(config())
    base = model.base_model
    parts = find_encoder_parts(model)
    assert {id(p) for p in parts.bottom} == {id(p) for n in named for p in base.get_submodule(n).parameters()}
    assert parts.between == ()


def test_the_trace_runs_once_per_class_and_config():
    freezing._traced_structure.cache_clear()
    model = _model(tf.BertConfig(**ENCODER))
    find_encoder_parts(model), prefix_names(model, 1), freeze(model, 1)
    info = freezing._traced_structure.cache_info()
    assert (info.misses, info.hits) == (1, 2)
