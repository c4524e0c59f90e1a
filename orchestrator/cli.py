"""The ``freezesweep`` command line: one trial locally, or a whole sweep through Ray Tune (the top layer).

Deferred on purpose: each command imports what it needs inside it, so that ``status`` or ``query`` never
pay the seconds that torch, transformers and Ray Tune take to import.
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import json
import signal
import sys
import warnings
from collections.abc import Callable, Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, NoReturn, Optional

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from freezesweep.orchestrator import api
from freezesweep.orchestrator.spec import DEFAULT_STORE, SpecError
from freezesweep.results.mlflow_export import TrackingError
from freezesweep.results.store import ResultStore, StoreError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="How many layers to freeze for the data you have: sweeps of fine-tunes into a Parquet store.",
)
# No markup in what is printed: errors, notes and table cells quote the user's data and files ("[', ']",
# "[1]"), which rich would read as its tags and drop. The one styled word is _fail's.
console = Console(width=None if sys.stdout.isatty() else 200, markup=False)
err_console = Console(stderr=True, soft_wrap=True, markup=False)


# The command this process runs (one per process), named in its errors: set by the group's callback.
_invoked: dict[str, str | None] = {"command": None}


@app.callback()
def _group(ctx: typer.Context) -> None:
    """freezesweep: run one trial, or launch/resume/inspect a sweep."""
    _invoked["command"] = ctx.invoked_subcommand
    warnings.showwarning = _show_warning


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """The API's warnings (rows left out) as the command's own lines, not Python's file:line form."""
    err_console.print(f"warning: {message}", highlight=False)


