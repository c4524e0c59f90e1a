"""orchestrator/launch.py in units: ``resolve_for_launch`` decides everything once, before anything is written, and
``run`` starts Ray only when some cell is left to run (real sweeps: test_sweep.py, test_faults.py)."""

from pathlib import Path

import pytest
import ray

from freezesweep.orchestrator.checks import load_spec
from freezesweep.orchestrator.launch import launch, resolve_for_launch
from freezesweep.orchestrator.plan import build_grid
from freezesweep.orchestrator.ray_session import RaySession
from freezesweep.orchestrator.rows import result_row
from freezesweep.results.store import ResultStore
from freezesweep.trials.config import TrialResult
from freezesweep.trials.precision import auto_precision
from tests.orchestrator.test_plan import RESOLVED


@pytest.fixture
def no_ray(monkeypatch):
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda *args, **kwargs: pytest.fail("Ray was started"))


def test_resolve_decides_precision_metrics_and_data_dir_once_without_ray(
    write_spec, no_ray, monkeypatch, tmp_path, toy_dataset
):
    monkeypatch.setenv("FREEZESWEEP_DATA_DIR", str(tmp_path / "glue"))
    spec = load_spec(write_spec("resolved", training={"precision": "auto"}, frozen_layers=[0, "all"]))
    sweep = resolve_for_launch(spec, RaySession())
    assert sweep.spec.training.precision == auto_precision("cpu")
    assert sweep.spec.training.select_metric == {toy_dataset: "accuracy"}
    assert sweep.spec.data_dir == str((tmp_path / "glue").resolve())  # recorded: resume needs no environment
    assert sweep.model_layers == {spec.model: 2} and {c.frozen_layers for c in build_grid(sweep)} == {0, 2}
    assert (sweep.address, sweep.gpu_share, sweep.gpu_packing) == (None, 0.0, None)
    # node_local (the embedded Ray): the local files' absolute paths, for trials run in folders of their own
    from freezesweep.orchestrator.local_files import Anchored

    assert isinstance(sweep.shipment, Anchored) and sweep.shipment.models == {spec.model: spec.model}
    assert all(Path(f).is_absolute() for f in sweep.shipment.datasets[toy_dataset])
    assert not (tmp_path / "store").exists()  # resolving writes nothing


def test_a_sweep_with_nothing_left_never_starts_ray(write_spec, no_ray, tmp_path):
    spec = load_spec(write_spec("finished"))
    sweep = resolve_for_launch(spec, RaySession())
    store = ResultStore(spec.store, spec.name)
    for cell in build_grid(sweep):
        store.write_row(result_row(spec.name, TrialResult(trial_id=cell.trial_id, config=cell, status="ok")))
    summary = launch(spec, show_progress=False)
    assert (summary.total, summary.already_ok, summary.ran) == (4, 4, 0)
    assert store.read_spec() is not None and not (tmp_path / "store" / "finished" / "_ray").exists()


@pytest.mark.parametrize(
    "overrides, depth",
    [
        ({}, 0),
        ({"methods": ["freeze"], "frozen_layers": [2, "all"], "lora_ranks": []}, 2),
        ({"methods": ["freeze", "probe"], "frozen_layers": [-1, 2], "lora_ranks": []}, -1),
        ({"methods": ["probe"], "frozen_layers": [], "lora_ranks": []}, 0),
    ],
)
def test_the_gpu_probe_depth_comes_from_the_variants_without_the_grid(overrides, depth):
    from freezesweep.orchestrator.launch import hungriest_depth
    from freezesweep.orchestrator.plan import hungriest_frozen_layers
    from tests.orchestrator.test_plan import _sweep

    sweep = _sweep(**overrides)
    assert hungriest_depth(sweep.spec, sweep.model_layers) == hungriest_frozen_layers(build_grid(sweep)) == depth


@pytest.mark.parametrize(
    "overrides, depths",
    [
        ({}, {"/nowhere/a": 2, "/nowhere/b": 1}),  # a: {6, 2} (the probe shares 'all'); b: {2}
        ({"methods": ["freeze"], "frozen_layers": [-1, 0], "lora_ranks": []}, {"/nowhere/a": 0, "/nowhere/b": 0}),
        ({"methods": ["freeze", "probe"], "frozen_layers": [1], "lora_ranks": []}, {"/nowhere/a": 2, "/nowhere/b": 2}),
        ({"methods": ["lora"], "frozen_layers": [], "lora_ranks": [4]}, {"/nowhere/a": 0, "/nowhere/b": 0}),
        (  # a random init's entries are its seed's: 2 seeds
            {"training": {**RESOLVED["training"], "model_init": "random"}},
            {"/nowhere/a": 4, "/nowhere/b": 2},
        ),
    ],
)
def test_the_evaluation_cache_entries_are_the_grids(overrides, depths):
    """One evaluation cache entry per frozen depth of at least one layer (probe cells: every layer;
    LoRA: none), per dataset, and of a random init per seed: counted from the variants, as the grid's
    cells make them (a cell's entry: its dataset, depth and weights)."""
    from freezesweep.orchestrator.plan import eval_entries_per_dataset
    from freezesweep.trials.run import weights_key
    from tests.orchestrator.test_plan import _sweep

    sweep = _sweep(**overrides)
    cells = build_grid(sweep)
    for model, expected in depths.items():
        assert eval_entries_per_dataset(sweep.spec, model, sweep.model_layers) == expected
        cached = {
            (c.dataset, c.frozen_layers if c.method == "freeze" else sweep.model_layers[model], weights_key(c))
            for c in cells
            if c.model == model and c.method in ("freeze", "probe")
        }
        assert expected * len(sweep.spec.datasets) == sum(1 for _, k, _ in cached if k >= 1)


