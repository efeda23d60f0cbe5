"""Preflight checks shared by the preflight step and the rollout's fleet
preflight: the spec resolved against the host's GPUs, and every reason the
host cannot take the model (GPUs, GPU memory, driver, disk, ports).

    spec = resolved_spec(spec)
    problems = host_problems(spec)      # [] when the host can serve the spec
"""

from __future__ import annotations

import re

from pyinfra import host

from core.disk import disk_shortfall
from core.ops import gb
from facts.gpu import Gpu, GpuP2P, NvidiaGpus
from facts.ports import PortHolder, PortListener
from tasks.spec import Spec


def resolved_spec(spec: Spec) -> Spec:
    """The spec with what depends on the host filled in from its GPUs:
    attention backend for "auto", NCCL P2P env. Unchanged on a host without GPUs
    (the preflight check then fails it)."""
    gpus = host.get_fact(NvidiaGpus)
    if not gpus:
        return spec
    used = [gpu for gpu in gpus if gpu.index in spec.gpu_ids]
    p2p = host.get_fact(GpuP2P)
    p2p_ok = True
    if p2p is not None and len(used) > 1:
        positions = {gpu: i for i, gpu in enumerate(p2p.gpus)}
        for a in spec.gpu_ids:
            for b in spec.gpu_ids:
                if a != b and a in positions and b in positions:
                    p2p_ok = p2p_ok and p2p.status[positions[a]][positions[b]] in ("OK", "X")
    return spec.resolve(compute_cap=(used or gpus)[0].compute_cap, p2p_ok=p2p_ok)


def rendezvous_port(spec: Spec) -> int | None:
    """Rank 0 of a multi-node group listens on dist_init_addr's port for the
    other ranks; None on other hosts."""
    if not spec.is_multinode or spec.node_rank != 0 or not spec.dist_init_addr:
        return None
    return int(spec.dist_init_addr.rsplit(":", 1)[1])


def port_holders(spec: Spec) -> tuple[PortHolder | None, PortHolder | None]:
    """(who listens on listen_port, who listens on rank 0's rendezvous port)."""
    holder = host.get_fact(PortListener, port=spec.listen_port)
    port = rendezvous_port(spec)
    return holder, (host.get_fact(PortListener, port=port) if port else None)


def _port_problem(spec: Spec, holder: PortHolder | None, what: str) -> list[str]:
    if holder is None or holder.unit == spec.unit_name:
        return []
    owner = f" of {holder.unit}" if holder.unit else ""
    return [f"{what} is held by pid {holder.pid} ({holder.process_name}{owner}), not by {spec.unit_name}"]


def preflight_problems(spec: Spec, gpus: list[Gpu], holder: PortHolder | None,
                       dist_holder: PortHolder | None = None) -> list[str]:
    """What in the GPUs and ports makes this host unable to serve the spec (empty when it can)."""
    problems = []
    if not gpus:
        problems.append("no NVIDIA GPU found (nvidia-smi missing or lists none)")
        return problems
    indexes = {gpu.index for gpu in gpus}
    missing = [index for index in spec.gpu_ids if index not in indexes]
    if missing:
        problems.append(
            f"gpu_ids {spec.gpu_ids}: GPU(s) {missing} do not exist; the host has "
            f"{len(indexes)} GPU(s): {sorted(indexes)}"
        )
    used = [gpu for gpu in gpus if gpu.index in spec.gpu_ids]
    if used:
        per_gpu = spec.model_bytes / max(spec.tp_size, 1)
        smallest = min(gpu.memory_total_mib for gpu in used) * 1024 * 1024
        if per_gpu > 0.9 * smallest:
            problems.append(
                f"the model needs ~{gb(per_gpu)} per GPU at TP {spec.tp_size} "
                f"({gb(spec.model_bytes)} / {spec.tp_size}), above 90% of the "
                f"{gb(smallest)} of the smallest GPU"
            )
    problems += _port_problem(spec, holder, f"port {spec.listen_port}")
    problems += _port_problem(spec, dist_holder, f"port {rendezvous_port(spec)} (dist_init_addr "
                                                 f"{spec.dist_init_addr}, where the other ranks join rank 0)")
    return problems


def driver_problems(spec: Spec, gpus: list[Gpu]) -> list[str]:
    """The NVIDIA driver below the spec's min_driver_version."""
    wanted = spec.min_driver_version
    if not wanted or not gpus:
        return []
    have = gpus[0].driver_version

    def key(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", text))

    if key(have) < key(wanted):
        return [f"NVIDIA driver {have} is older than min_driver_version {wanted}"]
    return []


def host_problems(spec: Spec) -> list[str]:
    """Every reason this host cannot take the spec: GPUs, GPU memory, driver, ports, disk."""
    gpus = host.get_fact(NvidiaGpus)
    problems = preflight_problems(spec, gpus, *port_holders(spec)) + driver_problems(spec, gpus)
    try:
        disk = disk_shortfall(spec)
    except Exception as err:  # noqa: BLE001 - the Hub unreachable, a revision it does not know, ...
        disk = f"cannot check the disk: {err}"
    if disk:
        problems.append(disk)
    return problems
