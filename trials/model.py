"""Model and tokenizer loading: hub ids, local folders, and offline packages that ship a model."""

from __future__ import annotations

import functools
import importlib.resources
from pathlib import Path

import torch
from freezesweep.trials import hub
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel

# Hub ids that a pip package ships, so they resolve with no network.
from freezesweep.trials.hub import OFFLINE_PACKAGES


class ModelError(ValueError):
    pass


def resolve_model_path(model: str) -> str:
    """A local folder as it is; a hub id shipped by an installed package to that package's folder;
    any other hub id unchanged (transformers then uses its cache or the hub). A name that can only be
    a folder (``names_folder``) but is none here raises ModelError naming it, rather than going to
    the hub with it."""
    path = Path(model).expanduser()
    if path.is_dir():
        return str(path)
    if names_folder(model):
        raise ModelError(f"model folder {model} does not exist on this machine")
    package = OFFLINE_PACKAGES.get(model)
    if package is not None:
        try:
            return str(importlib.resources.files(package) / "model")
        except ModuleNotFoundError:
            pass  # not installed: fall through to the hub
    return model


def names_folder(model: str) -> bool:
    """Whether ``model`` can only be a local folder: a hub id is ``name`` or ``owner/name``, and its
    parts never start with a dot (so ``/x``, ``~/x``, ``./x``, ``a/b/c`` are folders)."""
    return model.startswith(("/", "~", ".")) or model.count("/") > 1 or "\\" in model


@functools.lru_cache(maxsize=8)
def load_model_config(model: str):
    """The model's config (layer count for validation); cached, a sweep asks for it per cell. A folder,
    a package or the hub cache is read without a request; a hub id missing from the cache asks the hub
    once before loading (``hub_problem``), so that no network fails at once, with the remedy."""
    path = model  # what a failure inside resolve_model_path leaves to compare
    try:
        path = resolve_model_path(model)
        return AutoConfig.from_pretrained(path, local_files_only=True)
    except ModelError as exc:
        raise ModelError(f"cannot load model {model!r}: {exc}") from exc
    except Exception as exc:
        if Path(path).is_dir():  # a folder's own error: the hub has nothing to do with it
            raise ModelError(f"cannot load model {model!r}: {_not_a_model_folder(path, exc)}") from exc
        if path != model or hub.offline():  # a package's or the cache's own error
            raise ModelError(f"cannot load model {model!r}: {_not_local(exc)}") from exc
    problem = hub.hub_problem(model)
    if problem is not None:
        raise ModelError(
            f"cannot load model {model!r}: it is not in this machine's Hugging Face cache and {problem}; "
            f"name a local folder instead (model: path/to/folder), or download it where the hub is "
            f"reachable (`hf download {model}`)"
        )
    try:
        return AutoConfig.from_pretrained(path)
    except Exception as exc:
        raise ModelError(f"cannot load model {model!r}: {exc}") from exc


def _not_a_model_folder(path: str, exc: Exception) -> str:
    """transformers' first line, and what a model folder holds where it lacks its config."""
    first = _first_line(exc)
    if (Path(path) / "config.json").is_file():
        return first
    return f"the folder has no config.json: a model folder holds what save_pretrained writes ({first})"


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _not_local(exc: Exception) -> str:
    """transformers' words, plus the remedy where HF_HUB_OFFLINE kept it from the hub."""
    if hub.offline():
        return f"{_first_line(exc)} (HF_HUB_OFFLINE is set: download it where the hub is reachable, or name a local folder)"
    return str(exc)


@functools.lru_cache(maxsize=4)
def load_tokenizer(model: str):
    # Cached per process: a Ray worker that runs several trials of one model builds it once.
    return AutoTokenizer.from_pretrained(resolve_model_path(model))


def build_skeleton(model: str, num_labels: int = 2) -> PreTrainedModel:
    """The sequence classifier's module tree on the meta device: no memory, no weights read (what
    validation inspects before any trial)."""
    config = AutoConfig.from_pretrained(resolve_model_path(model), num_labels=num_labels)
    with torch.device("meta"):
        return AutoModelForSequenceClassification.from_config(config)


def build_model(model: str, num_labels: int, model_init: str) -> PreTrainedModel:
    """A sequence classifier; the caller seeds the RNG first, which fixes the new head's init."""
    return built_model(model, num_labels, model_init)[0]


