"""systemd: what systemd says of a unit, and which unit a process belongs to."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand

from facts._value import FactValue

_UNIT_PROPERTIES = (
    "LoadState",
    "ActiveState",
    "SubState",
    "MainPID",
    "UnitFileState",
    "FragmentPath",
    "NRestarts",
    "InvocationID",
    "ExecMainStartTimestampMonotonic",
    "NeedDaemonReload",
)

_UNIT_RE = re.compile(r"[^/]+\.(?:service|scope)$")


@dataclass(frozen=True)
class UnitState(FactValue):
    load_state: str  # "loaded" or "not-found"
    active_state: str  # "active", "activating", "failed", "inactive", ...
    sub_state: str
    main_pid: int
    unit_file_state: str  # "enabled", "disabled", "" when not found
    fragment_path: str
    restarts: int
    invocation_id: str
    started_monotonic_us: int
    need_daemon_reload: bool = False

    @property
    def exists(self) -> bool:
        return self.load_state == "loaded"

    @property
    def running(self) -> bool:
        return self.active_state in ("active", "activating", "reloading")


class SystemdUnitState(FactBase[UnitState]):
    """
    State of one systemd unit (loaded, active, main PID, restarts, enabled),
    from one ``systemctl show``.

    .. code:: python

        state = host.get_fact(SystemdUnitState, unit="sglang.service")
        state.active_state, state.main_pid
    """

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "systemctl"

    def command(self, unit: str) -> StringCommand:
        return StringCommand(
            "systemctl show", QuoteString(unit), f"--property={','.join(_UNIT_PROPERTIES)}"
        )

    def process(self, output: list[str]) -> UnitState:
        props = {}
        for line in output:
            key, sep, value = line.partition("=")
            if sep:
                props[key] = value
        return UnitState(
            load_state=props.get("LoadState", "not-found"),
            active_state=props.get("ActiveState", "inactive"),
            sub_state=props.get("SubState", "dead"),
            main_pid=int(props.get("MainPID") or 0),
            unit_file_state=props.get("UnitFileState", ""),
            fragment_path=props.get("FragmentPath", ""),
            restarts=int(props.get("NRestarts") or 0),
            invocation_id=props.get("InvocationID", ""),
            started_monotonic_us=int(props.get("ExecMainStartTimestampMonotonic") or 0),
            need_daemon_reload=props.get("NeedDaemonReload") == "yes",
        )


def unit_from_cgroup(lines: list[str]) -> str | None:
    """The innermost .service/.scope of a /proc/PID/cgroup listing.

    The unified (``0::``) line wins; on hybrid hosts the ``name=systemd`` one.

    >>> unit_from_cgroup(["0::/system.slice/sglang.service"])
    'sglang.service'
    """
    paths = {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            paths[parts[1]] = parts[2]
    for key in ("", "name=systemd"):
        path = paths.get(key)
        if not path or path == "/":
            continue
        units = [part for part in path.split("/") if _UNIT_RE.match(part)]
        if units:
            return units[-1]
    return None
