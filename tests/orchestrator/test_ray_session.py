"""orchestrator/ray_session.py: which cluster, and a cluster that does not answer is a clear error
naming the address given, not Ray's endless retries."""

import subprocess
import sys

import pytest

from freezesweep.orchestrator.ray_session import (
    RaySession,
    RayUnreachable,
    check_reachable,
    cluster_address,
    forwarded_env,
)
from tests.conftest import free_port


def test_the_address_comes_from_the_spec_else_the_environment(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cluster_address(None) is None and not RaySession().on_cluster
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert cluster_address(None) == "10.0.0.1:6379"
    assert RaySession("ray://head:10001").address == "ray://head:10001"


@pytest.mark.parametrize("form", ["127.0.0.1:{port}", "ray://127.0.0.1:{port}"])
def test_an_address_where_nothing_listens_is_named(form):
    address = form.format(port=free_port())  # bound and released: nothing listens there now
    with pytest.raises(RayUnreachable, match=f"no Ray cluster answers at '{address}'"):
        check_reachable(address, timeout_s=5)
    check_reachable("auto")  # Ray's own forms are Ray's to resolve


def test_launch_against_a_cluster_that_does_not_answer_fails_naming_it(write_spec):
    """Before: no error after 150 s, Ray's C++ warnings naming another address. Now validation, which
    lists the cluster's nodes, names the address at once (exit 2) and nothing is written."""
    address = f"127.0.0.1:{free_port()}"
    path = write_spec("unanswered")
    done = subprocess.run(
        [sys.executable, "-m", "freezesweep.orchestrator.cli", "launch", str(path), "--address", address],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "freezesweep launch: error:" in done.stderr
    assert (
        f"cannot reach the Ray cluster at '{address}'" in done.stderr
        and f"no Ray cluster answers at '{address}'" in done.stderr
    )


def test_rays_own_disk_full_traceback_and_failed_trials_list_are_at_debug_level():
    """Before: a launch on a full disk printed Ray's ERROR traceback (Tune saving its experiment state)
    beside the launch's own clear message. Other errors of Ray's still show."""
    import errno
    import io
    import logging

    from freezesweep.orchestrator.ray_session import quiet_what_the_launch_says

    logger = logging.getLogger("ray-like-for-this-test")
    logger.propagate, shown = False, io.StringIO()
    logger.addHandler(logging.StreamHandler(shown))
    quiet_what_the_launch_says(logger)
    quiet_what_the_launch_says(logger)  # once per handler, however often a session connects
    assert len(logger.handlers[0].filters) == 1
    try:
        raise RuntimeError("sync failed") from OSError(errno.ENOSPC, "No space left on device")
    except RuntimeError:
        logger.error("Saving experiment state to storage failed with exception: ", exc_info=True)
    assert shown.getvalue() == ""
    logger.error("something else went wrong")
    assert shown.getvalue() == "something else went wrong\n"
    logger.setLevel(logging.DEBUG)  # asked for: there, at debug level
    logger.error("Error writing bytes to file. Detail: [errno 28] No space left on device")
    assert shown.getvalue().endswith("No space left on device\n")
    logger.setLevel(logging.INFO)
    logger.error("Trials did not complete: %s", ["tune_trainable_8b07e25d"])  # a walk-through's log: each
    assert shown.getvalue().endswith("No space left on device\n")  # failed cell's line says it already


def test_an_interrupt_while_ray_starts_takes_what_it_started_down(monkeypatch):
    """Before: Ctrl-C inside ray.init left its agents orphaned for about a minute (a new user's walk)."""
    import ray

    from freezesweep.orchestrator.ray_session import RaySession

    shut = []

    def interrupted(**kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", interrupted)
    monkeypatch.setattr(ray, "shutdown", lambda: shut.append(True))
    with pytest.raises(KeyboardInterrupt):
        RaySession().connect()
    assert shut == [True]


def test_ray_that_cannot_start_here_is_one_line_and_stores_no_spec(write_spec, tmp_path):
    """A walk-through: HOME a folder Ray could not write (its session token goes to ~/.ray) gave Ray's chained
    traceback, exit 1; the spec it had stored then refused the same sweep's changed epochs ("already has
    rows")."""
    import os

    home = tmp_path / "home-is-a-file"
    home.write_text("")
    path = write_spec("homeless")
    env = {**os.environ, "HOME": str(home)}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-m", "freezesweep.orchestrator.cli", "launch", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    error = [line for line in done.stderr.splitlines() if line.startswith("freezesweep launch: error:")]
    assert error and "Ray could not start on this machine: " in error[0], done.stderr[-2000:]
    assert error[0].endswith("(Ray keeps a session token in ~/.ray: HOME must be a folder it can write)")
    assert "Traceback" not in done.stderr
    from freezesweep.orchestrator.checks import load_spec
    from freezesweep.results.store import ResultStore

    assert ResultStore(str(tmp_path / "store"), "homeless").read_spec() is None
    load_spec(write_spec("homeless", training={"epochs": 3}))


def test_a_ray_jobs_own_env_vars_are_not_forwarded_again():
    """Under `ray job submit --runtime-env-json`, ray.init refuses a key the job's runtime env already
    sets (the launch failed as "cannot reach the Ray cluster"); those reach every worker anyway."""
    import json

    job = {"runtime_env": {"env_vars": {"FREEZESWEEP_FAULT": "crash@1"}}}
    environ = {
        "FREEZESWEEP_FAULT": "crash@1",
        "FREEZESWEEP_FAULT_DIR": "faults",
        "HF_HUB_OFFLINE": "1",
        "FREEZESWEEP_CACHE_DIR": "cache",  # the driver's own folder
        "PATH": "/bin",
        "RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps(job),
    }
    assert forwarded_env(environ) == {"FREEZESWEEP_FAULT_DIR": "faults", "HF_HUB_OFFLINE": "1"}
    del environ["RAY_JOB_CONFIG_JSON_ENV_VAR"]
    assert forwarded_env(environ)["FREEZESWEEP_FAULT"] == "crash@1"
