"""What each optimisation gives on a decoder-only family, side by side in one run, and which
optimisations each family's trials use.

    python benchmarks/family_speed.py [--data-dir D] [--family qwen2] [--repeats 3] [--threads 1]

1. The table of families x optimisations: a k = mid trial and a k = -1 trial of each tiny family of
   the test matrix (tests/families.py: 3 layers, hidden 32), every optimisation switched on; each
   optimisation is listed where its own check let it run (the row's ``optimisations``).
2. The speed of each optimisation on one decoder family (a small random Qwen2 by default: 4 layers,
   hidden 256, the MiniLM tokenizer): whole trials on SST-2 (n = 64, 4 evaluations of 256
   validation rows, fp32) with every optimisation off, each one alone, and all on; the same trial run
   again in the same worker (its caches warm, as in a sweep: every later trial of the grid meets
   them so) and the median of ``--repeats`` such runs taken. Printed as seconds and as the ratio to
   the plain trial; an optimisation that steps aside for the family shows x1.00 and says so.
Nothing is hard-coded: every figure is measured in this run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/families.py: the test matrix's models

from tests.families import FAMILIES, save_family  # noqa: E402
from freezesweep.trials.config import TrialConfig  # noqa: E402
from freezesweep.trials.model import load_tokenizer  # noqa: E402
from freezesweep.trials.run import run_trial  # noqa: E402
from freezesweep.trials.worker import WorkerState  # noqa: E402

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
SWITCHES = ("eval_cache", "train_cache", "narrow_last_layer", "pack_training")
USED = {
    "eval_cache": "eval_cache",
    "train_cache": "train_cache",
    "narrow_last_layer": "narrowed_last_layer",
    "pack_training": "packed_training",
}


def config(
    model: str, data: str, data_dir: str | None, threads: int, frozen_layers: int, on: set[str], **size
) -> TrialConfig:
    return TrialConfig(
        dataset=data,
        data_dir=data_dir,
        model=model,
        frozen_layers=frozen_layers,
        seed=0,
        learning_rate=1e-3,
        precision="fp32",
        num_threads=threads,
        **{name: name in on for name in SWITCHES},
        **size,
    )


def family_table(root: Path, tokenizer, data: str, data_dir: str | None, threads: int) -> None:
    print("1. optimisations each family's trials used (k = mid: 2 of 3 layers frozen; k = -1: embeddings only)")
    print(f"   {'family':<12} {'k = 2':<46} k = -1")
    size = dict(train_size=16, epochs=1, batch_size=8, max_eval_examples=32, max_seq_length=32)
    worker = WorkerState()
    for name, family in FAMILIES.items():
        folder = save_family(root / name, family, tokenizer)
        used = [
            run_trial(config(folder, data, data_dir, threads, k, set(SWITCHES), **size), worker=worker) for k in (2, -1)
        ]
        print(f"   {name:<12} {', '.join(used[0].optimisations) or '-':<46} {', '.join(used[1].optimisations) or '-'}")


def speed(folder: str, data: str, data_dir: str | None, threads: int, repeats: int) -> None:
    size = dict(train_size=64, epochs=2, batch_size=16, eval_every_epochs=0.5, max_eval_examples=256, max_seq_length=64)
    runs = {"plain (all off)": set(), **{f"{name} alone": {name} for name in SWITCHES}, "all on": set(SWITCHES)}
    print(
        f"2. seconds per trial, k = 2 of 4 layers frozen, {threads} thread(s), warm worker (median of {repeats});"
        " x: plain / this"
    )
    print(f"   {'':<26} {'trial':>8} {'':>6} {'training':>9} {'':>6} {'evaluation':>10} {'':>6}  used")
    # Round-robin: each repeat runs every variant once, so the machine's load meets them alike.
    setups = {
        label: (WorkerState(), config(folder, data, data_dir, threads, 2, on, **size)) for label, on in runs.items()
    }
    colds = {label: run_trial(cfg, worker=worker) for label, (worker, cfg) in setups.items()}  # fills the caches
    samples = {label: [] for label in runs}
    for _ in range(repeats):
        for label, (worker, cfg) in setups.items():
            samples[label].append(_timed(cfg, worker))
    plain = None
    for label, on in runs.items():
        times = tuple(statistics.median(r[i] for r in samples[label]) for i in range(3))
        plain = plain or times
        stepped = [n for n in on if USED[n] not in colds[label].optimisations]
        note = f"  (stepped aside: {', '.join(stepped)})" if stepped else ""
        cells = "".join(f" {t:8.2f}s x{p / t:4.2f}" for t, p in zip(times, plain))
        print(f"   {label:<26}{cells}  {', '.join(colds[label].optimisations) or '-'}{note}")


def _timed(cfg: TrialConfig, worker: WorkerState) -> tuple[float, float, float]:
    """(whole trial, its training, its evaluations) in seconds."""
    started = time.perf_counter()
    result = run_trial(cfg, worker=worker)
    assert result.status == "ok", result.error
    return time.perf_counter() - started, result.train_time_s, result.eval_time_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("FREEZESWEEP_DATA_DIR"))
    parser.add_argument("--family", default="qwen2", choices=["llama", "mistral", "qwen2"])  # one config naming
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(MINILM)
    print(f"cpu: {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        family_table(root, tokenizer, "glue/sst2", args.data_dir, args.threads)
        base = FAMILIES[args.family]
        options = {
            **base.options,
            "hidden_size": 256,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 688,
        }
        bigger = dataclasses.replace(base, options=options)
        print(f"\n{args.family}: 4 layers, hidden 256, random weights, SST-2")
        speed(save_family(root / "bigger", bigger, tokenizer), "glue/sst2", args.data_dir, args.threads, args.repeats)


if __name__ == "__main__":
    from freezesweep.trials.data import DatasetError
    from freezesweep.trials.model import ModelError

    try:
        main()
    except (DatasetError, ModelError) as exc:  # what the user can fix: one line, not a traceback
        raise SystemExit(f"error: {exc}") from None
