"""The training step as CUDA graphs over length buckets (issue 35.4; opt-in, off until a GPU measured
it): the buckets and the static-shape padding on any device, the whole graphed fit on the CPU with the
capture stood in for (trials/cpu_graphs.py: recorded operators replayed on the captured tensors, no
Python, as a real replay), the real capture on a GPU."""

import dataclasses
import functools

import numpy as np
import pytest
import torch

from tests.devices import CUDA, DEVICES
from tests.families import FAMILIES, save_family
from freezesweep.trials import graphs, run
from freezesweep.trials.eval_cache import eval_mode
from freezesweep.trials.first_token import Reader, narrowed
from freezesweep.trials.packing import PackedFeed, pack
from freezesweep.trials.run import initial_model
from freezesweep.trials.tokens import Tokens, collate
from freezesweep.trials.worker import WorkerState


def test_buckets_cover_every_batch_in_a_few_shapes():
    sizes = np.random.default_rng(0).integers(90, 330, 500)
    buckets = graphs.length_buckets(sizes)
    assert len(buckets) <= graphs.BUCKETS and all(b % 8 == 0 for b in buckets)
    assert buckets[-1] >= sizes.max() and buckets == tuple(sorted(buckets))
    chosen = [graphs.bucket_for(int(s), buckets) for s in sizes]
    assert all(c is not None and c >= s for c, s in zip(chosen, sizes))
    assert np.mean([c - s for c, s in zip(chosen, sizes)]) < 0.25 * np.mean(sizes)  # padding stays small
    assert graphs.bucket_for(buckets[-1] + 1, buckets) is None
    assert graphs.length_buckets([17]) == (24,)


@pytest.fixture(scope="module")
def still_bert(tmp_path_factory, minilm_tokenizer) -> str:
    """A tiny BERT without dropout: a graphed step is then the eager step's function exactly."""
    return save_family(tmp_path_factory.mktemp("still-bert"), FAMILIES["bert"], minilm_tokenizer)


def _cell(still_bert: str, toy_dataset: str, **fields):
    """A cell of 40 rows (batches of 16, 16, 8: two row counts) of the still BERT, fp32, one thread."""
    from freezesweep.trials.config import TrialConfig

    fixed = dict(train_size=40, epochs=3, learning_rate=3e-3, precision="fp32", num_threads=1)
    return TrialConfig(dataset=toy_dataset, model=still_bert, **{**fixed, **fields})


def _batch(pad_id: int) -> "Batch":  # noqa: F821
    rows = [[101, 7, 8, 9, 102], [101, 5, 102], [101, 4, 6, 102], [101, 102]]
    return collate(Tokens(tuple(np.array(r) for r in rows), None), np.array([1, 0, 1, 0]), pad_id)


