"""The host's CPU sockets (a board with two joins its GPUs across the CPU interconnect)."""

from __future__ import annotations

from pyinfra.api import FactBase


class CpuSockets(FactBase[int | None]):
    """
    The number of CPU sockets: the distinct ``physical_package_id`` of the online CPUs (what
    ``lscpu``'s "Socket(s):" counts); None when sysfs does not say.

    .. code:: python

        host.get_fact(CpuSockets)     # 2 on a dual-socket board
    """

    def command(self) -> str:
        return "cat /sys/devices/system/cpu/cpu[0-9]*/topology/physical_package_id 2>/dev/null | sort -u || true"

    def process(self, output: list[str]) -> int | None:
        ids = {line.strip() for line in output if line.strip().lstrip("-").isdigit()}
        return len(ids) or None
