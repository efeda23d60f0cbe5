"""The sandbox fleet shared by test_rollout.py and test_router.py.

sgc10 runs SGLang's router, sgc11..sgc14 are SGLang servers registered with
it (inventory/sandbox_fleet.py). The hosts are booted once and converged once
per pytest session, whichever module asks first, and removed by name at the
end of the session (never sandbox.hosts.down(): other tests share the machine).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INDEXES = [10, 11, 12, 13, 14]
ROUTER = "sgc10"
# the xdist group of the modules that share the fleet (pytestmark): one worker runs them, on one fleet
FLEET_GROUP = "fleet-sgc10-14"
SERVERS = ["sgc11", "sgc12", "sgc13", "sgc14"]
ROUTER_URL = "http://10.77.10.2:30000"
ENV = {"SGC_FLEET_INDEXES": "10-14", "SGC_FLEET_ROUTER": ROUTER, "PYINFRA_PROGRESS": "off"}

_SESSION: dict = {"hosts": None, "converged": False, "converge": None}


def fleet(request) -> dict:
    """{name: SandboxHost} of the fleet, booted and converged (once per session)."""
    from sandbox import hosts as sandbox_api

    if _SESSION["hosts"] is None:
        def cleanup():
            for index in INDEXES:
                sandbox_api.remove(f"sgc{index}")

        request.config.add_cleanup(cleanup)  # end of the session, also after a failure
        booted = sandbox_api.up(indexes=INDEXES)
        wait_for_ssh(booted)
        _SESSION["hosts"] = {h.name: h for h in booted}
    if not _SESSION["converged"]:
        from sandbox import hubd

        # the canary downloads from the Hub, the other three copy from it (peer seeding)
        before = hubd.stats()
        proc = rollout("--canary", "1", "--batch-size", "3", "-q", timeout=900)
        assert proc.returncode == 0, proc.out[-6000:]
        _SESSION["converge"] = {"out": proc.out, "hub_before": before, "hub_after": hubd.stats()}
        _SESSION["converged"] = True
    return _SESSION["hosts"]


def first_converge() -> dict:
    """The fleet's first converge: its output, the Hub's stats before and after it."""
    assert _SESSION["converge"] is not None, "fleet() converges the fleet first"
    return _SESSION["converge"]


def wait_for_ssh(hosts, timeout: float = 120) -> None:
    """Until each host's sshd answers (before the first rollout connects).

    Raises TimeoutError naming the host and the last answer seen when one does
    not answer within ``timeout`` s (never returns with a host unreachable)."""
    for host in hosts:
        deadline = time.monotonic() + timeout
        while True:
            try:
                proc = host.run("true", check=False, timeout=10)
                if proc.returncode == 0:
                    break
                last = f"ssh exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-500:]}"
            except subprocess.TimeoutExpired:
                last = "ssh did not return within 10 s"
            if time.monotonic() >= deadline:
                raise TimeoutError(f"sshd of {host.name} ({host.address}) did not answer `ssh true` "
                                   f"within {timeout:.0f} s; last: {last}")
            time.sleep(1)


def rollout(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m rollout inventory/sandbox_fleet.py ARGS`; output in .out. ``env`` overrides ENV."""
    argv = [sys.executable, "-m", "rollout", "inventory/sandbox_fleet.py", *args]
    proc = subprocess.run(argv, cwd=ROOT, env={**os.environ, **ENV, "COLUMNS": "200", **(env or {})},
                          capture_output=True, text=True, timeout=timeout)
    proc.out = proc.stdout + proc.stderr  # type: ignore[attr-defined]
    return proc


def sandbox_group_value(key: str):
    """A value of group_data/sandbox.py (read, not imported)."""
    tree = ast.parse((ROOT / "group_data" / "sandbox.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == key:
            return ast.literal_eval(node.value)
    return None


def override(tmp_path: Path, extra_env: dict | None = None, **values) -> str:
    """A --group-data dir whose sandbox.py overrides the servers' settings;
    extra_env is added to group_data/sandbox.py's."""
    folder = tmp_path / "override"
    folder.mkdir(exist_ok=True)
    lines = []
    if extra_env is not None:
        env = {**(sandbox_group_value("extra_env") or {}), **extra_env}
        lines.append(f"extra_env = {env!r}")
    lines += [f"{key} = {value!r}" for key, value in values.items()]
    (folder / "sandbox.py").write_text("\n".join(lines) + "\n")
    return str(folder)


def summary(output: str) -> dict[str, dict[str, str]]:
    """The rollout's summary table: {host: {batch, result, changed, restarted, staged, ready, out, error}}."""
    rows = {}
    columns = ("batch", "result", "changed", "restarted", "staged", "ready", "out", "error")
    for line in output.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃]", line)[1:-1]]
        if len(cells) == 9 and re.fullmatch(r"sgc\d+", cells[0]):
            rows[cells[0]] = dict(zip(columns, cells[1:], strict=True))
        elif len(cells) == 9 and not cells[0] and rows:  # a wrapped error cell
            last = rows[list(rows)[-1]]
            last["error"] = (last["error"] + " " + cells[8]).strip()
    return rows


def unit_props(host, unit: str = "sglang.service") -> dict[str, str]:
    out = host.run(f"systemctl show {unit} --property=MainPID,NRestarts,ActiveState,ExecMainStartTimestampMonotonic").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def started_us(host, unit: str = "sglang.service") -> int:
    return int(unit_props(host, unit)["ExecMainStartTimestampMonotonic"])