@pytest.mark.parametrize("device", DEVICES)
def test_padding_to_a_bucket_leaves_the_logits(still_bert, toy_dataset, minilm_tokenizer, device):
    """A packed row's extra tokens (a sequence of their own) and a padded batch's extra columns
    (masked) change no real row's logits."""
    from freezesweep.trials.config import TrialConfig

    cfg = TrialConfig(dataset=toy_dataset, model=still_bert, train_size=8, frozen_layers=0, precision="fp32")
    model = initial_model(cfg, 2, WorkerState()).to(device)
    batch = _batch(minilm_tokenizer.pad_token_id).to(torch.device(device))
    feed = PackedFeed(Reader(), 0)
    packed = pack(batch.to(torch.device("cpu")), 0).to(torch.device(device))
    with eval_mode(model), torch.no_grad(), narrowed(model, feed.reader):
        exact = feed.logits(model, packed)
        bucketed = feed.logits(model, graphs.padded_to(packed, 24, minilm_tokenizer.pad_token_id))
    torch.testing.assert_close(bucketed, exact, rtol=1e-5, atol=1e-6)
    with eval_mode(model), torch.no_grad():
        plain = model(**batch.model_inputs()).logits
        wider = model(**graphs.padded_to(batch, 16, minilm_tokenizer.pad_token_id).model_inputs()).logits
    torch.testing.assert_close(wider, plain, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_a_graphed_fit_trains_as_the_eager_one(still_bert, toy_dataset, monkeypatch, device, packed):
    """The whole graphed path through ``run_trial``: the first step eager (AdamW's state), then one
    capture per (rows, bucket) and a replay per step, the schedule filling the tensor learning rate.
    Without dropout it follows the eager trial's curve to float rounding (the bucket's extra columns
    change the matrix shapes only). On the CPU the capture is stood in for; on a GPU it is real."""

    captures = []
    real = graphs.capture_on_cpu if device == "cpu" else graphs.capture
    monkeypatch.setattr(
        graphs,
        "capture",
        lambda step, warm, inputs, shared: captures.append(inputs) or real(step, warm, inputs, shared),
    )
    monkeypatch.setattr(graphs, "cuda_graphs_apply", lambda cfg, *_: cfg.cuda_graphs)  # on the CPU too
    cfg = _cell(still_bert, toy_dataset, frozen_layers=0, device=device, pack_training=packed)
    eager = run.run_trial(cfg)
    graphed = run.run_trial(dataclasses.replace(cfg, cuda_graphs=True))
    assert "cuda_graphs" in graphed.optimisations and "cuda_graphs" not in eager.optimisations
    assert ("packed_training" in graphed.optimisations) == packed
    assert 2 <= len(captures) <= 2 * graphs.BUCKETS  # one per (rows, bucket) met: the 8-row batch has its own
    assert {len(c.labels) for c in captures} == {16, 8}
    assert [p.step for p in graphed.eval_curve] == [p.step for p in eager.eval_curve]
    assert [p.loss for p in graphed.eval_curve] == pytest.approx([p.loss for p in eager.eval_curve], rel=1e-4)
    assert graphed.best_val_accuracy == eager.best_val_accuracy


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_a_graphed_array_trains_as_the_eager_one(still_bert, toy_dataset, monkeypatch, device, packed):
    """A trial array on one stream (trials/array.py) as CUDA graphs: each member's eager first step
    (its AdamW state), then one capture per (rows, bucket) of every member's update, a replay per step
    and each member's schedule after it. Without dropout every member follows its eager array's curve
    to float rounding; its row says both optimisations."""
    from freezesweep.trials import array

    captures = []
    real = graphs.capture_on_cpu if device == "cpu" else graphs.capture
    monkeypatch.setattr(
        graphs,
        "capture",
        lambda step, warm, inputs, shared: captures.append(inputs) or real(step, warm, inputs, shared),
    )
    monkeypatch.setattr(graphs, "cuda_graphs_apply", lambda cfg, *_: cfg.cuda_graphs)  # on the CPU too
    cells = [
        _cell(still_bert, toy_dataset, frozen_layers=k, device=device, pack_training=packed, trial_array=True)
        for k in (-1, 0, 2)
    ]
    masks = _masks_in_captures(monkeypatch, captures)
    eager = array.run_array(cells)
    graphed = array.run_array([dataclasses.replace(c, cuda_graphs=True) for c in cells])
    assert 2 <= len(captures) <= 2 * graphs.BUCKETS and {len(c.labels) for c in captures} == {16, 8}
    # what the model got in a capture: a padded feed's mask prebuilt (transformers' own mask building
    # made a host tensor that a capture refused: an H200, transformers 5.17); a packed batch's is 4-D already
    assert masks and set(masks) == {4}
    for g, e in zip(graphed, eager):
        assert {"trial_array", "cuda_graphs"} <= set(g.optimisations) and "cuda_graphs" not in e.optimisations
        assert ("packed_training" in g.optimisations) == packed
        assert [p.step for p in g.eval_curve] == [p.step for p in e.eval_curve]
        assert [p.loss for p in g.eval_curve] == pytest.approx([p.loss for p in e.eval_curve], rel=1e-4)
        assert g.best_val_accuracy == e.best_val_accuracy
    assert len({tuple(p.loss for p in g.eval_curve) for g in graphed}) == 3  # each member its own update


def _masks_in_captures(monkeypatch, captures: list) -> list[int]:
    """The attention mask's rank that BERT's forward gets while a capture (its first run) is under way."""
    from transformers.models.bert import modeling_bert

    ranks: list[int] = []
    forward, seen = modeling_bert.BertModel.forward, [0]

    def spied(self, *args, **kwargs):
        if len(captures) > seen[0]:  # a capture began since the last forward: this one runs in it
            seen[0] = len(captures)
            ranks.append(kwargs["attention_mask"].dim())
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(modeling_bert.BertModel, "forward", spied)
    return ranks


def test_a_graphed_array_captures_again_when_a_member_leaves(still_bert, toy_dataset, monkeypatch):
    """A member that diverges leaves with its row; the graphs held its update, so the others' are
    captured again without it, and their curves are the clean graphed run's."""
    from freezesweep.trials import array

    monkeypatch.setattr(graphs, "capture", graphs.capture_on_cpu)
    monkeypatch.setattr(graphs, "cuda_graphs_apply", lambda cfg, *_: cfg.cuda_graphs)
    cells = [
        _cell(still_bert, toy_dataset, frozen_layers=k, epochs=4, trial_array=True, cuda_graphs=True)
        for k in (-1, 0, 2)
    ]
    clean = array.run_array(cells)
    made, captured = [], array.array_graphs
    monkeypatch.setattr(
        array, "array_graphs", lambda stack, active, *rest: made.append(len(active)) or captured(stack, active, *rest)
    )
    _poison(monkeypatch, array, depth=0, after_steps=4)  # (a replay's)
    results = array.run_array(cells)
    diverged = next(r for r in results if r.config.frozen_layers == 0)
    assert diverged.status == "diverged"
    assert made == [3, 2]  # captured for all three, then again for the two that went on
    for a, b in zip(results, clean):
        if a is not diverged:
            # the same numbers as the members' run beside k = 0; to float rounding, not bitwise: the array of
            # two multiplies other shapes than the array of three, and the CPU's kernels may block them
            # otherwise (one run in seven differed at 1e-7 after another test's imports)
            assert a.status == "ok" and len(a.eval_curve) == len(b.eval_curve)
            assert [p.loss for p in a.eval_curve] == pytest.approx([p.loss for p in b.eval_curve], rel=1e-6)


def _poison(monkeypatch, array, depth: int, after_steps: int) -> None:
    """The weights of the member of ``depth`` turn NaN after its ``after_steps``-th step, in place and
    outside any graph (as a diverging update leaves them): its next replay's loss and gradients are
    NaN, inside the graph, which goes on replaying the other members' updates beside it."""
    for stream in (array.SharedStream, array.OwnStreams):

        def poisoned(self, run, active, step=stream.__call__):
            losses = step(self, run, active)
            for member in active:
                if member.cfg.frozen_layers == depth and member.state.step + 1 == after_steps:
                    with torch.no_grad():
                        run.stack.tensors["classifier.weight"][member.slot].fill_(float("nan"))
            return losses

        monkeypatch.setattr(stream, "__call__", poisoned)


def _failing_capture(fail_at: int, calls: list, device: str = "cpu"):
    """A capture whose ``fail_at``-th call fails as one that meets a host sync does: on a GPU a real
    capture of a step that reads its loss on the host, on the CPU a stand-in that raises the same."""

    real = graphs.capture_on_cpu if device == "cpu" else graphs.capture  # bound now: the test patches the name

    def capture(step, warm, inputs, shared):
        calls.append(len(inputs.labels))
        if len(calls) != fail_at:
            return real(step, warm, inputs, shared)
        if device == "cpu":
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        return real(lambda batch: step(batch).sum().item(), warm, inputs, shared)

    return capture


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fail_at", [1, 2], ids=["first", "second"])
def test_a_failed_capture_goes_on_eagerly(still_bert, toy_dataset, monkeypatch, fail_at, device):
    """A capture that fails is not a failed trial: the fit goes on eagerly from that step and captures
    nothing more; its row lists no ``cuda_graphs``. Failing at the first capture, every step is the
    eager trial's (the same curve without dropout, to the rounding of the capturable AdamW's tensor
    learning rate); at the second, after replays, to a bucket's rounding. On a GPU the capture really
    fails, and the GPU is still usable after it."""
    calls: list = []
    monkeypatch.setattr(graphs, "capture", _failing_capture(fail_at, calls, device))
    monkeypatch.setattr(graphs, "cuda_graphs_apply", lambda cfg, *_: cfg.cuda_graphs)
    cfg, worker = _cell(still_bert, toy_dataset, frozen_layers=0, device=device), WorkerState()
    eager = run.run_trial(cfg, worker=worker)
    fell_back = run.run_trial(dataclasses.replace(cfg, cuda_graphs=True), worker=worker)
    assert fell_back.status == "ok" and len(calls) == fail_at
    assert "cuda_graphs" not in fell_back.optimisations and "packed_training" in fell_back.optimisations
    assert "operation not permitted when stream is capturing" in next(iter(worker.graph_failures.values()))
    losses, expected = [p.loss for p in fell_back.eval_curve], [p.loss for p in eager.eval_curve]
    assert losses == pytest.approx(expected, rel=1e-6 if fail_at == 1 else 1e-4)
    if device == "cuda":  # the trial's stream again, not the capture's
        assert torch.cuda.current_stream() == torch.cuda.default_stream()
    later = run.run_trial(dataclasses.replace(cfg, cuda_graphs=True, seed=1), worker=worker)
    assert later.status == "ok" and "cuda_graphs" not in later.optimisations
    assert len(calls) == fail_at  # the worker's verdict: the model's later trials capture nothing


def test_out_of_memory_in_a_capture_stays_the_trials(still_bert, toy_dataset, monkeypatch):
    def capture(step, warm, inputs, shared):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(graphs, "capture", capture)
    monkeypatch.setattr(graphs, "cuda_graphs_apply", lambda cfg, *_: cfg.cuda_graphs)
    cfg = _cell(still_bert, toy_dataset, frozen_layers=0, cuda_graphs=True)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        run.run_trial(cfg)
    assert run.run_trial_or_oom(cfg).status == "oom"


def test_a_graphed_array_whose_capture_fails_goes_on_eagerly(still_bert, toy_dataset, monkeypatch):
    """The same for a trial array: every member goes on eagerly, along the eager array's curves (to
    rounding: its members' AdamW is the capturable one, with tensor step counts), with ``trial_array``
    but not ``cuda_graphs`` in its row; nothing is captured again."""
    from freezesweep.trials import array

    calls: list = []
    monkeypatch.setattr(graphs, "capture", _failing_capture(1, calls))
    monkeypatch.setattr(graphs, "cuda_graphs_apply", lambda cfg, *_: cfg.cuda_graphs)
    cells = [_cell(still_bert, toy_dataset, frozen_layers=k, trial_array=True) for k in (-1, 0, 2)]
    worker = WorkerState()
    eager = array.run_array(cells, worker=worker)
    fell_back = array.run_array([dataclasses.replace(c, cuda_graphs=True) for c in cells], worker=worker)
    assert len(calls) == 1 and len(worker.graph_failures) == 1
    for f, e in zip(fell_back, eager):
        assert f.status == "ok" and f.optimisations == e.optimisations  # each its own (k = 2: the eval cache)
        assert [p.loss for p in f.eval_curve] == pytest.approx([p.loss for p in e.eval_curve], rel=1e-6)


def test_fp16_and_the_training_cache_step_aside(tiny_trial):
    from freezesweep.trials.precision import PrecisionPlan

    on = dataclasses.replace(tiny_trial, cuda_graphs=True)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert graphs.cuda_graphs_apply(on, cuda, PrecisionPlan("bf16", "cuda"), None)
    assert not graphs.cuda_graphs_apply(tiny_trial, cuda, PrecisionPlan("bf16", "cuda"), None)  # off by default
    assert not graphs.cuda_graphs_apply(on, cpu, PrecisionPlan("fp32", "cpu"), None)
    assert not graphs.cuda_graphs_apply(on, cuda, PrecisionPlan("fp16", "cuda"), None)  # the scaler decides on the host
    assert not graphs.cuda_graphs_apply(on, cuda, PrecisionPlan("bf16", "cuda"), object())
    assert TrialConfigDefaults.cuda_graphs is False


@pytest.mark.skipif(torch.cuda.is_available(), reason="a rehearsal is for machines without CUDA")
def test_a_rehearsal_runs_the_graphed_path_on_the_cpu(still_bert, toy_dataset, monkeypatch):
    """FREEZESWEEP_CPU_GRAPHS=1 where there is no GPU: a CPU trial asked for CUDA graphs runs its steps
    and evaluations as recorded graphs, nothing patched, its row saying so, and follows the eager trial;
    without it, the CPU runs it eagerly."""
    cfg = _cell(still_bert, toy_dataset, frozen_layers=0)
    eager = run.run_trial(cfg)
    unset = run.run_trial(dataclasses.replace(cfg, cuda_graphs=True))
    assert "cuda_graphs" not in unset.optimisations and "eval_graphs" not in unset.optimisations
    monkeypatch.setenv(graphs.CPU_GRAPHS, "1")
    recorded = _counting(monkeypatch, graphs.cpu_graphs, "record")
    rehearsed = run.run_trial(dataclasses.replace(cfg, cuda_graphs=True))
    assert {"cuda_graphs", "eval_graphs"} <= set(rehearsed.optimisations)
    assert len(recorded) >= 3  # the steps' two row counts, and the evaluation
    assert [p.loss for p in rehearsed.eval_curve] == pytest.approx([p.loss for p in eager.eval_curve], rel=1e-4)


class TrialConfigDefaults:
    from freezesweep.trials.config import TrialConfig

    cuda_graphs = TrialConfig.__dataclass_fields__["cuda_graphs"].default


# --- evaluations as graphs ---------------------------------------------------------------------------
# One trial's curve evaluated two ways: to float rounding on a CPU (the prebuilt mask against the model's
# own); on a GPU its two runs' backward kernels need not repeat bit for bit (atomics)
_ROUNDING = {"cpu": 1e-6, "cuda": 1e-4}


_CAPTURE_EVALUATION = graphs.capture_evaluation


def _evaluations_graphed(monkeypatch, device: str, on: bool, captures: list) -> None:
    """Steps as graphs (on the CPU with the capture stood in for), evaluations too where ``on``; each
    evaluation's capture appended to ``captures`` with what its run read on the host (on the CPU: the
    stand-in records it under the spy, and fails as a real capture where the run reads the host)."""
    from freezesweep.trials.syncs import HostSyncs

    # the real one (on the CPU it captures through the stand-in), never the spy an earlier call left
    real = _CAPTURE_EVALUATION
    if device == "cpu":
        monkeypatch.setattr(graphs, "capture", graphs.capture_on_cpu)
    monkeypatch.setattr(graphs, "cuda_graphs_apply", lambda cfg, *_: cfg.cuda_graphs)
    monkeypatch.setattr(graphs, "evaluation_graphs_apply", lambda graphed, device: graphed and on)

    def capture(run, shared):
        with HostSyncs() as spy:
            made = real(run, shared)
        captures.append(spy.syncs() if device == "cpu" else [])
        return made

    monkeypatch.setattr(graphs, "capture_evaluation", capture)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("frozen", [0, 2], ids=["from-the-embeddings", "from-the-eval-cache"])
def test_a_graphed_trials_evaluations_are_its_eager_ones(still_bert, toy_dataset, monkeypatch, device, frozen):
    """A trial's evaluations as one CUDA graph (with its step's): captured once, at the first, and
    replayed at every later one, reading the weights as the steps left them; the same curve as the
    trial evaluated eagerly. Nothing in the captured run reads the host (a capture refuses it): the
    padding mask comes prebuilt (trials/packing.py ``evaluation_feed``)."""
    captures: list = []
    _evaluations_graphed(monkeypatch, device, False, captures)
    cfg = _cell(still_bert, toy_dataset, frozen_layers=frozen, device=device, cuda_graphs=True)
    eager = run.run_trial(cfg)
    _evaluations_graphed(monkeypatch, device, True, captures)
    graphed = run.run_trial(cfg)
    assert "eval_graphs" in graphed.optimisations and "eval_graphs" not in eager.optimisations
    assert "cuda_graphs" in graphed.optimisations
    assert ("eval_cache" in graphed.optimisations) == ("eval_cache" in eager.optimisations)
    assert device != "cpu" or ("eval_cache" in graphed.optimisations) == (frozen == 2)  # (a GPU's: as exact)
    assert len(graphed.eval_curve) >= 3 and captures == [[]]  # one capture, no host read in it
    assert [p.step for p in graphed.eval_curve] == [p.step for p in eager.eval_curve]
    assert [p.loss for p in graphed.eval_curve] == pytest.approx(
        [p.loss for p in eager.eval_curve], rel=_ROUNDING[device]
    )
    assert graphed.best_val_accuracy == eager.best_val_accuracy
    assert device != "cpu" or [p.accuracy for p in graphed.eval_curve] == [p.accuracy for p in eager.eval_curve]


@pytest.mark.parametrize("device", DEVICES)
def test_a_graphed_arrays_evaluations_are_its_eager_ones(still_bert, toy_dataset, monkeypatch, device):
    """A trial array on one stream: a graph per evaluation group (here the depths from the embeddings,
    slots 0 and 2, picked by a device index, and k = 2 from its cache, slot 1), each captured once;
    every member's curve the array's evaluated eagerly."""
    from freezesweep.trials import array

    captures: list = []
    _evaluations_graphed(monkeypatch, device, False, captures)
    cells = [
        _cell(still_bert, toy_dataset, frozen_layers=k, device=device, trial_array=True, cuda_graphs=True)
        for k in (-1, 2, 0)
    ]
    eager = array.run_array(cells)
    _evaluations_graphed(monkeypatch, device, True, captures)
    graphed = array.run_array(cells)
    cached = "eval_cache" in eager[1].optimisations  # k = 2 (on a CPU: always; a GPU's: where exact)
    assert device != "cpu" or cached
    assert captures == [[]] * (1 + cached)  # a group per depth evaluated, each captured once, no host read in it
    for g, e in zip(graphed, eager):
        assert {"trial_array", "cuda_graphs", "eval_graphs"} <= set(g.optimisations)
        assert "eval_graphs" not in e.optimisations and len(g.eval_curve) >= 3
        assert [p.loss for p in g.eval_curve] == pytest.approx([p.loss for p in e.eval_curve], rel=_ROUNDING[device])
        assert g.best_val_accuracy == e.best_val_accuracy
        assert device != "cpu" or [p.accuracy for p in g.eval_curve] == [p.accuracy for p in e.eval_curve]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("as_array", [False, True], ids=["trial", "array"])
def test_a_failed_capture_of_an_evaluation_goes_on_eagerly(still_bert, toy_dataset, monkeypatch, device, as_array):
    """An evaluation whose capture fails is evaluated eagerly, and every later one: the same curve, a
    row without ``eval_graphs`` (its step's graphs stay); the worker keeps the verdict, and its later
    trials of the model capture no evaluation."""
    from freezesweep.trials import array

    captures: list = []
    _evaluations_graphed(monkeypatch, device, True, captures)
    real, calls = graphs.capture_evaluation, []

    def failing(run, shared):  # as one that reads the host: a real capture of such a run on a GPU
        calls.append(1)
        if device == "cpu":
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        return real(lambda: (run()[0].cpu(), *run()[1:]), shared)

    cells = [
        _cell(still_bert, toy_dataset, frozen_layers=k, device=device, trial_array=as_array, cuda_graphs=True)
        for k in ((-1, 0) if as_array else (0,))
    ]
    trials = (
        (lambda cs, worker: array.run_array(cs, worker=worker))
        if as_array
        else (lambda cs, worker: [run.run_trial(c, worker=worker) for c in cs])
    )
    monkeypatch.setattr(graphs, "evaluation_graphs_apply", lambda graphed, device: False)
    eager = trials(cells, WorkerState())
    monkeypatch.setattr(graphs, "evaluation_graphs_apply", lambda graphed, device: graphed)
    monkeypatch.setattr(graphs, "capture_evaluation", failing)
    worker = WorkerState()
    fell_back = trials(cells, worker)
    assert len(calls) == 1
    for f, e in zip(fell_back, eager):
        assert f.status == "ok" and "eval_graphs" not in f.optimisations and "cuda_graphs" in f.optimisations
        assert [p.loss for p in f.eval_curve] == pytest.approx([p.loss for p in e.eval_curve], rel=_ROUNDING[device])
    (failure,) = [why for key, why in worker.graph_failures.items() if key[-1] == "evaluation"]
    assert "operation not permitted" in failure
    later = trials([dataclasses.replace(c, seed=1) for c in cells], worker)
    assert len(calls) == 1 and all("eval_graphs" not in r.optimisations for r in later)


def test_evaluations_get_the_padding_mask_prebuilt_where_graphed_or_on_a_gpu_but_fp16():
    """Where a sync per evaluation batch costs (a GPU) or a capture refuses it (graphed); fp16 keeps the
    model's own mask building (the prebuilt mask turns -inf there), a CPU too (a sync costs nothing)."""
    from freezesweep.trials.precision import PrecisionPlan
    from freezesweep.trials.run import prebuilt_mask

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert prebuilt_mask(False, cuda, PrecisionPlan("bf16", "cuda")) and prebuilt_mask(
        False, cuda, PrecisionPlan("fp32", "cuda")
    )
    assert not prebuilt_mask(False, cuda, PrecisionPlan("fp16", "cuda"))
    assert not prebuilt_mask(False, cpu, PrecisionPlan("fp32", "cpu")) and not prebuilt_mask(
        False, cpu, PrecisionPlan("bf16", "cpu")
    )
    assert prebuilt_mask(True, cpu, PrecisionPlan("fp32", "cpu"))  # (graphed: the tests' stand-in on a CPU)


# --- slots (an array whose members draw their own batches) as one graph ---------------------------------
def _slot_cells(still_bert: str, toy_dataset: str, device: str = "cpu", pack: bool = True) -> list:
    """Four cells through two slots, in an order where taking the queue's first would change a slot's
    depth: k = 2's short cell ends first (6 steps against 9), and the queue's next is a k = 0 one."""
    cell = functools.partial(_cell, still_bert, toy_dataset, trial_array=True, device=device, pack_training=pack)
    return [
        cell(train_size=40, seed=0, frozen_layers=0),
        cell(train_size=24, seed=0, frozen_layers=2),
        cell(train_size=40, seed=1, frozen_layers=0),
        cell(train_size=24, seed=1, frozen_layers=2),
    ]


def _counting(monkeypatch, module, name: str) -> list:
    made, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **kw: made.append(a) or real(*a, **kw))
    return made


