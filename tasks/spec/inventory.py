"""Checks across the hosts of an inventory: every targeted host valid, node
groups consistent, a router and its servers on one API key, the servers of
one machine apart (tasks/spec/machines.py).

``validate_inventory`` keeps its result on the inventory object, so deploy.py
may call it from each host's run (and config.py before connecting)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pyinfra.api.host import Host
from pyinfra.api.inventory import Inventory

from tasks.spec.build import host_spec
from tasks.spec.built import AnySpec, RouterSpec, Spec
from tasks.spec.errors import SpecError
from tasks.spec.machines import machine_of, machine_problems

# Where validate_inventory keeps its result: an attribute of the pyinfra Inventory object.
SPECS_ATTR = "_sglang_converge_specs"


def node_groups(specs: Mapping[str, AnySpec]) -> dict[str, list[Spec]]:
    """The multi-node TP groups among ``specs``: {group key: specs in rank order}."""
    groups: dict[str, list[Spec]] = {}
    for spec in specs.values():
        if isinstance(spec, Spec) and spec.group_key is not None:
            groups.setdefault(spec.group_key, []).append(spec)
    return {key: sorted(members, key=lambda s: (s.node_rank, s.host_name)) for key, members in groups.items()}


def _described_group_problems(
    members: Sequence[Spec], specs: Mapping[str, AnySpec], inventory_names: set[str], targeted: set[str]
) -> list[str]:
    """A group described once (node_group): the same node_group on every
    rank, every rank a targeted host of the inventory."""
    first = members[0]
    group = first.node_group
    assert group is not None
    lines: list[str] = []
    for spec in members[1:]:
        if spec.node_group != group:
            shown = spec.node_group.model_dump(exclude_none=True) if spec.node_group else None
            lines.append(
                f"{spec.host_name}: node_group = {shown!r}: "
                f"differs from {first.host_name}'s {group.model_dump(exclude_none=True)!r}: every host of "
                "a node group must have the same node_group (set it once, in the group's data)"
            )
    for rank, name in enumerate(group.hosts):
        other = specs.get(name)
        if name not in inventory_names:
            lines.append(
                f"{first.host_name}: node_group.hosts = {group.hosts!r}: rank {rank} {name!r} is not a host "
                f"of the inventory: allowed: the inventory's host names ({', '.join(sorted(inventory_names))})"
            )
        elif name not in targeted:
            lines.append(
                f"{first.host_name}: node group {group.label!r}: rank {rank} ({name}) is not targeted (--limit): "
                "the ranks of a TP group are (re)started together: target all of its hosts or none"
            )
        elif other is None:
            pass  # its own errors are listed
        elif not isinstance(other, Spec) or other.node_group != group:
            mine = other.node_group if isinstance(other, Spec) else None
            lines.append(
                f"{name}: node_group = {mine.model_dump(exclude_none=True) if mine else None!r}: "
                f"node group {group.label!r} lists {name} as rank {rank}: allowed: the same node_group as "
                f"{first.host_name}"
            )
    return lines


def _per_host_group_problems(key: str, members: Sequence[Spec]) -> list[str]:
    """A group described by each host's nnodes / node_rank / dist_init_addr:
    one nnodes, each rank on exactly one targeted host."""
    first = members[0]
    lines: list[str] = []
    if len({s.nnodes for s in members}) > 1:
        lines.append(
            f"{first.host_name}: nnodes = {first.nnodes}: other hosts with dist_init_addr "
            f"{key!r} say nnodes = {', '.join(str(s.nnodes) for s in members if s.nnodes != first.nnodes)}: "
            "allowed: the same nnodes on every rank (or describe the group once with node_group)"
        )
    by_rank: dict[int, list[str]] = {}
    for spec in members:
        by_rank.setdefault(spec.node_rank, []).append(spec.host_name)
    for rank, names in sorted(by_rank.items()):
        if len(names) > 1:
            lines.append(
                f"{names[1]}: node_rank = {rank}: {names[0]} has node_rank {rank} too in the group at "
                f"dist_init_addr {key!r}: allowed: each rank 0..{first.nnodes - 1} on exactly one host"
            )
    missing = [r for r in range(first.nnodes) if r not in by_rank]
    if missing:
        lines.append(
            f"{first.host_name}: dist_init_addr = {key!r}: no targeted host has node_rank "
            f"{', '.join(map(str, missing))} of nnodes = {first.nnodes}: allowed: each rank 0..{first.nnodes - 1} "
            "on exactly one targeted host (or describe the group once with node_group)"
        )
    return lines


def _rank_problems(members: Sequence[Spec]) -> list[str]:
    """Every rank like rank 0: as many GPUs, the same tp_size, model and dist init address."""
    first = members[0]
    rank0 = f"rank {first.node_rank} ({first.host_name}) of node group {first.group_label!r}"
    lines: list[str] = []
    for spec in members[1:]:
        if len(spec.gpu_ids) != len(first.gpu_ids):
            lines.append(
                f"{spec.host_name}: gpu_ids = {spec.gpu_ids!r} ({len(spec.gpu_ids)} GPUs): {rank0} uses "
                f"{len(first.gpu_ids)}: allowed: {len(first.gpu_ids)} GPUs on every rank "
                "(tp_size = GPUs per node x nnodes)"
            )
        if spec.tp_size != first.tp_size:
            lines.append(
                f"{spec.host_name}: tp_size = {spec.tp_size}: {rank0} has tp_size {first.tp_size}: "
                "allowed: the same tp_size on every rank"
            )
        if spec.model != first.model:
            lines.append(
                f"{spec.host_name}: model = {spec.model!r}: {rank0} runs {first.model!r}: "
                "allowed: the same model on every rank"
            )
        if spec.dist_init_addr != first.dist_init_addr:
            lines.append(
                f"{spec.host_name}: dist_init_addr = {spec.dist_init_addr!r}: {rank0} uses "
                f"{first.dist_init_addr!r}: allowed: one dist init address for the whole group"
            )
    return lines


def group_problems(specs: Mapping[str, AnySpec], inventory_names: set[str], targeted: set[str]) -> list[str]:
    """Cross-host checks of every node group: one line per problem, naming
    the host, the field, the value and what is allowed."""
    lines: list[str] = []
    for key, members in node_groups(specs).items():
        if members[0].node_group is not None:
            lines += _described_group_problems(members, specs, inventory_names, targeted)
        else:
            lines += _per_host_group_problems(key, members)
        lines += _rank_problems(members)
    return lines


def router_key_problems(specs: Mapping[str, AnySpec]) -> list[str]:
    """A router and the servers behind it share one API key: the servers use
    it to call the router's /workers API, the router gives it to them with
    each request, and a keyed server behind a keyless router would serve
    anyone who reaches the router."""
    routers = {s.router_url: s for s in specs.values() if isinstance(s, RouterSpec) and s.router_url}
    lines = []
    for spec in specs.values():
        router = routers.get(spec.router_url) if isinstance(spec, Spec) and spec.router_url else None
        if router is None:
            continue
        mine = spec.api_key.get_secret_value() if spec.api_key else None
        theirs = router.api_key.get_secret_value() if router.api_key else None
        if mine == theirs:
            continue
        where = f"its router {router.host_name} at {spec.router_url}"
        if theirs is None:
            why = (f"this server demands an API key but {where} runs without one (its api_key_env = "
                   f"{router.api_key_env!r}): through the router anyone could use it")
        elif mine is None:
            why = (f"{where} demands an API key (its api_key_env = {router.api_key_env!r}) and this server "
                   "has none to register with")
        else:
            why = f"the key differs from the one of {where} (its api_key_env = {router.api_key_env!r})"
        lines.append(f"{spec.host_name}: api_key_env = {spec.api_key_env!r}: {why}: allowed: the same key on a "
                     "router and its servers")
    return lines


def _machine_specs(inventory: Inventory, specs: dict[str, AnySpec]) -> dict[str, AnySpec]:
    """``specs`` plus, where they build, the untargeted servers on a targeted host's machine (in
    inventory order): a server left out by --limit still holds its GPUs and port."""
    machines = {machine_of(h) for h in inventory if h.name in specs}
    out: dict[str, AnySpec] = {}
    for other in inventory:
        if other.name in specs:
            out[other.name] = specs[other.name]
        elif machine_of(other) in machines and other.data.get("role") != "router":
            try:
                out[other.name] = host_spec(other)
            except SpecError:
                pass  # its own run reports it
    return out


def targeted_hosts(inventory: Inventory) -> list[Host]:
    """The inventory's hosts within --limit (all of them before a State exists)."""
    state: Any = getattr(inventory, "state", None)
    hosts = list(inventory)
    if state is not None and hasattr(state, "is_host_in_limit"):
        hosts = [h for h in hosts if state.is_host_in_limit(h)]
    return hosts