@app.command()
def trial(
    model: Annotated[str, typer.Option(help="hub id or local model folder")],
    dataset: Annotated[
        str,
        typer.Option(
            help="glue/<task> (sst2, cola, rte, mrpc, stsb, qnli, mnli, qqp), a folder with "
            "train/validation files, or TRAIN,VALIDATION files"
        ),
    ],
    train_size: Annotated[int, typer.Option(help="rows of the stratified, nested train subset")],
    frozen_layers: Annotated[
        Optional[str],
        typer.Option(
            metavar="K",
            help="freeze (needed with it): -1 embeddings only, 0 nothing, k embeddings + first k layers, all: every layer",
        ),
    ] = None,
    method: Annotated[str, typer.Option(help="freeze | lora | probe")] = "freeze",
    lora_rank: Annotated[Optional[int], typer.Option(help="lora: the adapters' rank")] = None,
    seed: Annotated[int, typer.Option(help="the trial's seed (head, batch order, dropout)")] = 0,
    split_seed: Annotated[int, typer.Option(help="draws the train subset")] = 0,
    epochs: Annotated[Optional[float], typer.Option(help="(default: 10, the reference protocol)")] = None,
    data_dir: Annotated[Optional[str], typer.Option(help="folder of <task>/{train,validation}.parquet")] = None,
    max_eval_examples: Annotated[
        Optional[int], typer.Option(help="a stratified validation sample of this many rows (default: every row)")
    ] = None,
    precision: Annotated[Optional[str], typer.Option(help="auto | fp16 | bf16 | fp32 (default: auto)")] = None,
    max_seq_length: Annotated[
        Optional[int], typer.Option(help="tokens kept of each example (default: 128, the reference protocol)")
    ] = None,
    model_init: Annotated[Optional[str], typer.Option(help="pretrained | random (default: pretrained)")] = None,
    text_column: Annotated[
        Optional[str], typer.Option(help="the text column (default: the GLUE task's, else sentence)")
    ] = None,
    text_pair_column: Annotated[Optional[str], typer.Option(help="second text of a sentence pair")] = None,
    label_column: Annotated[Optional[str], typer.Option(help="the label column (default: label)")] = None,
    empty_texts: Annotated[Optional[str], typer.Option(help="refuse (default) | drop: rows with an empty text")] = None,
    select_metric: Annotated[
        Optional[str], typer.Option(help="picks the best evaluation (default: the task's official metric)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the full result as JSON")] = False,
) -> None:
    """Run one trial locally, without Ray, and print its result: the cell a one-cell sweep of these
    options would run (its trial_id too), every problem of them named at once, before it starts."""
    api.quiet_libraries()
    from freezesweep.trials.run import failed_result, run_trial
    from freezesweep.trials.precision import cpu_precision_note

    training = {
        "epochs": epochs,
        "max_eval_examples": max_eval_examples,
        "precision": precision,
        "max_seq_length": max_seq_length,
        "model_init": model_init,
        "text_column": text_column,
        "text_pair_column": text_pair_column,
        "label_column": label_column,
        "empty_texts": empty_texts,
        "select_metric": select_metric,
    }
    one_cell = {
        "name": "trial",
        "model": model,
        "datasets": [dataset],
        "train_sizes": [train_size],
        "methods": [method],
        "frozen_layers": [] if frozen_layers is None else [frozen_layers],
        "lora_ranks": [] if lora_rank is None else [lora_rank],
        "seeds": [seed],
        "split_seed": split_seed,
        "data_dir": data_dir,
        "training": {k: v for k, v in training.items() if v is not None},
    }
    try:
        cfg = trial_cell(one_cell)
    except (SpecError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        _fail(exc)
    note = cpu_precision_note(precision or "auto") if cfg.gpus_per_trial == 0 else None
    if note:
        err_console.print(f"note: {note}", highlight=False)
    try:
        result = run_trial(cfg)
    except Exception as exc:  # the same row a sweep would store, and a failing exit code
        result = failed_result(cfg, exc)
    if as_json:
        print(json.dumps(result.to_dict(), default=str))
    else:
        _print_trial(result)
    raise typer.Exit(0 if result.status == "ok" else 1)


# The options' names in a one-cell spec, said beside its problems.
TRIAL_SOURCE = (
    "the trial's options, as a one-cell sweep (train_sizes: --train-size, frozen_layers: --frozen-layers, "
    "methods: --method, lora_ranks: --lora-rank, seeds: --seed, datasets: --dataset, data_dir: --data-dir, "
    "training.<key>: --<key>)"
)


def trial_cell(one_cell: dict[str, Any]):
    """The cell a one-cell sweep spec runs, checked by a sweep's own checks (the store's aside: a trial
    writes nothing), on this machine's GPU where it has one: its precision is resolved for it (``auto``)
    and fp16 is allowed there, as the trial runs with no device set (trials/precision.py)."""
    import dataclasses

    import torch

    from freezesweep.orchestrator.checks import validate
    from freezesweep.orchestrator.plan import build_grid
    from freezesweep.orchestrator.sweeps import resolve_here

    gpus = 1.0 if torch.cuda.is_available() else 0.0
    spec = validate({**one_cell, "resources": {"gpus_per_trial": gpus}}, TRIAL_SOURCE, devices=False, stored=False)
    [cell] = build_grid(resolve_here(spec))
    return dataclasses.replace(cell, gpus_per_trial=gpus)


def _print_trial(result) -> None:
    table = Table(title=f"trial {result.trial_id}", show_header=False)
    fields = [
        "status",
        "select_metric",
        "best_val_score",
        "best_epoch",
        "final_val_score",
        "baseline_score",
        "best_val_accuracy",
        "majority_baseline",
        "trainable_params",
        "total_params",
        "train_time_s",
        "eval_time_s",
        "wall_time_s",
        "train_examples_per_s",
        "peak_mem_mb",
        "device",
        "precision",
        "train_indices_digest",
        "error",
    ]
    for name in fields:
        value = getattr(result, name)
        if value is not None:
            table.add_row(name, f"{value:.4f}" if isinstance(value, float) else str(value))
    for name, value in result.best_val_metrics.items():  # the task's other metrics at the best evaluation
        if name != "accuracy":  # best_val_accuracy is above
            table.add_row(f"best_val_{name}", f"{value:.4f}")
    console.print(table)


StoreOpt = Annotated[
    Optional[str], typer.Option("--store", help=f"store root (default: the spec's, else {DEFAULT_STORE})")
]
# A stored sweep's commands: the name alone knows no spec, so the store is ./sweeps unless told.
SweepStoreOpt = Annotated[
    Optional[str],
    typer.Option(
        "--store",
        help=f"store root (default: {DEFAULT_STORE}; where SWEEP is the spec file, the store it names)",
    ),
]
SweepArg = Annotated[
    str,
    typer.Argument(
        metavar="SWEEP", help="the sweep's name, or the spec file it was launched from (which names its store too)"
    ),
]


class OutputFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


def _fail(exc: Exception | str, code: int = 2) -> None:
    """The error, naming the command that was run (``freezesweep report: …``), and its exit code."""
    command = f"freezesweep {_invoked['command']}: " if _invoked["command"] else ""
    err_console.print(f"[red]{command}error:[/red] {escape(str(exc))}", markup=True, highlight=False)
    raise typer.Exit(code)


def _run_launch(run: Callable[[], Any], sweep: Callable[[], str]) -> None:
    """A launch or resume through the API; exit codes: 0 done, 1 some cells failed, 2 refused, 3 rows
    kept in the spool, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM)."""
    try:  # a second of Ray's import: a Ctrl-C there exited 130 without a word (a walk-through)
        from freezesweep.orchestrator.ray_session import RayStartFailed, RayUnreachable
        from freezesweep.orchestrator.spec import SpecError
        from freezesweep.results.lock import SweepLocked
        from freezesweep.results.store import StoreUnavailable
    except KeyboardInterrupt:
        err_console.print("interrupted before anything started: nothing was written", highlight=False)
        exit_interrupted(130)

    terminated = []
    try:
        with api.sigterm_as_interrupt() as terminated, warnings.catch_warnings():  # also around validation
            warnings.simplefilter("ignore", api.UnfinishedCellsWarning)  # said below, with the command to run
            summary = run()
    except (SweepLocked, SpecError, StoreError, RayUnreachable, RayStartFailed) as exc:
        _fail(exc)
    except StoreUnavailable as exc:
        _fail(exc, code=3)
    except KeyboardInterrupt:  # before or after Tune ran (Tune itself stops gracefully and returns)
        err_console.print(f"interrupted: nothing was lost; {sweep()}", highlight=False)
        exit_interrupted(143 if terminated else 130)
    _print_summary(summary, stopped=143 if summary.terminated or terminated else 130)


def exit_interrupted(code: int) -> NoReturn:
    """Exit 130 (Ctrl-C) or 143 (SIGTERM), whatever comes next: a second Ctrl-C while Ray shuts down at
    exit raised in its atexit callback, and the process ended 1, read as failed cells (a walk-through).
    Ignored from the interpreter's exit on: atexit runs this before Ray's own shutdown, registered at
    ray.init (last in, first out); not now, since a process started until then would inherit it."""
    atexit.register(signal.signal, signal.SIGINT, signal.SIG_IGN)
    raise typer.Exit(code) from None


def _print_summary(summary, stopped: int) -> None:
    recovered = f", {summary.recovered} recovered from Ray's state" if summary.recovered else ""
    if summary.gpu_packing:
        console.print(summary.gpu_packing, highlight=False)
    retried = (
        f" ({summary.oom_retried} run again with twice the GPU share after running out of memory)"
        if summary.oom_retried
        else ""
    )
    console.print(
        f"sweep {summary.sweep}: {summary.total} cells, {summary.already_ok} already done{recovered}, "
        f"ran {summary.ran}: {summary.ok} ok, {summary.failed} failed/oom{retried}"
        + (f", {summary.diverged} diverged (a non-finite loss: final, not run again)" if summary.diverged else "")
    )
    if summary.not_needed:
        console.print(
            f"settle mode: {summary.not_needed} of the grid's cells not run: each group's rounds stopped once it was "
            f"decided or at its budget (`freezesweep report {summary.sweep}{api.store_flag(summary.store)}` says which)"
        )
    console.print(f"store: {summary.store}/{summary.sweep}/results/")
    # the store as the launch named it: a spec's own `store:` is not where `resume NAME` looks by default
    resume = f"`freezesweep resume {summary.sweep}{api.store_flag(summary.store)}`"
    if summary.unfinished:
        why = "stopped by SIGTERM" if stopped == 143 else "interrupted"
        console.print(f"{summary.unfinished} cells not finished ({why}): {resume} runs them")
        exit_interrupted(stopped)
    if summary.failed:
        console.print(
            f"{resume} runs the failed cells again; `freezesweep status {summary.sweep}"
            f"{api.store_flag(summary.store)}` lists why each failed"
        )
        raise typer.Exit(1)


AddressOpt = Annotated[
    Optional[str], typer.Option(help="Ray cluster address (default: the spec's, else RAY_ADDRESS, else a local Ray)")
]


def _go_on(spec_path: Path, store: str | None) -> str:
    """What continues a launch interrupted before its end: `resume` given the spec file (it names the sweep
    and its store) once the sweep is stored, else the launch again (interrupted while validating)."""
    try:
        raw = yaml.safe_load(spec_path.read_text())
        stored = ResultStore(store or raw.get("store") or DEFAULT_STORE, raw["name"]).exists()
    except Exception:  # a hint must not fail: the launch again is always right
        stored = False
    if stored:
        return f"`freezesweep resume {spec_path}{_store_flag(store)}` continues the sweep"
    return f"nothing was stored yet: `freezesweep launch {spec_path}{_store_flag(store)}` starts it"


def _store_flag(store: str | None) -> str:
    return f" --store {store}" if store else ""


@app.command()
def launch(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="sweep spec YAML")],
    store: StoreOpt = None,
    address: AddressOpt = None,
) -> None:
    """Validate a spec, then run every cell that has no ok row yet."""
    _run_launch(lambda: api.launch(spec_path, store=store, address=address), lambda: _go_on(spec_path, store))


