"""Trial arrays (trials/array.py) against the single trial (trials/run.py), the reference: tiny models,
fp32 on the CPU, seconds each."""

from __future__ import annotations

import copy
import dataclasses
import functools

import pytest
import torch

from freezesweep.trials import array as arrays
from freezesweep.trials.array import array_key, build_array, group_cells, run_array
from freezesweep.trials.config import TrialConfig
from freezesweep.trials.evaluate import task_loss
from freezesweep.trials.packing import PaddedFeed
from freezesweep.trials.run import adapt, check_batch, run_trial, trial_data, trial_model
from freezesweep.trials.train import make_schedule, optimizer_for, train_step
from freezesweep.trials.worker import WorkerState
from tests.conftest import lacking, make_toy_dataset

DEPTHS = (-1, 0, 1, 2)  # tiny_bert has 2 layers: embeddings only, nothing, one layer, every layer


@pytest.fixture
def tiny_trial(tiny_trial):
    return dataclasses.replace(tiny_trial, trial_array=True)  # auto runs arrays on GPUs only


@pytest.fixture
def cells(tiny_trial):
    return [dataclasses.replace(tiny_trial, frozen_layers=k) for k in DEPTHS]


def built(cells, worker=None):
    worker = worker or WorkerState()
    run = build_array(cells, len(cells), arrays.Plan({}, lambda cfg, point: None), lambda result: None, worker, 0.0)
    assert run is not None
    return run


def single(cfg: TrialConfig, slot_weights: dict[str, torch.Tensor] | None = None):
    """The cell's single-trial model (frozen as its trial freezes it), optionally with a slot's weights."""
    worker = WorkerState()
    data = trial_data(cfg, torch.device("cpu"), worker)
    model = trial_model(cfg, data, torch.device("cpu"))
    if slot_weights:
        model.load_state_dict(slot_weights, strict=False)
    adapt(model, cfg)
    return model, data


def slot_weights(run, slot: int) -> dict[str, torch.Tensor]:
    return {name: tensor[slot].detach().clone() for name, tensor in run.stack.tensors.items()}


