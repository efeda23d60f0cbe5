"""Preflight: what the host's GPUs are, and whether they can take the model.

Facts (facts/gpu.py): ``NvidiaGpus`` (one ``nvidia-smi --query-gpu`` call),
``GpuP2P`` (``nvidia-smi topo -p2p r``) and ``SimulatedGpus``; ``PortListener``
(facts/ports.py). The step fails before anything changes when the host has
fewer GPUs than the spec uses, or the model does not fit in their memory.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy, operation

from facts.gpu import Gpu, GpuP2P, NvidiaGpus, SimulatedGpus
from facts.ports import PortHolder, PortListener
from tasks import model as model_step
from tasks._common import fail_command, gb, plan, report


def resolved_spec(spec):
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


def rendezvous_port(spec) -> int | None:
    """Rank 0 of a multi-node group listens on dist_init_addr's port for the
    other ranks; None on other hosts."""
    if not spec.is_multinode or spec.node_rank != 0 or not spec.dist_init_addr:
        return None
    return int(spec.dist_init_addr.rsplit(":", 1)[1])


def port_holders(spec) -> tuple[PortHolder | None, PortHolder | None]:
    """(who listens on listen_port, who listens on rank 0's rendezvous port)."""
    holder = host.get_fact(PortListener, port=spec.listen_port)
    port = rendezvous_port(spec)
    return holder, (host.get_fact(PortListener, port=port) if port else None)


def preflight_problems(spec, gpus: list[Gpu], holder: PortHolder | None,
                       dist_holder: PortHolder | None = None) -> list[str]:
    """What makes this host unable to serve the spec (empty when it can)."""
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
    if holder is not None and holder.unit != spec.unit_name:
        owner = f" of {holder.unit}" if holder.unit else ""
        problems.append(
            f"port {spec.listen_port} is held by pid {holder.pid} ({holder.process_name}{owner}), "
            f"not by {spec.unit_name}"
        )
    if dist_holder is not None and dist_holder.unit != spec.unit_name:
        owner = f" of {dist_holder.unit}" if dist_holder.unit else ""
        problems.append(
            f"port {rendezvous_port(spec)} (dist_init_addr {spec.dist_init_addr}, where the other ranks join "
            f"rank 0) is held by pid {dist_holder.pid} ({dist_holder.process_name}{owner}), not by {spec.unit_name}"
        )
    return problems


@operation()
def gpu_host_can_serve(spec):
    """
    Fail before anything changes when the host cannot take the model: missing
    GPUs, too little GPU memory for the model at this TP size, too little disk
    for the download, the port (or rank 0's rendezvous port of a multi-node
    group) held by another program.

    .. code:: python

        gpu_host_can_serve(spec=spec)
    """
    gpus = host.get_fact(NvidiaGpus)
    problems = preflight_problems(spec, gpus, *port_holders(spec))
    disk = model_step.disk_shortfall(spec)
    if disk:
        problems.append(disk)
    if problems:
        message = "preflight: " + "\npreflight: ".join(problems)
        plan(message)
        yield fail_command(message)
        return
    used = [gpu for gpu in gpus if gpu.index in spec.gpu_ids]
    p2p = spec.unit_env.get("NCCL_P2P_DISABLE") and "P2P off (NCCL_P2P_DISABLE=1)" or "P2P OK"
    simulated = host.get_fact(SimulatedGpus)
    summary = (
        f"preflight: {len(used)} x {used[0].name} ({used[0].memory_total_mib} MiB, SM {used[0].compute_cap}), "
        f"driver {used[0].driver_version}, {p2p}; attention backend {spec.attention_backend}"
        f"{' (auto)' if spec.attention_backend_requested == 'auto' else ''}"
        f"{'; GPUs SIMULATED (sandbox nvidia-smi stand-in)' if simulated else ''}"
    )
    plan(summary)
    report(summary)
    host.noop(summary)


@deploy("Preflight")
def preflight(spec):
    """Facts about GPUs, disk and port; fails early, changes nothing."""
    gpu_host_can_serve(spec=spec, name="preflight: GPUs, disk, port")
