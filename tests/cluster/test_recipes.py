"""The cluster recipes, checked without starting anything: the autoscaler configs against Ray's own
schema, the KubeRay manifests' required fields, token authentication everywhere, and the same pins
(Python, Ray, freezesweep, torch) in every recipe as in pyproject, the Makefile and the installed Ray."""

import json
import re
import shlex
import sys
from importlib import metadata, resources

import jsonschema
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tests.conftest import REPO

tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")

CLUSTER = REPO / "cluster"
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
FREEZESWEEP = PROJECT["version"]
RAY = metadata.version("ray")  # the Ray the project is tested with: the recipes pin the same
PYTHON = SpecifierSet(PROJECT["requires-python"])
TORCH = re.search(r"^TORCH \?= torch==(\S+)$", (REPO / "Makefile").read_text(), re.M).group(1)
AUTOSCALER = ["aws-gpu.yaml", "gcp-gpu.yaml"]
WHEEL = f"freezesweep-{FREEZESWEEP}-py3-none-any.whl"


def _autoscaler(name: str) -> dict:
    return yaml.safe_load((CLUSTER / name).read_text())


def _python_floor() -> tuple[int, int]:
    (floor,) = [s.version for s in PYTHON if s.operator == ">="]
    return tuple(int(p) for p in floor.split(".")[:2])


def test_pins_agree_with_pyproject():
    ray_requirement = next(Requirement(r) for r in PROJECT["dependencies"] if Requirement(r).name == "ray")
    assert Version(RAY) in ray_requirement.specifier  # the recipes' Ray is one pyproject accepts


# --- the autoscaler configs (ray up) ------------------------------------------------------------------


@pytest.mark.parametrize("name", AUTOSCALER)
def test_autoscaler_config_matches_rays_schema(name):
    schema = json.loads((resources.files("ray") / "autoscaler" / "ray-schema.json").read_text())
    config = _autoscaler(name)
    jsonschema.validate(config, schema)
    workers = [t for key, t in config["available_node_types"].items() if key != config["head_node_type"]]
    assert workers and all(t["resources"].get("GPU", 0) >= 1 for t in workers)
    assert any("--num-gpus=0" in c for c in config["head_start_ray_commands"])  # the head runs no trial


@pytest.mark.parametrize("name", AUTOSCALER)
def test_every_ray_start_keeps_token_auth_and_every_node_gets_the_token(name):
    config = _autoscaler(name)
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in config[key] if "ray start" in c]
        assert starts and all("RAY_AUTH_MODE=token" in c for c in starts), key
    assert "RAY_AUTH_MODE=disabled" not in (CLUSTER / name).read_text()
    # file_mounts are copied to every node, workers included: the token reaches them all.
    tokens = {remote for remote, local in config["file_mounts"].items() if local == "~/.ray/auth_token"}
    assert {t.rsplit("/", 2)[-2:] == [".ray", "auth_token"] for t in tokens} == {True}


@pytest.mark.parametrize("name", AUTOSCALER)
def test_every_node_installs_the_pinned_versions(name):
    config = _autoscaler(name)
    # setup_commands run on every node, autoscaled workers included, unless a node type overrides them.
    for node_type in config["available_node_types"].values():
        assert "worker_setup_commands" not in node_type and "setup_commands" not in node_type
    setup = " ".join(config["setup_commands"])
    assert "sys.version_info >= ({}, {})".format(*_python_floor()) in setup  # the image's Python, checked
    installs = [shlex.split(c.replace("~", "$HOME")) for c in config["setup_commands"] if "pip install" in c]
    (install,) = installs
    assert f"torch=={TORCH}" in install
    assert any(re.fullmatch(rf"ray\[[a-z,]*\]=={re.escape(RAY)}", arg) for arg in install)
    assert any(arg.endswith(f"/{WHEEL}[s3]") for arg in install)