@app.command()
def resume(sweep: SweepArg, store: SweepStoreOpt = None, address: AddressOpt = None) -> None:
    """Run the cells of a stored sweep that have no ok row (failed ones are retried)."""
    again = f"`freezesweep resume {sweep}{_store_flag(store)}` continues the sweep"
    _run_launch(lambda: api.resume(sweep, store=store, address=address), lambda: again)


@app.command()
def plan(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="sweep spec YAML")], store: StoreOpt = None
) -> None:
    """A dry run: the grid's cells per axis, done and pending against the store, and the work left as
    measured trial times price it (its own, or the store's other sweeps' under the same protocol); a settle
    sweep's next round, and its whole budget left at most. Nothing starts."""
    from freezesweep.orchestrator.spec import SpecError
    from freezesweep.results.query import collapse_long_axes

    try:
        planned = api.plan(spec_path, store=store)
    except (SpecError, StoreError) as exc:
        _fail(exc)
    cells, pending = len(planned.cells), len(planned.pending)
    if planned.settle:  # settle mode runs what the rows call for, round by round: the next one is known
        console.print(
            f"sweep {planned.name}: settle mode, at most {cells:,} cells ({planned.size_words}); "
            f"{planned.done:,} done, the next round runs {pending:,}"
            + ("" if pending else ": settled, or at its budget"),
            highlight=False,
        )
    else:
        console.print(
            f"sweep {planned.name}: {cells:,} cells ({planned.size_words}), {planned.done:,} done, "
            f"{pending:,} to run in {planned.rounds} round(s)",
            highlight=False,
        )
    for note in planned.notes:
        console.print(f"note: {note}", highlight=False)
    if planned.gpus_here:
        console.print(planned.gpus_here, highlight=False)
    _print_frame(collapse_long_axes(planned.status), OutputFormat.table, f"sweep {planned.name}: cells per axis")
    _print_work(planned)
    console.print("nothing was started", highlight=False)


