"""freezesweep: how many layers of a pretrained transformer to freeze, for the labelled data you have.

Its packages live under this one import name: ``freezesweep.orchestrator`` (specs, plans, launches,
the CLI), ``freezesweep.trials`` (one fine-tune, plain PyTorch), ``freezesweep.results`` (the Parquet
store, queries, decisions, reports; no torch) and ``freezesweep.cluster`` (recipes).

Importing ``freezesweep`` itself is cheap: Ray workers import ``freezesweep.trials`` through it.
"""

from pathlib import Path as _Path

__version__ = "0.3.0"

# A bare checkout (nothing installed: the GPU machine's checks, which carry the working tree only) finds
# the sibling folders as this package's subpackages. Installed, the wheel or the editable install maps
# them (pyproject.toml's package-dir) and this adds nothing that is not already found there.
_CHECKOUT = _Path(__file__).resolve().parent.parent
if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "trials" / "__init__.py").is_file():
    __path__.append(str(_CHECKOUT))