@pytest.mark.parametrize("name", AUTOSCALER)
def test_no_working_tree_is_synced(name):
    config = _autoscaler(name)
    assert set(config["file_mounts"].values()) == {"./dist", "~/.ray/auth_token"}  # the wheel folder, the token
    assert not config.get("cluster_synced_files")
    assert "-e " not in " ".join(config["setup_commands"])  # an installed wheel, not an editable checkout
    wheel_folder = next(remote for remote, local in config["file_mounts"].items() if local == "./dist")
    assert wheel_folder.endswith("/freezesweep-dist") and "$HOME/freezesweep-dist/" + WHEEL in " ".join(
        config["setup_commands"]
    ).replace("~", "$HOME")


@pytest.mark.parametrize("name", AUTOSCALER)
def test_gpu_workers_start_mps_before_ray(name):
    """CUDA MPS on every GPU worker before its `ray start` (the trials that share its GPU run together),
    not on the head, which runs no trial; a node where it does not start still joins."""
    config = _autoscaler(name)
    commands = config["worker_start_ray_commands"]
    mps = [i for i, c in enumerate(commands) if "nvidia-cuda-mps-control -d" in c]
    starts = [i for i, c in enumerate(commands) if "ray start" in c]
    assert mps and starts and mps[0] < starts[0]
    assert "|| echo" in commands[mps[0]]  # a failed start does not stop the node from joining
    assert not any("mps" in c for c in config["head_start_ray_commands"])


# --- KubeRay ----------------------------------------------------------------------------------------


def _manifest(name: str) -> dict:
    (doc,) = list(yaml.safe_load_all((CLUSTER / name).read_text()))
    return doc


def _cluster_spec(doc: dict) -> dict:
    return doc["spec"]["rayClusterSpec"] if doc["kind"] == "RayJob" else doc["spec"]


def _containers(spec: dict) -> dict[str, list[dict]]:
    return {
        "head": spec["headGroupSpec"]["template"]["spec"]["containers"],
        "workers": [c for g in spec["workerGroupSpecs"] for c in g["template"]["spec"]["containers"]],
    }


def _image_python(image: str) -> str:
    match = re.fullmatch(rf"[^:]+/freezesweep:{re.escape(FREEZESWEEP)}-ray{re.escape(RAY)}-py(\d)(\d+)", image)
    assert match, f"image {image!r} does not pin freezesweep {FREEZESWEEP}, Ray {RAY} and Python"
    return f"{match[1]}.{match[2]}"


def _assert_token_auth(container: dict) -> None:
    env = {e["name"]: e for e in container.get("env", [])}
    assert env["RAY_AUTH_MODE"]["value"] == "token", container["name"]
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"], container["name"]  # a Secret, not a literal


