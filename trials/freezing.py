"""Layer freezing with the reference semantics, discovered from the model's structure.

frozen_layers = -1: the embeddings only; 0: nothing; k >= 1: the embeddings and the first k layers
(k may equal the number of layers). The classification head, and whatever runs above the layer stack
(BERT's pooler, a decoder's final norm), always train.

The structure is found, not listed per model (docs/models.md):

- the layers are the one flat ``nn.ModuleList`` of the base model whose length is
  ``config.num_hidden_layers`` (``h`` on GPT-2, ``layers`` on Llama, ``encoder.layer`` on BERT);
- the rest is placed by *running* the model: a skeleton of the same class and config is built on
  the meta device (no memory, no weights) and run once on a few token ids, with a hook on every
  module: as meta tensors, or, where the model's code asks those for values (a mask's padding, a
  mixture of experts' routing), as fake tensors (shapes without values, which transformers' checks
  on values skip). A module
  outside the layers belongs to the "bottom" when it first runs before the first layer has returned,
  or never runs: the embeddings whatever their name (``wte``/``wpe``, ``embed_tokens``,
  ``word_embeddings``, OPT's ``project_in``, BLOOM's embedding norm) and what the layers share (MPNet's
  relative attention bias, DeBERTa's relative embeddings and their norm, which the layers read without
  calling). One that first runs once the first i layers have run, and before the rest, freezes with
  them, from k = i (DeBERTa-v2's ``conv``, after the first layer: from k = 1). A final norm or a
  pooler first runs after the last layer: it trains with the head. The model's
  ``get_input_embeddings()`` must land in the bottom, and every layer must run exactly once, in order.

Refused, with the reason (FreezingError, before any trial: orchestrator/checks.py): models whose
depths share layers (ALBERT with fewer groups than layers: no "first k layers" to freeze), layers kept
in nested lists (Funnel's blocks), encoder–decoder models (BART, T5: two stacks, so "the first k
layers" names none of them), and models whose skeleton cannot run without values (Longformer and
JetMoe decide on them).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
from collections.abc import Iterator
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
    # What runs between two layers (DeBERTa-v2's conv after layer 0), each parameter with the number of
    # layers run before it first runs: it freezes with them (k >= that number).
    between: tuple[tuple[int, nn.Parameter], ...] = ()

    def prefix(self, depth: int | None) -> list[nn.Parameter]:
        """The parameters frozen with the first ``depth`` layers (None: every layer): the bottom, those
        layers and what runs between them."""
        depth = len(self.layers) if depth is None else depth
        layers = [p for layer in self.layers[:depth] for p in layer.parameters()]
        return [*self.bottom, *layers, *(p for runs_after, p in self.between if runs_after <= depth)]


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
    # modules first run between two layers, with the number of layers run before them
    between_modules: tuple[tuple[str, int], ...] = ()


# What applies to a model whose structure is refused (the message names it).
_WHAT_APPLIES = (
    "only frozen_layers: 0 (full fine-tuning) applies to it here; LoRA and the probe need the layer stack too"
)


def find_encoder_parts(model: nn.Module) -> EncoderParts:
    base = getattr(model, "base_model", model)
    layers_name = _layers_name(model)
    structure = _structure(model, layers_name)
    modules = dict(base.named_modules())

    def own(name: str) -> list[nn.Parameter]:
        return list(modules[name].parameters(recurse=False)) if name in modules else []

    return EncoderParts(
        bottom=tuple(p for name in structure.bottom_modules for p in own(name)),
        layers=base.get_submodule(layers_name),
        layers_name=layers_name,
        between=tuple((after, p) for name, after in structure.between_modules for p in own(name)),
    )


def prefix_names(model: nn.Module, depth: int | None = None) -> set[str]:
    """The parameters of the frozen prefix at ``depth`` (the embeddings and shared encoder parameters,
    then the first ``depth`` layers and what runs between them; None: every layer): what a cache of the
    states after layer ``depth`` stands in for, as ``freeze(model, depth)`` freezes it. Empty below one
    layer (no cache there)."""
    if depth is not None and depth < 1:
        return set()
    prefix = {id(p) for p in find_encoder_parts(model).prefix(depth)}
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
    lists = [(n, m) for n, m in base.named_modules() if isinstance(m, nn.ModuleList)]
    # A list of lists (Funnel's blocks) is no stack: its items are not layers, and never run themselves.
    flat = [(n, m) for n, m in lists if not any(isinstance(item, nn.ModuleList) for item in m)]
    candidates = [(n, m) for n, m in flat if len(m) == num_layers]
    if len(candidates) == 1:
        return candidates[0][0]
    if not candidates and isinstance(num_layers, int):
        _refuse_without_stack(name, num_layers, lists)
    found = ", ".join(f"{n} ({len(m)})" for n, m in candidates) or "none"
    raise FreezingError(
        f"cannot find the encoder layers of {name}: expected exactly one ModuleList "
        f"of config.num_hidden_layers={num_layers} modules, found {found}"
    )


def _refuse_without_stack(name: str, num_layers: int, lists: list[tuple[str, nn.Module]]) -> None:
    """Say why no list holds the ``num_layers`` layers, where the lists show it: nested, or too few."""
    nested = [(n, m) for n, m in lists if any(isinstance(item, nn.ModuleList) for item in m)]
    innermost = [m for _, m in lists if not any(isinstance(sub, nn.ModuleList) for sub in list(m.modules())[1:])]
    held = sum(len(m) for m in innermost)
    if nested and held >= num_layers:
        outer, blocks = nested[0]
        raise FreezingError(
            f"{name} keeps its {num_layers} layers in nested lists ({outer}: {len(blocks)} lists of layers, as "
            f"Funnel's blocks), not one stack: 'the first k layers' names no single list to freeze from; "
            f"{_WHAT_APPLIES}"
        )
    if innermost and held < num_layers:
        shared, so = (
            ("one layer shared by every depth", "freezing 'the first k layers' would freeze them all")
            if held == 1
            else (f"{held} layers shared among the depths", "'the first k layers' names no prefix of them")
        )
        raise FreezingError(
            f"{name} runs {num_layers} layers from fewer layer modules ({shared}, as ALBERT's): {so}; {_WHAT_APPLIES}"
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
    # A mixture of experts runs them as one batched matmul here: the default grouped matmul takes bf16
    # alone on a skeleton, and the eager loop asks which experts the tokens chose (a value). A
    # transformers without that setting (or refusing it) keeps its own: the trace then says what failed.
    with contextlib.suppress(Exception):
        config._experts_implementation = "batched_mm"
    with torch.device("meta"):
        skeleton = model_class(config)
    # Legacy constructors (XLNet's torch.FloatTensor) ignore the device context. In eval mode no
    # LayerDrop skips a layer.
    skeleton.to("meta").eval()
    # No padding index, so that no check asks whether the ids hold padding (a meta tensor has no values);
    # a config whose fields are typed strictly (transformers 5's ModernBERT decoder) keeps its own
    with contextlib.suppress(Exception):
        skeleton.config.pad_token_id = None
    return _trace(skeleton, layers_name)


def _trace(skeleton: nn.Module, layers_name: str) -> Structure:
    """Place each module outside the layers by how many layers had run when it first ran: none (or never
    run) is the bottom, all of them the top, in between freezes with the layers before it."""
    base = getattr(skeleton, "base_model", skeleton)
    layers = base.get_submodule(layers_name)
    in_layers = {id(m) for m in layers.modules()}
    outside = [(name, module) for name, module in base.named_modules() if id(module) not in in_layers]
    first_run, returned = _run_hooked(skeleton, base, layers, outside)
    _check_each_layer_ran_once(type(skeleton).__name__, layers_name, len(layers), returned)
    owners = [name for name, module in outside if any(True for _ in module.parameters(recurse=False))]
    bottom = tuple(name for name in owners if first_run.get(name, 0) == 0)
    between = tuple((name, first_run[name]) for name in owners if 0 < first_run.get(name, 0) < len(layers))
    _check_input_embeddings(skeleton, base, bottom)
    return Structure(layers_name=layers_name, bottom_modules=bottom, between_modules=between)


def _run_hooked(
    skeleton: nn.Module, base: nn.Module, layers: nn.Module, outside: list[tuple[str, nn.Module]]
) -> tuple[dict[str, int], list[int]]:
    """Run ``base`` once; returns how many layers had returned when each module ``outside`` them first ran
    (by name), and the index of each layer as it returned, in order."""
    first_run: dict[str, int] = {}
    returned: list[int] = []

    # A hook that returns something replaces the module's arguments or output: these return None.
    def seen(name: str) -> None:
        first_run.setdefault(name, len(returned))

    def ran(index: int) -> None:
        returned.append(index)

    handles = [layer.register_forward_hook(lambda *_, i=i: ran(i)) for i, layer in enumerate(layers)]
    for name, module in outside:
        if module is not base:
            handles.append(module.register_forward_pre_hook(lambda *_, n=name: seen(n)))
    try:
        try:  # meta tensors first: how every family ran before, on every transformers version
            with torch.no_grad():
                base(**_trace_inputs())
        except Exception:  # a check on values (RoFormer's mask, a MoE's routing): fake tensors skip it
            first_run.clear()
            returned.clear()
            with torch.no_grad(), _fake_tensors():
                base(**_trace_inputs())
    except Exception as exc:  # a structure we cannot run: named, never a crash elsewhere
        cause = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:160]}"
        raise FreezingError(
            f"cannot trace the structure of {type(skeleton).__name__}: its skeleton (its class and config, "
            f"without weights) does not run on token ids without values ({cause}), so its embeddings and "
            f"layers cannot be told apart; {_WHAT_APPLIES}"
        ) from exc
    finally:
        for handle in handles:
            handle.remove()
    return first_run, returned


@contextlib.contextmanager
def _fake_tensors() -> Iterator[None]:
    """Fake tensors: shapes and dtypes without values. Transformers skips its checks on values (a mask
    with no padding, padding in the ids) for them, which a meta tensor would answer by raising."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    # An operation it cannot fake is logged with its traceback before it raises: the FreezingError says it.
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):  # the skeleton's meta parameters become fake too
            yield
    finally:
        log.setLevel(level)


