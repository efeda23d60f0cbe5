"""Ports: which process, of which systemd unit, listens on a TCP port."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyinfra.api import FactBase, StringCommand

from facts._value import FactValue
from facts.systemd import unit_from_cgroup


@dataclass(frozen=True)
class PortHolder(FactValue):
    pid: int
    process_name: str
    unit: str | None


class PortListener(FactBase[PortHolder | None]):
    """
    The process listening on a TCP port, with its systemd unit; None when free.

    .. code:: python

        holder = host.get_fact(PortListener, port=30000)
        holder.unit if holder else None  # "sglang.service"
    """

    def command(self, port: int) -> StringCommand:
        return StringCommand(
            f"line=$(ss -Hltnp 'sport = :{int(port)}' 2>/dev/null | head -n 1); "
            '[ -n "$line" ] || exit 0; echo "listen: $line"; '
            'pid=$(printf "%s" "$line" | sed -n "s/.*pid=\\([0-9]*\\).*/\\1/p"); '
            '[ -n "$pid" ] && sed "s/^/cgroup: /" "/proc/$pid/cgroup" 2>/dev/null; true'
        )

    def process(self, output: list[str]) -> PortHolder | None:
        listen = next((line for line in output if line.startswith("listen: ")), None)
        if listen is None:
            return None
        match = re.search(r'users:\(\("([^"]*)",pid=(\d+)', listen)
        cgroup = [line[8:] for line in output if line.startswith("cgroup: ")]
        if not match:
            return PortHolder(pid=0, process_name="?", unit=None)
        return PortHolder(pid=int(match.group(2)), process_name=match.group(1), unit=unit_from_cgroup(cgroup))