def _print_work(planned) -> None:
    """The pending cells' price; in settle mode, that of its next round and of the whole budget left at
    most (what a report's open group quotes for a new settle sweep), at the same measured times."""
    settle = planned.budget is not None
    if not planned.pending:  # "about 0 s of trials (… 0 of 0 pending cells priced …)" said nothing
        done = "the sweep is settled or at its budget" if settle else "every cell of the grid is done"
        console.print(f"work: none, {done}", highlight=False)
        return
    prices = [("work", planned.work, len(planned.pending), planned.priced_from, False)]
    if settle:
        prices = [
            ("work of the next round", *prices[0][1:]),
            (
                "work of the whole budget left",
                planned.budget_work,
                len(planned.budget),
                planned.budget_priced_from,
                True,
            ),
        ]
    if all(estimate is None for _, estimate, *_ in prices):
        console.print(
            "work: no measured trial of these kinds in the store yet (this sweep's, or another's under the same "
            "protocol) to estimate it from",
            highlight=False,
        )
        return
    for what, estimate, cells, priced_from, upper_bound in prices:
        _print_price(planned, what, estimate, cells, priced_from, upper_bound)


def _print_price(
    planned, what: str, estimate, cells: int, priced_from: tuple[str, ...], upper_bound: bool = False
) -> None:
    """One price (``plan.estimate_work``); a settle sweep's whole budget is an upper bound: each of its
    groups stops once it is decided."""
    if estimate is None:
        console.print(f"{what}: no measured trial of its {cells:,} cells' kinds to estimate it from", highlight=False)
        return
    others = ", ".join(priced_from)
    elsewhere = f", with rows of sweep(s) {others} run under the same protocol" if others else ""
    rest = cells - estimate.measured_cells
    # the rest: plan.estimate_work's fallbacks (a walk-through asked how "the other 3" were priced)
    rest_words = f"; the other {rest:,} by their model, dataset and train size, else every measured row" if rest else ""
    about, kind = ("at most about", "cells not done of the open groups") if upper_bound else ("about", "pending cells")
    until = ", were every open group to run to settle.max_seeds (each stops once decided)" if upper_bound else ""
    # fewer cells than slots run one a slot (an AVX2 walk-through's one-cell round was priced at half its time)
    at_once = min(planned.trials_at_once, cells)
    slots = "" if at_once == planned.trials_at_once else f" of {planned.trials_at_once}"
    console.print(
        f"{what}: {about} {_hours(estimate.trial_s)} of trials{until} (from {estimate.measured_rows:,} measured rows"
        f"{elsewhere}: {estimate.measured_cells:,} of {cells:,} {kind} priced by rows of their own kind{rest_words}); "
        f"{about} {_hours(estimate.trial_s / at_once)} at {at_once}{slots} trial(s) at once (this machine's cores, or "
        "max_concurrent_trials)",
        highlight=False,
    )


