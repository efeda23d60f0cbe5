"""Local sandbox hosts for the demo, tests and benchmarks.

Real Debian guests (systemd-nspawn: systemd PID 1, sshd, own network
namespace) with simulated GPUs. CLI: `python -m sandbox up|down|status|ssh`.
API: sandbox.hosts (up, down, status, load_hosts, set_disk, grow_disk),
sandbox.stale (start_stale), sandbox.gpusim (simulated GPU state).
"""

from __future__ import annotations

from typing import Any

__all__ = ["SandboxHost", "up", "down", "status", "load_hosts", "set_disk", "grow_disk"]


def __getattr__(name: str) -> Any:
    # the API of sandbox.hosts, imported on first use: the sandbox inventories import
    # sandbox.hubd and sandbox.inventory_data on every pyinfra run, never the rest
    if name in __all__:
        from sandbox import hosts

        return getattr(hosts, name)
    raise AttributeError(f"module 'sandbox' has no attribute {name!r}")
