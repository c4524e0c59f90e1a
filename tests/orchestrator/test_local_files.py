"""Share-nothing workers: the driver ships the spec's local files through Ray's object store, a node
writes them once into its own folder, and trials read them there with their ids unchanged; a named
local path that is missing is an error, never the hub; a preflight task names each node and what it lacks."""

import shutil
from pathlib import Path

import pytest
import ray

from freezesweep.orchestrator import local_files
from freezesweep.orchestrator.plan import build_grid
from freezesweep.orchestrator.sweeps import resolve_here
from freezesweep.orchestrator.checks import load_spec
from freezesweep.orchestrator.ray_session import RaySession
from freezesweep.orchestrator.spec import SpecError
from tests.conftest import make_toy_dataset, make_toy_pair_dataset, ray_sweeps
from freezesweep.trials.data import DatasetError, load_task


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    """One embedded single-node Ray for the module (about 3 s to start on 2 cores). Its workers
    inherit the environment at start: the tests' cache folder, not the user's."""
    import ray

    started = not ray.is_initialized()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FREEZESWEEP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
        if started:
            ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        yield ray
    if started:
        ray.shutdown()


@pytest.fixture
def no_hub(monkeypatch):
    import datasets

    def refuse(*args, **kwargs):
        raise AssertionError(f"the hub was asked for {args}")

    monkeypatch.setattr(datasets, "load_dataset", refuse)
    monkeypatch.delenv("FREEZESWEEP_DATA_DIR", raising=False)


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_missing_local_paths_are_errors_never_the_hub(no_hub, write_spec, tmp_path, tiny_trial):
    """A data dir without the task, a missing dataset folder, a missing model folder: each an error
    naming the path, in one spec error before anything runs; a trial given them fails the same way."""
    import dataclasses

    from freezesweep.trials.model import ModelError, resolve_model_path
    from freezesweep.trials.run import run_trial

    with pytest.raises(DatasetError, match=f"no folder {tmp_path / 'sst2'}"):
        load_task("glue/sst2", data_dir=str(tmp_path))
    with pytest.raises(ModelError, match=f"model folder {tmp_path / 'model'} does not exist"):
        resolve_model_path(str(tmp_path / "model"))
    with pytest.raises(SpecError) as refused:
        load_spec(
            write_spec(
                datasets=["glue/sst2", str(tmp_path / "mine")], data_dir=str(tmp_path), model=str(tmp_path / "model")
            )
        )
    message = str(refused.value)
    assert f"no folder {tmp_path / 'sst2'} in data_dir {tmp_path}" in message
    assert f"datasets: {tmp_path / 'mine'}: no such folder here" in message  # the dataset named once
    assert "glue/sst2: glue/sst2" not in message and "mine'" not in message
    with pytest.raises(DatasetError, match=f"data_dir {tmp_path / 'glu'} is not a folder here"):
        load_task("glue/sst2", data_dir=str(tmp_path / "glu"))  # a mistyped data dir is said to be one
    assert f"model folder {tmp_path / 'model'} does not exist" in message
    with pytest.raises(DatasetError, match="no folder"):
        run_trial(
            dataclasses.replace(tiny_trial, dataset="glue/sst2", data_dir=str(tmp_path), select_metric="accuracy")
        )