def perturb(run) -> None:
    """Give every slot weights of its own (a fresh array's members are all the initial model)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for tensor in run.stack.tensors.values():
            tensor.add_(0.05 * torch.randn(tensor.shape, generator=generator))


def test_forward_and_gradients_are_each_single_models(cells):
    run = built(cells)
    perturb(run)
    batch = check_batch(run.members[0].data, torch.device("cpu"))
    run.stack.model.eval()
    logits = run.stack.logits(PaddedFeed(), batch)
    losses = torch.func.vmap(task_loss, in_dims=(0, None))(logits, batch.labels)
    losses.sum().backward()
    for member in run.members:
        model, _ = single(member.cfg, slot_weights(run, member.slot))
        model.eval()
        own = model(**batch.model_inputs()).logits
        torch.testing.assert_close(logits[member.slot], own, rtol=0, atol=1e-6)
        task_loss(own, batch.labels).backward()
        grads = dict(model.named_parameters())
        for name in member.leaves:
            expected = grads[name].grad
            got = run.stack.tensors[name].grad[member.slot]
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * max(1.0, float(expected.abs().max())))


def test_one_step_is_each_single_trials_step_frozen_slices_bit_unchanged(cells):
    """Weight decay on and clipping biting (max_grad_norm far below the gradients' norms, which differ
    per member): each member's step is its own single trial's, and what it freezes never moves."""
    cells = [dataclasses.replace(c, weight_decay=0.1, max_grad_norm=0.01) for c in cells]
    run = built(cells)
    initial = slot_weights(run, 0)
    batch = run.base.feed.prepare(check_batch(run.members[0].data, torch.device("cpu")))
    torch.manual_seed(0)
    with arrays.first_token.narrowed(run.stack.model, run.reader):
        run.stack.model.train()
        arrays.array_step(run.stack, run.members, batch, run.base.plan, run.base.feed)
    for member in run.members:
        cfg = member.cfg
        model, data = single(cfg)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer, scheduler = optimizer_for(params, cfg, make_schedule(len(data.train_rows), cfg))
        torch.manual_seed(0)
        with arrays.first_token.narrowed(model, run.reader):
            model.train()
            train_step(
                model,
                batch,
                optimizer,
                scheduler,
                run.base.plan.grad_scaler(),
                params,
                run.base.plan,
                run.base.feed,
                0.01,
            )
        after = dict(model.named_parameters())
        for name, tensor in run.stack.tensors.items():
            if name in member.leaves:
                torch.testing.assert_close(tensor[member.slot], after[name], rtol=0, atol=1e-6)
            else:
                assert torch.equal(tensor[member.slot], initial[name]), f"k={cfg.frozen_layers}: {name} moved"


def test_frozen_slices_stay_bit_unchanged_through_a_fit_with_weight_decay(cells):
    cells = [dataclasses.replace(c, weight_decay=0.1) for c in cells]
    run = built(cells)
    initial, members = slot_weights(run, 0), list(run.members)  # fit_array lets each go as it leaves
    with arrays.first_token.narrowed(run.stack.model, run.reader):
        arrays.fit_array(run)
    moved = set()
    for member in members:
        for name, tensor in run.stack.tensors.items():
            unchanged = torch.equal(tensor[member.slot], initial[name])
            assert unchanged != (name in member.leaves), (member.cfg.frozen_layers, name)
            moved |= set() if unchanged else {name}
    assert any("embeddings" in name for name in moved)  # the k = 0 member trained what k = -1 froze


def test_the_layers_every_member_freezes_run_once(cells):
    """Layer 0 is frozen by every member of a k >= 1 array: unbatched (one pass for all); layer 1 is
    trained by one of them: batched over the members."""
    run = built([c for c in cells if c.frozen_layers >= 1])
    layers = arrays.find_encoder_parts(run.stack.model).layers
    batched = {}

    def seen(module, args, out, i):  # returns None: the output stays the layer's
        batched.setdefault(i, torch._C._functorch.is_batchedtensor(out[0] if isinstance(out, tuple) else out))

    hooks = [layer.register_forward_hook(functools.partial(seen, i=i)) for i, layer in enumerate(layers)]
    try:
        run.stack.logits(PaddedFeed(), check_batch(run.members[0].data, torch.device("cpu")))
    finally:
        for hook in hooks:
            hook.remove()
    assert batched == {0: False, 1: True}
    assert {n.split(".")[3] for n in run.stack.tensors if n.startswith("bert.encoder.layer.")} == {"1"}


def test_each_member_is_evaluated_from_its_own_depth(cells):
    """On one stream the evaluation runs per member only the layers its single trial runs: k = -1 and
    0 (no cache) in one pass from the embeddings, k = 1 from its cached states (layer 1 only), k = 2
    (every layer frozen) from its own (no layer at all). Tiny BERT has 2 layers."""
    run = built(cells)
    groups = run.eval_depths.groups(run.members)
    assert [(g.slots, g.prefix and g.prefix.layer) for g in groups] == [((0, 1), None), ((2,), 1), ((3,), 2)]
    layers = arrays.find_encoder_parts(run.stack.model).layers
    members: dict[int, list[int]] = {0: [], 1: []}

    def seen(module, args, out, i):  # how many members each pass of layer i computes
        value = out[0] if isinstance(out, tuple) else out
        members[i].append(_width(value) if torch._C._functorch.is_batchedtensor(value) else 0)

    hooks = [layer.register_forward_hook(functools.partial(seen, i=i)) for i, layer in enumerate(layers)]
    try:
        arrays.evaluate_array(run.stack, run.base.eval_batches[:1], run.base.plan, run.base.device, groups)
    finally:
        for hook in hooks:
            hook.remove()
    assert members == {0: [2], 1: [2, 1]}  # layer 0: the uncached pair; layer 1: the pair, then k = 1


def _width(batched: torch.Tensor) -> int:
    """The member dimension's size of a tensor batched by ``vmap``."""
    return torch._C._functorch.get_unwrapped(batched).shape[torch._C._functorch.maybe_get_bdim(batched)]


def assert_same_as_singles(array_results, single_results, atol=1e-5):
    """Each member's row is its single trial's, the evaluation cache at its own depth too
    (``EvalDepths``), with the same optimisations (slots packed where their single trials are)."""
    for a, s in zip(array_results, single_results):
        assert a.trial_id == s.trial_id and a.status == s.status == "ok"
        assert "trial_array" in a.optimisations and "trial_array" not in s.optimisations
        assert a.eval_cached_layers == s.eval_cached_layers
        assert ("eval_cache" in a.optimisations) == ("eval_cache" in s.optimisations)
        assert a.optimisations == (*s.optimisations, "trial_array")
        assert [p.step for p in a.eval_curve] == [p.step for p in s.eval_curve]
        assert a.best_step == s.best_step and a.train_indices == s.train_indices
        for p, q in zip(a.eval_curve, s.eval_curve):
            assert p.loss == pytest.approx(q.loss, abs=atol) and p.accuracy == pytest.approx(q.accuracy, abs=1e-9)
        for (_, p), (_, q) in zip(a.train_loss_curve, s.train_loss_curve):
            assert p == pytest.approx(q, abs=atol)
        assert (a.trainable_params, a.total_params) == (s.trainable_params, s.total_params)


