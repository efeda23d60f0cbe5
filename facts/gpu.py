"""NVIDIA GPUs: what nvidia-smi says of the host's GPUs, their P2P matrix and
the compute processes on them (with the systemd unit that owns each).

nvidia-smi prints ``[N/A]`` or ``[Not Supported]`` for values a GPU cannot
report (memory on unified-memory GPUs such as GB10 / GH200, some MIG modes):
those parse as None, never as a guess; the checks that need them say so."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyinfra.api import FactBase

from facts._value import FactValue
from facts.systemd import unit_from_cgroup

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


# what nvidia-smi prints for a value the GPU cannot report (in csv, with or without units)
UNAVAILABLE = ("[N/A]", "[Not Supported]", "N/A", "[Unknown Error]", "[Insufficient Permissions]")


def smi_text(value: str) -> str | None:
    """A csv field of nvidia-smi, None when it says the value is not available.

    >>> smi_text("12.0"), smi_text("[N/A]"), smi_text("[Not Supported]")
    ('12.0', None, None)
    """
    value = value.strip()
    return None if not value or value in UNAVAILABLE else value


def smi_int(value: str) -> int | None:
    """A numeric csv field of nvidia-smi (``nounits``), None when not available.

    >>> smi_int("97887"), smi_int("[N/A]")
    (97887, None)
    """
    text = smi_text(value)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"nvidia-smi printed {value!r} where a number was expected") from None


@dataclass(frozen=True)
class Gpu(FactValue):
    index: int
    uuid: str
    name: str
    memory_total_mib: int | None  # None: nvidia-smi says [N/A] / [Not Supported] (unified memory, MIG)
    memory_used_mib: int | None
    compute_cap: str | None
    driver_version: str | None
    pci_bus_id: str | None

    @property
    def memory_free_mib(self) -> int | None:
        if self.memory_total_mib is None or self.memory_used_mib is None:
            return None
        return self.memory_total_mib - self.memory_used_mib


class NvidiaGpus(FactBase[list[Gpu]]):
    """
    The host's NVIDIA GPUs, from one ``nvidia-smi --query-gpu`` call
    (index, uuid, name, memory, compute capability, driver, PCI bus id).

    .. code:: python

        gpus = host.get_fact(NvidiaGpus)
        gpus[0].compute_cap, gpus[0].driver_version  # "12.0", "580.95.05"
        gpus[0].memory_total_mib  # None on a unified-memory GPU (nvidia-smi: [N/A])
    """

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "nvidia-smi"

    @staticmethod
    def default() -> list[Gpu]:
        return []

    def command(self) -> str:
        return f"nvidia-smi --query-gpu={','.join(GPU_QUERY_FIELDS)} --format=csv,noheader,nounits"

    def process(self, output: list[str]) -> list[Gpu]:
        gpus = []
        for line in output:
            if not line.strip():
                continue
            fields = [field.strip() for field in line.split(",")]
            if len(fields) != len(GPU_QUERY_FIELDS):
                raise ValueError(f"unexpected nvidia-smi line: {line!r}")
            index, uuid, name, total, used, cap, driver, bus = fields
            gpus.append(Gpu(int(index), uuid, smi_text(name) or "?", smi_int(total), smi_int(used),
                            smi_text(cap), smi_text(driver), smi_text(bus)))
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

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "nvidia-smi"

    def command(self) -> str:
        return "nvidia-smi topo -p2p r"

    def process(self, output: list[str]) -> P2PMatrix | None:
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


@dataclass(frozen=True)
class GpuProcess(FactValue):
    pid: int
    process_name: str
    used_mib: int | None  # None: nvidia-smi says [N/A] (unified memory, some MIG modes)
    gpu_uuid: str
    # innermost systemd unit of the process ("foo.service", "session-3.scope"), or None
    unit: str | None


class GpuComputeProcesses(FactBase[list[GpuProcess]]):
    """
    Compute processes on the host's GPUs, each with its owning systemd unit
    (from /proc/PID/cgroup: a process of another unit must be stopped through
    systemd, a plain kill is undone by ``Restart=always``).

    One line per process per GPU, as ``nvidia-smi --query-compute-apps`` gives.

    .. code:: python

        for process in host.get_fact(GpuComputeProcesses):
            print(process.pid, process.unit, process.used_mib)
    """

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "nvidia-smi"

    @staticmethod
    def default() -> list[GpuProcess]:
        return []

    def command(self) -> str:
        return (
            "apps=$(nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid,process_name"
            " --format=csv,noheader,nounits) || exit 1; "
            'printf "%s\\n" "$apps" | grep . | sed "s/^/app: /"; '
            'for pid in $(printf "%s\\n" "$apps" | cut -d, -f1 | sort -u); do '
            'sed "s|^|cgroup: $pid |" "/proc/$pid/cgroup" 2>/dev/null; done; true'
        )

    def process(self, output: list[str]) -> list[GpuProcess]:
        apps = []
        cgroups: dict[int, list[str]] = {}
        for line in output:
            if line.startswith("app: "):
                fields = [field.strip() for field in line[5:].split(",", 3)]
                pid, used, uuid, name = fields
                apps.append((int(pid), name, smi_int(used), uuid))
            elif line.startswith("cgroup: "):
                pid, cgroup_line = line[8:].split(" ", 1)
                cgroups.setdefault(int(pid), []).append(cgroup_line)
        return [
            GpuProcess(pid, name, used, uuid, unit_from_cgroup(cgroups.get(pid, [])))
            for pid, name, used, uuid in apps
        ]


class SimulatedGpus(FactBase[bool]):
    """
    True on sandbox hosts, whose nvidia-smi is the test bed's stand-in.

    .. code:: python

        host.get_fact(SimulatedGpus)
    """

    def command(self) -> str:
        return "test -e /etc/sandbox-gpu/SIMULATED && echo yes || echo no"

    def process(self, output: list[str]) -> bool:
        return bool(output) and output[0].strip() == "yes"
