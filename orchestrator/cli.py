"""The ``freezesweep`` command line: one trial locally, or a whole sweep through Ray Tune (the top layer).

Deferred on purpose: each command imports what it needs inside it, so that ``status`` or ``query`` never
pay the seconds that torch, transformers and Ray Tune take to import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import sys
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="How many layers to freeze for the data you have: sweeps of fine-tunes into a Parquet store.")
console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, soft_wrap=True)


# The command this process runs (one per process), named in its errors: set by the group's callback.
_invoked = {"command": None}


@app.callback()
def _group(ctx: typer.Context) -> None:
    """freezesweep: run one trial, or launch/resume/inspect a sweep."""
    _invoked["command"] = ctx.invoked_subcommand


def _quiet_libraries() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


@app.command()
def trial(
    model: Annotated[str, typer.Option(help="hub id or local model folder")],
    dataset: Annotated[str, typer.Option(help="glue/<task> (sst2, cola, rte, mrpc, stsb, qnli, mnli, qqp), a folder with "
                                               "train/validation files, or TRAIN,VALIDATION files")],
    train_size: Annotated[int, typer.Option()],
    frozen_layers: Annotated[Optional[int], typer.Option(
        help="freeze: -1 embeddings only, 0 nothing, k embeddings + first k layers")] = None,
    method: Annotated[str, typer.Option(help="freeze | lora | probe")] = "freeze",
    lora_rank: Annotated[Optional[int], typer.Option(help="lora: the adapters' rank")] = None,
    seed: Annotated[int, typer.Option()] = 0,
    split_seed: Annotated[int, typer.Option()] = 0,
    epochs: Annotated[Optional[float], typer.Option()] = None,
    data_dir: Annotated[Optional[str], typer.Option(help="folder of <task>/{train,validation}.parquet")] = None,
    max_eval_examples: Annotated[Optional[int], typer.Option()] = None,
    precision: Annotated[Optional[str], typer.Option(help="auto | fp16 | bf16 | fp32 (default: auto)")] = None,
    model_init: Annotated[Optional[str], typer.Option(help="pretrained | random (default: pretrained)")] = None,
    text_column: Annotated[Optional[str], typer.Option()] = None,
    text_pair_column: Annotated[Optional[str], typer.Option(help="second text of a sentence pair")] = None,
    label_column: Annotated[Optional[str], typer.Option()] = None,
    empty_texts: Annotated[Optional[str], typer.Option(help="refuse (default) | drop: rows with an empty text")] = None,
    select_metric: Annotated[Optional[str], typer.Option(
        help="picks the best evaluation (default: the task's official metric)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the full result as JSON")] = False,
) -> None:
    """Run one trial locally, without Ray, and print its result."""
    _quiet_libraries()
    from freezesweep.orchestrator.spec import TrainingSpec, method_fields
    from freezesweep.trials.config import TrialConfig
    from freezesweep.trials.data import DatasetError, official_metric
    from freezesweep.trials.precision import PrecisionError, resolve_config
    from freezesweep.trials.run import check_method, failed_result, run_trial

    given = {"epochs": epochs, "max_eval_examples": max_eval_examples, "precision": precision, "model_init": model_init,
             "text_column": text_column, "text_pair_column": text_pair_column, "label_column": label_column,
             "empty_texts": empty_texts}
    try:
        # the protocol as a sweep's cell gets it: the spec's training section, its defaults TrialConfig's
        protocol = TrainingSpec(**{k: v for k, v in given.items() if v is not None})
        select_metric = select_metric or official_metric(dataset, data_dir, text_column, label_column, text_pair_column,
                                                         protocol.empty_texts)
        cfg = TrialConfig(dataset=dataset, model=model, train_size=train_size, frozen_layers=frozen_layers, seed=seed,
                          method=method, lora_rank=lora_rank, **method_fields(method), split_seed=split_seed,
                          data_dir=data_dir, select_metric=select_metric, **protocol.trial_fields())
        cfg = resolve_config(cfg)  # "auto" → what this machine runs natively; the row names it
        check_method(cfg)
    except (PrecisionError, DatasetError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        _fail(exc)
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
    fields = ["status", "select_metric", "best_val_score", "best_epoch", "final_val_score", "baseline_score",
              "best_val_accuracy", "majority_baseline", "trainable_params", "total_params", "train_time_s",
              "eval_time_s", "wall_time_s", "train_examples_per_s", "peak_mem_mb", "device", "precision", "train_indices_digest", "error"]
    for name in fields:
        value = getattr(result, name)
        if value is not None:
            table.add_row(name, f"{value:.4f}" if isinstance(value, float) else str(value))
    for name, value in result.best_val_metrics.items():  # the task's other metrics at the best evaluation
        if name != "accuracy":  # best_val_accuracy is above
            table.add_row(f"best_val_{name}", f"{value:.4f}")
    console.print(table)


StoreOpt = Annotated[Optional[str], typer.Option("--store", help="store root (default: the spec's, else ./sweeps)")]


class OutputFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


def _fail(exc: Exception, code: int = 2) -> None:
    """The error, naming the command that was run (``freezesweep report: …``), and its exit code."""
    command = f"freezesweep {_invoked['command']}: " if _invoked["command"] else ""
    err_console.print(f"[red]{command}error:[/red] {exc}", highlight=False)
    raise typer.Exit(code)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[list[int]]:
    """SIGTERM (a scheduler or ``kill`` stopping the driver) handled like Ctrl-C: Tune stops its trials,
    the lock is released, Ray shuts down on the way out. Yields the signals received."""
    received: list[int] = []

    def on_term(signum, frame) -> None:
        received.append(signum)
        signal.raise_signal(signal.SIGINT)  # Tune's graceful stop while it runs; KeyboardInterrupt elsewhere

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_launch(raw, source: str) -> None:
    """Validate (against the cluster when there is one), then launch; exit codes: 0 done, 1 some cells
    failed, 2 refused, 3 rows kept in the spool, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM)."""
    from freezesweep.orchestrator.checks import data_notes, validate
    from freezesweep.orchestrator.launch import StoreUnavailable, launch
    from freezesweep.orchestrator.ray_session import RaySession, RayUnreachable
    from freezesweep.orchestrator.spec import LARGE_GRID, SpecError
    from freezesweep.results.lock import SweepLocked

    _quiet_libraries()
    session = RaySession(raw.get("address") if isinstance(raw, dict) else None)
    with _sigterm_as_interrupt() as terminated:
        try:
            spec = validate(raw, source, cluster=session)
            for note in data_notes(spec):
                err_console.print(f"note: {note}", highlight=False)
            if spec.cell_count() > LARGE_GRID:
                err_console.print(f"a large grid: {spec.cell_count():,} cells ({spec.cell_count_words()}), run in "
                                  f"rounds of {spec.resources.cells_per_round:,}", highlight=False)
            summary = launch(spec, session=session)
        except (SweepLocked, SpecError, RayUnreachable) as exc:
            _fail(exc)
        except StoreUnavailable as exc:
            _fail(exc, code=3)
        except KeyboardInterrupt:  # before or after Tune ran (Tune itself stops gracefully and returns)
            err_console.print("interrupted: nothing was lost; `freezesweep resume` continues the sweep", highlight=False)
            raise typer.Exit(143 if terminated else 130) from None
    _print_summary(spec, summary, stopped=143 if terminated else 130)


def _print_summary(spec, summary, stopped: int) -> None:
    recovered = f", {summary.recovered} recovered from Ray's state" if summary.recovered else ""
    if summary.gpu_packing:
        console.print(summary.gpu_packing, highlight=False)
    retried = f" ({summary.oom_retried} run again with twice the GPU share after running out of memory)" \
        if summary.oom_retried else ""
    console.print(f"sweep {spec.name}: {summary.total} cells, {summary.already_ok} already done{recovered}, "
                  f"ran {summary.ran}: {summary.ok} ok, {summary.failed} failed/oom{retried}"
                  + (f", {summary.diverged} diverged (a non-finite loss: final, not run again)" if summary.diverged else ""))
    console.print(f"store: {spec.store}/{spec.name}/results/")
    if summary.unfinished:
        console.print(f"{summary.unfinished} cells not finished (interrupted): `freezesweep resume {spec.name}` runs them")
        raise typer.Exit(stopped)
    if summary.failed:
        raise typer.Exit(1)


@app.command()
def launch(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="sweep spec YAML")],
    store: StoreOpt = None,
    address: Annotated[Optional[str], typer.Option(help="Ray cluster address (default: RAY_ADDRESS, else a local Ray)")] = None,
) -> None:
    """Validate a spec, then run every cell that has no ok row yet."""
    from freezesweep.orchestrator.spec import SpecError, read_yaml

    try:
        raw = read_yaml(spec_path, overrides={"store": store, "address": address})
    except SpecError as exc:
        _fail(exc)
    _run_launch(raw, str(spec_path))


@app.command()
def resume(sweep: str, store: StoreOpt = None,
           address: Annotated[Optional[str], typer.Option(help="Ray cluster address")] = None) -> None:
    """Run the cells of a stored sweep that have no ok row (failed ones are retried)."""
    from freezesweep.orchestrator.spec import SpecError
    from freezesweep.orchestrator.sweeps import stored_spec

    try:
        spec = stored_spec(sweep, store or "./sweeps")  # validated in full just below, with the cluster
    except SpecError as exc:
        _fail(exc)
    raw = {**spec.model_dump(mode="json"), "store": store or spec.store, "address": address or spec.address}
    _run_launch(raw, f"{store or './sweeps'}/{sweep}/spec.yaml")


@app.command()
def plan(spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="sweep spec YAML")], store: StoreOpt = None) -> None:
    """A dry run: the grid's cells per axis, done and pending against the store, and the work left as
    the store's own measured trial times price it. Nothing starts, nothing is written."""
    from freezesweep.orchestrator.checks import load_spec
    from freezesweep.orchestrator.plan import build_grid, settle_round
    from freezesweep.orchestrator.spec import SpecError
    from freezesweep.orchestrator.sweeps import resolve_for_plan
    from freezesweep.results.query import collapse_long_axes, status_table
    from freezesweep.results.store import FINAL_STATUSES, ResultStore

    try:
        spec = load_spec(spec_path, overrides={"store": store}, devices=False)  # the trials' machines are not here
    except SpecError as exc:
        _fail(exc)
    sweep, note = resolve_for_plan(spec)
    cells = build_grid(sweep)
    result_store = ResultStore(spec.store, spec.name)
    rows = result_store.read_table(columns=["trial_id", "status", "wall_time_s", "best_val_score",
                                            "baseline_score", "collapsed"]).to_pandas()
    statuses = dict(zip(rows["trial_id"], rows["status"]))
    pending = [c for c in cells if statuses.get(c.trial_id) not in FINAL_STATUSES]
    if spec.settle:  # settle mode runs what the rows call for, round by round: the next one is known
        pending = settle_round(sweep, cells, rows)
        console.print(f"sweep {spec.name}: settle mode, at most {len(cells):,} cells ({spec.cell_count_words()}); "
                      f"{sum(s in FINAL_STATUSES for s in statuses.values()):,} done, the next round runs "
                      f"{len(pending):,}" + ("" if pending else ": settled, or at its budget"), highlight=False)
    else:
        console.print(f"sweep {spec.name}: {len(cells):,} cells ({spec.cell_count_words()}), "
                      f"{len(cells) - len(pending):,} done, {len(pending):,} to run in "
                      f"{-(-len(pending) // spec.resources.cells_per_round)} round(s)", highlight=False)
    if note:
        console.print(f"note: {note}", highlight=False)
    _print_frame(collapse_long_axes(status_table(cells, statuses)), OutputFormat.table,
                 f"sweep {spec.name}: cells per axis")
    _print_work(spec, cells, pending, rows)
    console.print("nothing was started", highlight=False)


