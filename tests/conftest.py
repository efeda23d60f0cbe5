"""Shared fixtures.

sandbox_hosts (session): two booted sandbox hosts (sandbox.hosts.up(2));
    its finalizer always calls sandbox.hosts.down() (also on a failure or
    Ctrl-C), so no guest, namespace, mount or NAT rule outlives the run;
    in a pytest-xdist worker it removes only sgc1 and sgc2 (the other
    workers' hosts are in use; .ci/run ends with `python -m sandbox down`).
run_pyinfra: run the pyinfra CLI against the sandbox hosts.

Tests that boot sandbox hosts are marked @pytest.mark.sandbox; they need
root and are skipped without it (or with SGC_SKIP_SANDBOX=1).

Under CI=true (CI sets it; .ci/run exports it) a skipped test of any kind
fails the run: the session exits 1 and the summary lists every skipped
test's id and reason (tests/unit/test_ci_skips.py proves it).
"""

from __future__ import annotations

import atexit
import importlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _sandbox_unavailable() -> str | None:
    if os.environ.get("SGC_SKIP_SANDBOX") == "1":
        return "SGC_SKIP_SANDBOX=1"
    if not sys.platform.startswith("linux"):
        return "sandbox hosts need Linux"
    if os.geteuid() != 0:
        return "sandbox hosts need root (namespaces, mounts, cgroups)"
    return None


# `make test` runs the integration tests on two pytest-xdist workers: a worker takes a whole group at a
# time, and a group is a module, or the modules that share hosts (their pytestmark:
# xdist_group(SHARED_CONVERGED_GROUP) on sgc280, xdist_group(FLEET_GROUP) on sgc10-14, ...), so no two
# workers boot the same host index. Groups go out in this order, the longest first (the durations
# .ci/run prints), so no worker is left alone with a long group at the end; the rest follow by name.
LONGEST_GROUPS_FIRST = (  # measured on 2 cores (2026-12-07, warm, staged hosts): 1319 s, 1021 s, 502 s, 443 s, ... 31 s
    "real-sgc290", "converged-sgc280", "fleet-sgc10-14", "test_faults_controller", "test_bench",
    "test_steps_idempotent", "test_incident", "sgc1-2", "test_two_servers", "test_faults_hub",
    "test_faults_fleet", "test_router_key", "test_multinode", "test_download_faults",
)


def _group_of_marks(marks) -> str | None:
    for mark in marks if isinstance(marks, list | tuple) else [marks]:
        if getattr(mark, "name", None) == "xdist_group":
            return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    return None


def xdist_group_of(item) -> str:
    """The item's host group: its xdist_group mark's name, else its module's name."""
    return _group_of_marks(list(item.iter_markers("xdist_group"))) or Path(str(item.fspath)).stem


def group_of_nodeid(nodeid: str) -> str:
    """The host group of a test id ("tests/integration/test_x.py::test_y"), from its module's pytestmark:
    what the xdist controller, which collects nothing itself, schedules by."""
    path = nodeid.split("::", 1)[0]
    stem = Path(path).stem
    if not path.endswith(".py"):
        return stem
    module = importlib.import_module(path[:-3].replace("/", "."))
    return _group_of_marks(getattr(module, "pytestmark", [])) or stem


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Whole host groups per worker, in collection order (make test passes --dist loadgroup).

    xdist's own loadgroup reads the groups from a suffix it writes into each test's node id, which
    pytest 9.2 no longer lets it write (Node._nodeid became Node._id): every test would go its own way,
    and two workers would boot and converge the same shared host. This scheduler asks each test's
    module for its group instead."""
    from xdist.scheduler import LoadScopeScheduling

    class HostGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of_nodeid(nodeid)

    return HostGroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    def order(item) -> tuple[bool, int]:
        group = xdist_group_of(item)
        rank = LONGEST_GROUPS_FIRST.index(group) if group in LONGEST_GROUPS_FIRST else len(LONGEST_GROUPS_FIRST)
        # a test that removes other modules' hosts (marker runs_last) runs after all of them, so the
        # session's shared hosts (the converged sgc280, the real server's sgc290) are booted only once
        return item.get_closest_marker("runs_last") is not None, rank

    items.sort(key=order)  # stable: within a group the order stays
    reason = _sandbox_unavailable()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if item.get_closest_marker("sandbox") is not None:
            item.add_marker(skip)


# ------------------------------------------------------------------ CI: a skip is a failure

_SKIPPED: list[tuple[str, str]] = []  # (test id, reason) of every skip in this session


def in_ci() -> bool:
    """CI=true (or 1/yes): a skipped test fails the run instead of passing it quietly."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: REASON")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_configure(config):
    # one id per test run, inherited by the xdist workers this process starts (after configure):
    # what a worker's staged template belongs to (tests/integration/templates.py)
    os.environ.setdefault("SGC_TEST_RUN_ID", uuid.uuid4().hex)