# (padded slots' CUDA case left out: the GPU check's tests part has a time limit, and packing is the default)
@pytest.mark.parametrize(
    "device, pack", [("cpu", True), ("cpu", False), pytest.param(*CUDA.values, True, marks=CUDA.marks)]
)
def test_graphed_slots_train_as_the_eager_ones(still_bert, toy_dataset, monkeypatch, device, pack):
    """Slots across seeds and train sizes as one CUDA graph (CPU: the capture stood in for; a GPU's is
    real): captured once, kept through every refill (the queue's next cell of a slot's depth takes it, and its
    optimizer, zeroed as new) and through a slot left free at the end (its last member's update stays
    in the graph, at weight 0). Without dropout each member follows the eager slots' curve to float
    rounding, whatever order the cells took the slots in. Packed slots and padded ones."""
    from freezesweep.trials import array

    monkeypatch.setattr(graphs, "capture", graphs.capture_on_cpu if device == "cpu" else graphs.capture)
    monkeypatch.setattr(graphs, "cuda_graphs_apply", lambda cfg, *_: cfg.cuda_graphs)
    cells = _slot_cells(still_bert, toy_dataset, device, pack)
    eager = array.run_array(cells, width=2)
    captures = _counting(monkeypatch, graphs, "capture")
    made, again = _counting(monkeypatch, array, "optimizer_for"), _counting(monkeypatch, array, "optimizer_again")
    graphed = array.run_array([dataclasses.replace(c, cuda_graphs=True) for c in cells], width=2)
    assert len(captures) == 1 and len(made) == 2 and len(again) == len(cells) - 2
    for g, e in zip(graphed, eager):
        assert g.status == e.status == "ok" and {"cuda_graphs", "trial_array"} <= set(g.optimisations)
        assert "cuda_graphs" not in e.optimisations and ("packed_training" in g.optimisations) == pack
        assert [p.step for p in g.eval_curve] == [p.step for p in e.eval_curve]
        assert [p.loss for p in g.eval_curve] == pytest.approx([p.loss for p in e.eval_curve], rel=1e-4)