@pytest.mark.parametrize("name, kind", [("kuberay-raycluster.yaml", "RayCluster"), ("kuberay-rayjob.yaml", "RayJob")])
def test_kuberay_manifest_fields_pins_and_token_auth(name, kind):
    doc = _manifest(name)
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == kind and doc["metadata"]["name"]
    spec = _cluster_spec(doc)
    assert spec["rayVersion"] == RAY
    assert isinstance(spec["headGroupSpec"]["rayStartParams"], dict)
    assert spec["workerGroupSpecs"]
    for group in spec["workerGroupSpecs"]:
        assert isinstance(group["rayStartParams"], dict) and group["groupName"]
        assert 1 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    containers = _containers(spec)
    for container in containers["head"] + containers["workers"]:
        assert _image_python(container["image"]) in PYTHON
        _assert_token_auth(container)
    for worker in containers["workers"]:
        assert int(worker["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    assert all("nvidia.com/gpu" not in c.get("resources", {}).get("limits", {}) for c in containers["head"])


@pytest.mark.parametrize("name", ["kuberay-raycluster.yaml", "kuberay-rayjob.yaml"])
def test_kuberay_gpu_workers_start_mps_before_ray(name):
    """KubeRay keeps the containers' own command (the annotation) and hands them its `ray start` in
    $KUBERAY_GEN_RAY_START_CMD: each GPU worker starts the MPS daemon first, in a pipe and log directory
    its user can write; every container keeps the file limit KubeRay's own command would set."""
    doc = _manifest(name)
    assert doc["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    containers = _containers(_cluster_spec(doc))
    for container in containers["head"] + containers["workers"]:
        script = " ".join(container["args"])
        assert script.startswith("ulimit -n 65536;") and script.endswith("$KUBERAY_GEN_RAY_START_CMD")
        assert container["command"] == ["/bin/bash", "-lc", "--"]
    for worker in containers["workers"]:
        script = " ".join(worker["args"])
        assert script.index("nvidia-cuda-mps-control -d") < script.index("$KUBERAY_GEN_RAY_START_CMD")
        env = {e["name"]: e.get("value", "") for e in worker["env"]}
        assert env["CUDA_MPS_PIPE_DIRECTORY"].startswith("/tmp/") and env["CUDA_MPS_LOG_DIRECTORY"].startswith("/tmp/")
    assert not any("mps" in " ".join(c["args"]) for c in containers["head"])


def test_rayjob_runs_freezesweep_launch_on_a_spec_the_head_has():
    doc = _manifest("kuberay-rayjob.yaml")
    assert "rayClusterSpec" in doc["spec"]
    command = shlex.split(doc["spec"]["entrypoint"])
    assert command[:2] == ["freezesweep", "launch"]
    spec_path = command[2]
    (head,) = _containers(doc["spec"]["rayClusterSpec"])["head"]
    assert any(spec_path.startswith(m["mountPath"] + "/") for m in head.get("volumeMounts", []))
    # The cluster is deleted when the job ends: its rows must go to a store that outlives it.
    store = command[command.index("--store") + 1]
    assert doc["spec"]["shutdownAfterJobFinishes"] and re.match(r"[a-z0-9]+://", store)
    for submitter in doc["spec"]["submitterPodTemplate"]["spec"]["containers"]:
        _assert_token_auth(submitter)


def test_kuberay_image_is_built_with_the_same_pins():
    text = (CLUSTER / "Dockerfile").read_text()
    base = re.search(r"^FROM rayproject/ray:(\S+)-py(\d)(\d+)-gpu$", text, re.M)
    assert base and base[1] == RAY
    image = _manifest("kuberay-raycluster.yaml")["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert _image_python(image["image"]) == f"{base[2]}.{base[3]}"  # the tag says the Python the image has
    assert f'"torch=={TORCH}"' in text and re.search(rf'"ray\[[a-z,]*\]=={re.escape(RAY)}"', text)
    assert f"/tmp/{WHEEL}[s3]" in text and f"COPY {WHEEL} " in text


# --- the walk-through names real commands -----------------------------------------------------------


def _freezesweep_calls() -> list[tuple[str, list[str]]]:
    """(command, its --options) of every freezesweep call in the README's code blocks and the RayJob."""
    readme = (CLUSTER / "README.md").read_text()
    code = re.findall(r"^```[a-z]*\n(.*?)^```", readme, re.S | re.M) + [
        _manifest("kuberay-rayjob.yaml")["spec"]["entrypoint"]
    ]
    calls = re.findall(r"\bfreezesweep (\w+)([^\n]*)", "\n".join(code))
    return [(command, re.findall(r"(?<!\S)(--[a-z-]+)", rest)) for command, rest in calls]


def test_walkthrough_uses_real_cli_commands_and_options():
    from typer.main import get_command

    from freezesweep.orchestrator.cli import app

    commands = get_command(app).commands
    calls = _freezesweep_calls()
    assert {"launch", "query", "summary"} <= {command for command, _ in calls}
    for command, options in calls:
        assert command in commands, command
        assert set(options) <= {o for p in commands[command].params for o in p.opts}, (command, options)
