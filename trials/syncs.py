"""Host syncs, counted: the calls that make the host wait for the device (``.item()``, ``float(t)``,
``bool(t)``, ``.cpu()``, ``.tolist()``, ``nonzero``, boolean-mask indexing, ``torch.equal`` …), and copies
between host and device (an index from a list included).

On a GPU each such call stalls the host until every queued kernel has run, so a step loop with one in
it can never run ahead of the device: it launches, waits, launches. The training loop keeps them to
evaluations (trials/train.py); ``HostSyncs`` is how that is checked on a machine without a GPU
(tests/trials/test_step_syncs.py) and counted on one (benchmarks/step_profile.py): it wraps the sync
points of torch's Python API and the project's own ``synchronize`` and records each call, on any
device. A CPU run has no real syncs, but the calls are the same ones a GPU run makes, so a sync added
to the loop fails the CPU test. On a CUDA device ``torch.cuda.set_sync_debug_mode("warn")`` (torch's
own detector, which sees syncs inside C++ ops too) is counted beside it.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

# Tensor methods that read a device value on the host (each a device-to-host copy the host waits for).
_TENSOR_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "__array__")
# Functions whose result is a host value computed on the device, or whose shape depends on the data.
_TORCH_READS = ("equal", "allclose", "is_nonzero", "nonzero", "masked_select", "unique")
_TENSOR_DATA_SHAPED = ("nonzero", "masked_select", "unique", "equal", "allclose")
DETECTED = "cuda sync (torch's detector)"


@dataclass
class HostSyncs:
    """Within ``with HostSyncs() as syncs:``, ``syncs.events`` lists every sync point called, by name,
    in order; ``mark(name)`` puts a marker of the caller's among them (tests mark steps and
    evaluations). Nested calls (``float(t)`` calling ``t.item()``) count once."""

    events: list[str] = field(default_factory=list)
    _saved: list[tuple[object, str, object]] = field(default_factory=list)
    _depth: int = 0
    _warnings: warnings.catch_warnings | None = None

    def mark(self, name: str) -> None:
        self.events.append(f"mark:{name}")

    def syncs(self) -> list[str]:
        """Every sync point called (the spy's and, on a GPU, torch's detector's), in order."""
        return [e for e in self.events if not e.startswith("mark:")]

    def detected(self) -> list[str]:
        """Only what torch's CUDA sync detector reported: the host really waited (on a GPU)."""
        return [e for e in self.events if e == DETECTED]

    def __enter__(self) -> "HostSyncs":
        for name in _TENSOR_READS:
            self._wrap(torch.Tensor, name, f"Tensor.{name}")
        for name in _TENSOR_DATA_SHAPED:
            self._wrap(torch.Tensor, name, f"Tensor.{name}")
        for name in _TORCH_READS:
            self._wrap(torch, name, f"torch.{name}")
        self._wrap(torch.Tensor, "__getitem__", "indexing", only=_index_read)
        self._wrap(torch.Tensor, "to", "copy between host and device", only=_crosses_devices)
        self._wrap(torch.Tensor, "copy_", "copy between host and device", only=_copy_crosses_devices)
        for name in ("tensor", "as_tensor", "from_numpy"):  # host data becoming a tensor: a copy to come
            self._wrap(torch, name, f"torch.{name} (host data)")
        self._wrap(torch.cuda, "synchronize", "torch.cuda.synchronize")
        self._wrap_project_synchronize()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self._warnings = warnings.catch_warnings()
            self._warnings.__enter__()
            warnings.simplefilter("always")
            shown = warnings.showwarning

            def show(message, *args, **kwargs):  # in order among the other events, as torch raises them
                if "synchroniz" in str(message):
                    self.events.append(DETECTED)
                else:
                    shown(message, *args, **kwargs)

            warnings.showwarning = show
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()
        if self._warnings is not None:
            torch.cuda.set_sync_debug_mode("default")
            self._warnings.__exit__(*exc)
            self._warnings = None

    def _wrap(self, owner, name: str, label: str, only=None) -> None:
        original = getattr(owner, name)
        spy = self

        def wrapper(*args, **kwargs):
            said = label if only is None else only(args, kwargs)
            if spy._depth == 0 and said:
                spy.events.append(said if isinstance(said, str) else label)
            spy._depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                spy._depth -= 1

        self._saved.append((owner, name, original))
        setattr(owner, name, wrapper)

    def _wrap_project_synchronize(self) -> None:
        """The project's own helper (trials/precision.py), wherever a module imported it by name."""
        from freezesweep.trials import precision

        original = precision.synchronize
        for module in [m for n, m in sys.modules.items() if n.startswith("freezesweep.") and m is not None]:
            for name, value in list(vars(module).items()):
                if value is original:
                    self._wrap(module, name, "synchronize")


def _index_read(args, kwargs) -> str | None:
    """A boolean mask (the result's shape is read on the host), or a list or array (made a tensor on
    the host, then copied to the device; a CUDA graph's capture refuses it)."""
    index = args[1] if len(args) > 1 else None
    items = index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items):
        return "boolean-mask indexing"
    return "index from host data" if any(isinstance(i, (list, np.ndarray)) for i in items) else None


def _device_of(value) -> torch.device | None:
    if isinstance(value, torch.Tensor):
        return value.device
    if isinstance(value, (str, torch.device)):
        try:
            return torch.device(value)
        except RuntimeError:
            return None
    return None


def _crosses_devices(args, kwargs) -> bool:
    """``t.to(device)`` to another device than the tensor's (a dtype alone, or its own device, copies
    nothing). On a CPU run there is no other device: what would be an upload there shows as the host
    data it starts from (``torch.tensor``, ``as_tensor``, ``from_numpy``), which the spy counts too."""
    target = _device_of(kwargs.get("device"))
    if target is None:
        target = next((d for d in map(_device_of, args[1:]) if d is not None), None)
    source = _device_of(getattr(args[0], "device", None))  # a tensor-like whose device is a name (loaders)
    return target is not None and source is not None and _same_device(source, target) is False


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    return a.index == b.index or a.index is None or b.index is None


def _copy_crosses_devices(args, kwargs) -> bool:
    destination, source = args[0], args[1] if len(args) > 1 else kwargs.get("src")
    return isinstance(source, torch.Tensor) and not _same_device(source.device, destination.device)