def _hours(seconds: float) -> str:
    """A duration as people read it: ``40 s``, ``12 min``, ``3.4 h`` (a small sweep was "0.00 h")."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:,.1f} h"


@contextlib.contextmanager
def _reading(sweep: str) -> Iterator[None]:
    """A stored sweep's command: its SpecError (no such sweep, a damaged spec.yaml) and StoreError (a store
    that is a file, or cannot be read) as the command's one-line error."""
    try:
        yield
    except (SpecError, StoreError) as exc:
        _fail(exc)


@app.command()
def status(sweep: SweepArg, store: SweepStoreOpt = None) -> None:
    """done / failed / missing cells per axis value, and the nodes (Ray node ids) the rows ran on."""
    from freezesweep.results.query import collapse_long_axes, mps_summary

    with _reading(sweep):
        found = api.status(sweep, store=store)
    for note in found.notes:  # an interrupted compaction, a stale lock
        err_console.print(note, highlight=False)
    _print_frame(collapse_long_axes(found.table), OutputFormat.table, f"sweep {found.name}")
    if found.nodes is not None:
        _print_frame(found.nodes, OutputFormat.table, f"rows ran on {len(found.nodes)} node(s), {found.gpus} GPU(s)")
        mps = mps_summary(found.nodes)
        if mps:
            console.print(mps, highlight=False)
    if found.failures is not None and len(found.failures):
        _print_frame(
            found.failures, OutputFormat.table, "why the failed cells failed (each row's `error` has it whole)"
        )