def test_a_short_fit_gives_each_single_trials_row(cells):
    """10 epochs of 120 rows with dropout on: the full fine-tune learns, each member's curve is its
    single trial's and its best evaluation the same step; the members, over at one step, give their
    rows together (one report for a Ray trial)."""
    cells = [dataclasses.replace(c, epochs=10, train_size=120, weight_decay=0.01) for c in cells[1::2]]  # k = 0, 2
    seen, finished = [], []
    results = run_array(cells, on_eval=lambda cfg, point: seen.append(cfg.trial_id), on_results=finished.append)
    singles = [run_trial(c) for c in cells]
    assert_same_as_singles(results, singles)
    assert max(r.best_val_accuracy - r.majority_baseline for r in results) > 0.1  # something learned
    assert [[r.trial_id for r in given] for given in finished] == [[c.trial_id for c in cells]]
    assert len(seen) == sum(len(r.eval_curve) for r in results)
    assert [r.optimisations for r in results] == [
        ("narrowed_last_layer", "packed_training", "trial_array"),  # k = 0
        ("eval_cache", "narrowed_last_layer", "packed_training", "trial_array"),  # k = 2: from its own depth
    ]


def test_a_bf16_array(cells):
    """bf16 autocast through the stacked model: rows in bf16, each near its single trial (a batched
    product rounds to bf16 in another order than a plain one: not to fp32's tolerance)."""
    cells = [dataclasses.replace(c, precision="bf16") for c in cells[1::2]]  # k = 0, 2
    results = run_array(cells)
    for a, s in zip(results, [run_trial(c) for c in cells]):
        assert a.precision == s.precision == "bf16" and "trial_array" in a.optimisations
        assert [p.step for p in a.eval_curve] == [p.step for p in s.eval_curve]
        assert all(p.loss == pytest.approx(q.loss, abs=2e-2) for p, q in zip(a.eval_curve, s.eval_curve))


@pytest.mark.parametrize("narrow,pack", [(False, False), (True, False)])
def test_padded_and_unnarrowed_feeds_in_an_array(cells, narrow, pack):
    cells = [dataclasses.replace(c, narrow_last_layer=narrow, pack_training=pack) for c in cells]
    results = run_array(cells)
    assert_same_as_singles(results, [run_trial(c) for c in cells])
    expected = ("narrowed_last_layer",) * narrow + ("trial_array",)
    assert {tuple(o for o in r.optimisations if o != "eval_cache") for r in results} == {expected}


def test_an_array_of_frozen_layers_uses_the_evaluation_cache(cells):
    cells = [c for c in cells if c.frozen_layers >= 1]
    results = run_array(cells)
    assert_same_as_singles(results, [run_trial(c) for c in cells])
    assert [r.eval_cached_layers for r in results] == [c.frozen_layers for c in cells]  # each from its own depth
    assert all("eval_cache" in r.optimisations for r in results)


def test_a_diverged_member_leaves_with_its_row_and_the_others_go_on_bit_identically(cells, monkeypatch):
    cells = [dataclasses.replace(c, epochs=4) for c in cells]
    clean = run_array(cells)
    update, steps = arrays.member_update, []

    def poisoned(stack, member):  # k = 1's gradients turn NaN at its third step
        steps.append(member.cfg.frozen_layers)
        if member.cfg.frozen_layers == 1 and steps.count(1) == 3:
            stack.tensors["classifier.weight"].grad[member.slot].fill_(float("nan"))
        update(stack, member)

    monkeypatch.setattr(arrays, "member_update", poisoned)
    finished = []
    results = run_array(cells, on_results=finished.append)
    diverged = next(r for r in results if r.config.frozen_layers == 1)
    assert diverged.status == "diverged" and diverged.diverged_at_step == 4
    assert finished[0] == [diverged]  # its row first, alone, while the others train on
    assert sorted(r.trial_id for r in finished[1]) == sorted(r.trial_id for r in results if r is not diverged)
    assert steps.count(1) == 4 < steps.count(0)  # no step after the evaluation that saw it
    for a, b in zip(results, clean):
        if a is not diverged:
            assert (a.eval_curve, a.train_loss_curve, a.best_step) == (b.eval_curve, b.train_loss_curve, b.best_step)