def test_shipped_files_reach_a_node_that_has_none_of_the_drivers_paths(local_ray, write_spec, tmp_path, tiny_bert):
    """Pack on the driver, then take the driver's data and model folders away: the node's copies
    are byte for byte the driver's, the trial config points at them with its trial_id unchanged,
    and the trial runs from them alone."""
    from freezesweep.trials.run import run_trial

    glue = tmp_path / "glue"
    make_toy_pair_dataset(glue / "rte", n_train=40, n_val=20)
    mine = make_toy_dataset(tmp_path / "mine", n_train=60, n_val=20, fmt="csv")
    model = Path(shutil.copytree(tiny_bert, tmp_path / "model"))
    spec = load_spec(
        write_spec(
            datasets=["glue/rte", str(mine)],
            data_dir=str(glue),
            model=str(model),
            train_sizes=[24],
            frozen_layers=[1],
            local_files="ship",
        )
    )
    assert local_files.mode(spec, on_cluster=False) == "ship"
    originals = {"rte": _tree(glue / "rte"), "mine": _tree(mine), "model": _tree(model)}
    shipment = RaySession().ship(spec)
    for folder in (glue, mine, model):
        folder.rename(folder.with_name(folder.name + "-away"))  # the node sees none of the driver's paths

    node = tmp_path / "node"
    cells = build_grid(resolve_here(spec))
    placed = [shipment.place(c, ray.get, root=node) for c in cells]
    assert [p.trial_id for p in placed] == [c.trial_id for c in cells]
    assert [(p.dataset, p.model, p.data_dir) for p in placed] == [(c.dataset, c.model, c.data_dir) for c in cells]
    rte, own = (next(p for p in placed if p.dataset == d) for d in ("glue/rte", str(mine)))
    assert [Path(f).read_bytes() for f in rte.dataset_files] == list(originals["rte"].values())
    assert [Path(f).name for f in own.dataset_files] == ["train.csv", "validation.csv"]
    assert _tree(Path(rte.model_dir)) == originals["model"]
    assert shipment.place(cells[0], ray.get, root=node) == placed[0]  # written once per node, then reused
    result = run_trial(own)
    assert result.status == "ok" and result.trial_id == own.trial_id
    assert all(not p.name.startswith(".") for p in node.iterdir())  # no staging folder left behind


def test_materialise_tolerates_a_concurrent_writer(local_ray, tmp_path):
    """Two trials of one node writing the same folder: the second rename loses, both read the whole folder."""
    source = tmp_path / "a.txt"
    source.write_text("hello")
    folder = local_files.ShippedFolder.put({"sub/a.txt": source}, put=ray.put)
    root = tmp_path / "node"
    (root / folder.digest / "sub").mkdir(parents=True)
    (root / folder.digest / "sub" / "a.txt").write_text("hello")  # another trial finished first
    assert (folder.materialise(root, ray.get) / "sub" / "a.txt").read_text() == "hello"
    shutil.rmtree(root)
    assert _tree(folder.materialise(root, ray.get)) == {"sub/a.txt": b"hello"}


def test_preflight_names_each_node_and_what_it_lacks(local_ray, write_spec, tmp_path, toy_dataset):
    node = local_ray.nodes()[0]
    spec = load_spec(write_spec(local_files="node_local"))
    session = RaySession()
    assert session.check_nodes(local_files.NodeNeeds.of(spec, "node_local")) == []  # this node has it all
    lacking = local_files.NodeNeeds(
        data_dir=str(tmp_path / "glue"),
        data_digests={"glue/sst2": {"train": "0", "validation": "0"}, toy_dataset: {"train": "0", "validation": "0"}},
        model_dirs=(str(tmp_path / "model"),),
        packages={"no_such_package_x": "org/m"},
    )
    [problem] = session.check_nodes(lacking)
    assert problem.startswith(f"node {node['NodeID'][:12]} ({node['NodeManagerAddress']}, ")
    for expected in [
        f"data_dir {tmp_path / 'glue'} is not a folder here",
        f"{toy_dataset}/train.csv (its content differs",
        f"model folder {tmp_path / 'model'}",
        "package no_such_package_x (it ships the model org/m)",
    ]:
        assert expected in problem, (expected, problem)


def test_a_cluster_launch_stops_before_any_trial_when_a_node_lacks_something(
    local_ray, write_spec, tmp_path, monkeypatch
):
    from freezesweep.orchestrator import launch as launch_module

    cluster = RaySession()
    cluster.address = "ray://head:10001"  # the embedded Ray (already connected), seen as a cluster
    spec = load_spec(write_spec("preflight", local_files="node_local"))
    monkeypatch.setattr(
        local_files.NodeNeeds, "of", classmethod(lambda cls, spec, how: cls(model_dirs=(str(tmp_path / "elsewhere"),)))
    )
    with pytest.raises(
        SpecError,
        match=r"preflight on the cluster's nodes \(local_files: node_local.*\n"
        rf"  - node \w{{12}} .* lacks: model folder {tmp_path / 'elsewhere'}",
    ):
        launch_module.launch(spec, show_progress=False, session=cluster)
    assert not (tmp_path / "store" / "preflight").exists()


