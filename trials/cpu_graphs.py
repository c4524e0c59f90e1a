"""A CUDA graph's contract on a CPU, for the tests of the graphed paths (trials/graphs.py) where there
is no GPU: a run recorded once as the operators it dispatches, then replayed as those operators on the
very tensors it met, with no Python of the caller's in between.

The stand-in it replaced ran the step's Python again at each replay, so on a CPU no test could see
what only a real replay shows (PyTorch's CUDA graphs notes, "Constraints"): a replay reads the
tensors its capture read, where they were then, so a weight the code swapped for a new tensor since is
read stale; a Python number or branch is frozen at its capture's value; a capture computes nothing,
so the tensors it would have updated (weights, AdamW's state) are as before it; and a capture refuses
a host read (``.item()``, ``nonzero``) or host data made a tensor (``torch.tensor`` of a number), which
is ``lift_fresh`` here. ``record`` keeps all four: it records at the dispatcher
(``TorchDispatchMode``: below autograd, autocast and ``vmap``, so it sees the operators a GPU would
run as kernels, the backward's included), puts back every tensor that existed before the capture and
that the capture wrote, refuses a host read with the message a CUDA capture gives, and answers
``torch.cuda.is_current_stream_capturing()`` as a capture does (libraries leave their host reads out
then). A graphed path whose CPU test passes with it can still fail on a GPU for what it does not model
(below), but no longer for these.

Memory, in part: a real graph holds what it allocated (its pool) but only the addresses of what it read
from outside, which must outlive it. The recording holds those tensors as a graph does, by their memory
only, so a replay after the program let that memory go fails, naming the tensor, where a GPU would read
freed memory (a view the program dropped is fine while its memory lives). What it does not model is the
reuse of freed memory by another of the program's tensors. Random draws are drawn anew at each replay,
as a graph's generator offsets advance.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_flatten, tree_unflatten

# Operators a CUDA capture refuses: a device value read on the host, a result whose shape is the data's,
# and host data becoming a tensor (a copy to the device).
_HOST_READS = frozenset(
    {
        torch.ops.aten._local_scalar_dense.default,  # .item(), float(t), bool(t), int(t)
        torch.ops.aten.nonzero.default,
        torch.ops.aten.masked_select.default,
        torch.ops.aten.equal.default,
        torch.ops.aten.is_nonzero.default,
        torch.ops.aten.lift_fresh.default,  # torch.tensor(3.0): host data made a (device) tensor
    }
)
# what a CUDA capture says of them (cudaErrorStreamCaptureUnsupported)
REFUSED = "operation not permitted when stream is capturing"


@dataclass
class _Op:
    func: Any
    args: tuple
    kwargs: dict
    fresh: list[torch.Tensor | None]  # each tensor output the op allocated (None: a view or an argument)


@dataclass(frozen=True)
class _Outside:
    """A tensor the capture read but did not make, held as a graph holds it: by its memory."""

    tensor: weakref.ref
    memory: StorageWeakRef
    dtype: torch.dtype
    offset: int
    shape: torch.Size
    stride: tuple[int, ...]

    @classmethod
    def of(cls, tensor: torch.Tensor) -> "_Outside":
        memory = StorageWeakRef(tensor.untyped_storage())
        return cls(weakref.ref(tensor), memory, tensor.dtype, tensor.storage_offset(), tensor.shape, tensor.stride())

    def get(self) -> torch.Tensor:
        """The tensor; where the program dropped it but not its memory, a view as it was on that memory."""
        tensor = self.tensor()
        if tensor is not None:
            return tensor
        if self.memory.expired():
            raise RuntimeError(
                f"a replay reads a tensor freed since its capture ({tuple(self.shape)}, {self.dtype}): a CUDA "
                "graph would read freed memory; keep what a graph reads alive as long as the graph"
            )
        storage = torch.UntypedStorage._new_with_weak_ptr(self.memory.cdata)
        return torch.empty(0, dtype=self.dtype, device=storage.device).set_(
            storage, self.offset, self.shape, self.stride
        )


@dataclass
class _Held:
    """An operator as a replay runs it: its arguments' leaves (tensors from outside as ``_Outside``)."""

    func: Any
    leaves: list
    spec: Any
    fresh: list[torch.Tensor | None]

    def run(self) -> list[torch.Tensor]:
        leaves = [leaf.get() if isinstance(leaf, _Outside) else leaf for leaf in self.leaves]
        args, kwargs = tree_unflatten(leaves, self.spec)
        return _tensors(self.func(*args, **kwargs))


