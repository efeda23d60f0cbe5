"""Stale GPU processes: compute processes on our GPUs that are not our server.

Fact: ``NvmlGpuUsage`` (facts/nvml.py) - every compute process on every GPU
(pid, bytes, GPU index and UUID) through NVML with the venv's pynvml
(nvidia-smi where the venv or pynvml is not there yet, said in the plan), with
the systemd unit that owns it (from /proc/PID/cgroup), because a process of
another unit must be stopped through systemd: a plain kill is undone by
``Restart=always``.

A sibling server of ours (another server on this machine: a unit another
inventory entry of the same machine names, or any unit whose file carries our
ownership marker) is never stopped: on our GPUs it fails the step, naming it,
with everything left as it was (two servers' gpu_ids must not overlap; the
settings check refuses that within one inventory).
"""

from __future__ import annotations

import os.path
import time

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, StringCommand, deploy, operation

from facts.files import FileText
from facts.nvml import GpuApp, NvmlGpuUsage
from core.ops import claims, fail_command, plan, record_failure
from core.paths import SYSTEMD_DIR
from tasks.spec import Spec, sibling_units

MIB = 1024 * 1024


def gpu_mib(used_bytes: int | None) -> str:
    return "[N/A] MiB" if used_bytes is None else f"{used_bytes // MIB} MiB"


def stale_processes(processes: list[GpuApp], gpu_ids, own_unit: str) -> list[tuple[GpuApp, int]]:
    """(process, gpu index) for every compute process on our GPUs outside our unit."""
    return [(process, process.gpu_index) for process in processes
            if process.gpu_index in gpu_ids and process.unit != own_unit]


def sibling_servers(stale: list[tuple[GpuApp, int]], siblings: dict[str, str]) -> dict[str, str]:
    """{unit: why it is ours} for the stale processes' units that are sibling servers: named by another
    inventory entry of this machine, or a unit file with our marker (a server of another inventory, or
    one renamed or removed from this one: its operator decides, not this run)."""
    found = {}
    for unit in sorted({process.unit for process, _ in stale if process.unit and process.unit.endswith(".service")}):
        if unit in siblings:
            found[unit] = f"the server of inventory host {siblings[unit]} on this machine"
        elif claims(host.get_fact(FileText, path=f"{SYSTEMD_DIR}/{unit}") or ""):
            found[unit] = "a server of sglang-converge (its unit file carries our marker)"
    return found


def describe(process: GpuApp, gpu: int) -> str:
    owner = f" of {process.unit}" if process.unit else ""
    return f"pid {process.pid} ({os.path.basename(process.name)}{owner}) holds {gpu_mib(process.used_bytes)} on GPU {gpu}"


def _stop(state, host, units: list[str], pids: list[int], grace_s: float, wait_s: float, names: dict) -> bool:
    def run(command: str):
        return host.run_shell_command(StringCommand(command), print_output=False, print_input=False)

    for unit in units:
        host.log(f"stale GPU processes: systemctl stop {unit} (a kill would be undone by its Restart=)", logger.warning)
        ok, out = run(f"systemctl stop {unit}")
        if not ok:
            host.log_styled(f"stale GPU processes: systemctl stop {unit} failed: {out.stderr}", fg="red",
                            log_func=logger.error)
            record_failure(state, host, f"stale GPU processes: systemctl stop {unit} failed: {out.stderr}")
            return False
    if pids:
        listed = " ".join(str(pid) for pid in pids)
        host.log(f"stale GPU processes: SIGTERM to pid {listed}", logger.warning)
        run(f"kill -TERM {listed} 2>/dev/null; true")
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            _ok, out = run(f"for p in {listed}; do [ -d /proc/$p ] && echo $p; done; true")
            if not out.stdout.strip():
                break
            time.sleep(0.2)
        else:
            alive = out.stdout.split()
            host.log(f"stale GPU processes: SIGKILL to pid {' '.join(alive)} after {grace_s:.0f} s", logger.warning)
            run(f"kill -KILL {' '.join(alive)} 2>/dev/null; true")
    # the memory must really be free before our server starts (TP balance check)
    watched = set(names)
    deadline = time.monotonic() + wait_s
    started = time.monotonic()
    while True:
        _ok, out = run("nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid --format=csv,noheader,nounits")
        holding = [line for line in out.stdout_lines if line.split(",")[0].strip().isdigit()
                   and int(line.split(",")[0]) in watched]
        if not holding:
            host.log(f"stale GPU processes: GPU memory freed in {time.monotonic() - started:.1f} s", logger.warning)
            return True
        if time.monotonic() > deadline:
            for line in holding:
                pid = int(line.split(",")[0])
                host.log_styled(f"stale GPU processes: still held after {wait_s:.0f} s: {names[pid]}", fg="red",
                                log_func=logger.error)
            record_failure(state, host, f"stale GPU processes: still held after {wait_s:.0f} s: "
                                        f"{names[int(holding[0].split(',')[0])]}", holding)
            return False
        time.sleep(0.2)