def validate_inventory(inventory: Inventory) -> dict[str, AnySpec]:
    """Validate every targeted host (--limit respected) before anything runs.

    Returns {host name: spec}; raises one SpecError listing every bad host.
    The result is kept on the inventory object (``SPECS_ATTR``): later calls
    with the same inventory return it without checking again."""
    known = getattr(inventory, SPECS_ATTR, None)
    if isinstance(known, dict):
        return known
    specs: dict[str, AnySpec] = {}
    lines: list[str] = []
    bad: list[str] = []
    targeted = targeted_hosts(inventory)
    for host in targeted:
        try:
            specs[host.name] = host_spec(host)
        except SpecError as e:
            bad.append(host.name)
            lines.extend(e.lines)
    inventory_names = {h.name for h in inventory}
    names = {h.name for h in targeted}
    apart = machine_problems(_machine_specs(inventory, specs), {h.name: machine_of(h) for h in inventory}, names)
    for line in group_problems(specs, inventory_names, names) + router_key_problems(specs) + apart:
        name = line.split(":", 1)[0]
        if name not in bad:
            bad.append(name)
        lines.append(line)
    if lines:
        raise SpecError(lines, header=f"invalid settings for {len(bad)} host(s): {', '.join(bad)}")
    setattr(inventory, SPECS_ATTR, specs)
    return specs
