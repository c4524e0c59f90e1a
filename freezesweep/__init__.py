"""freezesweep: how many layers of a pretrained transformer to freeze, for the labelled data you have.

The Python API lives here (``import freezesweep as fs``): ``fs.load_spec``, ``fs.plan``, ``fs.launch``,
``fs.resume``, ``fs.results_frame``, ``fs.decide``, ``fs.report`` and the rest of ``__all__``
(implemented in ``freezesweep.orchestrator.api``; the CLI is a thin layer over them).

Its packages live under this one import name: ``freezesweep.orchestrator`` (specs, plans, launches,
the CLI), ``freezesweep.trials`` (one fine-tune, plain PyTorch), ``freezesweep.results`` (the Parquet
store, queries, decisions, reports; no torch) and ``freezesweep.cluster`` (recipes).

Importing ``freezesweep`` itself is cheap: Ray workers import ``freezesweep.trials`` through it, so
the API's names are loaded on first use (a module ``__getattr__``), not here.
"""

import importlib as _importlib
import importlib.abc as _abc
import importlib.util as _util
import sys as _sys
import types as _types
import warnings as _warnings
from pathlib import Path as _Path
from typing import TYPE_CHECKING as _TYPE_CHECKING

__version__ = "0.3.0"

# The repository's folders that are this package's subpackages (pyproject.toml's package-dir).
_FOLDERS = ("orchestrator", "trials", "results", "cluster")


class _CheckoutFolders(_abc.MetaPathFinder):
    """Imported from a checkout (nothing installed: the GPU machine's checks, which carry the working tree
    only; or Python started in the checkout's root, whose ``freezesweep/`` comes first on ``sys.path``), the
    four subpackages are the sibling folders, and nothing else in the checkout is: ``freezesweep.benchmarks``
    stays unimportable. The wheel and ``make install``'s strict editable install hold them inside
    ``freezesweep/`` and need none of this."""

    def __init__(self, checkout: _Path) -> None:
        self.checkout = checkout

    def find_spec(self, fullname, path=None, target=None):
        parent, _, folder = fullname.rpartition(".")
        if parent != __name__ or folder not in _FOLDERS:
            return None  # their modules are found on the subpackage's own __path__
        init = self.checkout / folder / "__init__.py"
        return _util.spec_from_file_location(fullname, init, submodule_search_locations=[str(init.parent)])


_HERE = _Path(__file__).parent  # not resolved: the strict editable install's links stay its own tree
if not (_HERE / "trials").is_dir() and (_HERE.parent / "trials" / "__init__.py").is_file():
    # First: the subpackages come from the tree this package came from, before any install's finder.
    _sys.meta_path.insert(0, _CheckoutFolders(_HERE.parent))

# Each exported name and the module that defines it.
_EXPORTS = {
    **dict.fromkeys(
        [
            "load_spec",
            "build_spec",
            "plan",
            "launch",
            "resume",
            "results_frame",
            "results_arrow",
            "results_duckdb",
            "query",
            "status",
            "summary",
            "decide",
            "report",
            "compact",
            "export_mlflow",
            "budget_prices",
            "Plan",
            "SweepStatus",
            "Decision",
            "Decisions",
            "SpecSource",
            "UnreadableRowsWarning",
            "UnfinishedCellsWarning",
        ],
        "freezesweep.orchestrator.api",
    ),
    **dict.fromkeys(["SweepSpec", "SpecError", "SweepNotFound"], "freezesweep.orchestrator.spec"),
    "LaunchSummary": "freezesweep.orchestrator.launch",
    "SweepLocked": "freezesweep.results.lock",
    **dict.fromkeys(["StoreError", "StoreUnavailable"], "freezesweep.results.store"),
    "TrackingError": "freezesweep.results.mlflow_export",
    "Report": "freezesweep.results.report",
}

# Written out (not derived from _EXPORTS): static readers (IDEs, the API reference's griffe) read it as text.
__all__ = [
    "load_spec",
    "build_spec",
    "plan",
    "launch",
    "resume",
    "results_frame",
    "results_arrow",
    "results_duckdb",
    "query",
    "status",
    "summary",
    "decide",
    "report",
    "compact",
    "export_mlflow",
    "budget_prices",
    "Plan",
    "SweepStatus",
    "Decision",
    "Decisions",
    "SpecSource",
    "UnreadableRowsWarning",
    "UnfinishedCellsWarning",
    "SweepSpec",
    "SpecError",
    "SweepNotFound",
    "LaunchSummary",
    "StoreUnavailable",
    "SweepLocked",
    "StoreError",
    "TrackingError",
    "Report",
    "__version__",
]

if _TYPE_CHECKING:  # what type checkers, IDEs and the API reference see
    from freezesweep.orchestrator.api import (
        Decision,
        Decisions,
        Plan,
        SpecSource,
        SweepStatus,
        UnfinishedCellsWarning,
        UnreadableRowsWarning,
        build_spec,
        compact,
        decide,
        budget_prices,
        export_mlflow,
        launch,
        load_spec,
        plan,
        query,
        report,
        results_arrow,
        results_duckdb,
        results_frame,
        resume,
        status,
        summary,
    )
    from freezesweep.orchestrator.launch import LaunchSummary
    from freezesweep.orchestrator.spec import SpecError, SweepNotFound, SweepSpec
    from freezesweep.results.lock import SweepLocked
    from freezesweep.results.report import Report
    from freezesweep.results.mlflow_export import TrackingError
    from freezesweep.results.store import StoreError, StoreUnavailable


def __getattr__(name: str):
    """An API name, imported from its module on first use and kept."""
    if name == "results":  # the 0.3 spelling fs.results(...): the subpackage, callable until the next release
        return _importlib.import_module(f"{__name__}.results")
    if name not in _EXPORTS:
        raise AttributeError(f"module 'freezesweep' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


class _CallableResults(_types.ModuleType):
    """The subpackage ``freezesweep.results`` (the store, queries, the report), which 0.3's API function of
    that name shadowed (``import freezesweep.results.settle as S`` failed). The function is now
    ``fs.results_frame``; for one release the subpackage still answers the old call, with a warning."""

    def __call__(self, *args, **kwargs):
        _warnings.warn(
            "fs.results(...) is now fs.results_frame(...) (freezesweep.results is the subpackage: the store, "
            "queries, the report); the old spelling goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return __getattr__("results_frame")(*args, **kwargs)


class _Package(_types.ModuleType):
    """Binds the subpackage ``results`` (the import system sets it on its parent, once, when first
    imported) as the callable module above: the same object under every import idiom."""

    def __setattr__(self, name: str, value) -> None:
        if name == "results" and type(value) is _types.ModuleType:
            value.__class__ = _CallableResults
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package
