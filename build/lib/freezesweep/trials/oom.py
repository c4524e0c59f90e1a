"""Out of GPU memory: recognise it whichever CUDA call raised it, and give the memory back for real.

Recognising: the caching allocator raises ``torch.cuda.OutOfMemoryError``, but an allocation that
fails inside a CUDA library surfaces as a RuntimeError (``torch.AcceleratorError`` in recent torch)
carrying the library's status, e.g. cuBLAS's workspace (``CUBLAS_STATUS_ALLOC_FAILED``), cuDNN's
(``CUDNN_STATUS_ALLOC_FAILED``; cuDNN 9: ``..._ALLOCATION_FAILED``) or a raw ``cudaMalloc`` (``CUDA
error: out of memory``). ``CUBLAS_STATUS_NOT_INITIALIZED`` is often an OOM too but not always (a
broken driver gives it as well), so it stays a plain failure.

Freeing: while an exception is being handled, its traceback holds every frame it passed through,
and with them the trial's model, optimizer state and batches, so ``torch.cuda.empty_cache()`` there
frees nothing (PyTorch FAQ, "My out of memory exception handler can't allocate memory": move the
recovery out of the except clause). The frames are cleared and the exception dropped first, then
the caches, then the allocator's unused blocks.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")

_OOM_MESSAGE = re.compile(
    r"CUDA out of memory|HIP out of memory|CUDA error: out of memory|hipErrorOutOfMemory"
    r"|\bCU(?:BLAS|DNN|SOLVER|SPARSE)_STATUS_\w*ALLOC\w*_FAILED|\bCUFFT_ALLOC_FAILED",
    re.IGNORECASE,
)


def is_oom(exc: BaseException) -> bool:
    """An out-of-memory error of the GPU, raised directly or as the cause of another exception."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, torch.cuda.OutOfMemoryError) or _OOM_MESSAGE.search(str(exc)):
            return True
        # an explicit cause, or the error being handled when this one was raised (unless suppressed)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return False


def release_frames(exc: BaseException) -> None:
    """Clear the locals of every frame in ``exc``'s traceback (and its causes'), so the tensors they
    hold can be freed even while something still refers to the exception."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)  # skips the frames still executing (the caller's)
        exc = exc.__cause__ or exc.__context__


def catch_oom(run: Callable[[], T], on_oom: Callable[[BaseException], T], free: Callable[[], None]) -> T:
    """``run()``; if it runs out of GPU memory, ``on_oom(exc)`` (the row, its text taken from the
    traceback while it still exists), then the traceback's frames are released and, once the handler
    has let go of the exception, ``free()`` gives the memory back. Other errors propagate."""
    try:
        return run()
    except Exception as exc:  # never an interrupt or an exit: those end the worker as they should
        if not is_oom(exc):
            raise
        outcome = on_oom(exc)
        release_frames(exc)
    # Outside the handler: the exception and its traceback are unreachable here, not only cleared.
    free()
    return outcome