def pytest_sessionstart(session):
    _SKIPPED.clear()


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):  # skip marks, skipif, pytest.skip in tests/fixtures
        _SKIPPED.append((report.nodeid, _skip_reason(report)))
    if report.failed and not os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("SGC_FAILURES_LOG"):
        # each failure as it happens (make test sets it): an hour-long run need not end to be read
        with open(os.environ["SGC_FAILURES_LOG"], "a") as log:
            log.write(f"==== {report.nodeid} ({report.when}, {time.strftime('%H:%M:%S')})\n"
                      f"{report.longreprtext[-6000:]}\n")


def pytest_collectreport(report):
    if report.skipped:  # a module skipped as a whole (pytest.skip(allow_module_level=True), importorskip)
        _SKIPPED.append((report.nodeid, _skip_reason(report)))


def pytest_sessionfinish(session, exitstatus):
    if not os.environ.get("PYTEST_XDIST_WORKER") and _sandbox_unavailable() is None:
        # this run's staged template layer (tests/integration/templates.py), once every worker is done
        from tests.integration import templates

        templates.remove_layer()
    if in_ci() and _SKIPPED and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not (in_ci() and _SKIPPED):
        return
    terminalreporter.section(f"CI=true: {len(_SKIPPED)} skipped test(s) fail the run", sep="=", red=True, bold=True)
    for nodeid, reason in _SKIPPED:
        terminalreporter.write_line(f"SKIPPED (a failure under CI) {nodeid}: {reason}")


def netns_names() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return sorted(line.split()[0] for line in out.splitlines() if line.strip())


class SandboxHosts(list):
    """The booted hosts (a list of SandboxHost), plus what the machine had before."""

    netns_before: list[str]


@pytest.fixture(scope="session")
def sandbox_hosts():
    reason = _sandbox_unavailable()
    if reason:
        pytest.skip(reason)
    from sandbox import hosts as sandbox_api

    # a SIGTERM'd test run still tears the sandbox down (pytest handles KeyboardInterrupt)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    hosts = SandboxHosts()
    hosts.netns_before = netns_names()

    def teardown() -> None:
        if os.environ.get("PYTEST_XDIST_WORKER"):  # the other workers' hosts are still in use
            for name in ("sgc1", "sgc2"):
                sandbox_api.remove(name)
        else:
            sandbox_api.down()

    atexit.register(teardown)  # backstop if the process dies oddly; both are idempotent
    try:
        hosts.extend(sandbox_api.up(2))
        yield hosts
    finally:
        teardown()
        atexit.unregister(teardown)


@pytest.fixture
def run_pyinfra(sandbox_hosts):
    """run_pyinfra(*args, limit=None, env=None, timeout=900) -> CompletedProcess.

    Runs `python -m pyinfra -y inventory/sandbox.py ARGS...` from the project
    root (e.g. run_pyinfra("deploy.py"), run_pyinfra("deploy.py", "--dry")),
    output captured as text; `limit` passes --limit NAME.
    """

    def run(*args: str, limit: str | None = None, env: dict | None = None, timeout: float = 900):
        argv = [sys.executable, "-m", "pyinfra", "-y"]
        if limit:
            argv += ["--limit", limit]
        argv += ["inventory/sandbox.py", *args]
        return subprocess.run(
            argv,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run
