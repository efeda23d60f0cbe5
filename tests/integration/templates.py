"""Sandbox hosts that boot already staged, for the modules whose point is not the install.

A fresh stand-in host spends most of its first converge building the server's venv: the pinned
packages, then compressed-tensors with transformers (~70 of its ~100 core-s, docs/testing.md). The
modules that test something else (a TP group, a fleet fault, a keyed router, a Hub fault) boot their
hosts with ``staged_hosts(indexes)`` instead: clones (sandbox/clones.py) of one host that stage.py
prepared with the sandbox's settings (tasks/pipeline.py STAGE_PIPELINE: the preflight, the package
set's venv, the model revision, compressed-tensors; no unit file, nothing serving). Such a host is
what an operator has after `stage.py`: the module's deploy.py then finds the venv and the revision
built and verified, and writes the unit, starts and waits for readiness; pip and the download are
the template's, once per run.

The template (sgc285) is staged once per test run by whichever xdist worker asks first (a file lock
across the workers; the other waits), snapshotted, and removed. A run is named by SGC_TEST_RUN_ID, which
tests/conftest.py sets in the session's first process (the workers inherit it); that process removes
its run's layer at the end, and a later run that finds an earlier run's layer makes its own.

The modules whose converge is the point keep fresh hosts: test_incident, test_rollout (the fleet's
first rollout), test_faults_controller (faults during pip), test_get_pip, test_steps_idempotent,
test_two_servers (one download for two servers), test_demo (`make demo`), the shared sgc280 and the
real server's sgc290.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

TEMPLATE_INDEX = 285  # not in the real server's range (290-299: inventory/sandbox_real.py)
LABEL = "tmpl-staged"
TIMINGS: dict[str, float] = {}  # the template's own seconds (stage, snapshot), printed by its users


RUN_ID_ENV = "SGC_TEST_RUN_ID"  # set by tests/conftest.py in the session's first process; workers inherit it


def _run_id() -> str:
    """The same in every worker of one pytest-xdist run (and only there)."""
    # xdist's own run id next: workers that did not inherit ours must still agree (else each would take the
    # other's layer for a stale one and remove the hosts running on it)
    return os.environ.get(RUN_ID_ENV) or os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid-{os.getpid()}"


def _side_file(suffix: str) -> Path:
    """A file beside the snapshot layers (the layer itself is the clones' /: nothing of ours goes in)."""
    from sandbox import clones

    return clones.SNAPSHOT_DIR.parent / f".{LABEL}.{suffix}"


def staged_layer() -> Path:
    """This run's snapshot of a staged host, made by the first caller of the run."""
    from sandbox import clones
    from sandbox import hosts as sandbox_api
    from tests.integration.helpers import pyinfra

    lock_path = _side_file("lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other worker waits while the first stages the template
        layer = clones.snapshot_path(LABEL)
        marker = _side_file("run")
        if layer.is_dir() and marker.is_file() and marker.read_text() == _run_id():
            return layer
        for name in clones.users(LABEL):  # hosts an interrupted earlier run left on its layer
            sandbox_api.remove(name)
        clones.remove_snapshot(LABEL)
        marker.unlink(missing_ok=True)
        name = sandbox_api.host_name(TEMPLATE_INDEX)
        sandbox_api.remove(name)
        started = time.monotonic()
        host = sandbox_api.up(indexes=[TEMPLATE_INDEX])[0]
        try:
            proc = pyinfra("stage.py", limit=name, timeout=900)
            assert proc.returncode == 0, f"staging the template {name} failed:\n{proc.out[-5000:]}"
            # what the clones rely on: a venv with the server's packages, the revision, no unit
            assert host.run("ls /opt/sglang/venv-envs/*/bin/python", check=False).returncode == 0, proc.out[-3000:]
            assert host.run("test ! -e /etc/systemd/system/sglang.service", check=False).returncode == 0
            TIMINGS["template staged"] = time.monotonic() - started
            clones.snapshot(name, LABEL)
            TIMINGS["template snapshot"] = time.monotonic() - started - TIMINGS["template staged"]
        finally:
            sandbox_api.remove(name)
        marker.write_text(_run_id())
        return layer


def staged_hosts(indexes: list[int]) -> list:
    """Fresh sandbox hosts sgc<index> booted on this run's staged layer (made first if missing);
    each has its own identity, disk (an overlay over the layer) and GPUs. Remove them with
    sandbox.hosts.remove as any host."""
    import pytest

    from sandbox import hosts as sandbox_api
    from tests.conftest import _sandbox_unavailable

    reason = _sandbox_unavailable()
    if reason:
        pytest.skip(reason)
    return sandbox_api.up(indexes=indexes, snapshot=staged_layer())


def remove_layer() -> None:
    """The end of a session: the template's layer goes, unless a host still runs on it (another
    session's: left for it)."""
    from sandbox import clones

    marker = _side_file("run")
    if not marker.is_file() or marker.read_text() != _run_id() or clones.users(LABEL):
        return  # another session's (e.g. the unit tests' beside the integration tests), or in use
    clones.remove_snapshot(LABEL)
    _side_file("run").unlink(missing_ok=True)
