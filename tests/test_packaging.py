"""The wheel installs one import name, ``freezesweep``: none of the repository's generic folder names
(``orchestrator``, ``trials``, ``results``, ``cluster``: each an unrelated package on PyPI) reaches
site-packages, and a clean environment imports freezesweep but none of them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

FOLDERS = ("orchestrator", "trials", "results", "cluster")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools writes build/ and *.egg-info/ beside the sources, never in the checkout.
    source = out / "source"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "sweeps", "site", "build", "report", ".devcarry", "*.egg-info", "__pycache__"
        ),
    )
    # the installed setuptools builds it: no build environment downloaded
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = out.glob("freezesweep-*.whl")
    return path


def test_the_wheels_only_top_level_package_is_freezesweep(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"freezesweep"}, top
    for folder in FOLDERS:  # each folder is there, under the one name, with its modules
        assert f"freezesweep/{folder}/__init__.py" in names
    assert "freezesweep/trials/run.py" in names and "freezesweep/orchestrator/cli.py" in names
    assert "freezesweep/cluster/aws-gpu.yaml" in names and "freezesweep/cluster/README.md" in names
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "freezesweep = freezesweep.orchestrator.cli:app" in entry_points


def test_a_clean_environment_imports_freezesweep_and_none_of_the_folder_names(wheel, tmp_path):
    env = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    python = env / "bin" / "python"
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # Only freezesweep's own top package is imported: its subpackages need torch, Ray and the rest, which
    # --no-deps left out; what matters is which names resolve at all.
    code = f"""
import importlib.util, freezesweep
print(freezesweep.__version__, freezesweep.__file__.startswith({str(env)!r}))
print([importlib.util.find_spec(f"freezesweep.{{n}}") is not None for n in {FOLDERS!r}])
print([importlib.util.find_spec(n) is not None for n in {FOLDERS!r}])
"""
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    version, subpackages, bare = done.stdout.splitlines()
    assert version.endswith("True")
    assert subpackages == "[True, True, True, True]"
    assert bare == "[False, False, False, False]"
