"""freezesweep: how many layers of a pretrained transformer to freeze, for the labelled data you have.

The Python API lives here (``import freezesweep as fs``): ``fs.load_spec``, ``fs.plan``, ``fs.launch``,
``fs.resume``, ``fs.results``, ``fs.decide``, ``fs.report`` and the rest of ``__all__``
(implemented in ``freezesweep.orchestrator.api``; the CLI is a thin layer over them).

Its packages live under this one import name: ``freezesweep.orchestrator`` (specs, plans, launches,
the CLI), ``freezesweep.trials`` (one fine-tune, plain PyTorch), ``freezesweep.results`` (the Parquet
store, queries, decisions, reports; no torch) and ``freezesweep.cluster`` (recipes).

Importing ``freezesweep`` itself is cheap: Ray workers import ``freezesweep.trials`` through it, so
the API's names are loaded on first use (a module ``__getattr__``), not here.
"""

from __future__ import annotations

import importlib as _importlib
import sys as _sys
import types as _types
from pathlib import Path as _Path
from typing import TYPE_CHECKING as _TYPE_CHECKING

__version__ = "0.3.0"

# A bare checkout (nothing installed: the GPU machine's checks, which carry the working tree only) finds
# the sibling folders as this package's subpackages. Installed, the wheel or the editable install maps
# them (pyproject.toml's package-dir) and this adds nothing that is not already found there.
_CHECKOUT = _Path(__file__).resolve().parent.parent
if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "trials" / "__init__.py").is_file():
    __path__.append(str(_CHECKOUT))

# Each exported name and the module that defines it.
_EXPORTS = {
    **dict.fromkeys(
        [
            "load_spec",
            "build_spec",
            "plan",
            "launch",
            "resume",
            "results",
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
    **dict.fromkeys(["SweepSpec", "SpecError"], "freezesweep.orchestrator.spec"),
    **dict.fromkeys(["LaunchSummary", "StoreUnavailable"], "freezesweep.orchestrator.launch"),
    "SweepLocked": "freezesweep.results.lock",
    "StoreError": "freezesweep.results.store",
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
    "results",
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
        results,
        results_arrow,
        results_duckdb,
        resume,
        status,
        summary,
    )
    from freezesweep.orchestrator.launch import LaunchSummary, StoreUnavailable
    from freezesweep.orchestrator.spec import SpecError, SweepSpec
    from freezesweep.results.lock import SweepLocked
    from freezesweep.results.report import Report
    from freezesweep.results.mlflow_export import TrackingError
    from freezesweep.results.store import StoreError


def __getattr__(name: str):
    """An API name, imported from its module on first use and kept."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'freezesweep' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


class _Package(_types.ModuleType):
    """``freezesweep.results`` names both the subpackage (the store, queries, the report) and the API's
    ``results`` function. Importing a subpackage makes it an attribute of its parent, which would hide
    the function; here the attribute stays the API's, and the subpackage is reached by its import name
    (``from freezesweep.results.query import sql``), as every module of freezesweep reaches it."""

    def __setattr__(self, name: str, value) -> None:
        if name in _EXPORTS and isinstance(value, _types.ModuleType):
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package
