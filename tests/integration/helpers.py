"""Helpers for integration tests: run pyinfra against one sandbox host, read its summary."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pyinfra(*args: str, limit: str, env: dict | None = None, timeout: float = 900,
            inventory: str = "inventory/sandbox.py") -> subprocess.CompletedProcess:
    """`pyinfra -y --limit HOST INVENTORY ARGS` from the project root; output in .out."""
    # --dry must not get -y: pyinfra then skips change detection, which prints the plan
    yes = [] if "--dry" in args else ["-y"]
    argv = [sys.executable, "-m", "pyinfra", *yes, "--limit", limit, inventory, *args]
    proc = subprocess.run(argv, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)
    proc.out = proc.stdout + proc.stderr  # type: ignore[attr-defined]
    return proc


def newcomer_env(*drop: str) -> dict[str, str]:
    """This process's environment without an outer make's variables (`make test` runs the tests that run
    `make demo`, `make bench`, ...: each runs as a newcomer's shell would), nor the names in ``drop``."""
    outer_make = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")
    return {k: v for k, v in os.environ.items() if k not in outer_make and k not in drop}


def grand_total(output: str) -> tuple[int, int, int]:
    """(success, error, no change) from pyinfra's results table."""
    match = re.search(r"Grand total\s+\d+\s+(\S+)\s+(\S+)\s+(\S+)", output)
    assert match, output[-3000:]
    return tuple(0 if value == "-" else int(value) for value in match.groups())  # type: ignore[return-value]


def facts(limit: str, *fact_args: str) -> dict[str, object]:
    """Gather facts over ssh with `pyinfra INVENTORY fact ...`: {fact name: value for the host}."""
    proc = subprocess.run([sys.executable, "-m", "pyinfra", "--limit", limit, "inventory/sandbox.py", "fact",
                           *fact_args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    result = {}
    for block in out.split("--> Fact data for: ")[1:]:
        name, _, rest = block.partition("\n")
        body = rest[: rest.index("\n}") + 2]
        result[name.split()[0]] = json.loads(body)[limit]
    missing = [name for name in fact_args if "=" not in name and name not in result]
    assert not missing, f"no fact data for {missing} in:\n{out[-3000:]}"
    return result


def unit_props(host, unit: str) -> dict[str, str]:
    out = host.run(f"systemctl show {unit} --property=MainPID,NRestarts,ActiveState,ExecMainStartTimestampMonotonic").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def boot_extra_host(index: int):
    """A fresh sandbox host of the test module's own (sgc<index>); remove with remove_host.

    Modules boot their own hosts rather than share the session's, so they can
    run alone, side by side, and leave the others' hosts alone.
    """
    import pytest

    from sandbox import hosts as sandbox_api
    from tests.conftest import _sandbox_unavailable

    reason = _sandbox_unavailable()
    if reason:
        pytest.skip(reason)
    return sandbox_api.up(indexes=[index])[0]


def remove_host(host) -> None:
    from sandbox import hosts as sandbox_api

    sandbox_api.remove(host.name)


def timed(timings: dict[str, float], name: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    """pyinfra(*args, **kwargs), its wall time kept in timings[name]."""
    started = time.monotonic()
    proc = pyinfra(*args, **kwargs)
    timings[name] = time.monotonic() - started
    return proc


SHARED_INDEX = 280  # the converged host test_gpu_balance, test_key_secrecy and test_model_draft share
# the xdist group of the modules that share it (pytestmark): one worker runs them all, on one sgc280
SHARED_CONVERGED_GROUP = "converged-sgc280"
# the xdist group of the modules that use sgc1: test_demo.py (`make demo` boots it), then test_sandbox.py
SGC1_GROUP = "sgc1-2"
_SHARED: dict = {}


def shared_converged_host(request, timings: dict[str, float]):
    """One sandbox host (sgc280) converged by deploy.py with the sandbox's settings, shared by the
    modules that need a converged host and leave it serving: booted and converged by the first
    that asks (its output in host.converge_out; its time in timings["converge"]), removed at the
    end of the session. Each module runs its own deploys on it; run alone, a module boots it.
    It boots staged (the run's template: tests/integration/templates.py), so its converge writes
    the unit, starts and passes the gates without building the venv again."""
    from tests.integration.templates import staged_hosts

    host = _SHARED.get("host")
    if host is not None and host.run("true", check=False, timeout=30).returncode == 0:
        return host
    host = staged_hosts([SHARED_INDEX])[0]
    request.config.add_cleanup(lambda: remove_host(host))
    proc = timed(timings, "converge", "deploy.py", limit=host.name)
    assert proc.returncode == 0, proc.out
    host.converge_out = proc.out
    _SHARED["host"] = host
    return host


REAL_INDEX = 290  # the real-SGLang host (inventory/sandbox_real.py) the real-server tests share
# the xdist group of the modules that share it: test_real_model.py, then test_real_server.py (which removes it)
REAL_GROUP = "real-sgc290"
_REAL: dict = {}


def real_pyinfra(*args: str, limit: str, env: dict | None = None, timeout: float = 1800):
    """pyinfra(...) against inventory/sandbox_real.py (the real SGLang server's hosts)."""
    return pyinfra(*args, limit=limit, env=env, timeout=timeout, inventory="inventory/sandbox_real.py")


def shared_real_host(request, timings: dict[str, float], env: dict | None = None):
    """The real-SGLang sandbox host (sgc290), booted and converged once per session by the first
    module that asks (its output in host.converge_out), removed at the end of the session. The
    converge installs the real server's ~8 GB venv with the deploy's own pip."""
    host = _REAL.get("host")
    if host is not None and host.run("true", check=False, timeout=30).returncode == 0:
        return host
    host = boot_extra_host(REAL_INDEX)
    request.config.add_cleanup(lambda: remove_host(host))
    started = time.monotonic()
    proc = real_pyinfra("deploy.py", limit=host.name, env=env)
    timings["converge"] = time.monotonic() - started
    assert proc.returncode == 0, proc.out[-6000:]
    host.converge_out = proc.out
    _REAL["host"] = host
    return host


def server_venv(host, unit: str = "sglang.service") -> str:
    """The venv the server's unit file runs (``ExecStart=<venv>/bin/python ...``: Spec.server_venv)."""
    found = re.findall(r"^ExecStart=(/\S+)/bin/python ", host.run(f"cat /etc/systemd/system/{unit}").stdout, re.M)
    assert len(found) == 1, found
    return found[0]


def sandbox_server_venv(**settings) -> str:
    """The venv group_data/sandbox.py's package set is built into (Spec.server_venv), with ``settings``."""
    from tests.unit.test_step_operations import sandbox_spec

    return sandbox_spec(**settings).server_venv


def wait_until(predicate: Callable[[], object], timeout: float, what: str, every: float = 0.2):
    """predicate()'s first truthy value; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)
    return value


class BackgroundDeploy:
    """`pyinfra -y --limit HOST inventory/sandbox.py ARGS` in its own process group, its output read
    as it comes: a test times a fault against a line, kills the controller, or waits for the end."""

    def __init__(self, *args: str, limit: str, env: dict | None = None):
        argv = [sys.executable, "-m", "pyinfra", "-y", "--limit", limit, "inventory/sandbox.py", *args]
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def out(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout: float = 300) -> str:
        """The first output line with ``text``; AssertionError when the run ends or the time is up first."""
        def found() -> str | None:
            return next((line for line in list(self.lines) if text in line), None)

        wait_until(lambda: found() or self.proc.poll() is not None, timeout, f"{text!r} in the output")
        self._reader.join(timeout=5 if self.proc.poll() is not None else 0)
        line = found()
        if line is None:
            raise AssertionError(f"the run ended without printing {text!r}:\n{self.out[-4000:]}")
        return line

    def finish(self, timeout: float = 400) -> subprocess.CompletedProcess:
        """Wait for the end (killed after ``timeout`` s, an AssertionError); .out, .seconds, .returncode."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the deploy did not end within {timeout:.0f} s:\n{self.out[-4000:]}") from None
        self._reader.join(timeout=10)
        done = subprocess.CompletedProcess(self.proc.args, rc, self.out, "")
        done.out = self.out  # type: ignore[attr-defined]
        done.seconds = time.monotonic() - self.t0  # type: ignore[attr-defined]
        return done

    def kill(self) -> None:
        """The operator's laptop dies: SIGKILL to pyinfra's whole process group."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._reader.join(timeout=10)
