"""Short reprs for the objects the API returns: a notebook prints what a cell returns, and a report's
PNG bytes (hundreds of kB), a plan's grid of a million cells or a DataFrame must not fill the page.

``short_repr`` is a dataclass's ``__repr__``: each field named with a summary of its value (a table's
shape, a byte count, a collection's length and first items, a long text's start), a few hundred
characters whatever the size of what it holds. The values themselves stay on the object's fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pandas as pd

TEXT_CHARS = 80  # a string longer than this is shown by its start
ITEMS = 3  # a collection longer than this is shown by its length and first items


def short_repr(obj: Any) -> str:
    """``Name(field=summary, …)`` over a dataclass's fields that take part in its repr."""
    fields = ", ".join(f"{f.name}={summary(getattr(obj, f.name))}" for f in dataclasses.fields(obj) if f.repr)
    return f"{type(obj).__name__}({fields})"


def summary(value: Any) -> str:
    """A value in a few dozen characters."""
    if isinstance(value, pd.DataFrame):
        return f"<DataFrame {len(value):,} rows × {value.shape[1]} columns>"
    if isinstance(value, pd.Series):  # its own repr is several lines, its dtype among them
        return f"<Series {len(value):,} value{'s' if len(value) != 1 else ''}>"
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value):,} bytes>"
    if isinstance(value, str):
        return repr(value) if len(value) <= TEXT_CHARS else repr(value[:TEXT_CHARS] + "…")
    if isinstance(value, Mapping):
        return _mapping(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        return _collection(value)
    shown = repr(value)
    return shown if len(shown) <= TEXT_CHARS else shown[:TEXT_CHARS] + "…"


def _mapping(value: Mapping) -> str:
    if all(isinstance(v, (bytes, bytearray)) for v in value.values()):  # figures: their names say enough
        return f"<{len(value)} figures: {', '.join(map(str, value))}>" if value else "{}"
    if len(value) <= ITEMS:
        return "{" + ", ".join(f"{k!r}: {summary(v)}" for k, v in value.items()) + "}"
    return f"<{type(value).__name__} of {len(value):,} keys>"


def _collection(value) -> str:
    if len(value) <= ITEMS:
        shown = ", ".join(summary(v) for v in value)
        return f"[{shown}]" if isinstance(value, list) else f"({shown}{',' if len(value) == 1 else ''})"
    return f"<{len(value):,} {type(next(iter(value))).__name__}s>"  # e.g. <1,000,000 TrialConfigs>
