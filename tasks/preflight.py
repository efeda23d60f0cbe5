"""Preflight: what the host's GPUs are, and whether they can take the model.

Facts (facts/gpu.py): ``NvidiaGpus`` (one ``nvidia-smi --query-gpu`` call),
``GpuP2P`` (``nvidia-smi topo -p2p r``) and ``SimulatedGpus``; ``PortListener``
(facts/ports.py). The step fails before anything changes when the host has
fewer GPUs than the spec uses, or the model does not fit in their memory.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy, operation

from core.checks import host_problems
from core.ops import fail_command, plan, report
from facts.gpu import NvidiaGpus, SimulatedGpus
from tasks.spec import Spec


@operation()
def gpu_host_can_serve(spec: Spec):
    """
    Fail before anything changes when the host cannot take the model: missing
    GPUs, too little GPU memory for the model at this TP size, a driver older
    than min_driver_version, too little disk for the download, the port (or
    rank 0's rendezvous port of a multi-node group) held by another program
    (core/checks.py, shared with the rollout's fleet preflight).

    .. code:: python

        gpu_host_can_serve(spec=spec)
    """
    problems = host_problems(spec)
    if problems:
        message = "preflight: " + "\npreflight: ".join(problems)
        plan(message)
        yield fail_command(message)
        return
    used = [gpu for gpu in host.get_fact(NvidiaGpus) if gpu.index in spec.gpu_ids]
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
def preflight(spec: Spec) -> None:
    """Facts about GPUs, disk and port; fails early, changes nothing."""
    gpu_host_can_serve(spec=spec, name="preflight: GPUs, disk, port")
