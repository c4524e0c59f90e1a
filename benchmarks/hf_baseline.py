"""The reference study's loop, written plainly with the Hugging Face ``Trainer``: the baseline that
freezesweep's speed is measured against (``benchmarks/grid_speed.py``).

Per trial, as the study ran it: the dataset read and tokenized, the pretrained
model loaded from disk, evaluation *and a checkpoint* every half epoch, the best model kept
(``load_best_model_at_end``), one trial at a time with every core. The work is the same as a
freezesweep cell's: the same nested stratified train rows, the same frozen layers, the same
schedule (HF Trainer semantics are what freezesweep reproduces), the same seed for the new head,
and the precision freezesweep resolves on this machine (``bf16=True``/``fp16=True`` as a user would
set them). Only the data order and dropout draws differ (the Trainer's own RNG use), so per-cell
accuracies agree in distribution, not bit for bit.

Needs ``accelerate`` (the Trainer's dependency): ``pip install accelerate``.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # before the heavy imports: nothing to run here
    print(
        "benchmarks/hf_baseline.py is a module (the HF Trainer baseline) used by benchmarks/grid_speed.py: "
        "run `python benchmarks/grid_speed.py --help` for the comparison",
        file=sys.stderr,
    )
    sys.exit(2)

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import pandas as pd
import transformers
from transformers import AutoTokenizer, DataCollatorWithPadding, Trainer, TrainerCallback, TrainingArguments, set_seed
from transformers.trainer_callback import PrinterCallback

from freezesweep.trials.config import TrialConfig
from freezesweep.trials.data import load_task
from freezesweep.trials.freezing import freeze
from freezesweep.trials.model import build_model, resolve_model_path
from freezesweep.trials.run import eval_rows
from freezesweep.trials.subsets import subset_indices
from freezesweep.trials.train import steps_for


@dataclass(frozen=True)
class BaselineResult:
    best_val_accuracy: float
    wall_time_s: float
    train_time_s: float  # inside optimizer steps
    eval_time_s: float  # inside evaluations
    checkpoint_time_s: float  # writing the per-evaluation checkpoints


class _Clock(TrainerCallback):
    """Splits a Trainer run into steps, evaluations and checkpoint writes."""

    def __init__(self):
        self.train_s = self.eval_s = self.save_s = 0.0
        self._step_started = self._eval_ended = None

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.train_s += time.perf_counter() - self._step_started

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.eval_s += metrics["eval_runtime"]
        self._eval_ended = time.perf_counter()

    def on_save(self, args, state, control, **kwargs):
        self.save_s += time.perf_counter() - self._eval_ended


class _NoFinalEvaluation(TrainerCallback):
    """transformers 5 evaluates (and saves) at the last step even off the evaluation stride; the
    reference's Trainer did not (its 18 evaluations at n = 200). Runs after DefaultFlowCallback."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == state.max_steps and state.global_step % args.eval_steps:
            control.should_evaluate = control.should_save = False


def _accuracy(prediction) -> dict[str, float]:
    return {"accuracy": float((np.argmax(prediction.predictions, -1) == prediction.label_ids).mean())}


def run_baseline_trial(cfg: TrialConfig, precision: str) -> BaselineResult:
    """One cell the reference study's way. ``cfg.data_dir`` must hold the task's Parquet files."""
    started = time.perf_counter()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    task = load_task(cfg.dataset, cfg.data_dir, cfg.text_column, cfg.label_column)  # the rows, for the subset
    rows = subset_indices(task.train.labels, cfg.train_size, cfg.split_seed)
    folder = Path(cfg.data_dir) / cfg.dataset.split("/")[-1]
    path = resolve_model_path(cfg.model)
    tokenizer = AutoTokenizer.from_pretrained(path)

    text, label = cfg.text_column or "sentence", cfg.label_column or "label"

    def tokenized(split: str, keep=None) -> list[dict]:
        frame = pd.read_parquet(folder / f"{split}.parquet")
        frame = frame.iloc[keep] if keep is not None else frame
        encoded = tokenizer(frame[text].tolist(), truncation=True, max_length=cfg.max_seq_length)
        return [{**{k: v[i] for k, v in encoded.items()}, "labels": int(y)} for i, y in enumerate(frame[label])]

    train, validation = tokenized("train", rows), tokenized("validation", eval_rows(task, cfg))
    set_seed(cfg.derived_seed)  # the same new head as freezesweep's cell
    model = build_model(cfg.model, task.num_labels, cfg.model_init)  # from_pretrained, or a random init
    freeze(model, cfg.frozen_layers)
    every = steps_for(cfg.eval_every_epochs, cfg.train_size, cfg.batch_size)
    out = Path(tempfile.mkdtemp(prefix="hf-baseline-"))
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate,
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        num_train_epochs=cfg.epochs,
        lr_scheduler_type="linear",
        warmup_steps=steps_for(cfg.warmup_epochs, cfg.train_size, cfg.batch_size),
        eval_strategy="steps",
        eval_steps=every,
        save_strategy="steps",
        save_steps=every,
        load_best_model_at_end=True,
        metric_for_best_model="accuracy",
        save_total_limit=2,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        use_cpu=not torch.cuda.is_available(),
        seed=cfg.derived_seed,
        report_to=[],
        logging_strategy="no",
        disable_tqdm=True,
    )
    clock = _Clock()
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=validation,
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
        compute_metrics=_accuracy,
        callbacks=[_NoFinalEvaluation(), clock],
    )
    trainer.remove_callback(PrinterCallback)  # no metrics dict printed per evaluation
    try:
        trainer.train()
        best = max(entry["eval_accuracy"] for entry in trainer.state.log_history if "eval_accuracy" in entry)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return BaselineResult(
        best_val_accuracy=best,
        wall_time_s=time.perf_counter() - started,
        train_time_s=clock.train_s,
        eval_time_s=clock.eval_s,
        checkpoint_time_s=clock.save_s,
    )
