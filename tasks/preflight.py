"""Preflight: what the host's GPUs are, and whether they can take the model.

Facts (facts/gpu.py): ``NvidiaGpus`` (one ``nvidia-smi --query-gpu`` call),
``GpuP2P`` (``nvidia-smi topo -p2p r``) and ``SimulatedGpus``; ``PortListener``
(facts/ports.py); ``PythonInterpreter`` (facts/interpreter.py) and
``VenvState``; the model's ``ModelConfig`` (or the Hub's config.json). The
venv does not exist yet here, so the GPUs come from nvidia-smi, not NVML.
The step fails before anything changes when the host has fewer GPUs than the
spec uses, a driver or Python the pinned stack cannot run on, or the model
does not fit in their memory (core/checks.py, core/capability.py,
core/memory_fit.py).
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy, operation

from core.checks import preflight_report
from core.ops import fail_command, plan, report
from facts.gpu import SimulatedGpus
from tasks.spec import Spec


def p2p_summary(spec: Spec) -> str:
    """What the NCCL env says of P2P, and why (the P2P fact; extra_env wins)."""
    env = spec.unit_env
    set_by_hand = sorted(k for k in spec.extra_env if k.startswith("NCCL_P2P_"))
    if set_by_hand:
        return "P2P per extra_env (" + ", ".join(f"{k}={env[k]}" for k in set_by_hand) + ")"
    if spec.p2p_ok is False:
        return "P2P off (NCCL_P2P_DISABLE=1)"
    if spec.p2p_ok is None and len(spec.gpu_ids) > 1:
        return "P2P unknown (nothing set: NCCL decides)"
    if spec.p2p_level and len(spec.gpu_ids) > 1:
        return f"P2P OK, NCCL_P2P_LEVEL={spec.p2p_level} (the TP GPUs meet across the CPU interconnect)"
    return "P2P OK (NCCL picks the level)"


@operation()
def gpu_host_can_serve(spec: Spec):
    """
    Fail before anything changes when the host cannot take the model: missing
    GPUs, a driver older than min_driver_version or than the pinned torch's
    CUDA needs, a Python below the pins' Requires-Python, no curl where pip
    must come from get-pip.py, weights that do not fit in GPU memory x
    mem_fraction_static at this TP size, too little disk for the download,
    the port (or rank 0's rendezvous port of a multi-node group) held by
    another program (core/checks.py, shared with the rollout's fleet
    preflight). The plan shows the memory fit (KV cache room in GB and
    tokens) and warns when the KV room is smaller than the context length.

    .. code:: python

        gpu_host_can_serve(spec=spec)
    """
    checked = preflight_report(spec)
    notes = "".join(f"\npreflight: {note}" for note in checked.notes)
    if checked.problems:
        message = "preflight: " + "\npreflight: ".join(checked.problems)
        plan(message + notes)
        yield fail_command(message)
        return
    used = [gpu for gpu in checked.gpus if gpu.index in spec.gpu_ids]
    memory = f"{used[0].memory_total_mib} MiB" if used[0].memory_total_mib is not None else "memory [N/A]"
    cap = used[0].compute_cap or "[N/A]: attention backend and SM env left to SGLang"
    simulated = host.get_fact(SimulatedGpus)
    summary = (
        f"preflight: {len(used)} x {used[0].name} ({memory}, SM {cap}), "
        f"driver {used[0].driver_version or '[N/A]'}, {p2p_summary(spec)}; attention backend {spec.attention_backend}"
        f"{' (auto)' if spec.attention_backend_requested == 'auto' else ''}"
        f"{'; GPUs SIMULATED (sandbox nvidia-smi stand-in)' if simulated else ''}"
    )
    plan(summary + notes)
    for line in (summary + notes).splitlines():
        report(line)
    host.noop(summary)


@deploy("Preflight")
def preflight(spec: Spec) -> None:
    """Facts about GPUs, disk and port; fails early, changes nothing."""
    gpu_host_can_serve(spec=spec, name="preflight: GPUs, disk, port")
