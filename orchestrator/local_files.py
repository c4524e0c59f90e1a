"""The local files a sweep names (data files: a data dir's GLUE tasks or a local dataset; local model
folders) and how the workers of a cluster get them: a worker node needs only freezesweep installed.

``local_files: ship`` (the default on a cluster): the driver reads the files the spec's datasets and
models need and puts each in Ray's object store once (``pack``). A worker writes them once per node,
on first use, into a folder of the node's own cache named by their content digest, moved into place
whole so trials starting together on one node never see half of it (``ShippedFolder.materialise``),
and the trial reads them there: the machine fields ``dataset_files`` and ``model_dir`` say where
(``Shipment.place``). Neither is identity, so the cell's ``trial_id`` does not change. Installed
packages that ship a model (trials.model.OFFLINE_PACKAGES) are not shipped: workers have packages.

``local_files: node_local``: every node has the files at the paths the spec names (a shared or
copied folder). With the embedded Ray (``auto`` without a cluster) the one node is this machine. A
relative path is the driver's working directory's, where validation found it: the driver sends it
absolute (``anchor``), as Ray Tune runs each trial in a folder of its own.

On a cluster the driver runs a preflight task on every alive node before the first trial
(``node_lacks``, sent by orchestrator/ray_session.py): it checks the named paths (node_local) and the
offline model packages, and the launch stops with one error naming each node and what it lacks.

Nothing here imports Ray: the object store is reached through the ``put`` and ``fetch`` functions
the caller passes (the Ray session on the driver, ``ray.get`` in a trial).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from freezesweep.orchestrator.spec import SweepSpec
from freezesweep.trials.config import TrialConfig
from freezesweep.trials.data import SPLITS, DatasetError, glue_task, resolve_cache_dir, resolve_data_dir, split_files

Put = Callable[[bytes], Any]  # bytes -> a reference in the object store (driver side)
Fetch = Callable[[Any], bytes]  # that reference -> the bytes (on any node)


def mode(spec: SweepSpec, on_cluster: bool) -> str:
    """``ship`` or ``node_local``: ``auto`` ships whenever the trials may run on other machines."""
    if spec.local_files != "auto":
        return spec.local_files
    return "ship" if on_cluster else "node_local"


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class ShippedFolder:
    """Files in Ray's object store, and the name of the folder a node writes them to."""

    digest: str  # of every file's relative path and content
    files: dict[str, Any]  # relative path -> ObjectRef of the file's bytes

    @classmethod
    def put(cls, files: dict[str, Path], put: Put) -> "ShippedFolder":
        """Driver side: each file into the object store once (``files``: relative path -> where it is here)."""
        blobs = {name: path.read_bytes() for name, path in files.items()}  # read once: hashed and shipped
        listing = sorted((name, hashlib.sha256(blob).hexdigest()) for name, blob in blobs.items())
        digest = hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:32]
        return cls(digest, {name: put(blob) for name, blob in blobs.items()})

    def materialise(self, root: Path, fetch: Fetch) -> Path:
        """Worker side: ``root/<digest>``, written on first use. The files go to a staging folder that
        is renamed into place whole: a concurrent trial on this node either sees no folder (and
        writes its own, whose rename then loses) or the complete one."""
        target = root / self.digest
        if target.is_dir():
            return target
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{self.digest}-", dir=root))
        try:
            for name, ref in self.files.items():
                (staging / name).parent.mkdir(parents=True, exist_ok=True)
                (staging / name).write_bytes(fetch(ref))
            os.rename(staging, target)
        except OSError:
            if not target.is_dir():  # not a lost race: the write itself failed
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target


def shipped_root() -> Path:
    """This node's folder of shipped files, in its own cache folder (``FREEZESWEEP_CACHE_DIR`` as set
    on the node: the driver does not forward its own), beside its token caches. Named by content, a
    copy is never stale, and a later sweep on the node reuses it instead of writing it again."""
    return resolve_cache_dir(None) / "shipped"


@dataclass(frozen=True)
class Shipment:
    datasets: dict[str, ShippedFolder]  # dataset name -> train.<ext> and validation.<ext>
    models: dict[str, ShippedFolder]  # model (a local folder of the driver) -> the folder's files

    def place(self, cfg: TrialConfig, fetch: Fetch, root: Path | None = None) -> TrialConfig:
        """``cfg`` reading its shipped files from this node's copies (machine fields only: same trial_id)."""
        root = root or shipped_root()
        updates: dict[str, Any] = {}
        if cfg.dataset in self.datasets:
            shipped = self.datasets[cfg.dataset]
            folder, by_split = shipped.materialise(root, fetch), {Path(name).stem: name for name in shipped.files}
            updates["dataset_files"] = (str(folder / by_split["train"]), str(folder / by_split["validation"]))
        if cfg.model in self.models:
            updates["model_dir"] = str(self.models[cfg.model].materialise(root, fetch))
        return dataclasses.replace(cfg, **updates)

    def model_files(self, model: str, fetch: Fetch, root: Path | None = None) -> str:
        """Where ``model`` is loaded from on this node."""
        folder = self.models.get(model)
        return str(folder.materialise(root or shipped_root(), fetch)) if folder else model