def test_driver_folders_are_not_forwarded_to_workers(monkeypatch):
    seen = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.update(kwargs))
    monkeypatch.setenv("FREEZESWEEP_CACHE_DIR", "/driver/cache")
    monkeypatch.setenv("FREEZESWEEP_DATA_DIR", "/driver/glue")
    monkeypatch.setenv("HF_HOME", "/driver/hf")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    RaySession().connect()
    forwarded = seen["runtime_env"]["env_vars"]
    assert forwarded["HF_HUB_OFFLINE"] == "1"
    assert not {"FREEZESWEEP_CACHE_DIR", "FREEZESWEEP_DATA_DIR", "HF_HOME"} & set(forwarded)


@ray_sweeps
def test_a_shipping_sweep_reads_the_nodes_copies_and_rows_name_the_specs_paths(
    local_ray, write_spec, tmp_path, toy_dataset, tiny_bert
):
    """Through Ray Tune (embedded, local_files: ship): the worker wrote the shipped files into its
    node's cache, and the rows say what the spec says, not where the node's copies are."""
    import json

    import pandas as pd

    from freezesweep.orchestrator.launch import launch

    spec = load_spec(write_spec("shipped", train_sizes=[24], frozen_layers=[1], local_files="ship"))
    summary = launch(spec, show_progress=False)
    assert (summary.ran, summary.ok) == (1, 1)
    row = pd.read_parquet(tmp_path / "store" / "shipped" / "results").iloc[0]
    config = json.loads(row["config"])
    assert (config["dataset"], config["model"], config["dataset_files"], config["model_dir"]) == (
        toy_dataset,
        tiny_bert,
        None,
        None,
    )
    assert row["trial_id"] == build_grid(resolve_here(spec))[0].trial_id
    copies = list(local_files.shipped_root().iterdir())
    assert {_tree(c).get("train.csv") for c in copies} >= {(Path(toy_dataset) / "train.csv").read_bytes()}
    assert any(_tree(c) == _tree(Path(tiny_bert)) for c in copies)


@ray_sweeps
def test_relative_paths_are_read_from_the_drivers_working_directory(
    local_ray, write_spec, tmp_path, toy_dataset, tiny_bert, monkeypatch
):
    """A data dir, a dataset folder and a model folder named relative to where the command runs (where
    validation found them): Ray Tune runs each trial in a folder of its own, so the trials read them
    from the driver's working directory, and the rows name them as the spec does."""
    import json

    import pandas as pd

    from freezesweep.orchestrator.launch import launch

    work = tmp_path / "work"
    shutil.copytree(toy_dataset, work / "data" / "toy")
    shutil.copytree(toy_dataset, work / "data" / "glue" / "sst2")  # a local GLUE copy of the toy rows
    shutil.copytree(tiny_bert, work / "models" / "tiny")
    monkeypatch.chdir(work)
    monkeypatch.delenv("FREEZESWEEP_DATA_DIR", raising=False)
    overrides = {"model": "models/tiny", "datasets": ["data/toy", "glue/sst2"], "data_dir": "data/glue"}
    spec = load_spec(write_spec("relative", train_sizes=[24], frozen_layers=[1], **overrides))
    summary = launch(spec, show_progress=False)
    rows = pd.read_parquet(tmp_path / "store" / "relative" / "results")
    assert (summary.ran, summary.ok) == (2, 2), rows["error"].tolist()
    configs = [json.loads(c) for c in rows["config"]]
    assert {(c["dataset"], c["model"], c["data_dir"], c["dataset_files"], c["model_dir"]) for c in configs} == {
        ("data/toy", "models/tiny", "data/glue", None, None),
        ("glue/sst2", "models/tiny", "data/glue", None, None),
    }


