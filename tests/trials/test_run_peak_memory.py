"""A trial's own peak host memory (trials/run.py: ``reset_peak_memory``, ``peak_memory_mb``,
``own_peak_mb``), measured without a model: what a reused worker process ran before, and what the
process holds anyway, must not count.

Before: the peak was VmHWM less the worker's caches, and VmHWM restarts from the whole RSS at the
reset (proc(5)): the imports, and what glibc's malloc kept of earlier trials' freed memory. Rows
rose with the order a worker ran them in (a probe "used" more than full fine-tuning)."""

import ctypes

import numpy as np
import pytest
import torch

from freezesweep.trials import run
from freezesweep.trials.worker import Lru, WorkerState

CPU = torch.device("cpu")
MIB = 2**20
CHUNK = 64 * 1024  # under glibc's mmap threshold: the chunks live in malloc's heap, kept there when freed


def _clear_refs_works() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        with open("/proc/self/status") as f:
            return "VmHWM:" in f.read()
    except OSError:
        return False


def _has_malloc_trim() -> bool:
    try:
        return hasattr(ctypes.CDLL(None), "malloc_trim")
    except (OSError, TypeError):
        return False


pytestmark = pytest.mark.skipif(
    not _clear_refs_works(), reason="needs Linux's /proc/self/status and a writable /proc/self/clear_refs (proc(5))"
)


def _chunks(mib: int) -> list[np.ndarray]:
    """``mib`` MiB in small arrays, every page touched (resident)."""
    return [np.ones(CHUNK // 8) for _ in range(mib * MIB // CHUNK)]


def _measured(trial, worker: WorkerState | None = None) -> float:
    """The own peak of ``trial`` (a callable that allocates, given the worker) as a trial's row takes it."""
    worker = worker or WorkerState()
    run.reset_peak_memory(CPU)
    run.note_held(worker, CPU)  # as trial_data does before it reads anything
    kept = trial(worker)
    peak = run.peak_memory_mb(CPU)
    del kept
    return run.own_peak_mb(CPU, peak, worker.held_mib(CPU))


@pytest.mark.skipif(not _has_malloc_trim(), reason="needs glibc's malloc_trim (malloc_trim(3)) to give freed heap back")
def test_an_earlier_trials_freed_memory_is_neither_counted_nor_hidden():
    """An earlier trial's 200 MiB, freed but kept by malloc (small allocations it keeps pin them
    in the heap), counted in the old figure; reused by this trial without raising the RSS, it would
    hide this trial's 50 MiB under a figure that counts from the RSS at the reset. Trimmed at the
    reset, the trial's 50 MiB show as 50."""
    earlier, kept = [], []
    for _ in range(200 * MIB // CHUNK):  # a small array kept after each chunk: the freed chunks cannot
        earlier.append(np.ones(CHUNK // 8))  # merge into the heap's top, which free() trims on its own
        kept.append(np.ones(64))
    del earlier
    own = _measured(lambda worker: _chunks(50))
    assert abs(own - 50) < 25, own
    del kept


def test_what_the_process_holds_at_the_start_is_not_the_trials():
    """A baseline held across the reset (imports, anything the process keeps: 150 MiB here) is not
    counted; only what the trial allocates on top of it."""
    baseline = np.ones(150 * MIB // 8)
    own = _measured(lambda worker: np.ones(50 * MIB // 8))
    assert abs(own - 50) < 25, own
    assert run.peak_memory_mb(CPU) >= 150  # the process's peak still has it (worker_peak_mem_mb)
    del baseline


def test_the_workers_caches_filled_during_a_trial_are_the_workers():
    """What the trial puts in its worker's caches (100 MiB, kept for later trials) is left out of its
    own peak; what it allocates for itself (50 MiB) is counted."""

    def trial(worker: WorkerState):
        worker.tasks.put("task", np.ones(100 * MIB // 8))
        return np.ones(50 * MIB // 8)

    worker = WorkerState(tasks=Lru(4))
    worker.tasks.put("earlier", np.ones(30 * MIB // 8))  # held before: in the RSS at the reset
    own = _measured(trial, worker)
    assert abs(own - 50) < 25, own


def test_file_pages_the_process_maps_and_keeps_are_not_the_trials(tmp_path):
    """A worker's first trial maps files it keeps (a model's weights, libraries imported): file-backed
    RSS (80 MiB here), not the trial's tensors (50 MiB)."""
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\1" * (80 * MIB))
    mapped = []

    def trial(worker: WorkerState):
        mapped.append(np.memmap(path, mode="r"))
        assert mapped[0].sum() == 80 * MIB  # every page read: resident, file-backed
        return np.ones(50 * MIB // 8)

    own = _measured(trial)
    assert abs(own - 50) < 25, own
    mapped.clear()


def test_a_result_without_a_noted_start_counts_no_cache_growth():
    """``own_peak_mb`` after a reset that no trial data followed (the memory probe's way) takes the
    worker's caches as unchanged."""
    run.reset_peak_memory(CPU)
    start = run._HOST_START.rss_mib
    assert run.own_peak_mb(CPU, start + 10, held_mib=500) == pytest.approx(10)
    assert run.own_peak_mb(CPU, start - 10, held_mib=0) == 0


def test_the_cuda_figure_is_the_allocators_peak_less_the_workers():
    """CUDA's path as it was: the allocator's peak since the reset less the worker's tensors."""
    assert run.own_peak_mb(torch.device("cuda"), 300, 100) == 200
    assert run.own_peak_mb(torch.device("cuda"), 50, 100) == 0
