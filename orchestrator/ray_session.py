"""The driver's one connection to Ray: which cluster (address resolution), one explicit ``connect``,
the cluster's nodes, the object store, and the short Ray tasks a launch sends before its trials
(precision and memory probes, the preflight check of every node). Trials themselves go through
Ray Tune (orchestrator/tune_adapter.py).

Ray is one connection per process: a session connects at most once, and a process connected by an
earlier session (a test, or a resume in the same process) is reused when it is the same place.
"""

from __future__ import annotations

import errno
import json
import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from freezesweep.orchestrator.local_files import Anchored, NodeNeeds, Shipment, node_lacks, pack
from freezesweep.orchestrator.spec import SweepSpec

if TYPE_CHECKING:  # torch: imported where a probe runs, not by every CLI command that may meet Ray
    from freezesweep.trials.memory_probe import MemoryProbe

# Environment a trial reads, forwarded to workers on other nodes (local workers inherit it anyway)...
_FORWARDED_ENV_PREFIXES = ("FREEZESWEEP_", "HF_", "TRANSFORMERS_")
# ...except the driver's folders: a node has its own caches, and the data dir is in the spec (its
# files shipped or checked on every node).
_DRIVER_PATH_ENV = frozenset(
    {
        "FREEZESWEEP_DATA_DIR",
        "FREEZESWEEP_CACHE_DIR",
        "HF_HOME",
        "HF_HUB_CACHE",
        "HF_DATASETS_CACHE",
        "HF_TOKEN_PATH",
        "TRANSFORMERS_CACHE",
    }
)
# A driver started by `ray job submit` finds its job's config here; ray.init refuses to repeat any of
# the job's env_vars (ray/_private/worker.py: "Failed to merge the Job's runtime env").
_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def forwarded_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The driver's environment its trials need, less the driver's folders and what a Ray job that
    started this driver already gives every worker (``ray job submit --runtime-env-json``)."""
    job = json.loads(environ.get(_JOB_CONFIG_ENV) or "{}")
    given = (job.get("runtime_env") or {}).get("env_vars") or {}
    return {
        k: v
        for k, v in environ.items()
        if k.startswith(_FORWARDED_ENV_PREFIXES) and k not in _DRIVER_PATH_ENV and k not in given
    }


CONNECT_TIMEOUT_S = 30  # an address where nothing answers is an error within this, naming it
PREFLIGHT_TIMEOUT_S = 120  # a node's first task starts a worker process and imports freezesweep
PROBE_TIMEOUT_S = 300  # a probe waits for a node with the trial's resources (an autoscaler may add one)


class RayUnreachable(ConnectionError):
    pass


class RayStartFailed(RuntimeError):
    """``ray.init`` raised: Ray could not start (or join) here, for a reason of this machine's."""


class TaskFailed(RuntimeError):
    """A probe task raised (its own exception's first line) or no node ran it in time."""


def cluster_address(address: str | None) -> str | None:
    """The Ray cluster a sweep runs on: the spec's or --address, else RAY_ADDRESS, else None (a local Ray)."""
    return address or os.environ.get("RAY_ADDRESS") or None


