"""The wheel installs one import name, ``freezesweep``: none of the repository's generic folder names
(``orchestrator``, ``trials``, ``results``, ``cluster``: each an unrelated package on PyPI) reaches
site-packages, and a clean environment imports freezesweep but none of them. Every module imports by
every idiom; the package holds its modules and nothing else of the checkout, installed (the wheel,
``make install``'s strict editable install) or imported from a bare checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import FOLDERS, REPO, product_modules

# What a checkout holds beside the package and never in it (git's own and build outputs aside).
COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "sweeps", "site", "build", "report", ".devcarry", "*.egg-info", "__pycache__", ".*_cache"
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools writes build/ and *.egg-info/ beside the sources, never in the checkout.
    source = out / "source"
    shutil.copytree(REPO, source, ignore=COPY_IGNORE)
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


# The package as pkgutil walks it (every documentation tool's way), and names of the checkout that must
# not import as part of it (each imported while the checkout's root was on the package's __path__).
WALK = """
import importlib, pkgutil, sys
import freezesweep

print(freezesweep.__file__)
print(*freezesweep.__path__, sep="|")
print(*sorted(module.name for module in pkgutil.walk_packages(freezesweep.__path__, "freezesweep.")))
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        print("imported", name)
    except ModuleNotFoundError:
        pass
"""


def _leaks() -> list[str]:
    """``freezesweep.<folder>`` for every top-level folder of the checkout that is not one of the four."""
    folders = [p.name for p in REPO.iterdir() if p.is_dir() and p.name.isidentifier() and p.name not in FOLDERS]
    return [f"freezesweep.{name}" for name in folders] + [
        "freezesweep.benchmarks.grid_speed",
        "freezesweep.freezesweep.freezesweep",
    ]


def _walk(python: list[str], cwd: Path, env: dict | None = None) -> tuple[Path, list[str], list[str], list[str]]:
    """The package's file, its __path__, the modules pkgutil walks and the leaks that imported."""
    done = subprocess.run(
        [*python, "-c", WALK, *_leaks()], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    file, path, walked, *imported = done.stdout.splitlines()
    return Path(file), path.split("|"), walked.split(), imported


def _without_pythonpath() -> dict:
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def test_the_installed_package_walks_to_exactly_its_modules_and_holds_nothing_else(wheel, tmp_path):
    """The wheel (what users get) and the development install (make install: strict editable mode, whose
    link tree static tools and pkgutil read) alike; from outside the checkout, as a user's script runs."""
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    expected = sorted(set(product_modules()) - {"freezesweep"})
    for env, where in (
        (_without_pythonpath(), "the development install"),
        ({**os.environ, "PYTHONPATH": str(site)}, site),
    ):
        file, path, walked, imported = _walk([sys.executable], tmp_path, env)
        if env.get("PYTHONPATH"):
            assert file.is_relative_to(site), file
        assert walked == expected, f"{where}: the walk differs (a lenient editable install? `make install`)"
        assert imported == [] and str(REPO) not in path, (where, imported, path)


def test_a_checkout_imports_its_subpackages_and_nothing_else_of_itself():
    """Python started in the checkout's root finds its freezesweep/ first: the four subpackages are the
    folders beside it, found by name (pkgutil, which lists directories, finds none there), and nothing
    else of the checkout becomes part of the package."""
    file, path, walked, imported = _walk([sys.executable], REPO, _without_pythonpath())
    assert file == REPO / "freezesweep" / "__init__.py"
    assert path == [str(REPO / "freezesweep")] and walked == [] and imported == []


def test_a_bare_checkout_runs_with_nothing_installed(tmp_path):
    """The GPU machine's checks run from a copy of the working tree, nothing installed: the subpackages are
    that copy's folders, with no site-packages at all (-S) and beside an install of another checkout."""
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO, checkout, ignore=COPY_IGNORE)
    file, path, walked, imported = _walk([sys.executable, "-S"], checkout, _without_pythonpath())
    assert file == checkout / "freezesweep" / "__init__.py" and path == [str(checkout / "freezesweep")]
    assert walked == [] and imported == []
    # -S: the stdlib only (a plain module); then beside this checkout's install, a module needing pyarrow
    for python, module in (
        ([sys.executable, "-S"], "freezesweep.cluster"),
        ([sys.executable], "freezesweep.results.store"),
    ):
        code = f"import importlib; print(importlib.import_module({module!r}).__file__)"
        done = subprocess.run(
            [*python, "-c", code], capture_output=True, text=True, cwd=checkout, env=_without_pythonpath()
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert Path(done.stdout.strip()).is_relative_to(checkout), done.stdout


IDIOMS = """
import pkgutil, sys
import freezesweep

names = sorted(module.name for module in pkgutil.walk_packages(freezesweep.__path__, "freezesweep."))
print(*names)
for name in names:
    parent, leaf = name.rsplit(".", 1)
    idioms = [(f"import {name} as m", "m"), (f"from {parent} import {leaf}", leaf), (f"import {name}", name)]
    for code, expression in idioms:
        try:
            scope = {}
            exec(code, scope)
            found = eval(expression, scope)
            assert found is sys.modules[name], f"{found!r} is not the module"
        except Exception as error:
            print(f"{code}: {type(error).__name__}: {error}")
"""


def test_every_module_imports_by_all_three_idioms(tmp_path):
    """``import a.b.c as m``, ``from a.b import c`` and ``a.b.c`` after ``import a.b.c`` each give the module
    itself (an API function named like a subpackage hid it): in a fresh interpreter, every module pkgutil
    walks in the installed package."""
    done = subprocess.run(
        [sys.executable, "-c", IDIOMS], capture_output=True, text=True, cwd=tmp_path, env=_without_pythonpath()
    )
    assert done.returncode == 0, done.stderr[-3000:]
    walked, *failures = done.stdout.splitlines()
    assert walked.split() == sorted(set(product_modules()) - {"freezesweep"})
    assert failures == []
