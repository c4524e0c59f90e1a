"""Validation metrics and loss over pre-built, length-sorted batches; the task's loss."""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from freezesweep.trials.eval_cache import PrefixStates, eval_mode, starting_at
from freezesweep.trials.graphs import EvalGraphs
from freezesweep.trials.metrics import compute_metrics, constant
from freezesweep.trials.packing import PaddedFeed
from freezesweep.trials.precision import PrecisionPlan
from freezesweep.trials.tokens import Batch


def task_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy over the classes, or for regression (float labels) the squared error of the one output."""
    logits = logits.float()
    if labels.is_floating_point():
        return F.mse_loss(logits.squeeze(-1), labels, reduction=reduction)
    return F.cross_entropy(logits, labels, reduction=reduction)


@torch.inference_mode()
def evaluate(
    model: nn.Module,
    batches: list[Batch],
    plan: PrecisionPlan,
    device: torch.device,
    prefix: PrefixStates | None = None,
    labels: np.ndarray | None = None,
    feed: PaddedFeed | None = None,
    eval_graphs: EvalGraphs | None = None,
) -> tuple[dict[str, float], float, bool]:
    """(every metric of the task, mean loss, whether every row got the same prediction) over all rows;
    restores the model's train/eval mode.
    With ``prefix``, the frozen layers are not run: their cached output is fed to the first trained one.
    ``labels``: the batches' labels on the host (``eval_labels``), read once per trial; else read here.
    ``feed``: how the model gets a batch (default: as it is); ``eval_graphs``: the pass as a CUDA graph."""

    def outputs() -> tuple[torch.Tensor, torch.Tensor]:
        return evaluation_outputs(model, batches, plan, device, prefix, feed or PaddedFeed())

    loss_sum, predicted = eval_graphs("trial", outputs) if eval_graphs is not None else outputs()
    labels = eval_labels(batches) if labels is None else labels
    predictions = predicted.cpu().numpy()
    regression, classes = labels.dtype.kind == "f", model.config.num_labels  # (the logits' width)
    metrics = compute_metrics(predictions, labels, regression=regression, num_labels=classes)
    return metrics, loss_sum.item() / len(labels), constant(predictions)


def evaluation_outputs(
    model: nn.Module,
    batches: list[Batch],
    plan: PrecisionPlan,
    device: torch.device,
    prefix: PrefixStates | None,
    feed: PaddedFeed,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The summed loss and every row's prediction, on the device: nothing read on the host (no sync per
    batch), so the pass can be a CUDA graph (trials/graphs.py ``EvalGraphs``)."""
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    predicted = []
    with (
        eval_mode(model),
        starting_at(model, prefix.layer, prefix.tuple_output)
        if prefix is not None
        else contextlib.nullcontext() as injector,
    ):
        for i, batch in enumerate(batches):
            batch = batch.to(device)
            if injector is not None:
                injector.states = prefix.states[i]
            with plan.autocast(cache=False):  # (a capture outlives no cast weight: trials/graphs.py)
                logits = feed.logits(model, batch)
            logits = logits.float()
            loss_sum += task_loss(logits, batch.labels, reduction="sum").double()
            predicted.append(logits.squeeze(-1) if batch.labels.is_floating_point() else logits.argmax(-1))
    return loss_sum, torch.cat(predicted)


def eval_labels(batches: list[Batch]) -> np.ndarray:
    """Every evaluation batch's labels, in order, on the host (one copy from the device)."""
    return torch.cat([b.labels for b in batches]).cpu().numpy()