class RaySession:
    """``address``: the cluster (resolved with ``cluster_address``); without one, an embedded Ray on
    this machine, with ``num_cpus``/``num_gpus`` when given (tests give it fake GPUs)."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None, num_gpus: int | None = None):
        self.address = cluster_address(address)
        self.local_resources = {k: v for k, v in (("num_cpus", num_cpus), ("num_gpus", num_gpus)) if v is not None}

    @property
    def on_cluster(self) -> bool:
        return self.address is not None

    def connect(self) -> None:
        """Connect once (a process already connected stays so). A cluster that does not answer is a
        RayUnreachable naming the address within CONNECT_TIMEOUT_S, not Ray's endless retries."""
        if ray.is_initialized():
            return
        if self.address:
            check_reachable(self.address)
        env = forwarded_env(os.environ)
        on_term = signal.getsignal(signal.SIGTERM)
        try:
            ray.init(
                address=self.address,
                include_dashboard=False,
                log_to_driver=False,
                logging_level="ERROR",
                runtime_env={"env_vars": env} if env else None,
                **self.local_resources,
            )
        except BaseException as exc:
            # Ctrl-C while the embedded Ray starts: the processes it started so far go with it (its
            # dashboard and runtime-env agents were left orphaned for about a minute).
            with contextlib.suppress(Exception):  # the interrupt, not a failure to clean up, is what is said
                ray.shutdown()
            if not isinstance(exc, Exception):
                raise
            # one line, not Ray's traceback (a walk-through's HOME that could not be written: Ray keeps a
            # session token in ~/.ray)
            where = f"join the cluster at {self.address}" if self.address else "start on this machine"
            in_home = isinstance(exc, OSError) and str(exc.filename or "").startswith(os.path.expanduser("~"))
            home = " (Ray keeps a session token in ~/.ray: HOME must be a folder it can write)" * in_home
            raise RayStartFailed(f"Ray could not {where}: {first_line(exc)}{home}") from exc
        if callable(on_term) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_term)  # ray.init replaces the process's own with sys.exit
        quiet_what_the_launch_says(logging.getLogger("ray"))

    def nodes(self) -> list[dict[str, float]]:
        """The total resources of each alive node."""
        self.connect()
        return [node["Resources"] for node in ray.nodes() if node.get("Alive")]

    def ship(self, spec: SweepSpec) -> Shipment:
        """The spec's local files in Ray's object store (orchestrator/local_files.py)."""
        self.connect()
        return pack(spec, put=ray.put)

    def run_task(
        self,
        fn: Callable,
        calls: list[dict[str, Any]],
        cpus: float,
        gpus: float,
        timeout_s: float = PROBE_TIMEOUT_S,
        fresh_process: bool = False,
    ) -> list[Any]:
        """``fn(**kwargs)`` for each of ``calls`` as Ray tasks holding these resources, their results in
        order; ``fresh_process``: each in a worker that exits after it (so the memory it took goes back)."""
        self.connect()
        task = ray.remote(num_cpus=cpus, num_gpus=gpus, max_calls=1 if fresh_process else 0)(fn)
        try:
            return ray.get([task.remote(**kwargs) for kwargs in calls], timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise TaskFailed(
                f"no node ran it ({cpus:g} CPU, {gpus:g} GPU) within {timeout_s:g} s (are there such nodes?)"
            ) from None
        except ray.exceptions.RayTaskError as exc:
            raise TaskFailed(first_line(exc)) from None

    def check_nodes(self, needs: NodeNeeds, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> list[str]:
        """One problem per alive node that lacks something of ``needs``, or cannot run freezesweep at
        all, or does not answer (a task pinned to each node)."""
        self.connect()
        task = ray.remote(num_cpus=0, max_retries=0)(node_lacks)
        asked = {
            task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote(
                needs
            ): node
            for node in ray.nodes()
            if node.get("Alive")
        }
        if not asked:
            return []
        done, late = ray.wait(list(asked), num_returns=len(asked), timeout=timeout_s)
        problems = []
        for ref in done:
            try:
                lacks = ray.get(ref)
            except Exception as exc:  # e.g. freezesweep not installed there: the task cannot even load
                lacks = [f"cannot run freezesweep's check: {first_line(exc)}"]
            if lacks:
                problems.append(f"node {_node_name(asked[ref])} lacks: " + "; ".join(lacks))
        for ref in late:
            ray.cancel(ref, force=True)
            problems.append(f"node {_node_name(asked[ref])} did not run the check within {timeout_s:g} s")
        return problems


class SaidByTheLaunchAtDebug(logging.Filter):
    """Ray's own ERROR records of what the launch says once, plainly, lowered to DEBUG: a full disk (Tune
    saving its experiment state to the store's ``_ray`` folder; the launch says the rows kept in the spool
    and why, ``StoreUnavailable``) and Tune's "Trials did not complete: [tune_trainable_8b07e25d]" after
    failed trials (each failed cell's line and row say why). With Ray's logger at DEBUG they still show."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG or not (disk_full(record) or trials_incomplete(record)):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def disk_full(record: logging.LogRecord) -> bool:
    """The record's exception, or one it was raised from, is ENOSPC (no space left on the device)."""
    exc = record.exc_info[1] if record.exc_info else None
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return True
        exc = exc.__cause__ or exc.__context__
    return "No space left on device" in record.getMessage()


def trials_incomplete(record: logging.LogRecord) -> bool:
    """Tune's list of the trials that failed (ray/tune/tune.py, ``run``), by their Tune names."""
    return record.getMessage().startswith("Trials did not complete")


def quiet_what_the_launch_says(logger: logging.Logger) -> None:
    """Every handler of ``logger`` (Ray's: its records never reach the root logger) gets the filter once."""
    for handler in logger.handlers:
        if not any(isinstance(f, SaidByTheLaunchAtDebug) for f in handler.filters):
            handler.addFilter(SaidByTheLaunchAtDebug())


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Something listens at ``host:port`` (or ``ray://host:port``); other forms (``auto``) are Ray's."""
    parts = urlsplit(address if "://" in address else f"ray-gcs://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host or not port:
        return
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        raise RayUnreachable(
            f"no Ray cluster answers at {address!r} ({type(exc).__name__}: {exc}); check the address and that "
            f"the head node is up ({ADDRESS_SOURCES})"
        ) from None


# Where an address comes from, and the way back to a Ray of one's own (said wherever a cluster is not reached).
ADDRESS_SOURCES = (
    "the address is --address, else the spec's `address:` (a resumed sweep's: the one its launch was given), "
    "else RAY_ADDRESS; --address local runs the trials on a Ray of its own on this machine"
)


def unreached_why() -> str:
    """What a failed connection to a cluster that listens most likely lacks: Ray 2.60's token, where
    this process has no RAY_AUTH_MODE (its GCS then answers "Unauthenticated", said only in its log)."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        return (
            "; if the cluster's nodes run with RAY_AUTH_MODE=token, set it here too, with the cluster's token "
            "(RAY_AUTH_TOKEN, or the token file `ray get-auth-token` wrote)"
        )
    return ""


def first_line(exc: BaseException) -> str:
    """``Type: first line`` of an exception, a Ray task's own one unwrapped."""
    cause = getattr(exc, "cause", None)  # a RayTaskError wraps the task's own exception
    cause = cause if isinstance(cause, BaseException) else exc
    return f"{type(cause).__name__}: {(str(cause).splitlines() or [''])[0]}"


def _node_name(node: dict) -> str:
    return f"{node['NodeID'][:12]} ({node.get('NodeManagerAddress')}, {node.get('NodeManagerHostname')})"


# --- what the probe tasks run on a node (module-level: Ray sends them by reference) ---------------
def trial_device_task(device_type: str) -> tuple[str, str]:
    """The kind of device a trial with these resources gets on the node that runs this, and what
    precision ``auto`` means there: a GPU Ray gave that is no CUDA device (``ray start --num-gpus`` on a
    machine without one, or torch without CUDA: cluster/local-cluster.sh's fake GPUs) is the CPU."""
    import torch

    from freezesweep.trials.precision import auto_precision

    if device_type == "cuda" and not torch.cuda.is_available():
        device_type = "cpu"
    return device_type, auto_precision(device_type)


def memory_probe_task(model: str, shipment: Shipment | Anchored | None = None, **shape: Any) -> MemoryProbe:
    """One trial of this shape measured on the GPU Ray gave this task (trials/memory_probe.py)."""
    from freezesweep.trials.memory_probe import probe as probe_memory

    return probe_memory(model=shipment.model_files(model, fetch=ray.get) if shipment else model, **shape)