def _check_each_layer_ran_once(model_name: str, layers_name: str, num_layers: int, returned: list[int]) -> None:
    """'The first k layers' names a prefix only when each layer runs once, in the list's order."""
    counts = collections.Counter(returned)
    for index in range(num_layers):
        runs = counts[index]
        if runs > 1:
            raise FreezingError(
                f"layer {index} of {model_name}'s {layers_name} ran {runs} times in one forward pass: its layers "
                f"are shared among the depths, so 'the first k layers' names no prefix; {_WHAT_APPLIES}"
            )
        if runs == 0:
            raise FreezingError(
                f"layer {index} of {model_name}'s {layers_name} was not seen running in a forward pass (not run, "
                f"or called past its hooks, through .forward): 'the first k layers' cannot be told apart; "
                f"{_WHAT_APPLIES}"
            )
    if returned != sorted(returned):
        raise FreezingError(
            f"the layers of {model_name}'s {layers_name} ran out of their order in the list ({returned}): "
            f"'the first k layers' names no prefix; {_WHAT_APPLIES}"
        )


def _trace_inputs() -> dict:
    # No attention mask: all ones is the same mask. A decoder keeps its (default) cache on: without one it
    # looks for packed sequences in the position ids (a question transformers skips on fake tensors too).
    return {"input_ids": torch.ones(1, 4, dtype=torch.long, device="meta")}


def _check_input_embeddings(skeleton: nn.Module, base: nn.Module, bottom: tuple[str, ...]) -> None:
    names = {id(m): n for n, m in base.named_modules()}
    try:
        embeddings = skeleton.get_input_embeddings() if hasattr(skeleton, "get_input_embeddings") else None
    except NotImplementedError:  # CANINE's hashed character embeddings: none is named; one of them will do
        embeddings = next((m for n, m in base.named_modules() if n in bottom and isinstance(m, nn.Embedding)), None)
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
    for p in parts.prefix(max(frozen_layers, 0)):
        p.requires_grad_(False)
    return FreezeReport(
        frozen_layers=frozen_layers,
        num_layers=num_layers,
        trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
        total_params=sum(p.numel() for p in model.parameters()),
    )
