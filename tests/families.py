"""Tiny random models of the families people fine-tune, built from a config with the MiniLM tokenizer
(3 layers, hidden 32, no dropout: a cached or packed path must then give the plain model's numbers
to float rounding, in training too). Each family names, by hand, where its layer stack and its
embeddings are: the independent count the tests check freezing against."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

LAYERS, HIDDEN = 3, 32


@dataclass(frozen=True)
class Family:
    model_type: str
    options: dict
    layers: str  # the layer stack, inside the base model
    embeddings: tuple[str, ...]  # what freezes with the embeddings, inside the base model


_ENCODER = dict(
    hidden_size=HIDDEN,
    num_hidden_layers=LAYERS,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=128,
)
_DECODER = dict(_ENCODER, num_key_value_heads=1)

FAMILIES = {
    "bert": Family("bert", _ENCODER, "encoder.layer", ("embeddings",)),
    "roberta": Family("roberta", dict(_ENCODER, max_position_embeddings=140), "encoder.layer", ("embeddings",)),
    "xlm-roberta": Family("xlm-roberta", dict(_ENCODER, max_position_embeddings=140), "encoder.layer", ("embeddings",)),
    "electra": Family(
        "electra", dict(_ENCODER, embedding_size=16), "encoder.layer", ("embeddings", "embeddings_project")
    ),
    "distilbert": Family(
        "distilbert",
        dict(dim=HIDDEN, n_layers=LAYERS, n_heads=2, hidden_dim=64, max_position_embeddings=128),
        "transformer.layer",
        ("embeddings",),
    ),
    "mpnet": Family("mpnet", _ENCODER, "encoder.layer", ("embeddings", "encoder.relative_attention_bias")),
    "deberta-v2": Family(
        "deberta-v2",
        dict(
            _ENCODER,
            relative_attention=True,
            pos_att_type=["p2c", "c2p"],
            position_biased_input=False,
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            max_relative_positions=-1,
            position_buckets=16,
        ),
        "encoder.layer",
        ("embeddings", "encoder.rel_embeddings", "encoder.LayerNorm"),
    ),
    "modernbert": Family(
        "modernbert", dict(_ENCODER, global_attn_every_n_layers=2, local_attention=16), "layers", ("embeddings",)
    ),
    "gpt2": Family("gpt2", dict(n_embd=HIDDEN, n_layer=LAYERS, n_head=2, n_positions=128), "h", ("wte", "wpe")),
    "opt": Family(
        "opt",
        dict(
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=2,
            ffn_dim=64,
            max_position_embeddings=128,
            word_embed_proj_dim=HIDDEN,
        ),
        "decoder.layers",
        ("decoder.embed_tokens", "decoder.embed_positions"),
    ),
    "llama": Family("llama", _DECODER, "layers", ("embed_tokens",)),
    "qwen2": Family("qwen2", _DECODER, "layers", ("embed_tokens",)),
    "mistral": Family("mistral", _DECODER, "layers", ("embed_tokens",)),
    "gemma": Family("gemma", dict(_DECODER, head_dim=16), "layers", ("embed_tokens",)),
    "phi3": Family("phi3", _DECODER, "layers", ("embed_tokens",)),
}
# Refused before any trial, with the reason (trials/freezing.py)
REFUSED = {
    "albert": Family("albert", dict(_ENCODER, embedding_size=16), "", ()),
    "bart": Family(
        "bart",
        dict(
            d_model=HIDDEN,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=128,
        ),
        "",
        (),
    ),
}


def tiny_config(family: Family, tokenizer):
    from transformers import AutoConfig

    config = AutoConfig.for_model(
        family.model_type,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        **family.options,
    )
    for name, value in config.to_dict().items():  # every dropout of every family's naming, off
        if isinstance(value, float) and ("dropout" in name or "pdrop" in name or name.endswith("_prob")):
            setattr(config, name, 0.0)
    return config


def save_family(folder: Path, family: Family, tokenizer) -> str:
    """The base model saved like a pretrained checkpoint (tests/conftest.py ``save_tiny``)."""
    from tests.conftest import save_tiny

    return save_tiny(folder, tiny_config(family, tokenizer), tokenizer)