@app.command()
def query(
    sweep: SweepArg,
    store: SweepStoreOpt = None,
    sql: Annotated[str, typer.Option("--sql", help="SQL over the table `results`")] = api.QUERY_SQL,
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """SQL (DuckDB) over the sweep's rows."""
    with _reading(sweep):
        try:
            frame = api.query(sweep, sql, store=store)
        except Exception as exc:  # a SQL error is the user's to fix: say it plainly
            _fail(exc)
    _print_frame(frame, fmt, f"{api.located(sweep)[0]}: {len(frame)} row{'s' * (len(frame) != 1)}")


@app.command()
def summary(
    sweep: SweepArg,
    store: SweepStoreOpt = None,
    metric: Annotated[
        Optional[str],
        typer.Option(help="another recorded metric (accuracy, f1, matthews, pearson, spearman) at the best evaluation"),
    ] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
) -> None:
    """The selected metric at the best evaluation per dataset × train size × frozen layers (mean, median, std, min,
    max); with several models or methods, per model and method too (a LoRA cell by its rank, a probe on its own)."""
    with _reading(sweep):
        try:
            table = api.summary(sweep, store=store, metric=metric)
        except ValueError as exc:  # an unknown metric, or no such sweep (SpecError)
            _fail(exc)
    what = metric or "the selected metric"
    _print_frame(table, fmt, f"sweep {api.located(sweep)[0]}: {what} at the best evaluation, over seeds")


WIDE_TABLE_COLUMNS = 12  # more than a terminal's table shows legibly


def _print_frame(frame, fmt: OutputFormat, title: str) -> None:
    if fmt is OutputFormat.csv:
        print(nested_as_json(frame).to_csv(index=False), end="")
    elif fmt is OutputFormat.json:
        print(_json_records(frame))
    else:
        table = Table(title=title)
        for column in frame.columns:
            table.add_column(str(column), justify="right" if frame[column].dtype.kind in "if" else "left")
        for row in frame.itertuples(index=False):
            table.add_row(*(f"{v:.4f}" if isinstance(v, float) else str(v) for v in row))
        console.print(table)
        if (
            len(frame.columns) > WIDE_TABLE_COLUMNS
        ):  # `SELECT *` printed 74 columns squeezed to nothing (a walk-through)
            console.print(f"({len(frame.columns)} columns: --format csv or json writes them whole)", highlight=False)


def _jsonable(value: Any) -> Any:
    """``value`` as json writes it, at any depth: numpy's arrays and scalars as lists and numbers, times
    as ISO text, missing and non-finite numbers as null (json would write NaN and Infinity, which no
    strict reader takes: DuckDB's 1.0/0 is inf)."""
    import math

    import numpy as np
    import pandas as pd

    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int)):  # bool is an int
        return value
    if value is pd.NaT or value is pd.NA:
        return None
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


JSON_CHUNK_ROWS = 1_000  # rows made Python objects at a time: a query's every row (and curve) never at once


def _json_records(frame) -> str:
    """The rows as JSON records, each value as stored: floats to their last digit, times as ISO text (as
    CSV writes them), null where missing or not finite. pandas' to_json cut floats to 10 digits, wrote
    times as epoch milliseconds and '/' as '\\/' (a walk-through)."""
    records = (
        json.dumps(_jsonable(record), allow_nan=False)
        for start in range(0, len(frame), JSON_CHUNK_ROWS)
        for record in frame.iloc[start : start + JSON_CHUNK_ROWS].to_dict(orient="records")
    )
    return "[" + ", ".join(records) + "]"


def nested_as_json(frame):
    """A CSV cell holding a list or a mapping (a row's eval_curve) as JSON: Python's repr put single quotes,
    None and newlines in the field (a walk-through)."""
    import numpy as np

    nested = [c for c in frame.columns if frame[c].map(lambda v: isinstance(v, (np.ndarray, list, tuple, dict))).any()]
    cells = {c: frame[c].map(lambda v: json.dumps(_jsonable(v)) if v is not None else None) for c in nested}
    return frame.assign(**cells) if cells else frame


