"""The last encoder layer computed past self-attention for the one position the head reads.

A sequence-classification head reads the last layer's output at the first token only (BERT's pooler,
RoBERTa's and ELECTRA's heads: ``hidden_states[:, 0]``). Everything in a BERT-family layer after
self-attention is position-wise: the attention output projection, its dropout and layer norm, the
feed-forward block and its layer norm. In the last layer that is needed for position 0 alone, which
skips about three quarters of the layer's work (its attention output projection and feed-forward
block for every other token) in training and evaluation alike. Self-attention still reads every
position (their keys and values), so the result is the same function of the same weights.

How: within ``narrowed(model, reader)``, a forward pre-hook on the last layer's attention-output
module (``attention.output``, called as (attention context, residual input) in the BERT family)
narrows both inputs to position 0; the layer then returns ``[batch, 1, hidden]`` and the head's
``[:, 0]`` reads the same vector the full layer would give. Whether a model qualifies is measured,
not assumed: once per (model, class) and process (trials/packing.py ``training_feed``), its logits with and without the hook on a real
batch, in fp32, must agree to float rounding; a head that reads other positions (mean pooling, the
last token) or a layer built otherwise fails that check, and the model runs in full.

Dropout in the narrowed part draws masks for position 0 only: the same distribution, fewer draws.
Where every layer is frozen the evaluation cache holds the last layer's full output, so evaluation
there is not narrowed (cached and uncached evaluation stay bit-identical); training still is.
Measured on one CPU core, MiniLM-L6, n = 200, bf16: a k = -1 trial 106 -> 98 s, a k = 4 trial 52 -> 42 s.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from freezesweep.trials.eval_cache import eval_mode
from freezesweep.trials.freezing import FreezingError, find_encoder_parts
from freezesweep.trials.tokens import Batch


def _attention_output(model: nn.Module) -> nn.Module | None:
    """The last layer's attention-output module, where the architecture has one (a decoder's
    ``self_attn`` has none: its head reads the last token, which this narrowing does not serve)."""
    try:
        last = find_encoder_parts(model).layers[-1]
    except FreezingError:
        return None  # no layer stack found (ALBERT, encoder-decoder models): nothing to narrow
    attention = getattr(last, "attention", None)
    output = getattr(attention, "output", None)
    return output if isinstance(output, nn.Module) else None


class Reader:
    """Where the head's tokens are: position 0 of every row (``rows`` None), or, for a packed batch
    (trials/packing.py: every sequence of the batch in one row), the offsets of its sequences' first
    tokens. The packed feed sets ``rows`` for its forward pass and puts None back after it."""

    def __init__(self, in_evaluation: bool = True):
        self.rows: torch.Tensor | None = None
        # False where the evaluation cache holds the last layer's full output (every layer frozen):
        # evaluating it narrowed would agree with the cache to float rounding only, not bit for bit.
        self.in_evaluation = in_evaluation

    def __call__(self, module: nn.Module, args: tuple) -> tuple | None:
        if not (module.training or self.in_evaluation):
            return None  # the arguments as they are
        return tuple(self._narrow(a) if isinstance(a, torch.Tensor) and a.dim() == 3 else a for a in args)

    def _narrow(self, states: torch.Tensor) -> torch.Tensor:
        if self.rows is None:
            return states[:, :1]
        return states[0, self.rows].unsqueeze(1)  # [1, tokens, hidden] -> [sequences, 1, hidden]


@contextlib.contextmanager
def narrowed(model: nn.Module, reader: Reader | None):
    """Within the block, the last layer computes its position-wise part for the head's token only
    (nothing changes where there is no reader: the model does not qualify, or narrowing is off)."""
    target = _attention_output(model) if reader is not None else None
    handle = target.register_forward_pre_hook(reader) if target is not None else None
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()


@torch.no_grad()
def narrowing_agrees(model: nn.Module, batch: Batch) -> bool:
    """True when narrowing leaves the model's logits on ``batch`` unchanged (fp32, eval mode)."""
    if _attention_output(model) is None:
        return False
    with eval_mode(model):
        full = model(**batch.model_inputs()).logits
        with narrowed(model, Reader()):
            narrow = model(**batch.model_inputs()).logits
    return logits_agree(full, narrow)


def logits_agree(full: torch.Tensor, other: torch.Tensor) -> bool:
    # fp32 rounding of a different matrix shape is ~1e-7 relative; a head reading other positions is off by far more
    return full.shape == other.shape and torch.allclose(full.float(), other.float(), rtol=1e-4, atol=1e-5)