@pytest.mark.parametrize("family", ["llama", "gpt2", "deberta-v2"])
def test_decoders_and_deberta_qualify(family, tmp_path, minilm_tokenizer, tiny_trial):
    from tests.families import FAMILIES, save_family

    model = save_family(tmp_path / family, FAMILIES[family], minilm_tokenizer)
    cells = [dataclasses.replace(tiny_trial, model=model, frozen_layers=k) for k in (-1, 0, 2)]
    results = run_array(cells)
    assert_same_as_singles(results, [run_trial(c) for c in cells])


def test_a_model_vmap_cannot_batch_steps_aside(tmp_path, minilm_tokenizer, tiny_trial):
    """BLOOM's GeLU is an autograd.Function without a vmap rule: its cells run as single trials."""
    from tests.families import LAYERS, HIDDEN, Family, save_family

    bloom = Family("bloom", dict(hidden_size=HIDDEN, n_layer=LAYERS, n_head=2), "h", ())
    model = save_family(tmp_path / "bloom", bloom, minilm_tokenizer)
    cells = [dataclasses.replace(tiny_trial, model=model, frozen_layers=k) for k in (0, 2)]
    worker = WorkerState()
    results = run_array(cells, worker=worker)
    assert list(worker.array_verdicts.values()) == [False]
    assert all("trial_array" not in r.optimisations for r in results)
    assert [r.eval_curve for r in results] == [run_trial(c).eval_curve for c in cells]


class _Dropout(torch.nn.Dropout):
    """Dropout that, under ``vmap`` in training, draws other masks than the plain model's (as a GPU's
    vmapped dropout does: seen on an H100) or raises (as a GPU's fused SDPA does under "same")."""

    def __init__(self, p: float, raises: bool):
        super().__init__(p)
        self.raises = raises

    def forward(self, x):
        if self.training and torch._C._functorch.is_batchedtensor(x):
            if self.raises:
                raise RuntimeError("same randomness is not supported here")
            torch.rand(())  # the masks that follow are others than the plain model's
        return super().forward(x)


def _with_dropout(tiny_trial, raises: bool):
    cfg = dataclasses.replace(tiny_trial, frozen_layers=0)
    data = trial_data(cfg, torch.device("cpu"), WorkerState())
    model = trial_model(cfg, data, torch.device("cpu"))
    for name, module in list(model.named_modules()):
        if isinstance(module, torch.nn.Dropout):
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent), leaf, _Dropout(0.5, raises))
    return model, check_batch(data, torch.device("cpu"))


@pytest.mark.parametrize("raises", [False, True], ids=["other-masks", "raises"])
def test_the_check_compares_numbers_with_dropout_off_and_needs_training_to_run(tiny_trial, caplog, raises):
    """Members whose dropout draws other masks than the plain model's still compute its function:
    they qualify (the array's masks are the members' shared draws). A model whose training pass
    raises under vmap is refused, and the log says what raised."""
    model, batch = _with_dropout(tiny_trial, raises)
    key = arrays.FeedKey(tiny_trial.model, type(model).__qualname__)
    caplog.set_level("WARNING", logger=arrays.__name__)
    assert arrays.array_agrees(model, batch, PaddedFeed(), key, WorkerState()) is not raises
    assert ("same randomness is not supported here" in caplog.text) is raises


def test_a_workers_verdicts_are_kept_per_attention(tiny_trial):
    """On a GPU single trials run SDPA and arrays eager attention in one worker: a verdict measured
    on one attention's numbers (the feed's, the array's) is not taken for the other's."""
    from freezesweep.trials.run import feed_of

    worker = WorkerState()
    cfg = dataclasses.replace(tiny_trial, frozen_layers=0)
    data = trial_data(cfg, torch.device("cpu"), worker)
    eager = trial_model(cfg, data, torch.device("cpu"))
    sdpa = copy.deepcopy(eager)
    sdpa.set_attn_implementation("sdpa")
    for model in (eager, sdpa):
        feed_of(cfg, model, data, torch.device("cpu"), packed=True)
    assert sorted(key.attention for key in worker.feed_verdicts) == ["eager", "sdpa"]


def test_an_arrays_model_runs_eager_attention(cells, monkeypatch):
    """Whatever attention a trial's model gets on its device (SDPA on a GPU), the array's model runs
    eager attention: a GPU's fused SDPA cannot draw dropout under vmap."""
    from freezesweep.trials import run as runs

    monkeypatch.setattr(runs, "attention_for", lambda model, device: model.set_attn_implementation("sdpa") or model)
    run = built(cells)
    assert run.stack.model.config._attn_implementation == "eager"