@app.command()
def report(
    sweeps: Annotated[
        list[str],
        typer.Argument(metavar="SWEEP...", help="one or more sweeps (names or spec files), side by side"),
    ],
    out: Annotated[Path, typer.Option("--out", help="folder for index.html, report.md and figures/")],
    store: SweepStoreOpt = None,
    tolerance: Annotated[
        Optional[float],
        typer.Option(
            help="the tolerance the sweeps asked (a fixed grid's `tolerance:`, 0.01 unless given; a settle sweep's "
            "settle.tolerance), as a check: another is refused, since one chosen after reading the rows voids the confidence"
        ),
    ] = None,
) -> None:
    """The decision (how many layers to freeze per train size), figures, paired statistics: an HTML report."""
    with _reading(", ".join(sweeps)):
        built = api.report(sweeps, out, store=store, tolerance=tolerance)
    for line in [*built.decisions["sentence"], *built.completeness, *api.budget_prices(built.decisions, sweeps, store)]:
        console.print(line, highlight=False, soft_wrap=True)
    console.print(f"report: {out / 'index.html'} (and report.md)")


@app.command()
def compact(sweep: SweepArg, store: SweepStoreOpt = None) -> None:
    """Compact a sweep's final rows into Parquet parts (a launch also does it between rounds): readers
    then open tens of files, not one per cell. Takes the sweep's lock; crash-safe."""
    from freezesweep.results.lock import SweepLocked

    with _reading(sweep):
        try:
            compacted = api.compact(sweep, store=store, on_note=lambda note: err_console.print(note, highlight=False))
        except SweepLocked as exc:
            _fail(exc)
    console.print(
        f"sweep {api.located(sweep)[0]}: {compacted} row file(s) compacted" + (" into one part" if compacted else ""),
        highlight=False,
    )


export_app = typer.Typer(no_args_is_help=True, help="A sweep's rows to another tool.")
app.add_typer(export_app, name="export")


@export_app.callback()
def _export_group(ctx: typer.Context) -> None:
    _invoked["command"] = f"export {ctx.invoked_subcommand}"  # errors say `freezesweep export mlflow:`


@export_app.command("mlflow")
def export_mlflow(
    sweep: SweepArg,
    store: SweepStoreOpt = None,
    tracking_uri: Annotated[
        Optional[str],
        typer.Option(
            help="MLflow tracking URI: a server (http://host:5000) or a SQLite file (sqlite:///mlflow.db); "
            "default: MLFLOW_TRACKING_URI, else MLflow's own sqlite:///mlflow.db in this folder"
        ),
    ] = None,
    experiment: Annotated[Optional[str], typer.Option(help="MLflow experiment (default: the sweep's name)")] = None,
) -> None:
    """Every row of a sweep as an MLflow run: axes and protocol as params, best and final metrics, the evaluation
    curve as stepped metrics, status/node/precision as tags. Run again: adds only rows MLflow lacks."""
    with _reading(sweep):
        try:
            done = api.export_mlflow(sweep, store=store, tracking_uri=tracking_uri, experiment=experiment)
        except (SpecError, StoreError):  # no such sweep, no such store: the command's own error, not MLflow's
            raise
        except ImportError as exc:
            _fail(
                f"MLflow is not installed ({exc}): pip install -e '.[mlflow]' in a checkout, or 'freezesweep[mlflow]'"
            )
        except TrackingError as exc:  # a folder, or no server answering: found out before any row
            _fail(f"nothing exported: {exc}")
        except Exception as exc:  # the server refusing, or gone mid-way: said plainly, no traceback
            _fail(f"MLflow export to {tracking_uri or 'the default tracking URI'} failed: {type(exc).__name__}: {exc}")
    console.print(
        f"sweep {api.located(sweep)[0]}: {done.added} run(s) added, {done.replaced} replaced by a newer row, "
        f"{done.unchanged} already in MLflow (experiment id {done.experiment_id} at {done.tracking_uri})",
        highlight=False,
    )


def _one_line_summaries(*apps: typer.Typer) -> None:
    """Each command's first docstring paragraph as one line in the command list: there typer's rich help
    keeps every line break of the source (typer.rich_utils._make_command_help), cutting a summary mid-line;
    its own page reflows it."""
    for info in (info for group in apps for info in group.registered_commands):
        doc = info.help or (info.callback.__doc__ if info.callback else None) or ""
        info.short_help = info.short_help or " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


_one_line_summaries(app, export_app)


def main() -> None:  # python -m freezesweep.orchestrator.cli
    app()


if __name__ == "__main__":
    main()  # the app exits with its command's code
