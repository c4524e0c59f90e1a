"""Where a trial's time goes, and what the reference study's habits cost: measured side by side.

    python benchmarks/trial_speed.py [--model M] [--data-dir D] [--device cpu|cuda] [--repeats N]

Prints, for the same model, data and machine in one run:
1. evaluation of the full validation split: length-sorted dynamic padding (freezesweep) vs the same
   batches in file order vs padding every row to max_seq_length;
2. a training step in each precision available on the device;
3. a weights+optimizer checkpoint written at every evaluation (the study) vs none (freezesweep),
   as seconds per evaluation and as a share of a whole trial;
4. tokenization: from scratch vs the disk cache vs the in-process cache, and a 1,000-row subset
   tokenized alone (what a trial does: trials/tokens.py tokenize_rows) vs read from the whole split;
5. evaluation with the frozen layers' output cached (trials/eval_cache.py) vs the full model, per k;
6. the last layer computed for the head's token only (trials/first_token.py), in evaluation and
   training, and training batches packed without their padding (trials/packing.py);
7. a trial array's evaluation (trials/array.py: one seed and train size, every depth -1 … L): each
   member from its own depth's cached states, a pass per depth, vs one pass for all members.
Only ratios measured here are printed; nothing is hard-coded.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig

from freezesweep.trials.worker import WorkerState
from freezesweep.trials.data import load_task
from freezesweep.trials.evaluate import evaluate
from freezesweep.trials.model import build_model, load_tokenizer, resolve_model_path
from freezesweep.trials.precision import resolve_config, resolve_precision
from freezesweep.trials.subsets import subset_indices
from freezesweep.trials.tokens import Tokens, collate, eval_batches, tokenize_rows, tokenize_split, train_batches


def timed(fn, repeats: int) -> float:
    """Median seconds of ``repeats`` calls after one warm-up."""
    fn()
    samples = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def row(name: str, seconds: float, baseline: float) -> None:
    print(f"  {name:<48} {seconds * 1000:10.1f} ms   x{baseline / seconds:6.2f} vs baseline")


def bench_eval(model, ids, labels, pad_id, plan, device, repeats) -> float:
    print("1. evaluation of the validation split (batch 128)")
    sorted_batches = eval_batches(ids, labels, 128, pad_id)
    rows = ids.input_ids
    chunks = np.array_split(np.arange(len(ids)), len(sorted_batches))
    file_order = [collate(ids.select(c), labels[c], pad_id) for c in chunks]
    padded = [
        collate(
            Tokens(tuple(np.pad(rows[i], (0, 128 - len(rows[i])), constant_values=pad_id) for i in c)),
            labels[c],
            pad_id,
        )
        for c in chunks
    ]
    base = timed(lambda: evaluate(model, padded, plan, device), repeats)
    row("padded to max_seq_length=128 (baseline)", base, base)
    row("dynamic padding, file order", timed(lambda: evaluate(model, file_order, plan, device), repeats), base)
    ours = timed(lambda: evaluate(model, sorted_batches, plan, device), repeats)
    row("dynamic padding, length-sorted (freezesweep)", ours, base)
    return ours


def bench_checkpoint(model, eval_s: float, train_step_s: float, repeats: int) -> None:
    print("3. checkpoint at every evaluation (reference: 20 evaluations, 10 epochs)")
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    for p in model.parameters():  # AdamW state as after a first step: exp_avg and exp_avg_sq per weight
        optimizer.state[p] = {
            "step": torch.tensor(1.0),
            "exp_avg": torch.zeros_like(p),
            "exp_avg_sq": torch.zeros_like(p),
        }
    with tempfile.TemporaryDirectory() as tmp:

        def save():
            model.save_pretrained(tmp)
            torch.save(optimizer.state_dict(), os.path.join(tmp, "optimizer.pt"))
            os.sync()

        save_s = timed(save, repeats)
    for n in (50, 1000):  # the smallest and largest cells of the study
        steps = 10 * -(-n // 16)
        trial_s = steps * train_step_s + 20 * eval_s
        print(
            f"  train size {n:>4}: trial ≈ {trial_s:7.1f} s without checkpoints, {trial_s + 20 * save_s:7.1f} s with"
            f"   x{(trial_s + 20 * save_s) / trial_s:5.2f} slower with (one save {save_s * 1000:.0f} ms)"
        )


def bench_tokenize(tokenizer, split, repeats: int) -> None:
    print(f"4. tokenization of the train split ({len(split)} rows)")
    with tempfile.TemporaryDirectory() as tmp:

        def cold():
            for f in Path(tmp).rglob("*.parquet"):
                f.unlink()
            tokenize_split(tokenizer, split, 128, Path(tmp), WorkerState())

        base = timed(cold, max(1, repeats // 2))
        row("tokenize from scratch (baseline)", base, base)

        def disk():
            tokenize_split(tokenizer, split, 128, Path(tmp), WorkerState())

        row("disk cache (another process, same machine)", timed(disk, repeats), base)
        row(
            "in-process cache (a reused Ray worker)",
            timed(lambda: tokenize_split(tokenizer, split, 128, Path(tmp)), repeats),
            base,
        )
        rows = subset_indices(split.labels, min(1000, len(split) // 20), 0)  # under WHOLE_SPLIT_SHARE
        row(
            f"{len(rows)} rows alone, a fresh worker",
            timed(lambda: tokenize_rows(tokenizer, split, rows, 128, Path(tmp), WorkerState()), repeats),
            base,
        )
        row(
            f"{len(rows)} rows from the whole split on disk",
            timed(lambda: tokenize_split(tokenizer, split, 128, Path(tmp), WorkerState()).select(rows), repeats),
            base,
        )


def bench_precision(model_name, ids, labels, pad_id, device, repeats) -> float:
    print("2. one training step (batch 16, nothing frozen)")
    names = ["fp32", "bf16"] + (["fp16"] if device.type == "cuda" else [])
    batch = train_batches(ids.select(range(16)), labels[:16], 16, pad_id, torch.Generator().manual_seed(0))[0].to(
        device
    )
    results = {}
    for name in names:
        plan = resolve_precision(name, device)
        model = build_model(model_name, 2, "pretrained").to(device)
        opt, scaler = torch.optim.AdamW(model.parameters(), lr=5e-5), plan.grad_scaler()

        def step():
            with plan.autocast():
                logits = model(**batch.model_inputs()).logits
            loss = torch.nn.functional.cross_entropy(logits.float(), batch.labels)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)

        results[name] = timed(step, repeats)
    for name, seconds in results.items():
        row(f"{name}" + (" (baseline)" if name == "fp32" else ""), seconds, results["fp32"])
    return min(results.values())


def bench_eval_cache(model, ids, labels, pad_id, plan, device, repeats) -> None:
    from freezesweep.trials.eval_cache import matches_full_model, prefix_states
    from freezesweep.trials.freezing import find_encoder_parts

    layers = len(find_encoder_parts(model).layers)
    print(f"5. evaluation with the frozen prefix cached ({layers}-layer model, batch 128, length-sorted)")
    batches = eval_batches(ids, labels, 128, pad_id)
    full = timed(lambda: evaluate(model, batches, plan, device), repeats)
    row("full model (k = 0, or no cache)", full, full)
    for k in sorted({1, layers // 2, layers}):
        prefix = prefix_states(model, batches, plan, device, k, ("bench",), WorkerState())
        assert matches_full_model(model, batches[0], prefix, plan, device), "the cached path must be exact"
        same = evaluate(model, batches, plan, device, prefix) == evaluate(model, batches, plan, device)
        runs = f"layers {k + 1}..{layers} and the head" if k < layers else "the head only"
        row(
            f"k = {k}: {runs}" + ("" if same else " (NOT EXACT)"),
            timed(lambda: evaluate(model, batches, plan, device, prefix), repeats),
            full,
        )


def bench_unpadded(model_name, train_ids, val_ids, train_labels, val_labels, pad_id, plan, device, repeats) -> None:
    """The last layer past attention for the head's token only (trials/first_token.py) and training
    batches without padding (trials/packing.py), on the real validation split and one epoch of
    n = 200 training batches, nothing frozen; the attention implementation as trials use it."""
    from freezesweep.trials.evaluate import task_loss
    from freezesweep.trials.first_token import narrowed
    from freezesweep.trials.model import attention_for
    from freezesweep.trials.packing import PaddedFeed, training_feed

    print("6. the last layer for the head's token only, training batches packed (nothing frozen)")
    model = build_model(model_name, 2, "pretrained").to(device)
    rows = np.arange(200)
    epoch = train_batches(train_ids.select(rows), train_labels[rows], 16, pad_id, torch.Generator().manual_seed(0))
    print(
        f"  training batches: {np.mean([b.input_ids.numel() for b in epoch]):.0f} positions, "
        f"{np.mean([int(b.attention_mask.sum()) for b in epoch]):.0f} tokens on average"
    )
    val = eval_batches(val_ids, val_labels, 64, pad_id)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=True)

    def train_epoch(feed):
        model.train()
        for batch in epoch:
            batch = feed.prepare(batch).to(device)
            with plan.autocast():
                loss = task_loss(feed.logits(model, batch), batch.labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    base_eval = timed(lambda: evaluate(model, val, plan, device), repeats)
    base_train = timed(lambda: train_epoch(PaddedFeed()), repeats)
    attention_for(model, device)
    reader, feed = training_feed(model, epoch[0].to(device), ("bench",), {})
    if reader is None:
        print("  this model does not qualify (its head reads more than the first token)")
        return
    print(f"  validation pass ({len(val)} batches of 64), attention {model.config._attn_implementation}")
    row("full last layer, default attention (baseline)", base_eval, base_eval)
    with narrowed(model, reader):
        row(
            "last layer for the head's token only",
            timed(lambda: evaluate(model, val, plan, device), repeats),
            base_eval,
        )
        print(f"  one epoch of training ({len(epoch)} steps)")
        row("padded, full last layer, default attention (baseline)", base_train, base_train)
        row("padded, last layer narrowed", timed(lambda: train_epoch(PaddedFeed()), repeats), base_train)
        row("packed, last layer narrowed (freezesweep)", timed(lambda: train_epoch(feed), repeats), base_train)


def bench_array_eval(model_name, data_dir, dataset, device, repeats) -> None:
    """Section 7: the same array's evaluation both ways, and how far apart their losses are."""
    from freezesweep.trials import array
    from freezesweep.trials.config import TrialConfig

    depths = range(-1, AutoConfig.from_pretrained(resolve_model_path(model_name)).num_hidden_layers + 1)
    print(f"7. a trial array's evaluation, {len(depths)} members (k = -1 … {depths[-1]}), the validation split")
    cells = [
        resolve_config(
            TrialConfig(dataset, model_name, 200, k, data_dir=data_dir, device=str(device), trial_array=True)
        )
        for k in depths
    ]
    run = array.build_array(cells, len(cells), array.Plan({}, lambda cfg, point: None), print, WorkerState(), 0.0)
    assert run is not None, "this model does not qualify for trial arrays"
    base = run.base

    def evaluated(groups):
        return array.evaluate_array(run.stack, base.eval_batches, base.plan, base.device, groups, base.eval_labels)

    groups = run.eval_depths.groups(run.members)
    one = timed(lambda: evaluated(None), repeats)
    row("one pass for all members (baseline)", one, one)
    row(f"a pass per depth, from its cache ({len(groups)} passes)", timed(lambda: evaluated(groups), repeats), one)
    alone, per_depth = evaluated(None), evaluated(groups)
    gap = max(abs(alone[slot][1] - per_depth[slot][1]) for slot in alone)
    print(f"  largest difference of a member's validation loss between the two: {gap:.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2")
    parser.add_argument("--dataset", default="glue/sst2")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--only",
        type=int,
        nargs="+",
        choices=range(1, 8),
        default=range(1, 8),
        help="sections to run (3 needs 1 and 2)",
    )
    args = parser.parse_args()
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    device = torch.device(args.device)
    plan = resolve_precision("auto", device)
    task = load_task(args.dataset, args.data_dir)
    tokenizer = load_tokenizer(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        val_ids = tokenize_split(tokenizer, task.validation, 128, Path(tmp))
        train_ids = tokenize_split(tokenizer, task.train, 128, Path(tmp))
    print(
        f"model {args.model} on {args.dataset}, device {device} ({plan.name} autocast), "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads\n"
    )
    model = build_model(args.model, task.num_labels, "pretrained").to(device)
    pad, labels, only = tokenizer.pad_token_id, task.validation.labels, set(args.only)
    if only & {1, 3}:
        eval_s = bench_eval(model, val_ids, labels, pad, plan, device, args.repeats)
    if only & {2, 3}:
        step_s = bench_precision(args.model, train_ids, task.train.labels, pad, device, args.repeats)
    if 3 in only:
        bench_checkpoint(model, eval_s, step_s, args.repeats)
    if 4 in only:
        bench_tokenize(tokenizer, task.train, args.repeats)
    if 5 in only:
        bench_eval_cache(model, val_ids, labels, pad, plan, device, args.repeats)
    if 6 in only:
        bench_unpadded(args.model, train_ids, val_ids, task.train.labels, labels, pad, plan, device, args.repeats)
    if 7 in only:
        bench_array_eval(args.model, args.data_dir, args.dataset, device, args.repeats)


if __name__ == "__main__":
    from freezesweep.trials.data import DatasetError
    from freezesweep.trials.model import ModelError

    try:
        main()
    except (DatasetError, ModelError) as exc:  # what the user can fix: one line, not a traceback
        raise SystemExit(f"error: {exc}") from None