def test_which_cells_qualify(tiny_trial):
    lora = dataclasses.replace(
        tiny_trial, method="lora", frozen_layers=None, lora_rank=4, lora_alpha=8.0, lora_dropout=0.0
    )
    probe = dataclasses.replace(
        tiny_trial, method="probe", frozen_layers=None, probe_pooling="auto", probe_folds=2, probe_cs=2
    )
    alone = [
        lora,
        probe,
        dataclasses.replace(tiny_trial, precision="fp16"),
        dataclasses.replace(tiny_trial, train_cache=True),
        dataclasses.replace(tiny_trial, checkpoint_every_epochs=1.0),
        dataclasses.replace(tiny_trial, trial_array=False),
        dataclasses.replace(tiny_trial, trial_array=None, gpus_per_trial=0),  # auto: on a GPU only
    ]
    assert [array_key(c) for c in alone] == [None] * len(alone)
    assert array_key(tiny_trial) == array_key(dataclasses.replace(tiny_trial, frozen_layers=2, eval_batch_size=32))
    assert array_key(tiny_trial) != array_key(dataclasses.replace(tiny_trial, seed=1))
    assert array_key(tiny_trial) != array_key(dataclasses.replace(tiny_trial, train_size=24))
    assert array_key(dataclasses.replace(tiny_trial, precision="bf16")) is not None
    assert array_key(dataclasses.replace(tiny_trial, trial_array=None, gpus_per_trial=0.25, precision="bf16"))


def test_asked_for_by_name_an_array_runs_on_a_cpu_too(tiny_trial):
    """The auto switch is the driver's (it groups cells where arrays pay); ``run_array`` called with
    cells the switch leaves unset trains them as an array wherever it runs (a profile, a benchmark)."""
    cells = [dataclasses.replace(tiny_trial, trial_array=None, gpus_per_trial=0, frozen_layers=k) for k in (0, 2)]
    assert group_cells(cells, width=8) == [[cells[0]], [cells[1]]]
    assert all("trial_array" in r.optimisations for r in run_array(cells))


def test_cells_group_into_arrays_in_order(tiny_trial):
    grid = [
        dataclasses.replace(tiny_trial, train_size=n, frozen_layers=k, seed=s)
        for n in (24, 48)
        for k in DEPTHS
        for s in (0, 1)
    ]
    lora = dataclasses.replace(
        tiny_trial, method="lora", frozen_layers=None, lora_rank=4, lora_alpha=8.0, lora_dropout=0.0
    )
    groups = group_cells([*grid, lora], width=3)
    assert [len(g) for g in groups] == [3, 3, 1, 1, 3, 3, 1, 1, 1]  # by (n, seed): k = -1, 0, 1 then k = 2
    assert sorted(c.trial_id for g in groups for c in g) == sorted(c.trial_id for c in [*grid, lora])
    for group in groups:
        assert len(group) <= 3 and len({array_key(c) for c in group}) == 1
        assert len({(c.train_size, c.seed) for c in group}) == 1
    assert groups[-1] == [lora]
    assert [len(g) for g in group_cells(grid, width=1)] == [1] * len(grid)


def test_cells_that_are_not_one_array_are_refused(tiny_trial):
    with pytest.raises(ValueError, match="not one trial array"):
        run_array([tiny_trial, dataclasses.replace(tiny_trial, learning_rate=1e-3)])  # another protocol
    with pytest.raises(ValueError, match="not one trial array"):
        run_array([tiny_trial, dataclasses.replace(tiny_trial, frozen_layers=2, trial_array=False)])
    with pytest.raises(ValueError, match="given twice"):
        run_array([tiny_trial, tiny_trial])


def test_single_model_copy_is_independent(cells):
    """The stacked slots are copies: the model's own (shared) parameters never change."""
    run = built(cells)
    before = copy.deepcopy(dict(run.stack.model.named_parameters()))
    with arrays.first_token.narrowed(run.stack.model, run.reader):
        arrays.fit_array(run)
    after = dict(run.stack.model.named_parameters())
    assert all(torch.equal(before[n], after[n]) for n in before)


def test_an_array_out_of_memory_runs_again_at_half_its_width(cells, tmp_path, monkeypatch):
    """The k = 1 member runs out of GPU memory (simulated, once) at its first evaluation: the array gives
    its memory back and its members run again as two arrays of two; one row each, as their singles."""
    monkeypatch.setenv("FREEZESWEEP_FAULT_DIR", str(tmp_path / "faults"))
    monkeypatch.setenv("FREEZESWEEP_FAULT", "oom@1:frozen_layers=1*1")
    widths, run = [], arrays.run_array
    monkeypatch.setattr(arrays, "run_array", lambda cfgs, *rest: widths.append(len(cfgs)) or run(cfgs, *rest))
    given = []
    results = arrays.run_array_or_oom(cells, on_results=given.extend)
    assert widths == [4, 2, 2]
    assert sorted(r.trial_id for r in given) == sorted(c.trial_id for c in cells)  # one row each
    monkeypatch.delenv("FREEZESWEEP_FAULT")
    assert_same_as_singles(results, [run_trial(c) for c in cells])


