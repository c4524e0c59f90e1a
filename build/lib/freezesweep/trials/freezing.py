"""Layer freezing with the reference semantics, discovered from the model's structure.

frozen_layers = -1: the embeddings only; 0: nothing; k >= 1: the embeddings and the first k encoder
layers (k may equal the number of layers). The classification head, and any pooler above the
encoder, always train.

The structure is found, not listed per model: the encoder layers are the one ``nn.ModuleList`` of
the base model whose length is ``config.num_hidden_layers``; the "bottom" is every base-model child
whose name says embedding (ELECTRA's ``embeddings_project`` too) plus whatever the layers' container
holds outside the layers (MPNet's shared ``relative_attention_bias``, used by every layer, so it is
frozen together with the embeddings).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


class FreezingError(ValueError):
    pass


@dataclass(frozen=True)
class EncoderParts:
    bottom: tuple[nn.Parameter, ...]  # embeddings and shared encoder parameters
    layers: nn.ModuleList
    layers_name: str


@dataclass(frozen=True)
class FreezeReport:
    frozen_layers: int | None  # None: another method (LoRA) that freezes no layer count
    num_layers: int
    trainable_params: int
    total_params: int


def find_encoder_parts(model: nn.Module) -> EncoderParts:
    base = getattr(model, "base_model", model)
    num_layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    candidates = [
        (name, module)
        for name, module in base.named_modules()
        if isinstance(module, nn.ModuleList) and len(module) == num_layers
    ]
    if len(candidates) != 1:
        found = ", ".join(f"{n} ({len(m)})" for n, m in candidates) or "none"
        raise FreezingError(
            f"cannot find the encoder layers of {type(model).__name__}: expected exactly one ModuleList "
            f"of config.num_hidden_layers={num_layers} modules, found {found}"
        )
    layers_name, layers = candidates[0]
    container_name = layers_name.rpartition(".")[0]
    container = base.get_submodule(container_name) if container_name else base
    layer_params = {id(p) for p in layers.parameters()}
    bottom = [p for name, child in base.named_children() if "embed" in name for p in child.parameters()]
    if not bottom:
        raise FreezingError(f"cannot find the embeddings of {type(model).__name__} (no child named *embed*)")
    if container is not base:
        bottom += [p for p in container.parameters() if id(p) not in layer_params]
    return EncoderParts(bottom=tuple(bottom), layers=layers, layers_name=layers_name)


def freeze(model: nn.Module, frozen_layers: int) -> FreezeReport:
    """Set requires_grad in place; frozen parameters get no gradient, so autograd records nothing
    below the last frozen layer and the optimizer keeps no state for them."""
    parts = find_encoder_parts(model)
    num_layers = len(parts.layers)
    if not -1 <= frozen_layers <= num_layers:
        raise FreezingError(
            f"frozen_layers={frozen_layers} is out of range for a {num_layers}-layer model "
            f"(-1 = embeddings only, 0 = nothing, 1..{num_layers} = embeddings + first k layers)"
        )
    for p in model.parameters():
        p.requires_grad_(True)
    if frozen_layers != 0:
        frozen = list(parts.bottom) + [p for layer in parts.layers[: max(frozen_layers, 0)] for p in layer.parameters()]
        for p in frozen:
            p.requires_grad_(False)
    return FreezeReport(
        frozen_layers=frozen_layers,
        num_layers=num_layers,
        trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
        total_params=sum(p.numel() for p in model.parameters()),
    )