def test_a_resume_reads_relative_paths_where_the_launch_found_them(tmp_path):
    """``launch_folder_for``: the launch's folder where more of the spec's relative paths (a data dir, a
    dataset's files, a model folder) are found there than here and none found here is lost; else here."""
    from types import SimpleNamespace

    from freezesweep.orchestrator.spec import SweepSpec
    from freezesweep.orchestrator.sweeps import launch_folder_for

    launched, here = tmp_path / "launched", tmp_path / "here"
    for folder in (launched / "data" / "glue", launched / "models" / "tiny", here):
        folder.mkdir(parents=True)
    (launched / "train.csv").write_text("x")
    spec = SweepSpec(
        name="s", model="models/tiny", datasets=["glue/sst2", "train.csv,val.csv"], data_dir="data/glue",
        train_sizes=[8], frozen_layers=[0], seeds=[0],
    )  # fmt: skip
    store = SimpleNamespace(read_launch_folder=lambda: str(launched))
    assert launch_folder_for(spec, store, here=str(here)) == str(launched)
    assert launch_folder_for(spec, store, here=str(launched)) is None  # already there
    assert launch_folder_for(spec, SimpleNamespace(read_launch_folder=lambda: None), here=str(here)) is None
    (here / "models" / "tiny").mkdir(parents=True)  # found here and there: the launch's folder finds more
    assert launch_folder_for(spec, store, here=str(here)) == str(launched)
    shutil.rmtree(launched / "models")  # found here, not there: here
    assert launch_folder_for(spec, store, here=str(here)) is None
    absolute = spec.model_copy(
        update={"model": str(here / "models" / "tiny"), "datasets": ["glue/sst2"], "data_dir": None}
    )
    assert launch_folder_for(absolute, store, here=str(here)) is None  # nothing relative


def test_a_resume_whose_launch_folder_is_gone_says_where_the_paths_were_looked_for(tmp_path):
    """A walk-through moved its project folder and resumed from above it: the model folder not found was read
    as a hub id ("We couldn't connect to 'https://huggingface.co'"), and nothing said why."""
    from types import SimpleNamespace

    from freezesweep.orchestrator.spec import SweepSpec
    from freezesweep.orchestrator.sweeps import lost_folder_note

    here = tmp_path / "here"
    (here / "data").mkdir(parents=True)
    spec = SweepSpec(name="s", model="models/q", datasets=["data"], train_sizes=[8], frozen_layers=[0], seeds=[0])
    gone = SimpleNamespace(read_launch_folder=lambda: str(tmp_path / "moved-away"))
    note = lost_folder_note(spec, gone, here=str(here))
    assert note.startswith(f"sweep 's' was launched in {tmp_path / 'moved-away'}, which is gone")
    assert f"({here}), where models/q is not found (a model not found is read as a hub id)" in note
    assert lost_folder_note(spec, SimpleNamespace(read_launch_folder=lambda: str(here)), here=str(here)) is None
    # a store an earlier version launched keeps no launch folder: an upgrade walk-through's resume said nothing
    unknown = SimpleNamespace(read_launch_folder=lambda: None)
    said = lost_folder_note(spec.model_copy(update={"model": "./models/q"}), unknown, here=str(here))
    assert said.startswith("sweep 's' does not say which folder it was launched in (launched-from.txt came")
    assert said.endswith("run the resume from the folder that holds them")
    # there, a name a hub id could be is one, downloaded where it is not cached (a review)
    assert lost_folder_note(spec.model_copy(update={"model": "org-x/not-cached"}), unknown, here=str(here)) is None
    hub = spec.model_copy(update={"model": "sentence-transformers/all-MiniLM-L6-v2"})  # a package ships it
    assert lost_folder_note(hub, gone, here=str(here)) is None  # a review: hub ids were listed as paths
    (here / "models" / "q").mkdir(parents=True)
    assert lost_folder_note(spec, gone, here=str(here)) is None  # every path found here: nothing to say