def test_a_lone_member_out_of_memory_is_its_oom_row(tiny_trial, monkeypatch):
    monkeypatch.setenv("FREEZESWEEP_FAULT", "oom@1")
    given = []
    [result] = arrays.run_array_or_oom([tiny_trial], on_results=given.extend)
    assert result.status == "oom" and given == [result]


# --- slots: members with streams of their own (seeds, train sizes), taking turns ----------------------
@pytest.fixture
def quiet_bert(tmp_path_factory, minilm_tokenizer) -> str:
    """tests/families.py's BERT: no dropout, so a slot (whose dropout draws are the array's, not its
    single trial's) must give its single trial's numbers to float rounding."""
    from tests.families import FAMILIES, save_family

    return save_family(tmp_path_factory.mktemp("quiet-bert"), FAMILIES["bert"], minilm_tokenizer)


@pytest.fixture(scope="module")
def varied_dataset(tmp_path_factory) -> str:
    """The toy task with 0 to 11 more words a sentence: batches of unequal token counts."""
    import random

    import pandas as pd

    folder, rng = make_toy_dataset(tmp_path_factory.mktemp("varied")), random.Random(7)
    for split in ("train", "validation"):
        frame = pd.read_csv(folder / f"{split}.csv")
        frame["sentence"] = [text + " really" * rng.randrange(12) for text in frame["sentence"]]
        frame.to_csv(folder / f"{split}.csv", index=False)
    return str(folder)