# (refilled: the GPU's case; the CPU's recorded replays read each later member's weights as a GPU's do)
@pytest.mark.parametrize(
    "device, order",
    [("cpu", "refilled"), ("cpu", "due-together"), pytest.param(*CUDA.values, "refilled", marks=CUDA.marks)],
)
def test_graphed_slots_evaluations_are_the_eager_ones(still_bert, toy_dataset, monkeypatch, device, order):
    """Slots' evaluations as a graph per slot and depth, two captures each time. Refilled: slot 0 holds
    k = 0 cells (from the embeddings), slot 1 k = 2 ones (from the cache), one after another, each later
    member replaying its slot's graph over the weights it trains now. Due together: two k = 0 cells of
    n = 40 and 24, due at once at every other step, the n = 24 one alone at the others, the n = 40 one
    alone once the other is over (a graph per set of slots due would be three). Every curve the eager one's."""
    from freezesweep.trials import array

    captures: list = []
    cells = _slot_cells(still_bert, toy_dataset, device)
    if order == "due-together":
        cells = [cells[0], dataclasses.replace(cells[3], frozen_layers=0)]
    cells = [dataclasses.replace(c, cuda_graphs=True) for c in cells]
    _evaluations_graphed(monkeypatch, device, False, captures)
    eager = array.run_array(cells, width=2)
    _evaluations_graphed(monkeypatch, device, True, captures)
    graphed = array.run_array(cells, width=2)
    assert captures == [[]] * 2  # no host read in either
    for g, e in zip(graphed, eager):
        assert {"trial_array", "cuda_graphs", "eval_graphs"} <= set(g.optimisations)
        assert "eval_graphs" not in e.optimisations and len(g.eval_curve) >= 3
        assert [p.loss for p in g.eval_curve] == pytest.approx([p.loss for p in e.eval_curve], rel=_ROUNDING[device])
        assert device != "cpu" or [p.accuracy for p in g.eval_curve] == [p.accuracy for p in e.eval_curve]