@dataclass(frozen=True)
class Anchored:
    """``local_files: node_local``: the files at the paths the spec names, each made absolute from the
    driver's working directory (``anchor``), for trials that run in folders of their own (Ray Tune's
    trial directory). Machine fields only, as ``Shipment``'s: the same trial_id."""

    data_dir: str | None  # the spec's data dir, or FREEZESWEEP_DATA_DIR's as the driver reads it
    datasets: dict[str, tuple[str, str]]  # dataset -> its (train, validation) files
    models: dict[str, str]  # a model named by a folder -> that folder

    def place(self, cfg: TrialConfig, fetch: Fetch | None = None) -> TrialConfig:
        """``cfg`` reading its files at their absolute paths."""
        updates: dict[str, Any] = {"data_dir": self.data_dir}
        if cfg.dataset in self.datasets:
            updates["dataset_files"] = self.datasets[cfg.dataset]
        if cfg.model in self.models:
            updates["model_dir"] = self.models[cfg.model]
        return dataclasses.replace(cfg, **updates)

    def model_files(self, model: str, fetch: Fetch | None = None) -> str:
        return self.models.get(model, model)


def anchor(spec: SweepSpec) -> Anchored:
    """Driver side: the spec's local files (``local_datasets``, ``local_models``: found from here) and
    its data dir, as absolute paths."""
    data_dir = resolve_data_dir(spec.data_dir)
    return Anchored(
        str(data_dir.absolute()) if data_dir else None,
        {d: (str(f["train"].absolute()), str(f["validation"].absolute())) for d, f in local_datasets(spec).items()},
        {model: str(Path(model).expanduser().absolute()) for model in local_models(spec)},
    )


def pack(spec: SweepSpec, put: Put) -> Shipment:
    """Driver side: the files of the spec's local datasets and model folders, in the object store.
    GLUE tasks read from the hub and hub models are not files: nothing to ship."""
    # a split's file keeps its format's extension: the reader picks by it
    datasets = {
        dataset: ShippedFolder.put({f"{split}{path.suffix}": path for split, path in files.items()}, put)
        for dataset, files in local_datasets(spec).items()
    }
    models = {model: ShippedFolder.put(_folder_files(Path(model).expanduser()), put) for model in local_models(spec)}
    return Shipment(datasets, models)


def local_datasets(spec: SweepSpec) -> dict[str, dict[str, Path]]:
    """The spec's datasets read from files here (by split): GLUE tasks from the hub have none."""
    found = {dataset: split_files(dataset, spec.data_dir) for dataset in spec.datasets}
    return {dataset: files for dataset, files in found.items() if files is not None}


def local_models(spec: SweepSpec) -> list[str]:
    """The spec's models that are folders here (the others come from the hub or a package)."""
    return [model for model in spec.models() if Path(model).expanduser().is_dir()]


def _folder_files(folder: Path) -> dict[str, Path]:
    """Every file of a model folder, by relative path; hidden ones (``.git``, ``.cache``) stay home."""
    return {
        str(p.relative_to(folder)): p
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    }


@dataclass(frozen=True)
class NodeNeeds:
    """What a trial opens on its node besides freezesweep itself (checked there by ``node_lacks``)."""

    data_dir: str | None = None
    data_digests: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)  # dataset -> split -> sha256
    model_dirs: tuple[str, ...] = ()
    packages: dict[str, str] = dataclasses.field(default_factory=dict)  # module -> the model it ships

    @classmethod
    def of(cls, spec: SweepSpec, how: str) -> "NodeNeeds":
        """Shipped files need nothing on the node; node-local ones must be there with the driver's
        content (a trial_id names the data, so a node with another copy must not make its rows)."""
        # deferred on purpose: trials.model imports transformers (seconds), which inspection never needs
        from freezesweep.trials.model import OFFLINE_PACKAGES

        packages = {
            OFFLINE_PACKAGES[m]: m
            for m in spec.models()
            if m in OFFLINE_PACKAGES and importlib.util.find_spec(OFFLINE_PACKAGES[m]) is not None
        }
        if how == "ship":
            return cls(packages=packages)
        anchored = anchor(spec)  # (a node's task runs in a folder of its own: the driver's paths, absolute)
        digests = {  # a GLUE task by its name (in the data dir), other datasets by their files
            dataset if glue_task(dataset) else ",".join(files): dict(zip(SPLITS, map(file_digest, map(Path, files))))
            for dataset, files in anchored.datasets.items()
        }
        return cls(anchored.data_dir, digests, tuple(anchored.models.values()), packages)


def node_lacks(needs: NodeNeeds) -> list[str]:
    """Run on a node: what it lacks of ``needs``, each named."""
    lacks = []
    for dataset, digests in needs.data_digests.items():
        try:
            files = split_files(dataset, needs.data_dir)
        except DatasetError as exc:
            lacks.append(str(exc))
            continue
        lacks += [
            f"{path} (its content differs from the driver's)"
            for split, path in files.items()
            if file_digest(path) != digests[split]
        ]
    lacks += [f"model folder {model}" for model in needs.model_dirs if not Path(model).expanduser().is_dir()]
    lacks += [
        f"package {package} (it ships the model {model})"
        for package, model in needs.packages.items()
        if importlib.util.find_spec(package) is None
    ]
    return lacks
