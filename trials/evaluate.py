"""Validation accuracy and loss over pre-built, length-sorted batches."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trials.precision import PrecisionPlan
from trials.tokens import Batch


@torch.inference_mode()
def evaluate(model: nn.Module, batches: list[Batch], plan: PrecisionPlan, device: torch.device) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) over all rows; restores the model's train/eval mode."""
    was_training = model.training
    model.eval()
    correct, loss_sum, count = 0, 0.0, 0
    for batch in batches:
        batch = batch.to(device)
        with plan.autocast():
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        logits = logits.float()
        loss_sum += F.cross_entropy(logits, batch.labels, reduction="sum").item()
        correct += (logits.argmax(-1) == batch.labels).sum().item()
        count += len(batch.labels)
    model.train(was_training)
    return correct / count, loss_sum / count
