"""Preflight: what the host's GPUs are, and whether they can take the model.

Facts: ``NvidiaGpus`` (one ``nvidia-smi --query-gpu`` call) and ``GpuP2P``
(``nvidia-smi topo -p2p r``). The step fails before anything changes when the
host has fewer GPUs than the spec uses, or the model does not fit in their
memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from tasks._facts import FactValue
from pyinfra.api import FactBase

GPU_QUERY_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "memory.used",
    "compute_cap",
    "driver_version",
    "pci.bus_id",
)


@dataclass(frozen=True)
class Gpu(FactValue):
    index: int
    uuid: str
    name: str
    memory_total_mib: int
    memory_used_mib: int
    compute_cap: str
    driver_version: str
    pci_bus_id: str

    @property
    def memory_free_mib(self) -> int:
        return self.memory_total_mib - self.memory_used_mib


class NvidiaGpus(FactBase[list[Gpu]]):
    """
    The host's NVIDIA GPUs, from one ``nvidia-smi --query-gpu`` call.

    .. code:: python

        gpus = host.get_fact(NvidiaGpus)
        gpus[0].compute_cap  # "12.0"
    """

    def requires_command(self, *args, **kwargs) -> str:
        return "nvidia-smi"

    @staticmethod
    def default() -> list[Gpu]:
        return []

    def command(self) -> str:
        return f"nvidia-smi --query-gpu={','.join(GPU_QUERY_FIELDS)} --format=csv,noheader,nounits"

    def process(self, output) -> list[Gpu]:
        gpus = []
        for line in output:
            if not line.strip():
                continue
            fields = [field.strip() for field in line.split(",")]
            if len(fields) != len(GPU_QUERY_FIELDS):
                raise ValueError(f"unexpected nvidia-smi line: {line!r}")
            index, uuid, name, total, used, cap, driver, bus = fields
            gpus.append(Gpu(int(index), uuid, name, int(total), int(used), cap, driver, bus))
        return gpus


@dataclass(frozen=True)
class P2PMatrix(FactValue):
    gpus: list[int]
    # status[i][j] as nvidia-smi prints it: "X" (self), "OK", "NS", "CNS", ...
    status: list[list[str]]

    @property
    def all_ok(self) -> bool:
        return all(cell in ("X", "OK") for row in self.status for cell in row)


class GpuP2P(FactBase[P2PMatrix | None]):
    """
    The GPUs' peer-to-peer read capability (``nvidia-smi topo -p2p r``).

    ``all_ok`` False means NCCL must not use P2P (``NCCL_P2P_DISABLE=1``).

    .. code:: python

        p2p = host.get_fact(GpuP2P)
        p2p.all_ok
    """

    def requires_command(self, *args, **kwargs) -> str:
        return "nvidia-smi"

    def command(self) -> str:
        return "nvidia-smi topo -p2p r"

    def process(self, output) -> P2PMatrix | None:
        gpus: list[int] = []
        status: list[list[str]] = []
        for line in output:
            cells = line.split()
            if not cells:
                if status:
                    break  # the legend follows the matrix
                continue
            if all(cell.startswith("GPU") for cell in cells) and not status:
                gpus = [int(cell[3:]) for cell in cells]
            elif cells[0].startswith("GPU") and gpus:
                status.append(cells[1 : len(gpus) + 1])
        if not gpus:
            return None
        return P2PMatrix(gpus=gpus, status=status)


# --- the port, and the checks -------------------------------------------------

import re  # noqa: E402

from pyinfra import host  # noqa: E402
from pyinfra.api import StringCommand, deploy, operation  # noqa: E402

from tasks import model as model_step  # noqa: E402
from tasks._common import fail_command, gb, plan, report  # noqa: E402
from tasks.stale_gpu import unit_from_cgroup  # noqa: E402


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
    """

    def command(self, port: int) -> StringCommand:
        return StringCommand(
            f"line=$(ss -Hltnp 'sport = :{int(port)}' 2>/dev/null | head -n 1); "
            '[ -n "$line" ] || exit 0; echo "listen: $line"; '
            'pid=$(printf "%s" "$line" | sed -n "s/.*pid=\\([0-9]*\\).*/\\1/p"); '
            '[ -n "$pid" ] && sed "s/^/cgroup: /" "/proc/$pid/cgroup" 2>/dev/null; true'
        )

    def process(self, output) -> PortHolder | None:
        listen = next((line for line in output if line.startswith("listen: ")), None)
        if listen is None:
            return None
        match = re.search(r'users:\(\("([^"]*)",pid=(\d+)', listen)
        cgroup = [line[8:] for line in output if line.startswith("cgroup: ")]
        if not match:
            return PortHolder(pid=0, process_name="?", unit=None)
        return PortHolder(pid=int(match.group(2)), process_name=match.group(1), unit=unit_from_cgroup(cgroup))


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


class SimulatedGpus(FactBase[bool]):
    """
    True on sandbox hosts, whose nvidia-smi is the test bed's stand-in.

    .. code:: python

        host.get_fact(SimulatedGpus)
    """

    def command(self) -> str:
        return "test -e /etc/sandbox-gpu/SIMULATED && echo yes || echo no"

    def process(self, output) -> bool:
        return bool(output) and output[0].strip() == "yes"


@deploy("Preflight")
def preflight(spec):
    """Facts about GPUs, disk and port; fails early, changes nothing."""
    gpu_host_can_serve(spec=spec, name="preflight: GPUs, disk, port")