def built_model(model: str, num_labels: int, model_init: str) -> tuple[PreTrainedModel, frozenset[str]]:
    """``build_model``'s classifier and the names of its parameters drawn from the seeded RNG rather
    than read: every one of a random init; of a pretrained model, those its checkpoint lacks (the new
    head, and any other: transformers initialises them and reports them as missing keys) or holds in
    another shape (a classifier saved with its head, for another number of labels: a new head, as
    the Trainer's ``ignore_mismatched_sizes`` makes one; before, every trial failed)."""
    path = resolve_model_path(model)
    if model_init == "pretrained":
        net, loading = AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=num_labels, output_loading_info=True, ignore_mismatched_sizes=True
        )
        # (named from the model, or from its base model; a mismatched key: its name, then both shapes)
        mismatched = loading.get("mismatched_keys", ())
        _only_the_head(model, mismatched, num_labels)
        missing = set(loading["missing_keys"]) | {key[0] for key in mismatched}
        return net, frozenset(n for n, _ in net.named_parameters() if n in missing or _base_name(net, n) in missing)
    if model_init == "random":
        config = AutoConfig.from_pretrained(path, num_labels=num_labels)
        net = AutoModelForSequenceClassification.from_config(config)
        return net, frozenset(n for n, _ in net.named_parameters())
    raise ModelError(f"model_init must be 'pretrained' or 'random', got {model_init!r}")


def _only_the_head(model: str, mismatched, num_labels: int) -> None:
    """A checkpoint's weights of another shape than the model's are new only where they are the output
    layer's, one row per label ([labels, hidden] and [labels]); elsewhere (position embeddings of another
    length) the checkpoint does not fit its own config, and a new draw would train without saying so."""
    other = [name for name, saved, wanted in mismatched if wanted[0] != num_labels or saved[1:] != wanted[1:]]
    if other:
        raise ModelError(
            f"model {model}: its checkpoint's {', '.join(other)} have other shapes than its config gives them "
            "(the folder's config.json and its weights do not match)"
        )


def _base_name(net: PreTrainedModel, name: str) -> str:
    return name.removeprefix(f"{net.base_model_prefix}.")


def is_decoder_only(config) -> bool:
    """A decoder-only language model (Llama, Qwen2, Mistral, Gemma, Phi-3, GPT-2, OPT, BLOOM): a causal
    LM architecture with no masked-LM one and no encoder-decoder (BERT, RoBERTa, ELECTRA have both;
    DeBERTa, DistilBERT, ModernBERT only the masked one)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    kind = getattr(config, "model_type", None)
    return (
        kind in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        and kind not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
        and not getattr(config, "is_encoder_decoder", False)
    )


def set_padding(model: PreTrainedModel, pad_id: int) -> PreTrainedModel:
    """The model told which id pads its batches. A decoder-only classifier (Llama, Qwen2, GPT-2, …)
    reads the last token that is not ``config.pad_token_id`` (left or right padding alike); with none
    set it refuses batches of more than one row, and with another id than the one the batches carry
    it would read padding. Encoders read position 0 and never look at it. Set on the trial's own copy."""
    if model.config.pad_token_id != pad_id:
        model.config.pad_token_id = pad_id
    return model


def attention_for(model: PreTrainedModel, device: torch.device) -> PreTrainedModel:
    """Eager attention on a CPU, the model's default (SDPA) elsewhere. At these sequence lengths the
    CPU's SDPA kernels are the slower ones (measured, MiniLM-L6 in bf16 on one core: a full validation
    pass 3.52 -> 3.39 s, a packed training step 0.22 -> 0.17 s: a block-diagonal mask with dropout
    sends SDPA to its unfused path); a GPU's fused SDPA kernels are what it is built for."""
    if device.type == "cpu":
        return eager_attention(model)
    return model


def attention_kernels(device: torch.device) -> None:
    """On a GPU, SDPA without its cuDNN kernels (flash and memory-efficient attention remain): a
    process-wide switch, set where a trial starts. Seen on an H100 (issue 35): a worker's first trial
    of 63 steps took 9.5 s, the same trial again 2.6 s (126 steps: 11.4 s, then 5.7 s), about 0.1 s
    for each packed token count met the first time (a packed batch's count varies from step to step).
    We attribute it to cuDNN attention, which PyTorch prefers on Hopper (``check_prefer_cudnn_attention``
    in aten/src/ATen/native/transformers/cuda/sdp_utils.cpp) and which builds an execution plan for each
    new shape (meta-pytorch/torchtune#1652, "Unusual CPU overhead of SDPA call on H100";
    sgl-project/sglang#4650 measured ~400 ms a build). The gain of this switch is not yet measured on a
    GPU (docs/speed.md)."""
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


def attention_of(model: PreTrainedModel) -> str:
    """The attention kernels the model runs ("sdpa", "eager", …; "" where it does not say), for the
    worker's cache keys: a verdict or cached state of one is not bit for bit the other's."""
    return str(getattr(model.config, "_attn_implementation", None) or "")


def eager_attention(model: PreTrainedModel) -> PreTrainedModel:
    """The model's attention as plain operators (matrix products, softmax, dropout). A trial array
    (trials/array.py) runs the model under ``torch.func.vmap``: a GPU's fused SDPA kernels draw their
    attention dropout inside the kernel, so vmapped members do not draw the plain model's masks, and
    the array's check (``array_agrees``) refused every model on a GPU (issue 35, seen on an H100);
    eager attention's dropout is an operator that ``vmap`` draws as its ``randomness`` says."""
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")
    return model
