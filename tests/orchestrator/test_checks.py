"""orchestrator/checks.py: invalid specs are rejected as a whole, before Ray starts, with every problem
named (both layers: shapes and values, and what needs the model, data, machine, store or cluster)."""

import os

import pandas as pd
import pytest
import yaml

from tests.conftest import make_toy_pair_dataset

from freezesweep.orchestrator.plan import build_grid
from freezesweep.orchestrator.sweeps import resolve_here
from freezesweep.orchestrator.checks import _removed_depths, load_spec, validate
from freezesweep.orchestrator.spec import SpecError
from freezesweep.results.store import ResultStore


def _problems(path) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return info.value.problems


BAD = {
    "unknown top-level key": ({"colour": "red"}, "colour: unknown key"),
    "unknown training key": ({"training": {"lr": 1}}, "training.lr: unknown key"),
    "k above the model's layers": ({"frozen_layers": [0, 3]}, "[3] exceed the 2 layers"),
    "k below -1": ({"frozen_layers": [-2]}, "frozen layers must be >= -1"),
    "a tolerance every depth is within": ({"tolerance": 2}, "tolerance: Input should be less than 1"),
    "a settle tolerance every depth is within": (
        {"seeds": [], "settle": {"tolerance": 1}},
        "settle.tolerance: Input should be less than 1",
    ),
    "train size above the split": ({"train_sizes": [24, 5000]}, "[5000] exceed the 240 train rows"),
    "train size zero": ({"train_sizes": [0]}, "train sizes must be positive"),
    "duplicate seeds": ({"seeds": [0, 0]}, "duplicate values [0]"),
    "empty axis": ({"seeds": []}, "seeds: give at least one seed, or a settle section"),
    "seeds beside settle": ({"settle": {"max_seeds": 4}}, "seeds and settle both given"),
    "settle without k = 0": ({"seeds": [], "frozen_layers": [2], "settle": {}}, "frozen_layers must hold 0"),
    "a budget below the initial seeds": (
        {"seeds": [], "settle": {"initial_seeds": 5, "max_seeds": 4}},
        "settle.max_seeds (4) is below settle.initial_seeds (5)",
    ),
    "fewer than 3 initial seeds": (
        {"seeds": [], "settle": {"initial_seeds": 2}},
        "settle.initial_seeds: Input should be",
    ),
    "empty axis of a swept method": ({"frozen_layers": []}, "frozen_layers is empty, but methods has freeze"),
    "GPU share above 1": (
        {"resources": {"gpus_per_trial": 1.5}},
        "gpus_per_trial: Input should be less than or equal to 1",
    ),
    "negative GPU share": (
        {"resources": {"gpus_per_trial": -0.5}},
        "gpus_per_trial: Input should be greater than or equal to 0",
    ),
    "unknown precision": ({"training": {"precision": "fp8"}}, "training.precision: Input should be"),
    "fp16 on CPU": ({"training": {"precision": "fp16"}}, "fp16 needs GPU trials"),
    "unknown dataset": ({"datasets": ["glue/mnli-nope"]}, "unknown GLUE task 'mnli-nope'"),
    "missing model path": ({"model": "/nonexistent/model-dir"}, "model: cannot load model"),
    "bad sweep name": ({"name": "no spaces please"}, "name: a folder name in the store: letters, digits"),
    "missing required key": ({"model": None}, "model: should be a model name (hub id or folder) or a list of them"),
    "wrong type": ({"train_sizes": "fifty"}, "train_sizes: Input should be a valid list"),
    "unknown metric": ({"training": {"select_metric": "acc"}}, "training.select_metric: unknown metric 'acc' (known: "),
    "metric that does not fit": (
        {"training": {"select_metric": "pearson"}},
        "training.select_metric: pearson does not fit",
    ),
    "metric for a dataset not swept": (
        {"training": {"select_metric": {"glue/mrpc": "f1"}}},
        "training.select_metric: glue/mrpc not among the datasets",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_kind_of_bad_spec_is_named(case, write_spec):
    overrides, expected = BAD[case]
    path = write_spec(**overrides)
    problems = _problems(path)
    assert any(expected in p for p in problems), problems


def test_all_problems_in_one_error(write_spec, tmp_path):
    path = write_spec(
        colour="red",
        frozen_layers=[-2, 3],
        train_sizes=[0, 5000],
        seeds=[1, 1],
        training={"precision": "fp16"},
        resources={"gpus_per_trial": -1},
    )
    problems = _problems(path)
    for expected in ["colour", "-2", "[3] exceed", "positive", "[5000] exceed", "duplicate", "fp16", "gpus_per_trial"]:
        assert any(expected in p for p in problems), (expected, problems)
    assert not (tmp_path / "store").exists()  # nothing created


def test_malformed_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\nmodel: x")
    assert "malformed YAML" in _problems(bad)[0]
    assert "no such file" in _problems(tmp_path / "absent.yaml")[0]
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just a string")
    assert "must be a mapping" in _problems(scalar)[0]
    # a walk-through: a folder or a binary file as the spec were tracebacks (IsADirectoryError, UnicodeDecodeError)
    assert _problems(tmp_path) == ["a folder, not a spec file (a sweep spec is one YAML file)"]
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"name: x\n\xff\xfe")
    assert _problems(binary) == ["not a text file in UTF-8 (byte 8): a spec is a YAML text file"]


def test_unwritable_store(write_spec, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    problems = _problems(write_spec(store=str(blocker / "store")))
    assert any(p.startswith("store:") for p in problems), problems


def test_grid_is_deterministic_and_ids_stable(write_spec):
    spec = load_spec(write_spec())
    grid = build_grid(resolve_here(spec))
    assert len(grid) == 4 == len({c.trial_id for c in grid})
    assert [c.trial_id for c in grid] == [c.trial_id for c in build_grid(resolve_here(load_spec(write_spec())))]
    grown = build_grid(resolve_here(load_spec(write_spec(seeds=[0, 1]))))
    assert {c.trial_id for c in grid} < {c.trial_id for c in grown}  # old cells keep their ids
    assert all(c.split_seed == spec.split_seed and c.epochs == 2 for c in grid)


def test_shipped_configs_are_valid(glue_dir, monkeypatch):
    from tests.conftest import REPO

    monkeypatch.setenv("FREEZESWEEP_DATA_DIR", str(glue_dir))
    demo = load_spec(REPO / "configs" / "demo.yaml")
    assert len(build_grid(resolve_here(demo))) == 12 and demo.model == "sentence-transformers/all-MiniLM-L6-v2"
    smoke = load_spec(REPO / "configs" / "smoke.yaml")  # the shrink switch: two cells, one epoch
    assert [(c.frozen_layers, c.epochs, c.max_eval_examples) for c in build_grid(resolve_here(smoke))] == [
        (0, 1, 64),
        (6, 1, 64),
    ]
    reference = validate(yaml.safe_load((REPO / "configs" / "reference.yaml").read_text()), semantic=False)
    grid = build_grid(resolve_here(reference))
    assert len(grid) == 350
    assert {c.frozen_layers for c in grid} == {-1, 0, 2, 4, 8, 10, 12}
    assert reference.training.learning_rate == 5e-5 and reference.training.precision == "fp16"


def _tree(folder):
    import hashlib

    return {
        str(p.relative_to(folder)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_cli_bad_spec_on_existing_sweep_touches_nothing(write_spec, tmp_path):
    """Many problems at once, including a protocol change: exit 2, every problem named, store unchanged."""
    import subprocess
    import sys

    from freezesweep.orchestrator.rows import result_row
    from freezesweep.results.store import ResultStore
    from tests.factories import trial_result

    good = load_spec(write_spec("existing"))
    store = ResultStore(good.store, good.name)
    store.write_spec(good.to_yaml())
    store.write_row(result_row("existing", trial_result()))
    before = _tree(tmp_path / "store")

    bad = write_spec(
        "existing",
        colour="red",
        frozen_layers=[0, 9],
        seeds=[3, 3],
        training={"learning_rate": 1.0},
        resources={"gpus_per_trial": 4},
    )
    done = subprocess.run(
        [sys.executable, "-m", "freezesweep.orchestrator.cli", "launch", str(bad)], capture_output=True, text=True
    )
    assert done.returncode == 2
    for expected in [
        "colour: unknown key",
        "[9] exceed",
        "duplicate values [3]",
        "gpus_per_trial",
        "training.learning_rate: changed from 0.003 to 1.0",
    ]:
        assert expected in done.stderr, (expected, done.stderr)
    assert _tree(tmp_path / "store") == before
    assert not (tmp_path / "store" / "existing" / "_ray").exists()


def test_auto_resolving_elsewhere_is_refused_naming_both(write_spec, tmp_path, monkeypatch):
    """An auto sweep run in fp32 (an AVX2-only CPU) and relaunched where auto means bf16: refused before
    any trial, nothing in the store touched; `resume` keeps the stored precision."""
    from freezesweep.orchestrator import launch as launch_module
    from freezesweep.orchestrator.rows import result_row
    from freezesweep.results.store import ResultStore
    from tests.factories import trial_result

    from freezesweep.orchestrator.ray_session import RaySession

    monkeypatch.setattr(launch_module, "precision_here", lambda spec: "fp32")
    auto = {"training": {"precision": "auto"}}
    first = launch_module.resolve_for_launch(load_spec(write_spec("moved", **auto)), RaySession())
    assert first.spec.training.precision == "fp32" and all(c.precision == "fp32" for c in build_grid(first))
    store = ResultStore(first.spec.store, first.name)
    store.write_spec(first.spec.to_yaml())
    store.write_row(result_row("moved", trial_result()))
    before = _tree(tmp_path / "store")

    monkeypatch.setattr(launch_module, "precision_here", lambda spec: "bf16")
    again = load_spec(write_spec("moved", **auto))  # validation defers the auto check to the launch
    with pytest.raises(SpecError) as info:
        launch_module.launch(again, show_progress=False)
    assert "training.precision: auto resolves to bf16 here, but sweep 'moved' was run in fp32" in str(info.value)
    assert _tree(tmp_path / "store") == before
    with pytest.raises(SpecError, match="changed from 'fp32' to 'bf16'"):  # an explicit change is named at once
        load_spec(write_spec("moved", training={"precision": "bf16"}))
    # How the work is done is not protocol: checkpoints and the evaluation batch may change.
    load_spec(write_spec("moved", training={"precision": "fp32", "checkpoint_every_epochs": 1, "eval_batch_size": 8}))


def test_a_sweep_from_before_pinned_ids_is_refused_not_rerun(write_spec, tmp_path):
    """A stored spec with precision auto (written before ids named the resolved precision)."""
    import subprocess
    import sys

    from freezesweep.orchestrator.launch import launch
    from freezesweep.results.store import ResultStore

    old = yaml.safe_load(write_spec("old", training={"precision": "auto"}).read_text())
    store = ResultStore(old["store"], "old")
    store.write_spec(yaml.safe_dump(old))
    with pytest.raises(SpecError, match="made by a freezesweep before 0.2"):
        launch(load_spec(write_spec("old", training={"precision": "auto"})), show_progress=False)
    for command in ("status", "resume"):  # every path that reads a stored spec says the same
        done = subprocess.run(
            [sys.executable, "-m", "freezesweep.orchestrator.cli", command, "old", "--store", old["store"]],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 2 and "made by a freezesweep before 0.2" in done.stderr, (command, done.stderr)
    assert not (tmp_path / "store" / "old" / "results").exists()


class FakeCluster:
    """A cluster as the checks see it (orchestrator/ray_session.py's RaySession stands here in a launch)."""

    def __init__(self, nodes, address="ray://head:10001"):
        self.address, self._nodes = address, nodes

    def nodes(self):
        if isinstance(self._nodes, Exception):
            raise self._nodes
        return self._nodes


def test_more_cpus_per_trial_than_this_machine_has_is_refused_before_the_embedded_ray(write_spec, monkeypatch):
    """Before: validation passed, and the launch waited on a trial Ray could never place, silently, until
    interrupted (a new user's walk-through: cpus_per_trial 4 on a 2-core machine). A cluster is asked instead."""
    from freezesweep.orchestrator import checks

    monkeypatch.setattr(checks, "_local_cpus", lambda: 2)
    load_spec(write_spec("fits", resources={"gpus_per_trial": 0, "cpus_per_trial": 2}))
    with pytest.raises(SpecError, match="4 CPUs per trial, but this machine has 2: no trial could start"):
        load_spec(write_spec("too-many", resources={"gpus_per_trial": 0, "cpus_per_trial": 4}))
    cluster = FakeCluster([{"CPU": 16.0}])
    load_spec(write_spec("on-cluster", resources={"gpus_per_trial": 0, "cpus_per_trial": 4}), cluster=cluster)


def test_with_a_cluster_resources_are_checked_against_its_nodes(write_spec, monkeypatch):
    """A CPU head node with GPU workers: a GPU share is fine when some node has a GPU; a request no
    single node can hold is refused, listing the nodes; a cluster that does not answer is one problem."""
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    gpu_workers = FakeCluster([{"CPU": 4.0}, {"CPU": 16.0, "GPU": 1.0}])
    load_spec(write_spec("on-cluster", resources={"gpus_per_trial": 0.25, "cpus_per_trial": 4}), cluster=gpu_workers)
    with pytest.raises(SpecError) as refused:
        load_spec(write_spec("too-big", resources={"gpus_per_trial": 1, "cpus_per_trial": 32}), cluster=gpu_workers)
    message = str(refused.value)
    assert "32 CPU and 1 GPU on one node" in message and "ray://head:10001" in message
    assert "4 CPU, 0 GPU; 16 CPU, 1 GPU" in message
    with pytest.raises(SpecError, match="cannot reach the Ray cluster at 'ray://head:10001'") as gone:
        load_spec(write_spec("gone"), cluster=FakeCluster(ConnectionError("connection refused")))
    # a cluster that listens but refuses: most likely its token (Ray says "Unauthenticated" only in its
    # log), and the way back to a Ray of one's own (a walk-through's resume went to its launch's address)
    assert "RAY_AUTH_MODE=token" in str(gone.value) and "--address local" in str(gone.value)


def test_parsing_a_spec_never_connects_to_its_cluster(write_spec, monkeypatch):
    """A spec that names an address is checked against this machine unless a cluster is handed in:
    validation itself never starts or joins a Ray cluster."""
    import ray

    monkeypatch.setattr(ray, "init", lambda *args, **kwargs: pytest.fail("validation connected to Ray"))
    assert load_spec(write_spec("named", address="ray://head:10001")).address == "ray://head:10001"


def test_gpus_per_trial_auto_needs_a_gpu_to_measure_on(write_spec, monkeypatch):
    """auto is accepted where a GPU exists (here or on a node of the cluster), and is one clear
    problem where none does; a share that is neither a number nor auto is named too."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    problems = _problems(write_spec("no-gpu", resources={"gpus_per_trial": "auto"}))
    assert [p for p in problems if "gpus_per_trial" in p] == [
        "resources.gpus_per_trial: auto measures a trial's memory on a GPU, but this machine has no CUDA GPU (set a "
        "share, 0 for CPU trials, or pass --address of a cluster with GPUs)"
    ]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert load_spec(write_spec("gpu-here", resources={"gpus_per_trial": "auto"})).resources.gpus_per_trial == "auto"

    with pytest.raises(SpecError) as info:
        load_spec(
            write_spec("cpu-cluster", resources={"gpus_per_trial": "auto"}),
            cluster=FakeCluster([{"CPU": 4.0}, {"CPU": 16.0}]),
        )
    assert any(
        p.startswith(
            "resources.gpus_per_trial: auto measures a trial's memory on a GPU (1 CPU and 1 GPU on "
            "one node), but no node of the cluster at 'ray://head:10001' has them"
        )
        for p in info.value.problems
    )
    load_spec(
        write_spec("gpu-cluster", resources={"gpus_per_trial": "auto"}),
        cluster=FakeCluster([{"CPU": 4.0}, {"CPU": 16.0, "GPU": 1.0}]),
    )
    assert "resources.gpus_per_trial: a GPU share in [0, 1], or auto (got 'half')" in _problems(
        write_spec("typo", resources={"gpus_per_trial": "half"})
    )


def test_without_an_address_a_gpu_share_needs_a_local_gpu(write_spec, monkeypatch):
    import torch

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SpecError, match="this machine has no CUDA GPU"):
        load_spec(write_spec("local-gpu", resources={"gpus_per_trial": 0.5}))


def test_task_shapes_are_checked_one_clear_error_each(write_spec, toy_dataset, tmp_path):
    """A GLUE pair task whose files lack the second sentence and hold float labels, and a metric that a
    classification task does not have: every problem named once, in one error, before anything runs."""
    rte = make_toy_pair_dataset(tmp_path / "glue" / "rte", regression=True)
    for split in ("train", "validation"):
        path = rte / f"{split}.parquet"
        pd.read_parquet(path).drop(columns=["sentence2"]).to_parquet(path)
    path = write_spec(
        datasets=[toy_dataset, "glue/rte"],
        data_dir=str(tmp_path / "glue"),
        training={"select_metric": {toy_dataset: "spearman"}},
    )
    problems = _problems(path)
    expected = [
        "datasets: glue/rte: no column 'sentence2' (training.text_pair_column in a spec, --text-pair-column for a trial) in the train and validation split",
        "datasets: glue/rte: label column 'label' holds floats in the train and validation split, but glue/rte "
        "is a classification task",
        f"training.select_metric: spearman does not fit {toy_dataset} (a 2-class classification task: "
        "accuracy, f1, matthews)",
    ]
    for line in expected:
        assert sum(p.startswith(line) for p in problems) == 1, (line, problems)
    assert len(problems) == 3, problems


def test_select_metric_defaults_to_each_tasks_official_one(write_spec, toy_dataset, toy_scores, glue_dir):
    from freezesweep.trials.config import TrialConfig

    spec = load_spec(
        write_spec(
            datasets=["glue/sst2", "glue/cola", "glue/stsb", "glue/mrpc", toy_dataset],
            train_sizes=[24],
            frozen_layers=[0],
            data_dir=str(glue_dir),
        )
    )
    metrics = {c.dataset: c.select_metric for c in build_grid(resolve_here(spec))}
    assert metrics == {
        "glue/sst2": "accuracy",
        "glue/cola": "matthews",
        "glue/stsb": "pearson",
        "glue/mrpc": "f1",
        toy_dataset: "accuracy",
    }
    local = load_spec(
        write_spec(
            datasets=[toy_scores],
            train_sizes=[24],
            training={"text_column": "sentence1", "text_pair_column": "sentence2"},
        )
    )
    assert [c.select_metric for c in build_grid(resolve_here(local))] == [
        "pearson",
        "pearson",
    ]  # float labels: regression
    sst2 = next(c for c in build_grid(resolve_here(spec)) if c.dataset == "glue/sst2")
    before = TrialConfig(**{k: v for k, v in sst2.to_dict().items() if k != "select_metric"})  # as made before
    assert sst2.trial_id == before.trial_id  # SST-2's official metric is accuracy: its ids are unchanged
    chosen = load_spec(
        write_spec(
            datasets=["glue/sst2", "glue/cola"],
            train_sizes=[24],
            data_dir=str(glue_dir),
            training={"select_metric": {"glue/cola": "accuracy"}},
        )
    )
    assert {c.dataset: c.select_metric for c in build_grid(resolve_here(chosen))} == {
        "glue/sst2": "accuracy",
        "glue/cola": "accuracy",
    }


def test_shipped_configs_keep_their_metric(glue_dir, monkeypatch):
    """The demo (SST-2) selects accuracy by default; the reference study says accuracy for SST-2 and CoLA."""
    from tests.conftest import REPO

    monkeypatch.setenv("FREEZESWEEP_DATA_DIR", str(glue_dir))
    assert {c.select_metric for c in build_grid(resolve_here(load_spec(REPO / "configs" / "demo.yaml")))} == {
        "accuracy"
    }
    reference = validate(yaml.safe_load((REPO / "configs" / "reference.yaml").read_text()), semantic=False)
    assert {c.select_metric for c in build_grid(resolve_here(reference))} == {"accuracy"}


def _stored_with_a_row(raw: dict) -> ResultStore:
    """``raw`` stored as a launch stores its spec, with a row (of another cell)."""
    from freezesweep.orchestrator.rows import result_row
    from tests.factories import trial_result

    store = ResultStore(raw["store"], raw["name"])
    store.write_spec(yaml.safe_dump(raw))
    store.write_row(result_row(raw["name"], trial_result()))
    return store


def _store_legacy_spec(spec_path, tmp_path) -> str:
    """A spec.yaml as a launch before select_metric existed stored it: no such key."""
    raw = yaml.safe_load(spec_path.read_text())
    raw["training"].pop("select_metric", None)
    _stored_with_a_row(raw)
    return raw["store"]


def test_a_sweep_stored_before_select_metric_reads_as_accuracy(write_spec, tmp_path, glue_dir):
    """Its rows picked by accuracy: resumed, its cells keep their ids; relaunching the spec where the default
    now means another metric (CoLA: Matthews) is a protocol change, named per dataset; SST-2 is not."""
    from freezesweep.orchestrator.sweeps import load_sweep

    axes = {"datasets": ["glue/sst2", "glue/cola"], "train_sizes": [24], "data_dir": str(glue_dir)}
    store = _store_legacy_spec(write_spec("legacy", **axes), tmp_path)
    stored = load_sweep("legacy", store)
    assert stored.spec.training.select_metric == {"glue/sst2": "accuracy", "glue/cola": "accuracy"}
    as_before = load_spec(write_spec("elsewhere", **axes, training={"select_metric": "accuracy"}))
    assert [c.trial_id for c in build_grid(stored)] == [c.trial_id for c in build_grid(resolve_here(as_before))]
    with pytest.raises(SpecError) as info:
        load_spec(write_spec("legacy", **axes))  # no select_metric: CoLA's official Matthews
    assert [p for p in info.value.problems if "select_metric" in p] == [
        "training.select_metric.glue/cola: changed from 'accuracy' to 'matthews', but sweep 'legacy' already has rows "
        "with the old protocol (start a new sweep name to compare protocols)"
    ]
    load_spec(write_spec("legacy", **axes, training={"select_metric": "accuracy"}))  # what the rows used: accepted
    load_spec(write_spec("legacy", **{**axes, "datasets": ["glue/sst2"]}))  # SST-2's default is accuracy: accepted


def test_a_protocol_change_is_named_beside_the_new_protocols_own_problems(write_spec):
    """Before: a changed learning rate beside a mistyped epochs (or an unknown training key) was said only
    once the epochs were mended: two rounds of errors for one spec."""

    raw = yaml.safe_load(write_spec("grown").read_text())
    _stored_with_a_row(raw)
    changed = "training.learning_rate: changed from 0.003 to 0.001, but sweep 'grown' already has rows"
    for bad in ({"epochs": "ten"}, {"epoch": 3}):
        problems = _problems(write_spec("grown", training={"learning_rate": 0.001, **bad}))
        assert len(problems) == 2 and problems[1].startswith(changed), problems
        assert problems[0].startswith("training.epoch"), problems


@pytest.mark.parametrize("methods", [["freeze"], ["lora"]])
def test_a_model_type_without_a_sequence_classifier_is_one_short_problem(
    write_spec, tmp_path, minilm_tokenizer, methods
):
    """Before (a walk-through's CodeGen): with LoRA a raw traceback (exit 1, no other problem named);
    without, transformers' ~4 KB list of every config class it has a classifier for."""
    from transformers import CodeGenConfig

    from tests.conftest import save_tiny

    config = CodeGenConfig(vocab_size=len(minilm_tokenizer), n_embd=32, n_layer=2, n_head=2, rotary_dim=8)
    model = save_tiny(tmp_path / "codegen", config, minilm_tokenizer)
    lora = {"lora_ranks": [2]} if methods == ["lora"] else {}
    problems = _problems(write_spec(model=model, methods=methods, frozen_layers=[0], seeds=[0, 1], **lora))
    assert (
        f"model: {model}: cannot build a sequence classifier from its config: transformers has no "
        "sequence-classification class for CodeGenConfig" in problems
    ), problems
    assert all(len(p) < 400 for p in problems), problems


def test_a_head_that_reads_the_last_position_is_refused(write_spec, tmp_path, minilm_tokenizer):
    """A walk-through: XLNet at frozen_layers 0 ran ok, its head reading right padding for shorter texts
    (the same text scored differently padded and unpadded)."""
    from transformers import XLNetConfig

    from tests.conftest import save_tiny

    config = XLNetConfig(vocab_size=len(minilm_tokenizer), d_model=32, n_layer=2, n_head=2, d_inner=64)
    model = save_tiny(tmp_path / "xlnet", config, minilm_tokenizer)
    problem = f"model: {model}: its classifier reads the last position (summary_type 'last', as XLNet's)"
    assert any(p.startswith(problem) for p in _problems(write_spec(model=model, frozen_layers=[0]))), problem
    config.summary_type = "mean"
    mean = save_tiny(tmp_path / "xlnet-mean", config, minilm_tokenizer)
    assert not any("summary_type" in p for p in _problems(write_spec(model=mean, frozen_layers=[0], seeds=[0, 0])))


def test_sizes_below_the_classes_and_no_room_for_text_are_refused(write_spec):
    """Before: train_sizes [1] with two classes and max_seq_length 1 were accepted without a word."""
    problems = _problems(write_spec(train_sizes=[1, 24], training={"max_seq_length": 2}))
    assert "train_sizes: [1] below the 2 classes of" in "\n".join(problems)
    assert any(
        p.startswith("training.max_seq_length: 2 leaves no room for text: ") and "adds 2 special tokens" in p
        for p in problems
    ), problems


def test_more_tokens_than_the_model_takes_are_refused(write_spec, tiny_bert, tiny_roberta):
    """A walk-through: max_seq_length 100000 passed, then every trial with a long text failed ("The
    expanded size of the tensor (2052) must match the existing size (512)")."""
    (problem,) = _problems(write_spec(training={"max_seq_length": 129}))
    assert (
        problem == f"training.max_seq_length: 129 is more than {tiny_bert} takes (128 tokens: its position embeddings)"
    )
    load_spec(write_spec(training={"max_seq_length": 128}))  # as many as it takes
    # 140 positions, ids start after the padding index (0 here: roberta-base's is 1, so 514 → 512)
    roberta = _problems(write_spec(model=tiny_roberta, training={"max_seq_length": 140}))
    assert roberta == [
        f"training.max_seq_length: 140 is more than {tiny_roberta} takes (139 tokens: its position embeddings)"
    ]


def test_the_position_limit_knows_offsets_and_relative_positions(monkeypatch):
    """The review: DeBERTa v3 has relative positions only (no table to run past), MPNet's ids start at 2
    whatever its pad_token_id; a tokenizer without a saved limit says 1e30."""
    from transformers import DebertaV2Config, MPNetConfig, RobertaConfig

    import freezesweep.trials.model as model_module
    from freezesweep.orchestrator.checks import position_limit

    class Unlimited:
        model_max_length = int(1e30)

    for config, limit in [
        (DebertaV2Config(max_position_embeddings=512, position_biased_input=False), None),
        (DebertaV2Config(max_position_embeddings=512), 512),
        (MPNetConfig(max_position_embeddings=514, pad_token_id=0), 512),
        (RobertaConfig(max_position_embeddings=514, pad_token_id=1), 512),  # roberta-base
    ]:
        monkeypatch.setattr(model_module, "load_model_config", lambda _, config=config: config)
        assert position_limit("m", Unlimited())[0] == limit, config.model_type


def test_dropped_empty_texts_are_counted_when_the_spec_says_drop(write_spec, tmp_path):
    from freezesweep.orchestrator.checks import data_notes

    folder = tmp_path / "gappy"
    folder.mkdir()
    rows = pd.DataFrame(
        {"sentence": [f"row {i}" if i % 10 else "" for i in range(60)], "label": [i % 2 for i in range(60)]}
    )
    rows.to_csv(folder / "train.csv", index=False)
    rows.assign(sentence=rows["sentence"].str.replace("row", "other")).to_csv(folder / "validation.csv", index=False)
    assert any("6 empty or missing text(s)" in p for p in _problems(write_spec(datasets=[str(folder)])))
    spec = load_spec(write_spec(datasets=[str(folder)], training={"empty_texts": "drop"}))
    assert data_notes(spec) == [
        f"{folder}: dropped 6 train and 6 validation row(s) with an empty or missing text (training.empty_texts: drop)"
    ]


# --- issue 29: every check of launch in plan, every layer's problems in the one error -------------------
def test_plan_refuses_fp16_on_cpu_trials_as_launch_does(write_spec):
    """Before: plan (devices=False) accepted fp16 with CPU trials, which launch refused."""
    path = write_spec(training={"precision": "fp16"})
    for devices in (True, False):
        with pytest.raises(SpecError) as info:
            load_spec(path, devices=devices)
        assert any("fp16 needs GPU trials" in p for p in info.value.problems), (devices, info.value.problems)


def test_an_unwritable_store_is_named_beside_an_invalid_sweep_name(write_spec, tmp_path):
    """Before: with the name invalid, "not a writable folder" was left out and appeared only after the fix."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    problems = _problems(_renamed(write_spec(store=str(blocker / "store")), "no spaces please"))
    assert any(p.startswith("name: a folder name in the store: letters, digits") for p in problems), problems
    assert any(p.startswith("store: cannot create") and "is not a writable folder" in p for p in problems), problems
    assert not list(tmp_path.glob("**/.freezesweep-probe-*"))


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc here")
def test_a_store_no_one_can_create_is_refused_also_for_root(write_spec):
    """A walk-through in a container as root: os.access says yes to root for /proc, so `store: /proc/sweeps`
    passed the checks and the launch died in a traceback. A folder is made and removed there now."""
    problems = _problems(write_spec(store="/proc/freezesweep-sweeps"))
    assert problems == [
        "store: cannot create '/proc/freezesweep-sweeps': '/proc' is not a writable folder (making a folder there: "
        "No such file or directory)"
    ]


def _renamed(path, name: str):
    spec = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**spec, "name": name}))
    return path


def test_a_train_size_below_the_classes_names_the_rarest_with_their_counts(write_spec, tmp_path):
    folder = tmp_path / "three"
    folder.mkdir()
    labels = ["a"] * 30 + ["b"] * 8 + ["c"] * 2
    frame = pd.DataFrame({"sentence": [f"row {i}" for i in range(40)], "label": labels})
    frame.to_csv(folder / "train.csv", index=False)
    frame.iloc[::4].to_csv(folder / "validation.csv", index=False)
    problems = _problems(write_spec(datasets=[str(folder)], train_sizes=[1, 3]))
    assert problems == [
        f"train_sizes: [1] below the 3 classes of {folder} (a stratified subset holds at least one row "
        "of each class; n = 1 leaves out 2 class(es), the rarest: 'c' (2 train rows), 'b' (8 train rows))"
    ]


def test_every_problem_of_a_dirty_file_and_the_sizes_it_refuses_are_named_at_once(write_spec, tmp_path):
    """Before: a missing label hid the label checks (a validation-only label, spellings of one label), and
    any data problem hid a train size below the classes: four rounds of fixes to see them all. A negative
    size is said once, without a class count drawn from it (-5 rows "left out 7 classes" of two)."""
    folder = tmp_path / "dirty"
    folder.mkdir()
    labels = ["pos", "neg"] * 20 + ["Pos", ""]
    pd.DataFrame({"sentence": [f"row {i}" for i in range(41)] + [""], "label": labels}).to_csv(
        folder / "train.csv", index=False
    )
    pd.DataFrame({"sentence": ["x", "y", "z"], "label": ["pos", "neg", "neutral"]}).to_csv(
        folder / "validation.csv", index=False
    )
    problems = _problems(write_spec(datasets=[str(folder)], train_sizes=[-5, 1, 24]))
    said = [p.split(": ", 1)[0] + ": " + p.split(": ")[-1][:40] for p in problems]
    assert len(problems) == 6, said
    assert sum("train sizes must be positive: [-5] is not" in p for p in problems) == 1
    assert sum("empty or missing text" in p for p in problems) == 1
    assert sum("missing or non-finite label" in p for p in problems) == 1
    assert sum("['neutral'] that the train split never has" in p for p in problems) == 1
    assert (
        sum(f"'Pos' (1 row: {folder}/train.csv line 42), 'pos' (21 rows) differ only in case" in p for p in problems)
        == 1
    )
    assert sum(p.startswith("train_sizes: [1] below the 3 classes") for p in problems) == 1


def test_a_settle_sweeps_question_and_budget_are_refused_once_it_has_rows(write_spec):
    """Before: a grown max_seeds or a new tolerance on a settle sweep with rows was accepted silently (the
    stored spec rewritten; the intervals then shared by looks the old ones were not paid for)."""
    settle = {"tolerance": 0.01, "initial_seeds": 3, "max_seeds": 5, "seeds_per_round": 2}
    raw = yaml.safe_load(write_spec("asked", seeds=[], settle=settle).read_text())
    _stored_with_a_row(raw)  # as a launch stores it
    problems = _problems(write_spec("asked", seeds=[], settle={**settle, "max_seeds": 9, "tolerance": 0.5}))
    assert [p.split(":")[0] for p in problems] == ["settle.tolerance", "settle.max_seeds"]
    assert (
        "voids the confidence" in problems[0]
        and "4 looks where the stored rows' confidence was shared by 2" in problems[1]
    )
    # a walk-through renamed the sweep alone, and its new question read the same subsets and seeds again
    assert "start a new sweep name and another split_seed" in problems[0]
    load_spec(write_spec("asked", seeds=[], settle={**settle, "learned_first": False}))  # the order: accepted


@pytest.mark.parametrize("empty_texts", ["refuse", "drop"])
def test_a_train_size_larger_than_the_data_is_named_beside_the_datas_own_problems(write_spec, tmp_path, empty_texts):
    """Issue 36: bad labels and empty texts were named, the train size larger than the data only once they
    were fixed. The files were read: every problem comes in the one error (plan's, as launch's)."""
    from freezesweep.orchestrator import api

    rows = [{"sentence": f"good movie {i}", "label": i % 2} for i in range(40)]
    rows += [{"sentence": "", "label": 1}, {"sentence": None, "label": 0}]  # empty texts
    rows += [{"sentence": "fine one", "label": None}, {"sentence": "dull two", "label": None}]  # no labels
    folder = tmp_path / "data"
    folder.mkdir()
    pd.DataFrame(rows).to_csv(folder / "train.csv", index=False)
    pd.DataFrame([{"sentence": "nice", "label": 1}, {"sentence": "bad", "label": 0}]).to_csv(
        folder / "validation.csv", index=False
    )
    spec = write_spec("bad", datasets=[str(folder)], train_sizes=[24, 10_000], training={"empty_texts": empty_texts})
    with pytest.raises(SpecError) as info:
        api.plan(spec)
    problems = "\n".join(info.value.problems)
    assert "missing or non-finite label(s)" in problems
    assert ("empty or missing text(s)" in problems) == (empty_texts == "refuse")
    train_rows = 44 if empty_texts == "refuse" else 42  # dropped rows are not there to train on
    assert f"train_sizes: [10000] exceed the {train_rows} train rows of {folder}" in problems
    # a dataset missing its label column: the size beside it too
    pd.DataFrame({"text": ["a"] * 30}).to_csv(folder / "train.csv", index=False)
    with pytest.raises(SpecError, match=r"(?s)label.*\[10000\] exceed the 30 train rows"):
        api.plan(write_spec("bad", datasets=[str(folder)], train_sizes=[24, 10_000]))


def _stored_fixed_grid(write_spec, name: str, cells: list[tuple[int, int, int]], **spec) -> dict:
    """A fixed grid stored as a launch stores it (seed 0, sizes 24 and 48, k 0 and 2), with final rows for
    ``cells`` (train size, k, seed)."""
    from freezesweep.results.store import SCHEMA

    raw = yaml.safe_load(write_spec(name, **spec).read_text())
    store = ResultStore(raw["store"], name)
    store.write_spec(yaml.safe_dump(raw))
    for n, k, seed in cells:
        values = dict(sweep=name, trial_id=f"{name}-{n}-{k}-{seed}", model=raw["model"], dataset=raw["datasets"][0])
        values |= dict(train_size=n, method="freeze", frozen_layers=k, seed=seed, status="ok")
        store.write_row({c: None for c in SCHEMA.names} | values)
    return raw


def test_seeds_added_to_a_fixed_grid_once_a_group_is_complete_are_refused(write_spec):
    """Before: a fixed grid grown by a seed after its decision was read was decided again at the same
    level, a second look (a 5-seed look then a 10-seed one: 3.9 % false "within" against 2.25 %)."""
    cells = [(24, k, seed) for k in (0, 2) for seed in range(3)] + [(48, 0, 0)]
    raw = _stored_fixed_grid(write_spec, "fixed", cells, seeds=[0, 1, 2])
    (problem,) = _problems(write_spec("fixed", seeds=[0, 1, 2, 3]))
    assert problem.startswith("seeds: [3] added, but sweep 'fixed' already has rows and its group ")
    assert f"{raw['datasets'][0]}, n = 24 may have been decided" in problem and "second look" in problem
    assert raw["model"] not in problem  # an upgrade walk-through: one model's full path named the group
    assert "another split_seed" in problem  # a new name alone would rerun the rows already seen
    (many,) = _problems(write_spec("fixed", seeds=list(range(50))))
    assert many.startswith("seeds: 47 (3, …, 49) added")  # not 47 numbers
    settle = {"tolerance": 0.01, "initial_seeds": 3, "max_seeds": 5}
    (switched,) = _problems(write_spec("fixed", seeds=[], settle=settle))
    assert switched.startswith("settle: sweep 'fixed' already has rows as a fixed grid; as a settle sweep")
    load_spec(write_spec("fixed", seeds=[0, 1, 2], train_sizes=[24, 48, 96]))  # other axes still grow


def test_a_fixed_grid_of_fewer_seeds_than_a_decision_needs_grows_and_says_so(write_spec):
    """A new user's walk-through: a grid of 2 seeds gave no advice, said so only in its report, and adding a
    seed was refused as a second look. Below 3 paired seeds no claim can be shown, so its one look cost
    nothing: seeds may be added, and `plan` says beforehand that it cannot advise."""
    from freezesweep.orchestrator import api

    _stored_fixed_grid(write_spec, "two", [(24, k, seed) for k in (0, 2) for seed in range(2)], seeds=[0, 1])
    load_spec(write_spec("two", seeds=[0, 1, 2]))
    assert "a fixed grid of 2 seeds gives no freezing advice" in api.plan(write_spec("two", seeds=[0, 1])).note
    assert api.plan(write_spec("two", seeds=[0, 1, 2])).note is None
    # a walk-through: no full fine-tuning, no advice, and no word of it (settle mode refuses such a spec)
    unpaired = api.plan(write_spec("no-full", frozen_layers=[2], seeds=[0, 1, 2])).note
    assert unpaired.startswith(
        "a fixed grid without full fine-tuning (methods: freeze with frozen_layers 0) gives no freezing advice"
    )


def test_a_depth_added_first_does_not_open_the_way_to_more_seeds(write_spec):
    """The review's bypass: add a depth (the group then looks incomplete), then seeds. A depth below the
    deepest is itself refused once a group may have been decided (its sequence tested again with more
    claims); a deeper one extends the sequence and is accepted, and seeds stay refused after it."""
    three = [0, 1, 2]
    cells = [(24, k, seed) for k in (0, 1) for seed in three]
    _stored_fixed_grid(write_spec, "deep", cells, frozen_layers=[0, 1], seeds=three)
    (inserted,) = _problems(write_spec("deep", frozen_layers=[-1, 0, 1], seeds=three))  # k = -1: between 0 and 1
    assert inserted.startswith("frozen_layers: [-1] added below the deepest depth (1), but sweep 'deep'")
    load_spec(write_spec("deep", frozen_layers=[0, 1, 2], seeds=three))  # deeper: accepted
    (problem,) = _problems(write_spec("deep", frozen_layers=[0, 1, 2], seeds=[*three, 3]))
    assert problem.startswith("seeds: [3] added")


def test_a_depth_inserted_into_a_settle_sweep_after_its_first_look_is_refused(write_spec):
    """Before: accepted, each report's sequence then had another first false claim (a review's simulation:
    7.7 % false "within" over four reports, against the 2.25 % a claim is paid). Before the first look
    (full fine-tuning and a depth at the initial seeds) it is a new cell; a deeper depth extends the sequence."""
    settle = {"tolerance": 0.01, "initial_seeds": 3, "max_seeds": 5}
    first = [(24, k, seed) for k in (0, 1) for seed in range(2)]
    _stored_fixed_grid(write_spec, "grown", first, seeds=[], settle=settle, frozen_layers=[0, 1])
    load_spec(write_spec("grown", seeds=[], settle=settle, frozen_layers=[-1, 0, 1]))  # no look yet: a new cell
    looked = first + [(24, 0, 2), (24, 1, 2)]
    _stored_fixed_grid(write_spec, "looked", looked, seeds=[], settle=settle, frozen_layers=[0, 1])
    (inserted,) = _problems(write_spec("looked", seeds=[], settle=settle, frozen_layers=[-1, 0, 1]))
    assert inserted.startswith("frozen_layers: [-1] added below the deepest depth (1), but sweep 'looked'")
    assert "has had a look" in inserted and "another split_seed" in inserted
    load_spec(write_spec("looked", seeds=[], settle=settle, frozen_layers=[0, 1, 2]))  # deeper: accepted


def test_seeds_or_depths_removed_once_a_group_may_be_decided_are_refused_a_train_size_is_not(write_spec):
    """A walk-through removed k = 2 from a decided fixed grid: accepted, and the report's sequence went on
    past it (a second test of the sequence, as a depth inserted is). Seeds removed: a decision on fewer seeds,
    a second look. A train size removed leaves the other groups' claims alone: accepted (its rows are left out
    of the report). Before any group may have been decided, nothing was looked at: accepted."""
    three = [0, 1, 2]
    cells = [(24, k, seed) for k in (0, 2) for seed in three]
    _stored_fixed_grid(write_spec, "shrunk", cells, seeds=three, train_sizes=[24, 48])
    (depth,) = _problems(write_spec("shrunk", frozen_layers=[0], seeds=three))
    assert depth.startswith("frozen_layers: [2] removed, but sweep 'shrunk' already has rows and its group ")
    assert "tested again without it" in depth and "another split_seed" in depth
    (seed,) = _problems(write_spec("shrunk", seeds=[0, 1]))
    assert seed.startswith("seeds: [2] removed") and "second look" in seed
    load_spec(write_spec("shrunk", seeds=three, train_sizes=[24]))  # another group's axis: accepted
    # a review: a depth deeper than the decided deepest was in no sequence looked at; `all` is a depth too
    _stored_fixed_grid(write_spec, "deeper", cells, seeds=three, frozen_layers=[0, 2, 4])
    load_spec(write_spec("deeper", seeds=three, frozen_layers=[0, 2]))  # k = 4 has no rows: accepted
    assert _removed_depths({"frozen_layers": [0, 2, "all"]}, {"frozen_layers": [0, 2]}) == ["all"]
    _stored_fixed_grid(write_spec, "young", [(24, 0, 0)], seeds=three)
    assert load_spec(write_spec("young", frozen_layers=[0], seeds=[0])).frozen_layers == [0]  # no look yet


def test_a_fixed_grids_tolerance_is_fixed_once_it_has_rows(write_spec):
    """The question is asked before the rows are seen: a changed `tolerance:` on a fixed grid with rows is
    refused (as settle.tolerance is), before any it is the spec's to set; settle sweeps ask settle.tolerance."""
    _stored_fixed_grid(write_spec, "asked", [], tolerance=0.02)
    assert load_spec(write_spec("asked", tolerance=0.05)).question_tolerance() == 0.05  # no rows: still open
    _stored_fixed_grid(write_spec, "asked", [(24, 0, 0)], tolerance=0.02)
    (changed,) = _problems(write_spec("asked", tolerance=0.05))
    assert changed.startswith("tolerance: sweep 'asked' already has rows asked at tolerance 0.02; 0.05 chosen")
    (dropped,) = _problems(write_spec("asked"))  # back to the default, 0.01: a change too
    (out_of_range,) = _problems(write_spec("asked", tolerance=1.5))  # a walk-through: said twice, the second wrong
    assert out_of_range.startswith("tolerance: Input should be less than 1") and "voids" not in out_of_range
    assert "asked at tolerance 0.02; 0.01 chosen after seeing them voids the confidence" in dropped
    settle = {"tolerance": 0.01, "initial_seeds": 3, "max_seeds": 5}
    (both,) = _problems(write_spec("both", seeds=[], settle=settle, tolerance=0.02))
    assert "tolerance and settle both given: a settle sweep asks settle.tolerance" in both


def test_a_depth_below_any_decided_groups_deepest_is_refused(write_spec):
    """A review's case: n = 24 decided with depths 0 and -1 only (its k = 2 failed), n = 48 with 0, -1 and 2.
    Before, the first decided group's deepest (-1) was the bar, and k = 1, below n = 48's deepest, passed."""
    settle = {"tolerance": 0.01, "initial_seeds": 3, "max_seeds": 5}
    cells = [(24, k, s) for k in (0, -1) for s in range(3)] + [(48, k, s) for k in (0, -1, 2) for s in range(3)]
    _stored_fixed_grid(write_spec, "uneven", cells, seeds=[], settle=settle, frozen_layers=[-1, 0, 2])
    (inserted,) = _problems(write_spec("uneven", seeds=[], settle=settle, frozen_layers=[-1, 0, 1, 2]))
    assert inserted.startswith("frozen_layers: [1] added below the deepest depth (2)") and "n = 48" in inserted


def test_seeds_added_before_any_group_is_complete_are_new_cells(write_spec):
    """No group had all its cells in: no decision could have been read, so no look was taken."""
    _stored_fixed_grid(write_spec, "early", [(24, 0, 0), (48, 0, 0)])
    assert load_spec(write_spec("early", seeds=[0, 1])).seeds == [0, 1]


def test_columns_can_be_named_per_dataset(write_spec, toy_dataset, tmp_path):
    """A new user's sweep: a GLUE-like task beside files of their own with other column names. Before, one
    text_column applied to every dataset ("no column 'review'" for the other), and a mapping was refused."""
    renamed = tmp_path / "reviews"
    renamed.mkdir()
    for split in ("train", "validation"):
        frame = pd.read_csv(f"{toy_dataset}/{split}.csv")
        frame.rename(columns={"sentence": "review", "label": "sentiment"}).to_parquet(renamed / f"{split}.parquet")
    columns = {"text_column": {str(renamed): "review"}, "label_column": {str(renamed): "sentiment"}}
    spec = load_spec(write_spec("mixed", datasets=[toy_dataset, str(renamed)], training=columns))
    cells = build_grid(resolve_here(spec))
    read = {(c.dataset, c.text_column, c.label_column) for c in cells}
    assert read == {(toy_dataset, None, None), (str(renamed), "review", "sentiment")}
    one = load_spec(
        write_spec("one", datasets=[str(renamed)], training={"text_column": "review", "label_column": "sentiment"})
    )
    (first, *_) = build_grid(resolve_here(one))
    assert (first.text_column, first.label_column) == ("review", "sentiment")  # one name for every dataset, as before
    columns_label = {"label_column": {str(renamed): "sentiment"}}
    lone = _problems(
        write_spec("lone", datasets=[toy_dataset, str(renamed)], training={"text_column": "review", **columns_label})
    )
    assert len(lone) == 1 and lone[0].startswith(f"datasets: {toy_dataset}: no column 'review'")
    assert lone[0].endswith(
        "; one training.text_column names every dataset's column: give {dataset: column} to name it for some only "
        f"(e.g. text_column: {{{renamed}: review}})"
    )  # a walk-through: one name for a file of their own beside another said only "no column"
    neither = _problems(write_spec("neither", datasets=[toy_dataset, str(renamed)], training={"text_column": "text"}))
    assert not any("give {dataset: column}" in p for p in neither)  # no dataset to name as the example
    strays = _problems(write_spec("stray", datasets=[toy_dataset], training={"text_column": {"elsewhere": "x"}}))
    assert strays == ["training.text_column: elsewhere not among the datasets"]
    slash = _problems(write_spec("slash", datasets=[f"{renamed}/"], training=columns))  # a walk-through
    hint = f"training.text_column: {renamed} (did you mean '{renamed}/', as datasets spells it?) not among the datasets"
    assert hint in slash, slash
    # a stored sweep reading one name for its dataset grows by a dataset named in a mapping: no cell of it
    # changes, so it is no change of protocol (the review found both refused)
    raw = yaml.safe_load(write_spec("grows", datasets=[toy_dataset], training={"text_column": "sentence"}).read_text())
    ResultStore(raw["store"], "grows").write_spec(yaml.safe_dump(raw))
    mapping = {
        "text_column": {toy_dataset: "sentence", str(renamed): "review"},
        "label_column": {str(renamed): "sentiment"},
    }
    load_spec(write_spec("grows", datasets=[toy_dataset, str(renamed)], training=mapping))


def test_a_model_folder_without_weights_tokenizer_or_config_is_refused(write_spec, tiny_bert, tmp_path):
    """Before: a folder with no weights passed and failed every trial; one with no tokenizer files trained
    "ok" on [UNK] alone (transformers 5 builds a 5-token tokenizer); one with no config.json was told to
    download it from the hub (a new user's walk-through)."""
    import shutil

    from freezesweep.trials.model import load_model_config

    folders = {name: tmp_path / name for name in ("no-weights", "no-tokenizer", "no-config")}
    for folder in folders.values():
        folder.mkdir()
    for name in os.listdir(tiny_bert):
        source = os.path.join(tiny_bert, name)
        if not name.endswith(".safetensors"):
            shutil.copy(source, folders["no-weights"])
        if name in ("config.json", "model.safetensors"):
            shutil.copy(source, folders["no-tokenizer"])
    shutil.copy(os.path.join(tiny_bert, "model.safetensors"), folders["no-config"])
    for name, expected in (
        ("no-weights", "the folder holds no weights"),
        ("no-tokenizer", "its tokenizer knows 5 tokens, its embeddings"),
        ("no-config", "the folder has no config.json: a model folder holds what save_pretrained writes"),
    ):
        load_model_config.cache_clear()
        problems = _problems(write_spec(model=str(folders[name])))
        assert any(expected in p for p in problems), (name, problems)
        assert not any("HF_HUB_OFFLINE" in p for p in problems), problems
    random_init = write_spec(model=str(folders["no-weights"]), training={"model_init": "random"})
    assert load_spec(random_init).model == str(folders["no-weights"])  # a random init reads no weights


def test_rows_outside_the_grid_now_are_no_cells_done_and_left_out_of_the_report(write_spec):
    """A walk-through shrank a grid (a depth, a train size) and respelled a model's folder: the launch counted
    the old rows as done ("trial 19/18", "22/18 ended", an ETA of minus one day) and the report decided with
    them. Now a row is a cell done only where the grid has its axis values; the report leaves the others out
    and says how many (`query` still reads them)."""
    from freezesweep.orchestrator.api import _sweep_rows
    from freezesweep.orchestrator.plan import in_grid
    from freezesweep.orchestrator.sweeps import grid_statuses
    from freezesweep.results.report import build_report

    cells = [(n, k, seed) for n in (24, 48) for k in (0, 2) for seed in range(2)]
    raw = _stored_fixed_grid(write_spec, "narrowed", cells, seeds=[0, 1])
    store = ResultStore(raw["store"], "narrowed")
    narrowed = write_spec("narrowed", seeds=[0, 1], train_sizes=[24])
    sweep = resolve_here(load_spec(narrowed))
    store.write_spec(narrowed.read_text())  # as a launch of the narrowed spec stores it
    kept, every = grid_statuses(sweep, store)
    assert len(every) == 8  # every row is known, so that Ray's saved state writes none of them again
    assert sorted(kept) == sorted(f"narrowed-24-{k}-{s}" for k in (0, 2) for s in range(2))
    assert len(store.statuses()) == 8  # every row stays in the store
    rows = _sweep_rows("narrowed", raw["store"], None)
    assert rows.left_out == 4 and set(rows.rows["train_size"]) == {24}
    (line,) = build_report([rows]).completeness
    assert "cells done" in line and line.endswith(  # (this test's ids are no real cells': none counts as done)
        " 4 stored rows are no cell of its grid now (an axis value removed from the spec, or spelled otherwise) and "
        "left out of this report; `freezesweep query` reads every row."
    )
    respelled = pd.DataFrame(
        dict(model=[raw["model"], f"./{raw['model']}/"], dataset=raw["datasets"][0], train_size=24, seed=0)
        | dict(method=[None, "freeze"], frozen_layers=[2, 2], lora_rank=[None, None])
    )
    assert in_grid(sweep, respelled).tolist() == [True, False]  # a row from before methods: a freeze row


def test_a_new_sweep_that_holds_another_sweeps_cells_is_told_before_it_runs_them(write_spec, tmp_path):
    """A walk-through followed a report's "a new settle sweep …" under the default split_seed: its first round
    reran the other sweep's cells bit for bit (the same ids, the same scores), and nothing said so. `plan` and
    a launch say it now; another split_seed (fresh subsets and run seeds) says nothing."""
    from freezesweep.orchestrator import api

    first = _stored_fixed_grid(write_spec, "first", [(24, 0, 0)], seeds=[0, 1, 2])
    settle = {"tolerance": 0.01, "initial_seeds": 3, "max_seeds": 5}
    note = api.plan(write_spec("again", seeds=[], settle=settle, train_sizes=[24])).note
    # 1 size x 2 depths x 3 seeds in common (the settle sweep's budget holds seeds 0-4)
    assert "this grid shares cells with other sweeps of the store (6 with sweep 'first'): the same protocol" in note
    assert "another split_seed gives fresh ones" in note
    assert api.plan(write_spec("fresh", seeds=[], settle=settle, train_sizes=[24], split_seed=7)).note is None
    longer = write_spec("longer", seeds=[0, 1, 2], training={"epochs": 3})  # another protocol: other cells
    assert "shares cells" not in (api.plan(longer).note or "")
    # a review: a second dataset made the protocols differ (a column mapping per dataset), and another
    # select metric (part of a cell's id) was taken for the same cells
    import shutil

    other = str(shutil.copytree(first["datasets"][0], tmp_path / "toy-copy"))
    wider = write_spec("wider", seeds=[0, 1, 2], datasets=[first["datasets"][0], other], train_sizes=[24])
    assert "(6 with sweep 'first')" in api.plan(wider).note  # the dataset both have: 1 size x 2 depths x 3 seeds
    chosen = write_spec("chosen", seeds=[0, 1, 2], training={"select_metric": "f1"})
    assert "shares cells" not in (api.plan(chosen).note or "")


def test_settings_that_do_less_together_than_they_seem_are_said(write_spec):
    """A walk-through: `warmup_epochs: 5` and `eval_every_epochs: 2` beside `epochs: 1` passed without a word."""
    from freezesweep.orchestrator import api

    note = api.plan(write_spec("odd", training={"epochs": 1, "warmup_epochs": 5, "eval_every_epochs": 2})).note
    assert "training.warmup_epochs 5 is longer than epochs 1: the learning rate rises for the whole run" in note
    assert "training.eval_every_epochs 2 is longer than epochs 1: each trial is evaluated once, at its end" in note
    plain = write_spec("plain", seeds=[0, 1, 2], training={"epochs": 2, "warmup_epochs": 1})
    assert api.plan(plain).note is None


def test_model_and_models_both_given_is_named_beside_every_other_problem(write_spec, tiny_bert):
    """A walk-through: `model:` and `models:` both given was the one problem said ("1 problem(s)"); with
    `models:` deleted the same file said six more. Now all at once, the rest checked with `model:`'s name
    (no "model: Field required" for a model that was given)."""
    problems = _problems(
        write_spec(
            models=[tiny_bert],
            train_sizes=[40.5],
            frozen_layers=[0, 2.5],
            methods=["freeze", "lora"],
            training={"batch_size": 0, "max_seq_length": 2},
        )
    )
    assert [p.split(":")[0] for p in problems] == [
        "give model or models, not both",
        "train_sizes.0",
        "frozen_layers.1",
        "training.batch_size",
        "lora_ranks is empty, but methods has lora",
        "training.max_seq_length",
    ], problems
    assert "leaves no room for text" in problems[-1]


def test_settle_problems_are_named_beside_its_own_keys_and_the_others(write_spec):
    """A walk-through: settle's unknown key was the one problem said, then (fixed) its budget below its
    initial seeds, and only then seeds + settle and tolerance + settle: three rounds of fixes for four."""
    settle = {"tolerance": 0.02, "initial_seeds": 5, "max_seeds": 3, "confidnce": 0.9}
    problems = _problems(write_spec(seeds=[0, 1], tolerance=0.02, settle=settle))
    assert problems == [
        "settle.confidnce: unknown key (did you mean confidence?)",
        "seeds and settle both given: settle mode chooses the seeds (0, 1, … up to settle.max_seeds); drop seeds",
        "tolerance and settle both given: a settle sweep asks settle.tolerance; drop tolerance",
        "settle.max_seeds (3) is below settle.initial_seeds (5)",
    ]
