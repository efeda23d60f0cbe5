"""Local sandbox hosts for the demo, tests and benchmarks.

Real Debian guests (systemd-nspawn: systemd PID 1, sshd, own network
namespace) with simulated GPUs. CLI: `python -m sandbox up|down|status|ssh`.
API: sandbox.hosts (up, down, status, load_hosts, set_disk, grow_disk),
sandbox.stale (start_stale), sandbox.gpusim (simulated GPU state).
"""

from .hosts import SandboxHost, down, grow_disk, load_hosts, set_disk, status, up

__all__ = ["SandboxHost", "up", "down", "status", "load_hosts", "set_disk", "grow_disk"]
