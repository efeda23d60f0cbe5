"""Preflight checks shared by the preflight step and the rollout's fleet
preflight: the spec resolved against the host's GPUs, and every reason the
host cannot take the model (GPUs, driver, the pinned stack, memory fit, disk,
ports), before anything is downloaded or installed.

    spec = resolved_spec(spec)
    problems = host_problems(spec)      # [] when the host can serve the spec
    report = preflight_report(spec)     # problems, plus the plan's notes and warnings
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyinfra import host

from core.capability import stack_check, version_key
from core.disk import disk_shortfall
from core.host_fitness import host_fitness
from core.server_envs import venv_disk_problem
from core.memory_fit import MemoryFit, memory_fit
from facts.gpu import Gpu, GpuP2P, NvidiaGpus, P2PMatrix
from facts.ports import PortHolder, PortListener
from tasks.spec import Spec

# `nvidia-smi topo -p2p r` codes that say P2P does not work between two GPUs ("U": unknown)
P2P_NOT_OK = frozenset({"NS", "CNS", "GNS", "TNS"})


def p2p_verdict(p2p: P2PMatrix | None, gpu_ids: list[int]) -> bool | None:
    """P2P between every pair of gpu_ids: True (all OK), False (a pair is known not
    to work), None (unknown: no matrix, a GPU missing from it, "U" or an unknown code)."""
    if len(gpu_ids) < 2:
        return True
    if p2p is None:
        return None
    positions = {gpu: i for i, gpu in enumerate(p2p.gpus)}
    verdict: bool | None = True
    for a in gpu_ids:
        for b in gpu_ids:
            if a == b:
                continue
            if a not in positions or b not in positions or positions[a] >= len(p2p.status):
                verdict = None
                continue
            row = p2p.status[positions[a]]
            cell = row[positions[b]] if positions[b] < len(row) else "U"
            if cell in P2P_NOT_OK:
                return False
            if cell != "OK":
                verdict = None
    return verdict


def resolved_spec(spec: Spec) -> Spec:
    """The spec with what depends on the host filled in from its GPUs:
    attention backend for "auto", NCCL P2P env (from the P2P matrix only:
    None when unknown). Unchanged on a host without GPUs (the preflight check
    then fails it) or whose compute capability nvidia-smi does not report."""
    gpus = host.get_fact(NvidiaGpus)
    if not gpus:
        return spec
    used = [gpu for gpu in gpus if gpu.index in spec.gpu_ids]
    compute_cap = (used or gpus)[0].compute_cap
    if compute_cap is None:
        return spec
    p2p_ok = p2p_verdict(host.get_fact(GpuP2P), [gpu.index for gpu in used]) if len(used) > 1 else True
    resolved = spec.resolve(compute_cap=compute_cap, p2p_ok=p2p_ok)
    level = host_fitness(resolved, gpus).p2p_level
    return resolved.resolve(compute_cap=compute_cap, p2p_ok=p2p_ok, p2p_level=level) if level else resolved


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
    problems += _port_problem(spec, holder, f"port {spec.listen_port}")
    problems += _port_problem(spec, dist_holder, f"port {rendezvous_port(spec)} (dist_init_addr "
                                                 f"{spec.dist_init_addr}, where the other ranks join rank 0)")
    return problems


def driver_problems(spec: Spec, gpus: list[Gpu]) -> list[str]:
    """The NVIDIA driver below the spec's min_driver_version (or not reported while one is required)."""
    wanted = spec.min_driver_version
    if not wanted or not gpus:
        return []
    have = gpus[0].driver_version
    if have is None:
        return [f"NVIDIA driver version unknown (nvidia-smi reports [N/A]): cannot check min_driver_version {wanted}"]
    if version_key(have) < version_key(wanted):
        return [f"NVIDIA driver {have} is older than min_driver_version {wanted}"]
    return []


@dataclass
class PreflightReport:
    """What the preflight found: problems refuse the host; notes (and WARNING: lines) go in the plan."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    gpus: list[Gpu] = field(default_factory=list)
    fit: MemoryFit | None = None


def preflight_report(spec: Spec) -> PreflightReport:
    """Every check: GPUs and ports, driver, the pinned stack (Python, torch's CUDA
    vs the driver, get-pip tools), the memory fit, the disk."""
    gpus = host.get_fact(NvidiaGpus)
    report = PreflightReport(gpus=gpus)
    report.problems = preflight_problems(spec, gpus, *port_holders(spec)) + driver_problems(spec, gpus)
    stack = stack_check(spec, gpus)
    report.problems += stack.problems
    report.notes += stack.notes
    if gpus:
        fitness = host_fitness(spec, gpus)
        if spec.host_fitness == "fail":
            report.problems += fitness.findings
        else:
            report.notes += [f"WARNING: {finding}" for finding in fitness.findings]
        report.notes += fitness.notes + ([f"NCCL_P2P_LEVEL={fitness.p2p_level}: {fitness.p2p_why}"]
                                         if fitness.p2p_level else [])
        report.fit, notes = memory_fit(spec, gpus)
        report.notes += notes
        if report.fit is not None:
            report.notes.append(report.fit.summary())
            report.problems += report.fit.problems()
            report.notes += report.fit.warnings()
    try:
        disk = disk_shortfall(spec)
    except Exception as err:  # noqa: BLE001 - the Hub unreachable, a revision it does not know, ...
        disk = f"cannot check the disk: {err}"
    if disk:
        report.problems.append(disk)
    venv_disk = venv_disk_problem(spec)
    if venv_disk:
        report.problems.append(venv_disk)
    return report


def host_problems(spec: Spec) -> list[str]:
    """Every reason this host cannot take the spec: GPUs, driver, the pinned stack,
    GPU memory (weights and KV room), ports, disk."""
    return preflight_report(spec).problems
