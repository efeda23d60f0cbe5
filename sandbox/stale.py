"""Test helper: a "stale" process of another service holding GPU memory on a sandbox host.

    pid = start_stale(host, gpu=0, gib=55)                       # detached, no unit
    pid = start_stale(host, gpu=0, gib=55, unit="other-llm",     # a systemd service
                      restart_always=True)                       # a plain kill is undone

The holder is /usr/local/lib/sandbox-gpu/hold.py (registers its PID with
gpusim); start_stale returns once `nvidia-smi --query-compute-apps` lists it.
"""

from __future__ import annotations

import shlex
import uuid

from .hosts import GUEST_LIB, SandboxHost

UNIT_TEMPLATE = """\
[Unit]
Description=Stale GPU holder (sandbox: {mib} MiB on GPU {gpu}, simulated)

[Service]
Type=simple
ExecStart=/usr/bin/python3 {lib}/hold.py --gpu {gpu} --mib {mib}{name_arg}
{restart}
[Install]
WantedBy=multi-user.target
"""


def _wait_registered_script(pid_expr: str, timeout_s: float) -> str:
    """Shell that waits until the PID from pid_expr is registered with gpusim, then prints it."""
    tries = int(timeout_s / 0.1)
    return (
        f"for i in $(seq {tries}); do "
        f"pid={pid_expr}; "
        f'if [ -n "$pid" ] && [ "$pid" != 0 ] && [ -f /run/sandbox-gpu/$pid.json ]; then echo $pid; exit 0; fi; '
        "sleep 0.1; done; echo 'stale holder did not register' >&2; exit 1"
    )


def start_stale(
    host: SandboxHost,
    gpu: int | str = 0,
    gib: float = 55,
    unit: str | None = None,
    restart_always: bool = False,
    name: str | None = None,
    timeout_s: float = 15,
) -> int:
    """Start a process on `host` that holds `gib` GiB on GPU `gpu`; returns its PID.

    Without `unit`: detached over ssh (setsid nohup), survives the ssh session.
    With `unit`: /etc/systemd/system/<unit>.service (Restart=always when
    restart_always), daemon-reload, start; the PID is the unit's MainPID.
    """
    mib = int(round(float(gib) * 1024))
    name_arg = f" --name {shlex.quote(name)}" if name else ""
    if unit is None:
        pidfile = f"/run/sandbox-gpu-stale-{uuid.uuid4().hex[:8]}.pid"
        cmd = (
            f"setsid nohup /usr/bin/python3 {GUEST_LIB}/hold.py --gpu {gpu} --mib {mib}{name_arg} "
            f"--pidfile {pidfile} </dev/null >/dev/null 2>&1 & "
            + _wait_registered_script(f"$(cat {pidfile} 2>/dev/null)", timeout_s)
        )
    else:
        unit_name = unit if unit.endswith(".service") else f"{unit}.service"
        text = UNIT_TEMPLATE.format(
            mib=mib,
            gpu=gpu,
            lib=GUEST_LIB,
            name_arg=name_arg,
            restart="Restart=always\nRestartSec=1\n" if restart_always else "",
        )
        q = shlex.quote(unit_name)
        cmd = (
            f"cat > /etc/systemd/system/{q} && systemctl daemon-reload && systemctl start {q} && "
            + _wait_registered_script(f"$(systemctl show -p MainPID --value {q})", timeout_s)
        )
        proc = host.run(cmd, input=text, timeout=timeout_s + 30)
        return int(proc.stdout.split()[-1])
    proc = host.run(cmd, timeout=timeout_s + 30)
    return int(proc.stdout.split()[-1])


def stop_stale(host: SandboxHost, pid: int | None = None, unit: str | None = None) -> None:
    """Stop a holder: its unit (stop + remove the unit file), or the PID (SIGTERM)."""
    if unit is not None:
        unit_name = unit if unit.endswith(".service") else f"{unit}.service"
        q = shlex.quote(unit_name)
        host.run(f"systemctl stop {q}; rm -f /etc/systemd/system/{q}; systemctl daemon-reload", check=False)
    if pid is not None:
        host.run(f"kill {int(pid)} 2>/dev/null || true", check=False)
