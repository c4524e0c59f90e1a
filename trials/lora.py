"""LoRA (Hu et al. 2021, arXiv:2106.09685) through peft: every pretrained weight frozen, a trainable
low-rank update ``(alpha / r) · B A`` beside chosen Linear modules of every encoder layer, and the
head (the classifier, and a pooler above the encoder) trained in full, as with ``freeze``.

Targets are module names inside a layer (of an encoder or a decoder-only model), matched as a name or a dotted suffix ("query"
matches ``attention.self.query``). The default is the attention projections of every layer (the
Linear modules under the layer's attention block: query, key, value and the output projection on
BERT-like models; ``self_attn``'s q/k/v/o_proj on Llama, Qwen2, Mistral, Gemma, OPT; ``qkv_proj`` and
``o_proj`` on Phi-3; GPT-2's ``attn.c_attn`` and ``attn.c_proj``, transformers' Conv1D) — the paper's setting widened from W_q, W_v to all four, as peft's examples do.

``peft.inject_adapter_in_model`` adds the adapters in place: the model keeps its class and forward,
so training, evaluation and checkpoints run unchanged (peft docs, "low-level API").
"""

from __future__ import annotations

from torch import nn

from freezesweep.trials.freezing import FreezeReport, find_encoder_parts


class LoraError(ValueError):
    """LoRA targets a model cannot take; ``problems``: each one in words."""

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = problems or [message]


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


def _in_attention(name: str) -> bool:
    """Inside the layer's attention block: BERT/RoBERTa "attention.self.query", DistilBERT "attention.q_lin"."""
    return any("attention" in part or "attn" in part for part in name.split(".")[:-1])


def _linear_types() -> tuple[type, ...]:
    """``nn.Linear``, and transformers' ``Conv1D`` (GPT-2's projections: a Linear with its weight
    transposed, which peft adapts with ``fan_in_fan_out``)."""
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:
        return (nn.Linear,)
    return nn.Linear, Conv1D


def layer_linears(model: nn.Module) -> list[str]:
    """The Linear modules of one encoder layer, by their name inside it."""
    layer = find_encoder_parts(model).layers[0]
    return [name for name, module in layer.named_modules() if isinstance(module, _linear_types())]


def attention_projections(model: nn.Module) -> tuple[str, ...]:
    """The default targets: the Linear modules under each layer's attention block."""
    found = tuple(n for n in layer_linears(model) if _in_attention(n))
    if not found:
        raise LoraError(
            f"{type(model).__name__}: no Linear module under an attention block in its layers "
            f"(its layers have: {', '.join(layer_linears(model))}); name lora targets"
        )
    return found


def target_problems(model: nn.Module, targets: tuple[str, ...] | None) -> list[str]:
    """Targets that match no Linear module of an encoder layer: one line each, naming what exists."""
    linears = layer_linears(model)
    missing = [t for t in targets or () if not any(_matches(n, t) for n in linears)]
    return [
        f"lora target {t!r} matches no Linear module in the layers of {type(model).__name__} "
        f"(they have: {', '.join(linears)})"
        for t in missing
    ]


def resolve_targets(model: nn.Module, targets: tuple[str, ...] | None) -> tuple[str, ...]:
    """The layer-relative names of the modules to adapt."""
    if not targets:
        return attention_projections(model)
    problems = target_problems(model, targets)
    if problems:
        raise LoraError("; ".join(problems), problems)
    return tuple(n for n in layer_linears(model) if any(_matches(n, t) for t in targets))


def apply_lora(
    model: nn.Module, rank: int, alpha: float, dropout: float, targets: tuple[str, ...] | None
) -> tuple[FreezeReport, tuple[str, ...]]:
    """Adapt ``model`` in place; returns its parameter counts and the resolved targets. The caller
    seeds the RNG first: peft initialises A randomly (B at zero, so the model starts as it was)."""
    from peft import LoraConfig, inject_adapter_in_model

    parts = find_encoder_parts(model)
    resolved = resolve_targets(model, targets)
    encoder = {id(p) for p in parts.prefix(None)}  # what runs between layers (DeBERTa-v2's conv) too
    head = [p for p in model.parameters() if id(p) not in encoder]  # classifier (+ pooler): trained in full
    # Full module names, so nothing outside the encoder layers is adapted by a suffix that also fits it.
    by_module = {id(m): name for name, m in model.named_modules()}
    names = [by_module[id(m)] for layer in parts.layers for n, m in layer.named_modules() if n in resolved]
    transposed = any(
        not isinstance(m, nn.Linear) for layer in parts.layers for n, m in layer.named_modules() if n in resolved
    )  # GPT-2's Conv1D stores its weight as (in, out)
    config = LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=names, bias="none", fan_in_fan_out=transposed
    )
    inject_adapter_in_model(config, model)  # also marks every non-adapter parameter frozen
    for p in head:
        p.requires_grad_(True)
    report = FreezeReport(
        frozen_layers=None,
        num_layers=len(parts.layers),
        trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
        total_params=sum(p.numel() for p in model.parameters()),
    )
    return report, resolved