def _print_work(spec, cells, pending, rows) -> None:
    """The pending cells' trial time, priced by the store's own measured rows (orchestrator/plan.py)."""
    import os

    from freezesweep.orchestrator.plan import estimate_work, work_key

    by_id = {c.trial_id: c for c in cells}
    measured: dict[tuple, list[float]] = {}
    for trial_id, status, wall_s in rows[["trial_id", "status", "wall_time_s"]].itertuples(index=False):
        if status == "ok" and trial_id in by_id and wall_s == wall_s:  # NaN: not measured
            measured.setdefault(work_key(by_id[trial_id]), []).append(float(wall_s))
    estimate = estimate_work(pending, measured)
    at_once = spec.resources.max_concurrent_trials or max(1, int((os.cpu_count() or 1) // spec.resources.cpus_per_trial))
    if estimate is None:
        console.print("work: no measured trial in the store yet to estimate it from", highlight=False)
    else:
        console.print(f"work: about {estimate.trial_s / 3600:,.2f} trial-hours ({estimate.measured_cells:,} of "
                      f"{len(pending):,} pending cells priced by rows of their own kind, from {estimate.measured_rows:,} "
                      f"measured rows); about {estimate.trial_s / at_once / 3600:,.2f} h at {at_once} trials at once "
                      "(this machine's cores, or max_concurrent_trials)", highlight=False)


def _warn_unreadable(result_store) -> None:
    """Rows that could not be read are left out, named (``resume`` sets them aside and runs their cells)."""
    if result_store.unreadable:
        err_console.print(f"warning: skipped {len(result_store.unreadable)} unreadable row file(s) (`freezesweep resume "
                          f"{result_store.sweep}` moves them aside and runs their cells again): "
                          + ", ".join(result_store.unreadable), highlight=False)


def _open(sweep: str, store: Optional[str]):
    """A stored sweep (resolved as launched) and its store."""
    from freezesweep.orchestrator.spec import SpecError
    from freezesweep.orchestrator.sweeps import sweep_from_store
    from freezesweep.results.store import ResultStore

    try:
        resolved = sweep_from_store(sweep, store or "./sweeps")
    except SpecError as exc:
        _fail(exc)
    return resolved, ResultStore(store or "./sweeps", sweep)


@app.command()
def status(sweep: str, store: StoreOpt = None) -> None:
    """done / failed / missing cells per axis value, and the nodes (Ray node ids) the rows ran on."""
    from freezesweep.results.query import NODE_COLUMNS, collapse_long_axes, placement, status_table

    resolved, result_store = _open(sweep, store)
    rows = result_store.read_table(columns=["trial_id", *NODE_COLUMNS]).to_pandas()  # one read: statuses and nodes
    statuses = dict(zip(rows["trial_id"], rows["status"]))
    _warn_unreadable(result_store)
    table = collapse_long_axes(status_table(_counted_cells(resolved, result_store), statuses))
    _print_frame(table, OutputFormat.table, f"sweep {sweep}")
    if len(rows):
        nodes, gpus = placement(rows), rows["gpu_uuid"].nunique()  # nunique skips nulls (CPU rows)
        _print_frame(nodes, OutputFormat.table, f"rows ran on {len(nodes)} node(s), {gpus} GPU(s)")


@app.command()
def query(sweep: str, store: StoreOpt = None,
          sql: Annotated[str, typer.Option("--sql", help="SQL over the table `results`")] =
          "SELECT dataset, model, method, train_size, frozen_layers, lora_rank, seed, status, select_metric, "
          "best_val_score FROM results ORDER BY dataset, model, method, train_size, frozen_layers, lora_rank, seed",
          fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table) -> None:
    """SQL (DuckDB) over the sweep's rows."""
    from freezesweep.results.query import sql as run_sql

    _, result_store = _open(sweep, store)
    try:
        frame = run_sql(result_store, sql)
    except Exception as exc:  # a SQL error is the user's to fix: say it plainly
        _fail(exc)
    _warn_unreadable(result_store)
    _print_frame(frame, fmt, f"{sweep}: {len(frame)} rows")


@app.command()
def summary(sweep: str, store: StoreOpt = None,
            metric: Annotated[Optional[str], typer.Option(help="another recorded metric (accuracy, f1, matthews, "
                                                          "pearson, spearman) at the best evaluation")] = None,
            fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table) -> None:
    """The selected metric at the best evaluation per dataset × train size × frozen layers (mean, median, std, min,
    max); with several models or methods, per model and method too (a LoRA cell by its rank, a probe on its own)."""
    from freezesweep.results.query import SUMMARY_COLUMNS, read_rows
    from freezesweep.results.query import summary as summarize

    _, result_store = _open(sweep, store)
    try:
        table = summarize(read_rows(result_store, columns=SUMMARY_COLUMNS), metric=metric)
    except ValueError as exc:
        _fail(exc)
    _warn_unreadable(result_store)
    what = metric or "the selected metric"
    _print_frame(table, fmt, f"sweep {sweep}: {what} at the best evaluation, over seeds")


def _counted_cells(resolved, result_store) -> list:
    """The cells a sweep's rows are counted against: its grid; in settle mode, the cells it ran and
    its next round (an arm decided early never runs the budget's other seeds)."""
    from freezesweep.orchestrator.plan import build_grid, settle_scope

    cells = build_grid(resolved)
    if resolved.spec.settle is None:
        return cells
    rows = result_store.read_table(columns=["trial_id", "status", "best_val_score", "baseline_score",
                                            "collapsed"]).to_pandas()
    return settle_scope(resolved, cells, rows)


def _print_frame(frame, fmt: OutputFormat, title: str) -> None:
    if fmt is OutputFormat.csv:
        print(frame.to_csv(index=False), end="")
    elif fmt is OutputFormat.json:
        print(frame.to_json(orient="records", default_handler=str))
    else:
        table = Table(title=title)
        for column in frame.columns:
            table.add_column(str(column), justify="right" if frame[column].dtype.kind in "if" else "left")
        for row in frame.itertuples(index=False):
            table.add_row(*(f"{v:.4f}" if isinstance(v, float) else str(v) for v in row))
        console.print(table)


@app.command()
def report(
    sweeps: Annotated[list[str], typer.Argument(metavar="SWEEP...", help="one or more sweeps, side by side")],
    out: Annotated[Path, typer.Option("--out", help="folder for index.html, report.md and figures/")],
    store: StoreOpt = None,
    tolerance: Annotated[Optional[float], typer.Option(
        help="how much of the selected metric below full fine-tuning still counts as as good (default: a settle "
             "sweep's own, else 0.01)")] = None,
) -> None:
    """The decision (how many layers to freeze per train size), figures, paired statistics: an HTML report."""
    from freezesweep.results.query import status_table
    from freezesweep.results.report import SweepRows, write_report

    inputs = []
    for name in sweeps:  # the grid says what is missing; results/ itself knows nothing of specs
        resolved, result_store = _open(name, store)
        settle = resolved.spec.settle  # its rule and every look it may have taken: the report's intervals too
        rule = settle.rule() if settle else None
        if rule is not None and tolerance is not None and tolerance != rule.tolerance:
            _fail(ValueError(f"sweep {name!r} is a settle sweep asked at tolerance {rule.tolerance:g}: its rounds "
                             "stopped on that question, and a tolerance chosen after seeing the rows voids the confidence; "
                             f"report it without --tolerance, or ask {tolerance:g} as a new settle sweep (a new name)"))
        inputs.append(SweepRows.from_store(result_store, status_table(_counted_cells(resolved, result_store),
                                                                      result_store.statuses()),
                                           _settle_family(resolved, rule)))
        _warn_unreadable(result_store)
    built = write_report(inputs, str(out), 0.01 if tolerance is None else tolerance)
    for line in [*built.decisions["sentence"], *built.completeness, *_budget_prices(built.decisions, sweeps, store)]:
        console.print(line, highlight=False, soft_wrap=True)
    console.print(f"report: {out / 'index.html'} (and report.md)")


def _budget_prices(decisions, sweeps: list[str], store) -> list[str]:
    """What deciding an open settle group would cost: a new sweep at the budget the report names, priced
    as ``plan`` prices pending cells (the store's measured trial times; orchestrator/plan.py)."""
    from freezesweep.orchestrator.plan import build_grid, estimate_work, work_key

    lines = []
    for name in sweeps:
        resolved, result_store = _open(name, store)
        asked = decisions[(decisions["sweep"] == name) & decisions["decided_at_seeds"].notna()]
        if resolved.spec.settle is None or asked.empty:
            continue
        rows = result_store.read_table(columns=["trial_id", "status", "wall_time_s"]).to_pandas()
        wall = dict(zip(rows.loc[rows["status"] == "ok", "trial_id"], rows.loc[rows["status"] == "ok", "wall_time_s"]))
        measured: dict[tuple, list[float]] = {}
        for cell in build_grid(resolved):
            wall_s = wall.get(cell.trial_id)
            if wall_s is not None and wall_s == wall_s:  # NaN: not measured
                measured.setdefault(work_key(cell), []).append(float(wall_s))
        for _, group in asked.iterrows():
            budget = int(group["decided_at_seeds"])
            settle = resolved.spec.settle.model_copy(update={"max_seeds": budget})
            grown = dataclasses.replace(resolved, spec=resolved.spec.model_copy(update={"settle": settle}))
            cells = [c for c in build_grid(grown) if (c.dataset, c.train_size) == (group["dataset"], group["train_size"])]
            estimate = estimate_work(cells, measured)
            cost = "" if estimate is None else f", about {estimate.trial_s / 3600:,.2f} trial-hours at the measured times"
            lines.append(f"{group['dataset']}, n = {group['train_size']}: a new settle sweep with settle.max_seeds "
                         f"{budget} runs at most {len(cells):,} trials for this size{cost} (`freezesweep plan` on "
                         "its spec prices the whole sweep)")
    return lines


def _settle_family(resolved, rule):
    """A settle sweep's rule with every look it may take and the comparisons its confidence is shared by
    (the report's intervals are the ones the rounds were decided by); None for a fixed grid."""
    from freezesweep.orchestrator.plan import sweep_comparisons

    return (rule, rule.looks, sweep_comparisons(resolved)) if rule else None


@app.command()
def compact(sweep: str, store: StoreOpt = None) -> None:
    """Compact a sweep's final rows into Parquet parts (a launch also does it between rounds): readers
    then open tens of files, not one per cell. Takes the sweep's lock; crash-safe."""
    from freezesweep.results.lock import SweepLock, SweepLocked

    _, result_store = _open(sweep, store)
    try:
        with SweepLock(result_store.fs, result_store.sweep_dir, uri=result_store.uri) as lock:
            result_store.guard = lock.check
            result_store.clean_staging()
            compacted = result_store.compact()
    except SweepLocked as exc:
        _fail(exc)
    console.print(f"sweep {sweep}: {compacted} row(s) compacted" + (" into one part" if compacted else ""),
                  highlight=False)


def main() -> None:  # python -m freezesweep.orchestrator.cli
    app()


if __name__ == "__main__":
    sys.exit(main())