@pytest.mark.parametrize(
    "frozen_layers, tokens",
    [
        ([0, "all", 2], {"/nowhere/a": 2 * 3000 + 2 * 1000, "/nowhere/b": 3000 + 1000}),
        ([1, 2, 3, 4, 5], {"/nowhere/a": 5 * 3000 + 3 * 1000, "/nowhere/b": 5 * 3000 + 3 * 1000}),  # the LRU's 8
    ],
)
def test_the_gpu_probe_is_asked_for_the_workers_evaluation_cache(monkeypatch, frozen_layers, tokens):
    """What ``gpus_per_trial: auto`` sends each model's probe: the token positions of the entries its
    workers keep, each dataset's entry as large as its validation rows padded (faked here: 1,000 and
    3,000), once per cached depth, the largest 8 (a worker's LRU)."""
    from freezesweep.orchestrator import launch as launching
    from freezesweep.trials.memory_probe import MemoryProbe
    from tests.orchestrator.test_plan import _sweep

    sweep, asked = _sweep(methods=["freeze"], frozen_layers=frozen_layers, lora_ranks=[]), []

    class Session:
        def run_task(self, fn, calls, **resources):
            asked.extend(calls)
            return [MemoryProbe(100.0, 10.0, 1.0, 80_000.0, "GPU", "fp32", 8, 0.125) for _ in calls]

    padded = {"/nowhere/d": 1000, "glue/cola": 3000}
    monkeypatch.setattr(launching, "eval_cache_tokens", lambda cfg, worker: padded[cfg.dataset])
    launching.measure_gpu_share(sweep.spec, sweep.model_layers, None, Session())
    assert {c["model"]: c["eval_tokens"] for c in asked} == tokens


def test_fake_gpus_of_a_cluster_run_cpu_trials_without_arrays(write_spec, capsys):
    """A walk-through on cluster/local-cluster.sh (GPUs that are a scheduling label): precision auto failed
    ("Torch not compiled with CUDA enabled") and the trials, on the CPU, were grouped as trial arrays."""
    from freezesweep.orchestrator import launch as launching
    from freezesweep.orchestrator.plan import ResolvedSweep, launch_units
    from freezesweep.orchestrator.ray_session import trial_device_task
    from freezesweep.orchestrator.spec import SpecError
    from freezesweep.orchestrator.sweeps import resolve_spec
    from freezesweep.trials.precision import auto_precision

    class Session:  # a cluster whose probe task runs here, on this CPU machine
        on_cluster = True

        def run_task(self, fn, calls, **resources):
            assert resources["gpus"] == 0.5
            return [fn(**call) for call in calls]

    spec = load_spec(
        write_spec("fake", resources={"gpus_per_trial": 0.5}, training={"precision": "auto"}), devices=False
    )
    assert trial_device_task("cuda") == ("cpu", auto_precision("cpu"))  # this machine has no CUDA
    device, precision = launching.trials_device(spec, Session())
    assert (device, precision) == ("cpu", auto_precision("cpu"))
    assert "no CUDA devices" in capsys.readouterr().err
    sweep = ResolvedSweep(resolve_spec(spec, precision), {spec.model: 2}, "fake:1", gpu_share=0.5, device=device)
    units = launch_units(build_grid(sweep), sweep)
    assert all(len(unit) == 1 for unit in units) and all(c.device == "cpu" for unit in units for c in unit)
    fp16 = load_spec(
        write_spec("fake16", resources={"gpus_per_trial": 0.5}, training={"precision": "fp16"}), devices=False
    )
    with pytest.raises(SpecError, match="fp16 needs a CUDA device, but the GPUs the cluster gives"):
        launching.trials_device(fp16, Session())


def test_an_alone_retry_interrupted_leaves_its_cells_unfinished(monkeypatch):
    """A review: Ctrl-C while a failed array's members ran alone went unseen (their array's failed rows
    were outcomes already): the launch went on to the next step and said "failed", exit 1, not 130."""
    from types import SimpleNamespace

    from freezesweep.orchestrator import launch as launching
    from freezesweep.trials.config import TrialConfig

    cells = [
        TrialConfig(dataset="d", model="m", train_size=8, frozen_layers=k, seed=0, precision="fp32") for k in (0, 2)
    ]
    written = []
    writer = SimpleNamespace(
        outcomes={c.trial_id: "failed" for c in cells}, write_all=lambda rows, n: written.extend(rows)
    )
    launch_ = SimpleNamespace(
        sweep=SimpleNamespace(name="s"), storage=None, writer=writer, stop_if=None, trainable=None
    )

    def tune_stopped_after_one(sweep, cells, storage, sink, **kwargs):
        sink([SimpleNamespace(trial_id=cells[0].trial_id)], 1)  # the second cell's trial never ended

    monkeypatch.setattr(launching, "run_tune", tune_stopped_after_one)
    assert launching.retry_alone(launch_, cells) is False
    assert writer.outcomes == {cells[0].trial_id: "failed"}  # the other: no outcome, so unfinished
    assert launching.retry_alone(launch_, []) is True
