"""Out of GPU memory: recognised whichever CUDA call raised it, and the memory really given back."""

import dataclasses
import weakref

import pytest
import torch

from tests.devices import DEVICES
from freezesweep.trials import faults, oom
from freezesweep.trials.oom import catch_oom, is_oom
from freezesweep.trials.run import failed_result, run_trial_or_oom
from freezesweep.trials.worker import WorkerState


@pytest.mark.parametrize(
    "error",
    [
        torch.cuda.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.11 GiB total capacity)"
        ),
        RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
        RuntimeError("cuDNN Frontend error: CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED"),
        RuntimeError("cusolver error: CUSOLVER_STATUS_ALLOC_FAILED, when calling `cusolverDnCreate(handle)`"),
        RuntimeError("HIP out of memory. Tried to allocate 2.00 GiB"),
    ],
)
def test_out_of_memory_is_recognised_whichever_call_raised_it(error):
    assert is_oom(error)
    assert failed_result_status(error) == "oom"


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("CUDA error: device-side assert triggered"),
        RuntimeError("CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`"),  # not always OOM
        RuntimeError("cuDNN error: CUDNN_STATUS_BAD_PARAM"),
        MemoryError("host out of RAM"),
        ValueError("expected 2 labels"),
    ],
)
def test_other_errors_are_plain_failures(error):
    assert not is_oom(error)
    assert failed_result_status(error) == "failed"


def test_an_oom_wrapped_by_another_exception_is_still_an_oom():
    try:
        try:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        except torch.cuda.OutOfMemoryError as inner:
            raise RuntimeError("evaluation failed") from inner
    except RuntimeError as outer:
        assert is_oom(outer)


def failed_result_status(error: BaseException) -> str:
    from freezesweep.trials.config import TrialConfig

    cfg = TrialConfig(dataset="d", model="m", train_size=1, frozen_layers=0, precision="fp32")
    return failed_result(cfg, error).status


def test_the_frames_are_released_before_the_memory_is_given_back(monkeypatch):
    """A tensor held by a frame of the raising function must be gone when the allocator's cache is
    emptied: inside the except clause the traceback still holds that frame (the bug this replaces)."""
    held = {}

    def trial():
        big = torch.ones(1 << 20)  # stands in for a model's weights on the GPU
        held["ref"] = weakref.ref(big)
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    seen_at_free = []
    outcome = catch_oom(trial, on_oom=lambda exc: f"row: {exc}", free=lambda: seen_at_free.append(held["ref"]()))
    assert outcome == "row: CUDA out of memory"
    assert seen_at_free == [None]


def test_release_frames_clears_a_frame_even_while_the_exception_is_still_referenced():
    held = {}

    def trial():
        big = torch.ones(1 << 20)
        held["ref"] = weakref.ref(big)
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    try:
        trial()
    except torch.cuda.OutOfMemoryError as exc:
        kept = exc  # e.g. a logger or a result that keeps the exception
        assert held["ref"]() is not None  # the traceback's frame holds it
        oom.release_frames(kept)
        assert held["ref"]() is None


@pytest.mark.parametrize("device", DEVICES)
def test_free_memory_runs_after_the_frames_go_and_empties_the_cuda_cache(monkeypatch, tiny_trial, device):
    """The worker's path (run_trial_or_oom): an injected OOM after the first evaluation gives the oom
    row, and the CUDA cache is emptied once, when nothing of the trial is left alive."""
    from freezesweep.trials import run

    models = []
    real_initial_model = run.initial_model

    def tracked(cfg, num_labels, worker=None):
        model = real_initial_model(cfg, num_labels, worker)
        models.append(weakref.ref(model))
        return model

    calls = []
    monkeypatch.setattr(run, "initial_model", tracked)
    monkeypatch.setattr(run, "_empty_cuda_cache", lambda: calls.append([m() for m in models]))
    monkeypatch.setenv("FREEZESWEEP_FAULT", "oom@1")
    worker = WorkerState()
    result = run_trial_or_oom(dataclasses.replace(tiny_trial, device=device), worker=worker)
    assert result.status == "oom" and "injected oom" in result.error
    assert result.placement["hostname"]
    assert (result.placement["gpu_uuid"] is None) == (device == "cpu")  # the GPU it ran on is named
    assert calls == [[None]], "the CUDA cache was emptied while the trial's model was alive, or not once"
    assert set(worker.sizes().values()) == {0}  # everything the worker kept went too


def test_other_errors_propagate_for_the_callers_retries(monkeypatch, tiny_trial):
    monkeypatch.setenv("FREEZESWEEP_FAULT", "crash@1")
    with pytest.raises(RuntimeError, match="injected crash"):
        run_trial_or_oom(tiny_trial)


def test_share_bounded_oom_fault_fires_only_below_its_share(monkeypatch, tiny_trial):
    """The share is the cell's own (what its scheduler gave it), read where the fault fires."""
    monkeypatch.setenv("FREEZESWEEP_FAULT", "oom<0.5@1")
    with pytest.raises(torch.cuda.OutOfMemoryError):
        faults.maybe_inject(dataclasses.replace(tiny_trial, gpus_per_trial=0.25), evals_done=1)
    faults.maybe_inject(dataclasses.replace(tiny_trial, gpus_per_trial=0.5), evals_done=1)  # fits at half a GPU
    for bad in ("crash<0.5@1", "oom<2@1", "oom<x@1"):
        monkeypatch.setenv("FREEZESWEEP_FAULT", bad)
        with pytest.raises(ValueError, match="bad FREEZESWEEP_FAULT rule"):
            faults.maybe_inject(tiny_trial, evals_done=1)


@pytest.mark.parametrize("device", DEVICES)
def test_cuda_memory_is_given_back_after_an_oom(device):
    """A real allocation in the raising frame: the guard frees the worker's memory after the frame is
    gone, and on a GPU the process then holds no more reserved memory than before (empty_cache returned
    the blocks to the driver). A GPU raises a real OutOfMemoryError (a petabyte); a CPU one stands in."""
    from freezesweep.trials.run import free_memory

    worker = WorkerState()
    worker.templates.put("kept", torch.ones(1024, device=device))  # what a worker keeps between trials
    free = []
    before = torch.cuda.memory_reserved() if device == "cuda" else None

    def trial():
        big = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)  # 256 MiB
        free.append(weakref.ref(big))
        if device == "cuda":
            torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # a petabyte: a real OutOfMemoryError
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (standing in on a CPU)")

    def free_after():
        assert free[0]() is None  # the raising frame's tensor is gone before the memory is given back
        free_memory(worker)

    outcome = catch_oom(trial, on_oom=lambda exc: type(exc).__name__, free=free_after)
    assert outcome == "OutOfMemoryError" and set(worker.sizes().values()) == {0}
    if device == "cuda":
        assert torch.cuda.memory_reserved() <= before