def _tensors(value) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def _written(func, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors the operator writes in place (``Tensor(a!)`` in its schema: ``add_``, ``out=``)."""
    written = []
    for i, argument in enumerate(func._schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            given = args[i] if i < len(args) and not argument.kwarg_only else kwargs.get(argument.name)
            written += _tensors(given)
    return written


def _fresh(args: tuple, kwargs: dict, out) -> list[torch.Tensor | None]:
    """Per tensor output: itself where the operator allocated it, None where it shares an argument's
    memory (a view, an in-place result). Asked of the memory, not the schema: an operator that may
    alias (``contiguous``, ``to``, ``reshape``; composite ones reach the dispatcher whole under
    inference mode) copies or not by its arguments' layout, which a replay repeats."""
    given = {t.untyped_storage().data_ptr() for t in _tensors((args, kwargs))}
    return [None if t.untyped_storage().data_ptr() in given else t for t in _tensors(out)]


class _Recording(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[_Op] = []
        self.made: set[int] = set()  # the storages the capture allocated
        self.before: list[tuple[torch.Tensor, torch.Tensor]] = []  # (a tensor the capture wrote, its value then)
        self.kept: set[tuple] = set()
        self.outside: dict[int, torch.Tensor] = {}  # the tensors first met as arguments (by id)
        self.inside: dict[int, torch.Tensor] = {}  # those first met as results: the graph's own

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_READS:
            raise RuntimeError(f"CUDA error: {REFUSED} ({func} in a capture)")
        for tensor in _written(func, args, kwargs):
            self._keep(tensor)
        for tensor in _tensors((args, kwargs)):
            if id(tensor) not in self.inside:
                self.outside.setdefault(id(tensor), tensor)
        out = func(*args, **kwargs)
        for tensor in _tensors(out):
            if id(tensor) not in self.outside:
                self.inside.setdefault(id(tensor), tensor)
        fresh = _fresh(args, kwargs, out)
        self.made.update(t.untyped_storage().data_ptr() for t in fresh if t is not None)
        self.ops.append(_Op(func, args, kwargs, fresh))
        return out

    def held(self) -> list[_Held]:
        """The operators as a replay runs them: what came from outside held by its memory only."""
        handles = {key: _Outside.of(tensor) for key, tensor in self.outside.items()}
        held = []
        for op in self.ops:
            leaves, spec = tree_flatten((op.args, op.kwargs))
            leaves = [handles.get(id(leaf), leaf) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
            held.append(_Held(op.func, leaves, spec, op.fresh))
        return held

    def _keep(self, tensor: torch.Tensor) -> None:
        """``tensor``'s value before the capture writes it, where it existed before the capture."""
        where = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.shape, tensor.stride())
        if where[0] not in self.made and where not in self.kept:
            self.kept.add(where)
            self.before.append((tensor, tensor.clone()))


@contextlib.contextmanager
def _capturing() -> Iterator[None]:
    """``torch.cuda.is_current_stream_capturing()`` says True, as in a capture: libraries ask it to leave
    out their host reads (transformers' ``is_tracing``: its padding-mask check)."""
    asked = torch.cuda.is_current_stream_capturing
    torch.cuda.is_current_stream_capturing = lambda: True
    try:
        yield
    finally:
        torch.cuda.is_current_stream_capturing = asked


def record(run: Callable[[], Any]) -> tuple[Callable[[], None], Any]:
    """``run()`` as a CUDA graph would have it: (replay, the outputs the capture returned, which each
    replay overwrites). The capture leaves every tensor that existed before it as it was; each replay
    runs the recorded operators on the recorded tensors (writing each allocated output into the
    tensor the capture allocated, so later operators read it), without autograd and without Python."""
    recording, inference = _Recording(), torch.is_inference_mode_enabled()
    with recording, _capturing():
        outputs = run()
    with torch.no_grad():
        for tensor, value in reversed(recording.before):  # the latest first: overlapping views end as they began
            tensor.copy_(value)
    ops = recording.held()
    del recording  # (it held what came from outside strongly)

    def replay() -> None:  # in the capture's inference mode: its outputs are inference tensors, or not
        with torch.inference_mode(inference), torch.no_grad():
            for op in ops:
                for kept, new in zip(op.fresh, op.run()):
                    if kept is not None:
                        kept.copy_(new)

    return replay, outputs