@pytest.mark.parametrize("pack", [True, False])
def test_slots_across_seeds_and_train_sizes_give_each_single_trials_row(
    tiny_trial, quiet_bert, varied_dataset, pack, monkeypatch
):
    """Packed (each slot's rows in one row of its real tokens) or padded, every slot trains as its single
    trial; packed, the slots' one width is the most real tokens a slot held at any step, up to a
    multiple of 8 (not the longest row times the rows, the padded slots' shape)."""
    cell = functools.partial(dataclasses.replace, tiny_trial, dataset=varied_dataset, model=quiet_bert)
    cells = [
        cell(train_size=n, seed=s, frozen_layers=k, pack_training=pack)
        for n in (24, 48)
        for s in (0, 1)
        for k in (0, 2)
    ]
    batches, own_step = [], arrays.own_step
    monkeypatch.setattr(
        arrays,
        "own_step",
        lambda stack, active, batch, *rest: batches.append(batch) or own_step(stack, active, batch, *rest),
    )
    finished = []
    results = run_array(cells, on_results=finished.extend, width=3)  # 8 cells through 3 slots
    assert_same_as_singles(results, [run_trial(c) for c in cells])
    assert all(("packed_training" in r.optimisations) == pack for r in results)
    assert sorted(r.trial_id for r in finished) == sorted(c.trial_id for c in cells)
    assert {len(r.eval_curve) for r in results} == {4, 3}  # each on its own schedule (n = 24, n = 48)
    assert {type(b).__name__ for b in batches} == {"PackedSlots" if pack else "SlotBatch"}
    if pack:
        widths = {b.input_ids.shape[-1] for b in batches}
        held = max(int(((b.sequence >= 0) & (b.weights.sum(1) > 0)[:, None]).sum(1).max()) for b in batches)
        assert widths == {-(-held // 8) * 8}
        padded_width = 16 * max(
            len(r) for c in cells for r in trial_data(c, torch.device("cpu"), WorkerState()).train_tokens.input_ids
        )
        assert held < padded_width


@pytest.mark.parametrize("family,packs", [("bert", True), ("roberta", True), ("llama", False)])
def test_which_families_train_their_slots_packed(family, packs, tmp_path, minilm_tokenizer, tiny_trial):
    """Packed slots where the model packs and its vmapped forward takes a batched mask and first tokens
    (RoBERTa: its positions after the padding index); a decoder (its head reads the last token) pads."""
    from tests.families import FAMILIES, save_family

    model = save_family(tmp_path / family, FAMILIES[family], minilm_tokenizer)
    cfg = dataclasses.replace(tiny_trial, model=model)
    data = trial_data(cfg, torch.device("cpu"), WorkerState())
    net = trial_model(cfg, data, torch.device("cpu"))
    worker, key = WorkerState(), arrays.FeedKey(model, type(net).__qualname__)
    _, feed = arrays.feed_of(cfg, net, data, torch.device("cpu"), packed=True)
    check = check_batch(data, torch.device("cpu"))
    assert arrays.packed_slots_agree(net, check, data.pad_id, feed, key, worker) is packs


def test_slots_whose_model_takes_no_packed_batch_train_padded(tiny_trial, quiet_bert, monkeypatch):
    monkeypatch.setattr(arrays, "_packed_slots_agree", lambda *args: False)
    cells = [dataclasses.replace(tiny_trial, model=quiet_bert, seed=s) for s in (0, 1)]
    results = run_array(cells, width=2)
    assert all("packed_training" not in r.optimisations and "trial_array" in r.optimisations for r in results)
    assert_same_as_singles(results, [run_trial(dataclasses.replace(c, pack_training=False)) for c in cells])


def test_a_slot_is_evaluated_at_its_own_steps_only(tiny_trial, quiet_bert, monkeypatch):
    """Slots on other schedules (n = 24 evaluates every step, n = 48 every other) are not evaluated
    when another is due: the members evaluated, summed over the run, are the points of the curves (an
    evaluation of every slot whoever was due ran more)."""
    cells = [
        dataclasses.replace(tiny_trial, model=quiet_bert, train_size=n, seed=s, frozen_layers=k)
        for n, s, k in ((24, 0, 0), (48, 1, 0), (24, 2, 2), (48, 0, 2))
    ]
    evaluated, group = [], arrays._evaluate_group

    def counted(stack, batches, plan, device, g, *rest):
        evaluated.append(len(g.slots))
        return group(stack, batches, plan, device, g, *rest)

    monkeypatch.setattr(arrays, "_evaluate_group", counted)
    results = run_array(cells, width=2)
    assert sum(evaluated) == sum(len(r.eval_curve) for r in results)
    assert_same_as_singles(results, [run_trial(c) for c in cells])


@pytest.mark.parametrize("init", ["random", "lacking"])
@pytest.mark.parametrize(
    "depths, cached",
    [
        ((0, 2), [None, 2, None, None]),  # k = 0 trains every weight of the k = 2 prefix
        ((1, 2), [1, 2, None, None]),  # nobody trains the prefix, whose weights differ between the seeds
    ],
)
def test_slots_of_another_random_init_evaluate_from_the_embeddings(
    tiny_trial, quiet_bert, depths, cached, init, tmp_path
):
    """A random init differs per seed, as does a pretrained model's weight its checkpoint lacks (drawn
    from the seed), and the cached states are the array model's (the first cell's seed): its seed's
    slots evaluate from them, a slot of another seed every layer, never those states (its single trial
    caches its own seed's), and each gives its single trial's numbers."""
    model, model_init = quiet_bert, init
    if init == "lacking":
        model, model_init = (
            lacking(quiet_bert, tmp_path / "lacking", "encoder.layer.0.attention.self.query.weight"),
            "pretrained",
        )
    cells = [
        dataclasses.replace(tiny_trial, model=model, model_init=model_init, seed=s, frozen_layers=k)
        for s in (0, 1)
        for k in depths
    ]
    results = run_array(cells, width=2)
    singles = [run_trial(c) for c in cells]
    assert [r.eval_cached_layers for r in results] == cached
    assert [r.eval_cached_layers for r in singles] == [k if k >= 1 else None for k in depths] * 2
    for a, s in zip(results, singles):
        assert [p.loss for p in a.eval_curve] == pytest.approx([p.loss for p in s.eval_curve], abs=1e-5)


@pytest.mark.parametrize("pack", [True, False])
def test_a_refilled_slot_leaves_the_others_bit_unchanged(tiny_trial, varied_dataset, pack):
    """The long member's numbers (dropout on) are the same whether its neighbour's slot stays empty
    after the short member or the next cell takes it, packed or padded."""
    tiny_trial = dataclasses.replace(tiny_trial, dataset=varied_dataset, pack_training=pack)
    long = dataclasses.replace(tiny_trial, train_size=48, frozen_layers=0)  # 6 steps
    short = dataclasses.replace(tiny_trial, train_size=24, frozen_layers=2, seed=1)  # 4 steps
    refill = dataclasses.replace(short, frozen_layers=0)  # its subset and batches: the queue's shape stays
    alone = run_array([long, short], width=2)[0]
    beside = run_array([long, short, refill], width=2)
    assert (beside[0].eval_curve, beside[0].train_loss_curve) == (alone.eval_curve, alone.train_loss_curve)
    assert beside[2].status == "ok" and len(beside[2].eval_curve) == len(run_trial(refill).eval_curve)


@pytest.mark.parametrize("family,form", [("bert", "4d"), ("llama", "2d"), ("deberta-v2", "2d")])
def test_how_each_family_takes_a_batched_padding_mask(family, form, tmp_path, minilm_tokenizer, tiny_trial):
    from tests.families import FAMILIES, save_family

    model = save_family(tmp_path / family, FAMILIES[family], minilm_tokenizer)
    cfg = dataclasses.replace(tiny_trial, model=model)
    data = trial_data(cfg, torch.device("cpu"), WorkerState())
    net = trial_model(cfg, data, torch.device("cpu"))
    key = arrays.FeedKey(model, type(net).__qualname__)
    assert arrays.slots_mask_form(net, check_batch(data, torch.device("cpu")), data.pad_id, key, WorkerState()) == form


def test_small_arrays_pool_into_slot_queues(tiny_trial):
    """Two depths, five seeds, width 8: arrays of 2 would leave the GPU's array a quarter full; they
    pool per model and task into one queue of 10 cells (cells of another task keep their own)."""
    grid = [dataclasses.replace(tiny_trial, frozen_layers=k, seed=s) for s in range(5) for k in (0, 2)]
    other = [dataclasses.replace(c, dataset=c.dataset + "-other") for c in grid[:2]]
    units = group_cells([*grid, *other], width=8)
    assert sorted(len(u) for u in units) == [2, 10]
    assert [len(u) for u in group_cells(grid, width=8, slots=False)] == [2] * 5
    assert [len(u) for u in group_cells(grid, width=2)] == [2] * 5  # full arrays of one stream stay


def test_a_member_that_left_its_slot_is_freed_before_its_successor_trains(tiny_trial, monkeypatch):
    """A slot's member (its optimizer state: twice its trainable slices) goes with its row: at every
    step (where a successor's first makes its AdamW state) the members alive are the slots' own, never
    one that left (the first ones stayed to the end in run.members; a loop variable kept one a step)."""
    import gc
    import weakref

    made, steps = [], []
    new_member, own_step = arrays.new_member, arrays.own_step

    def tracked(*args, **kwargs):
        member = new_member(*args, **kwargs)
        made.append((member.cfg.trial_id, weakref.ref(member.optimizer)))
        return member

    def step(stack, active, *args, **kwargs):
        gc.collect()
        steps.append(({tid for tid, ref in made if ref() is not None}, {m.cfg.trial_id for m in active}))
        return own_step(stack, active, *args, **kwargs)

    monkeypatch.setattr(arrays, "new_member", tracked)
    monkeypatch.setattr(arrays, "own_step", step)
    cells = [dataclasses.replace(tiny_trial, train_size=24, seed=s, frozen_layers=2) for s in range(3)]
    results = run_array(cells, width=1)  # one slot: the cells one after another
    assert [r.status for r in results] == ["ok"] * 3 and len(made) == 3
    assert {frozenset(active) for _, active in steps} == {frozenset([c.trial_id]) for c in cells}
    assert all(alive == active for alive, active in steps)


def test_an_arrays_cached_depths_keep_to_the_workers_budget(cells):
    """Room for one depth's states: the array caches k = 1 and evaluates k = 2 from the embeddings (its
    depths' states are held together for its whole life), each member as its single trial scores."""
    from freezesweep.trials.worker import MAX_EVAL_ENTRIES, Lru, states_bytes

    probe = WorkerState()
    run_trial(dataclasses.replace(cells[2], epochs=1), worker=probe)
    (entry,) = probe.eval_states.values()
    worker = WorkerState(eval_states=Lru(MAX_EVAL_ENTRIES, states_bytes(entry), states_bytes))
    run = built(cells, worker)
    groups = run.eval_depths.groups(run.members)
    assert [(g.slots, g.prefix and g.prefix.layer) for g in groups] == [((0, 1, 3), None), ((2,), 1)]
    results = run_array(cells, worker=worker)
    assert [r.eval_cached_layers for r in results] == [None, None, 1, None]
    for a, s in zip(results, [run_trial(dataclasses.replace(c, eval_cache=False)) for c in cells]):
        assert [p.step for p in a.eval_curve] == [p.step for p in s.eval_curve]
        assert all(p.loss == pytest.approx(q.loss, abs=1e-5) for p, q in zip(a.eval_curve, s.eval_curve))