@operation()
def stale_gpu_processes_stopped(
    gpu_ids: list[int],
    own_unit: str,
    python: str,
    policy: str = "stop",
    grace_s: float = 30,
    protect_units: list[str] | None = None,
    protect_process_names: list[str] | None = None,
    siblings: dict[str, str] | None = None,
):
    """
    Stop compute processes on ``gpu_ids`` that are not in ``own_unit``: one
    owned by another systemd service through ``systemctl stop`` (its
    Restart= would undo a kill), any other with SIGTERM, then SIGKILL after
    ``grace_s``; then wait until nvidia-smi shows their memory freed.
    Protected units and process names are never touched: they fail the step.
    Nor is a sibling server (``siblings``: {unit: inventory host} of the
    other servers on this machine, or a unit file with our marker).

    + python: the server venv's python, whose pynvml reads NVML (nvidia-smi when it cannot)
    + policy: "stop", "fail" (refuse to continue) or "ignore"

    .. code:: python

        stale_gpu_processes_stopped(gpu_ids=[0, 1], own_unit="sglang.service", python="/opt/sglang/venv/bin/python",
                                    protect_units=["nvidia-persistenced.service"])
    """
    usage = host.get_fact(NvmlGpuUsage, python=python)
    stale = stale_processes(usage.processes, gpu_ids, own_unit)
    via = "" if usage.source == "nvml" else f" (read with {usage.via})"
    if not stale:
        host.noop(f"no other compute process on GPUs {gpu_ids}{via}")
        return
    if via:
        plan(f"stale GPU processes{via}")
    lines = [describe(process, gpu) for process, gpu in stale]
    if policy == "ignore":
        plan("stale GPU processes ignored (stale_policy = 'ignore'): " + "; ".join(lines))
        host.noop("stale GPU processes ignored: " + "; ".join(lines))
        return
    ours = sibling_servers(stale, siblings or {})
    if ours:
        message = ("stale GPU processes on our GPUs, not stopped: sibling servers of this deploy (never stopped; "
                   "their gpu_ids must not overlap ours: stop or move that server first)\n" + "\n".join(
                       f"  {describe(process, gpu)}: {ours[process.unit]}" for process, gpu in stale
                       if process.unit in ours))
        plan(message)
        yield fail_command(message)
        return
    units_protected = set(protect_units or [])
    names_protected = set(protect_process_names or [])
    protected = [
        describe(process, gpu)
        for process, gpu in stale
        if process.unit in units_protected or os.path.basename(process.name) in names_protected
    ]
    if protected or policy == "fail":
        why = "protected (protect_units / protect_process_names)" if protected else "stale_policy = 'fail'"
        message = "stale GPU processes on our GPUs, not stopped: " + why + "\n" + "\n".join(
            f"  {line}" for line in (protected or lines)
        )
        plan(message)
        yield fail_command(message)
        return
    units = sorted({process.unit for process, _ in stale if process.unit and process.unit.endswith(".service")})
    pids = sorted({process.pid for process, _ in stale if not (process.unit and process.unit.endswith(".service"))})
    for process, gpu in stale:
        how = (f"systemctl stop {process.unit}" if process.unit in units else f"SIGTERM, SIGKILL after {grace_s:.0f} s")
        plan(f"stop stale GPU process: {describe(process, gpu)} -> {how}")
    names = {process.pid: describe(process, gpu) for process, gpu in stale}
    yield FunctionCommand(_stop, (units, pids, grace_s, max(30.0, grace_s + 10), names), {})


@deploy("Stale GPU processes")
def stale_gpu(spec: Spec) -> None:
    """Free our GPUs from processes that are not our server."""
    stale_gpu_processes_stopped(
        gpu_ids=list(spec.gpu_ids),
        own_unit=spec.unit_name,
        python=spec.python_bin,
        policy=spec.stale_policy,
        grace_s=spec.stale_grace_s,
        protect_units=list(spec.protect_units),
        protect_process_names=list(spec.protect_process_names),
        siblings=sibling_units(host),
        name=f"stale GPU processes on GPUs {','.join(map(str, spec.gpu_ids))}",
    )
