"""The product's import graph, read with ``ast`` (module- and function-level imports alike): no
cycle between its modules, no private name imported from another module or reached
through another package's module (tests: of the package they mirror only), and Ray imported by at
most three modules (the Ray session, the Tune adapter and one more at the most)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import FOLDERS, REPO, product_modules

PACKAGES = (*FOLDERS, "freezesweep")
RAY_MODULES_MAX = 3


def _package(module: str) -> str:
    """The layer a module belongs to: ``freezesweep.trials.run`` -> ``trials``; ``torch.nn`` -> ``torch``."""
    parts = module.split(".")
    return parts[1] if parts[0] == "freezesweep" and len(parts) > 1 else parts[0]


MODULES = product_modules()


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every import statement anywhere in the file; ``import a.b`` gives (a.b, [])."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def _product_targets(module: str, names: list[str]) -> set[str]:
    """The product modules an import reaches: the module itself, or ``from package import module``."""
    if module not in MODULES:
        return set()
    submodules = {f"{module}.{name}" for name in names if f"{module}.{name}" in MODULES}
    return submodules or {module}


def _graph() -> dict[str, set[str]]:
    return {
        name: {target for module, names in _imports(path) for target in _product_targets(module, names)} - {name}
        for name, path in MODULES.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, components, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_no_import_cycle_in_the_product():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_private_name_is_imported_across_modules():
    private = [
        f"{name}: from {module} import {imported}"
        for name, path in MODULES.items()
        for module, names in _imports(path)
        if module.split(".")[0] == "freezesweep"
        for imported in names
        if imported.startswith("_")
    ]
    assert private == []


def _private_attributes(path: Path) -> list[tuple[str, str]]:
    """(module, ``alias._x``) where the alias names a product module this file imported (``from
    freezesweep.results import settle`` then ``settle._t``): a private name reached through its module."""
    tree = ast.parse(path.read_text(), str(path))
    modules: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            modules |= {a.asname: a.name for a in node.names if a.asname}
    modules |= {alias: "freezesweep" for alias, name in modules.items() if name == "freezesweep"}
    return [
        (modules[node.value.id], f"{node.value.id}.{node.attr}")
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        if modules.get(node.value.id) in MODULES and node.attr.startswith("_") and not node.attr.startswith("__")
    ]


@pytest.mark.parametrize("folder", ["product", "tests", "benchmarks"])
def test_no_private_name_is_reached_through_another_package(folder):
    """The product, its tests and benchmarks use another package's public names only (a benchmark read
    ``settle._t_of_prefix``): only the tests of a package (tests/<package>/, mirroring it; tests/test_api.py
    the top-level API) reach into its modules, and product modules into their own package's."""
    paths = MODULES.items() if folder == "product" else ((str(p), p) for p in (REPO / folder).rglob("*.py"))
    private = [
        f"{name}: {use}"
        for name, path in paths
        for module, use in _private_attributes(path)
        if _package(module) not in _home(name, path, folder)
    ]
    assert private == []


def _home(name: str, path: Path, folder: str) -> set[str]:
    """The packages a file may reach into: a product module's own; a test's mirrored package (tests/trials/…:
    trials; tests/test_api.py: the top-level freezesweep and its API, orchestrator/api.py); none for a benchmark."""
    if folder == "product":
        return {_package(name)}
    parts = path.relative_to(REPO / folder).parts
    if folder == "tests" and len(parts) > 1:
        return {parts[0]}
    return {"freezesweep", "orchestrator"} if parts == ("test_api.py",) else set()


def test_the_private_reach_finder_finds_one(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from freezesweep.results import settle\nsettle._x(1)\nsettle.public(2)\n")
    assert _private_attributes(source) == [("freezesweep.results.settle", "settle._x")]


def test_ray_is_imported_by_at_most_three_modules():
    users = sorted(
        name
        for name, path in MODULES.items()
        if any(module == "ray" or module.startswith("ray.") for module, _ in _imports(path))
    )
    assert len(users) <= RAY_MODULES_MAX, users


@pytest.mark.parametrize(
    "package, forbidden",
    [("results", ("torch", "trials", "orchestrator", "ray")), ("trials", ("orchestrator", "results", "ray"))],
)
def test_package_boundaries(package, forbidden):
    """results/ reads and writes the store without torch or trials; trials/ runs without Ray."""
    crossing = [
        f"{name}: {module}"
        for name, path in MODULES.items()
        if _package(name) == package
        for module, _ in _imports(path)
        if _package(module) in forbidden
    ]
    assert crossing == []


def test_every_product_import_goes_through_the_one_import_name():
    """The folders are installed under freezesweep only: an import of a bare `trials` or `results` would
    find an unrelated package of that name (or a user's own results.py) first."""
    bare = [
        f"{name}: {module}"
        for name, path in MODULES.items()
        for module, _ in _imports(path)
        if module.split(".")[0] in PACKAGES[:-1]
    ]
    tests = [
        f"{path.relative_to(REPO)}: {module}"
        for path in sorted((REPO / "tests").rglob("*.py"))
        for module, _ in _imports(path)
        if module.split(".")[0] in PACKAGES[:-1]
    ]
    assert bare == [] and tests == []
