"""Several servers on one machine: inventory entries whose ssh address (ssh_hostname, else the host
name, and ssh_port) is the same are servers of one machine, each with its own unit, GPUs and port.

``sibling_units`` names the other servers of a host's machine (the stale GPU step never stops them);
``machine_problems`` refuses entries of one machine that would collide: GPUs, ports or unit names in
common, or a model dir (or venv) that two of them would fill differently."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from itertools import combinations
from typing import Any

from tasks.spec.built import AnySpec, Spec
from tasks.spec.server_settings import HostSettings

DEFAULT_UNIT = HostSettings.model_fields["unit_name"].default


def machine_of(host: Any) -> str:
    """Where the host's ssh connection lands: "ADDRESS:PORT"."""
    return f"{host.data.get('ssh_hostname') or host.name}:{host.data.get('ssh_port') or 22}"


def sibling_units(host: Any) -> dict[str, str]:
    """{unit name: inventory host} of the other servers on this host's machine (whole inventory, --limit
    or not: a server left out of this run still serves)."""
    inventory = getattr(host, "inventory", None)
    if inventory is None:
        return {}
    mine = machine_of(host)
    return {str(other.data.get("unit_name") or DEFAULT_UNIT): other.name for other in inventory
            if other.name != host.name and other.data.get("role") != "router" and machine_of(other) == mine}


def _ports(spec: Spec) -> dict[int, str]:
    """{port: the setting} this server listens on."""
    ports = {spec.listen_port: "listen_port"}
    if spec.is_multinode and spec.node_rank == 0 and spec.dist_init_addr:
        ports.setdefault(int(spec.dist_init_addr.rsplit(":", 1)[1]), "dist_init_addr")
    return ports


def _dirs(spec: Spec) -> dict[str, tuple[str, str, str]]:
    """{normalized dir: (setting, repo, revision)} of what the server downloads."""
    out = {posixpath.normpath(spec.model_dir): ("model_dir", spec.profile.repo, spec.profile.revision)}
    if spec.draft is not None and spec.draft_dir:
        out[posixpath.normpath(spec.draft_dir)] = ("draft_dir", spec.draft.repo, spec.draft.revision)
    return out


def pair_problems(a: Spec, b: Spec, machine: str) -> list[str]:
    """What collides between two servers of one machine, said as ``b``'s problems (its values first)."""
    where = f"on the same machine ({machine})"
    lines = []
    common = sorted(set(a.gpu_ids) & set(b.gpu_ids))
    if common:
        lines.append(f"gpu_ids = {b.gpu_ids!r}: {b.host_name} and {a.host_name} (gpu_ids = {a.gpu_ids!r}) share "
                     f"GPU(s) {common} {where}: allowed: disjoint gpu_ids for the servers of one machine")
    for port in sorted(set(_ports(a)) & set(_ports(b))):
        lines.append(f"{_ports(b)[port]} = {port}: {b.host_name} and {a.host_name} ({_ports(a)[port]}) both listen "
                     f"on port {port} {where}: allowed: a port of its own for each server")
    if a.unit_name == b.unit_name:
        lines.append(f"unit_name = {b.unit_name!r}: {b.host_name} and {a.host_name} both use it {where}: allowed: "
                     f"a unit_name of its own for each server, e.g. {b.unit_stem + '-b.service'!r}")
    for path in sorted(set(_dirs(a)) & set(_dirs(b))):
        (field, *theirs), (_field, *mine) = _dirs(b)[path], _dirs(a)[path]
        if theirs != mine:
            lines.append(f"{field} = {path!r}: {b.host_name} wants {theirs[0]}@{theirs[1][:12]} there and "
                         f"{a.host_name} {mine[0]}@{mine[1][:12]} {where}: allowed: one revision per dir (the same "
                         "model, or a dir of its own)")
    return [f"{b.host_name}: {line}" for line in lines]


def machine_problems(specs: Mapping[str, AnySpec], machines: Mapping[str, str], targeted: Iterable[str]) -> list[str]:
    """Every collision between two servers of one machine, one line each, starting with a targeted host
    (the later of the two in inventory order when both are). ``specs``: the servers' specs in inventory
    order (targeted ones and, where they build, the others of a targeted host's machine)."""
    chosen = set(targeted)
    by_machine: dict[str, list[Spec]] = {}
    for spec in specs.values():
        if isinstance(spec, Spec) and spec.host_name in machines:
            by_machine.setdefault(machines[spec.host_name], []).append(spec)
    lines = []
    for machine, servers in by_machine.items():
        for a, b in combinations(servers, 2):
            if b.host_name in chosen:
                lines += pair_problems(a, b, machine)
            elif a.host_name in chosen:
                lines += pair_problems(b, a, machine)
    return lines