def test_a_slots_optimizer_taken_over_is_a_new_ones():
    """``optimizer_again``: the state a new AdamW's first step makes (a taken-over slot's next step is
    its new cell's first), its schedule from the first learning rate again."""
    from freezesweep.trials.config import TrialConfig
    from freezesweep.trials.train import Schedule, optimizer_again, optimizer_for

    cfg = TrialConfig(dataset="d", model="m", train_size=8, frozen_layers=0, weight_decay=0.1)
    schedule = Schedule(2, 10, 0, frozenset({5, 10}), frozenset())
    fresh, used = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    optimizers = []
    for param, steps in ((fresh, 1), (used, 4)):
        optimizer, scheduler = optimizer_for([param], cfg, schedule)
        for i in range(steps):
            param.grad = torch.full_like(param, 0.5 + i)
            optimizer.step()
            scheduler.step()
        optimizers.append(optimizer)
    assert not torch.equal(used, fresh)
    optimizer, _ = optimizer_again(optimizers[1], schedule)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(cfg.learning_rate)  # the schedule's step 0
    with torch.no_grad():
        used.fill_(1.0)
    used.grad = torch.full_like(used, 0.5)
    optimizer.step()
    assert torch.equal(used, fresh)


def test_a_diverged_slot_stays_in_the_graph_and_leaks_nothing(still_bert, toy_dataset, monkeypatch):
    """A member whose loss and gradients turn NaN inside a replay diverges and leaves with its row; its
    slot, left free, stays in the graph with its NaN slices (nothing is captured again), and the other
    member's numbers are those of the run where nobody diverged."""
    from freezesweep.trials import array

    monkeypatch.setattr(graphs, "capture", graphs.capture_on_cpu)
    monkeypatch.setattr(graphs, "cuda_graphs_apply", lambda cfg, *_: cfg.cuda_graphs)
    cells = [
        _cell(still_bert, toy_dataset, seed=s, frozen_layers=k, trial_array=True, cuda_graphs=True)
        for s, k in ((0, 0), (1, 2))
    ]
    clean = array.run_array(cells, width=2)
    captures = _counting(monkeypatch, graphs, "capture")
    _poison(monkeypatch, array, depth=2, after_steps=2)  # (a replay's)
    kept, diverged = array.run_array(cells, width=2)
    assert diverged.status == "diverged" and kept.status == "ok" and len(captures) == 1
    assert [p.loss for p in kept.eval_curve] == pytest.approx([p.loss for p in clean[0].eval_curve], rel=1e-6)
    losses, expected = [loss for _, loss in kept.train_loss_curve], [loss for _, loss in clean[0].train_loss_curve]
    assert losses == pytest.approx(expected, rel=1e-6)


def test_slots_whose_capture_fails_go_on_eagerly(still_bert, toy_dataset, monkeypatch):
    """A failed capture of the slots' step: every member goes on eagerly, along the eager slots'
    curves, its row without ``cuda_graphs``; the worker keeps the verdict."""
    from freezesweep.trials import array

    calls: list = []
    monkeypatch.setattr(graphs, "capture", _failing_capture(1, calls))
    monkeypatch.setattr(graphs, "cuda_graphs_apply", lambda cfg, *_: cfg.cuda_graphs)
    cells, worker = _slot_cells(still_bert, toy_dataset), WorkerState()
    eager = array.run_array(cells, width=2, worker=worker)
    fell_back = array.run_array([dataclasses.replace(c, cuda_graphs=True) for c in cells], width=2, worker=worker)
    assert len(calls) == 1 and len(worker.graph_failures) == 1
    for f, e in zip(fell_back, eager):
        assert f.status == "ok" and "cuda_graphs" not in f.optimisations and "trial_array" in f.optimisations
        assert [p.loss for p in f.eval_curve] == pytest.approx([p.loss for p in e.eval_curve], rel=1e-4)
