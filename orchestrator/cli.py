"""The ``freezesweep`` command line: one trial locally, or a whole sweep through Ray Tune."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="How many layers to freeze for the data you have: sweeps of fine-tunes into a Parquet store.")
console = Console()
err_console = Console(stderr=True)


@app.callback()
def _group() -> None:
    """freezesweep: run one trial, or launch/resume/inspect a sweep."""


def _quiet_libraries() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


@app.command()
def trial(
    model: Annotated[str, typer.Option(help="hub id or local model folder")],
    dataset: Annotated[str, typer.Option(help="glue/sst2, glue/cola, or a folder with train/validation files")],
    train_size: Annotated[int, typer.Option()],
    frozen_layers: Annotated[int, typer.Option(help="-1 embeddings only, 0 nothing, k embeddings + first k layers")],
    seed: Annotated[int, typer.Option()] = 0,
    split_seed: Annotated[int, typer.Option()] = 0,
    epochs: Annotated[Optional[float], typer.Option()] = None,
    data_dir: Annotated[Optional[str], typer.Option(help="folder of <task>/{train,validation}.parquet")] = None,
    max_eval_examples: Annotated[Optional[int], typer.Option()] = None,
    precision: Annotated[str, typer.Option(help="auto | fp16 | bf16 | fp32")] = "auto",
    model_init: Annotated[str, typer.Option(help="pretrained | random")] = "pretrained",
    text_column: Annotated[Optional[str], typer.Option()] = None,
    label_column: Annotated[Optional[str], typer.Option()] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the full result as JSON")] = False,
) -> None:
    """Run one trial locally, without Ray, and print its result."""
    _quiet_libraries()
    from trials.config import TrialConfig
    from trials.run import failed_result, run_trial

    overrides = {"epochs": epochs} if epochs is not None else {}
    cfg = TrialConfig(dataset=dataset, model=model, train_size=train_size, frozen_layers=frozen_layers, seed=seed,
                      split_seed=split_seed, data_dir=data_dir, max_eval_examples=max_eval_examples,
                      precision=precision, model_init=model_init, text_column=text_column,
                      label_column=label_column, **overrides)
    try:
        result = run_trial(cfg)
    except Exception as exc:  # the same row a sweep would store, and a failing exit code
        result = failed_result(cfg, exc)
    if as_json:
        print(json.dumps(result.to_dict(), default=str))
    else:
        _print_trial(result)
    raise typer.Exit(0 if result.status == "ok" else 1)


def _print_trial(result) -> None:
    table = Table(title=f"trial {result.trial_id}", show_header=False)
    fields = ["status", "best_val_accuracy", "best_epoch", "final_val_accuracy", "majority_baseline",
              "trainable_params", "total_params", "train_time_s", "eval_time_s", "wall_time_s",
              "train_examples_per_s", "peak_mem_mb", "device", "precision", "train_indices_digest", "error"]
    for name in fields:
        value = getattr(result, name)
        if value is not None:
            table.add_row(name, f"{value:.4f}" if isinstance(value, float) else str(value))
    console.print(table)


def main() -> None:  # python -m orchestrator.cli
    app()


if __name__ == "__main__":
    sys.exit(main())
