"""Validation accuracy and loss over pre-built, length-sorted batches."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from trials.eval_cache import PrefixStates, starting_at
from trials.precision import PrecisionPlan
from trials.tokens import Batch


@torch.inference_mode()
def evaluate(model: nn.Module, batches: list[Batch], plan: PrecisionPlan, device: torch.device,
             prefix: PrefixStates | None = None) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) over all rows; restores the model's train/eval mode. With
    ``prefix``, the frozen layers are not run: their cached output is fed to the first trained one."""
    was_training = model.training
    model.eval()
    # Sums stay on the device and are read once at the end: no host sync per batch.
    correct = torch.zeros((), dtype=torch.long, device=device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    with starting_at(model, prefix.layer, prefix.tuple_output) if prefix is not None else contextlib.nullcontext() as injector:
        for i, batch in enumerate(batches):
            batch = batch.to(device)
            if injector is not None:
                injector.states = prefix.states[i]
            with plan.autocast():
                logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
            logits = logits.float()
            loss_sum += F.cross_entropy(logits, batch.labels, reduction="sum").double()
            correct += (logits.argmax(-1) == batch.labels).sum()
            count += len(batch.labels)
    model.train(was_training)
    return correct.item() / count, loss_sum.item() / count
