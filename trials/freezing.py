"""Layer freezing with the reference semantics, discovered from the model's structure.

frozen_layers = -1: the embeddings only; 0: nothing; k >= 1: the embeddings and the first k layers
(k may equal the number of layers). The classification head, and whatever runs above the layer stack
(BERT's pooler, a decoder's final norm), always train.

The structure is found, not listed per model (docs/models.md):

- the layers are the one ``nn.ModuleList`` of the base model whose length is
  ``config.num_hidden_layers`` (``h`` on GPT-2, ``layers`` on Llama, ``encoder.layer`` on BERT);
- the "bottom" is found by *running* the model: a skeleton of the same class and config is built on
  the meta device (no memory, no weights) and run once on a few token ids, with a hook on every
  module; a parameter belongs to the bottom when its module is outside the layers and does not first
  run after the last layer. That is the embeddings whatever their name (``wte``/``wpe``,
  ``embed_tokens``, ``word_embeddings``, OPT's ``project_in``, BLOOM's embedding norm) and what the
  layers share (MPNet's relative attention bias, DeBERTa's relative embeddings and their norm, which
  the layers read without calling). A final norm or a pooler first runs after the last layer: it
  trains with the head. The model's ``get_input_embeddings()`` must land in the bottom.

Refused, with the reason (FreezingError, before any trial: orchestrator/checks.py): models whose
depths share one layer (ALBERT: no "first k layers" to freeze) and encoder–decoder models (BART, T5:
two stacks, so "the first k layers" names none of them).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
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


@dataclass(frozen=True)
class Structure:
    """Where things are, by module name inside the base model: what a class and config give."""

    layers_name: str
    bottom_modules: tuple[str, ...]  # modules whose own parameters are frozen with the embeddings


# What applies to a model whose structure is refused (the message names it).
_WHAT_APPLIES = (
    "only frozen_layers: 0 (full fine-tuning) applies to it here; LoRA and the probe need the layer stack too"
)


def find_encoder_parts(model: nn.Module) -> EncoderParts:
    base = getattr(model, "base_model", model)
    layers_name = _layers_name(model)
    structure = _structure(model, layers_name)
    modules = dict(base.named_modules())
    bottom = [
        p for name in structure.bottom_modules if name in modules for p in modules[name].parameters(recurse=False)
    ]
    return EncoderParts(bottom=tuple(bottom), layers=base.get_submodule(layers_name), layers_name=layers_name)


def prefix_names(model: nn.Module, depth: int | None = None) -> set[str]:
    """The parameters of the frozen prefix at ``depth`` (the embeddings and shared encoder parameters,
    then the first ``depth`` layers; None: every layer): what a cache of the states after layer
    ``depth`` stands in for. Empty below one layer (no cache there)."""
    if depth is not None and depth < 1:
        return set()
    parts = find_encoder_parts(model)
    prefix = {id(p) for layer in parts.layers[:depth] for p in layer.parameters()} | {id(p) for p in parts.bottom}
    return {n for n, p in model.named_parameters() if id(p) in prefix}


def _layers_name(model: nn.Module) -> str:
    """The name of the layer stack, or a FreezingError saying why there is none to freeze."""
    base = getattr(model, "base_model", model)
    config = getattr(model, "config", None)
    num_layers = getattr(config, "num_hidden_layers", None)
    name = type(model).__name__
    if getattr(config, "is_encoder_decoder", False):
        raise FreezingError(
            f"{name} is an encoder-decoder model: it has an encoder and a decoder stack, so "
            f"'the first k layers' names no single stack to freeze from; {_WHAT_APPLIES}"
        )
    candidates = [(n, m) for n, m in base.named_modules() if isinstance(m, nn.ModuleList) and len(m) == num_layers]
    if len(candidates) == 1:
        return candidates[0][0]
    stacks = [(n, m) for n, m in base.named_modules() if isinstance(m, nn.ModuleList)]
    if not candidates and isinstance(num_layers, int) and stacks and all(len(m) < num_layers for _, m in stacks):
        raise FreezingError(
            f"{name} runs {num_layers} layers from fewer layer modules (one layer shared by every "
            f"depth, as ALBERT's): freezing 'the first k layers' would freeze them all; {_WHAT_APPLIES}"
        )
    found = ", ".join(f"{n} ({len(m)})" for n, m in candidates) or "none"
    raise FreezingError(
        f"cannot find the encoder layers of {name}: expected exactly one ModuleList "
        f"of config.num_hidden_layers={num_layers} modules, found {found}"
    )


def _structure(model: nn.Module, layers_name: str) -> Structure:
    config = getattr(model, "config", None)
    if not hasattr(config, "to_json_string"):
        raise FreezingError(
            f"cannot find the embeddings of {type(model).__name__}: not a transformers model "
            "(no config to build its skeleton from)"
        )
    # a class is hashable (mypy, not reading torch, sees type[Any] here)
    return _traced_structure(type(model), config.to_json_string(), layers_name)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=16)
def _traced_structure(model_class: type, config_json: str, layers_name: str) -> Structure:
    """The structure of ``model_class`` with this config, from one run of its skeleton on the meta
    device (cached: a trial asks for it several times, every trial of a model the same)."""
    import json

    config_class = getattr(model_class, "config_class", None)
    config = config_class.from_dict(json.loads(config_json)) if config_class else None
    if config is None:
        raise FreezingError(f"cannot rebuild {model_class.__name__} from its config")

    with torch.device("meta"):
        skeleton = model_class(config)
    # Built with its padding index; now none, so that no check asks whether the ids hold padding (a
    # meta tensor has no values to ask).
    skeleton.config.pad_token_id = None
    return _trace(skeleton, layers_name)


def _trace(skeleton: nn.Module, layers_name: str) -> Structure:
    """Run ``skeleton``'s base model once; each module outside the layers is "after" when it first
    runs once the last layer has run."""
    base = getattr(skeleton, "base_model", skeleton)
    layers = base.get_submodule(layers_name)
    in_layers = {id(m) for m in layers.modules()}
    first_run_after: dict[str, bool] = {}
    done: list[bool] = []  # set once the last layer has returned

    def seen(name: str) -> None:  # a pre-hook that returns something replaces the module's arguments
        first_run_after.setdefault(name, bool(done))

    handles = [layers[-1].register_forward_hook(lambda *_: done.append(True))]
    for name, module in base.named_modules():
        if id(module) not in in_layers and module is not base:
            handles.append(module.register_forward_pre_hook(lambda *_, n=name: seen(n)))
    try:
        with torch.no_grad():
            base(**_trace_inputs())
    except Exception as exc:  # a structure we cannot run: named, never a crash elsewhere
        raise FreezingError(
            f"cannot run {type(skeleton).__name__}'s skeleton to find its embeddings: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        for handle in handles:
            handle.remove()
    bottom = tuple(
        name
        for name, module in base.named_modules()
        if id(module) not in in_layers
        and any(True for _ in module.parameters(recurse=False))
        and not first_run_after.get(name, False)
    )
    _check_input_embeddings(skeleton, base, bottom)
    return Structure(layers_name=layers_name, bottom_modules=bottom)


def _trace_inputs() -> dict:
    # No attention mask: building one from a meta tensor asks for its values; all-ones is the same mask.
    # A decoder keeps its (default) cache on: without one it looks for packed sequences in the
    # position ids, another question about values.
    return {"input_ids": torch.ones(1, 4, dtype=torch.long, device="meta")}


def _check_input_embeddings(skeleton: nn.Module, base: nn.Module, bottom: tuple[str, ...]) -> None:
    embeddings = skeleton.get_input_embeddings() if hasattr(skeleton, "get_input_embeddings") else None
    names = {id(m): n for n, m in base.named_modules()}
    if embeddings is None or names.get(id(embeddings)) not in bottom:
        raise FreezingError(
            f"cannot find the embeddings of {type(skeleton).__name__}: its input embeddings do not "
            "run before its first layer"
        )


def structure_problems(model: nn.Module, frozen_layers: list[int], needs_layers: bool = False) -> list[str]:
    """What keeps ``frozen_layers`` (and, with ``needs_layers``, LoRA or the probe) from applying to
    ``model``; a meta-device skeleton is enough. Its layers, embeddings and head must be found for
    any value but 0 (nothing frozen needs no structure). Empty when everything applies."""
    if not needs_layers and all(k == 0 for k in frozen_layers):
        return []
    try:
        find_encoder_parts(model)
    except FreezingError as exc:
        return [str(exc)]
    base = getattr(model, "base_model", model)
    in_base = {id(p) for p in base.parameters()}
    if not any(id(p) not in in_base for p in model.parameters()):
        return [f"cannot find the classification head of {type(model).__name__} (no parameter outside its base model)"]
    return []


def freeze(model: nn.Module, frozen_layers: int) -> FreezeReport:
    """Set requires_grad in place; frozen parameters get no gradient, so autograd records nothing
    below the last frozen layer and the optimizer keeps no state for them."""
    if frozen_layers == 0:  # nothing frozen: any model, whatever its structure
        for p in model.parameters():
            p.requires_grad_(True)
        total = sum(p.numel() for p in model.parameters())
        return FreezeReport(
            frozen_layers=0,
            num_layers=getattr(getattr(model, "config", None), "num_hidden_layers", 0),
            trainable_params=total,
            total_params=total,
        )
    parts = find_encoder_parts(model)
    num_layers = len(parts.layers)
    if not -1 <= frozen_layers <= num_layers:
        raise FreezingError(
            f"frozen_layers={frozen_layers} is out of range for a {num_layers}-layer model "
            f"(-1 = embeddings only, 0 = nothing, 1..{num_layers} = embeddings + first k layers)"
        )
    for p in model.parameters():
        p.requires_grad_(True)
    frozen = list(parts.bottom) + [p for layer in parts.layers[: max(frozen_layers, 0)] for p in layer.parameters()]
    for p in frozen:
        p.requires_grad_(False)
    return FreezeReport(
        frozen_layers=frozen_layers,
        num_layers=num_layers,
        trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
        total_params=sum(p.numel() for p in model.parameters()),
    )
