"""How the GPUs reach each other (``nvidia-smi topo -m``): through one PCIe switch (PIX), several
bridges (PXB), a host bridge (PHB), host bridges within a NUMA node (NODE), across the CPU
interconnect (SYS), or NVLink (NV#); and each GPU's CPU and NUMA affinity. NCCL's P2P level
follows from it (core/host_fitness.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pyinfra.api import FactBase

from facts._value import FactValue

ANSI = re.compile(r"\x1b\[[0-9;]*m")  # nvidia-smi underlines the header row on a terminal
# nvidia-smi's legend, nearest first (NCCL_P2P_LEVEL takes the same names: PIX, PXB, PHB, SYS;
# NODE sits between PHB and SYS)
LINK_ORDER = ("X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS")


def link_rank(link: str) -> int:
    """Nearer links rank lower: X 0, NV# 1, PIX 2, ... SYS 6; an unknown code ranks past SYS."""
    if link.startswith("NV"):
        return 1
    return LINK_ORDER.index(link) if link in LINK_ORDER else len(LINK_ORDER)


@dataclass(frozen=True)
class Topology(FactValue):
    gpus: tuple[int, ...]
    links: dict[str, str] = field(default_factory=dict)  # "i,j" -> "SYS", "PIX", "NV12", ...
    cpu_affinity: dict[str, str] = field(default_factory=dict)  # "GPU index" -> "0-31,64-95"
    numa_affinity: dict[str, str] = field(default_factory=dict)  # "GPU index" -> "0" ("N/A": unknown)

    def link(self, a: int, b: int) -> str | None:
        return self.links.get(f"{a},{b}")


class GpuTopology(FactBase[Topology | None]):
    """
    The GPU rows of ``nvidia-smi topo -m`` (NIC rows and columns and the legend skipped); None when
    nvidia-smi prints no matrix.

    .. code:: python

        topo = host.get_fact(GpuTopology)
        topo.link(0, 4)     # "SYS": GPU 0 and GPU 4 meet across the CPU interconnect
    """

    def requires_command(self) -> str:
        return "nvidia-smi"

    def command(self) -> str:
        return "nvidia-smi topo -m"

    def process(self, output: list[str]) -> Topology | None:
        header: list[str] | None = None
        rows: dict[int, list[str]] = {}
        for line in output:
            if line.startswith("Legend"):
                break
            cells = [cell.strip() for cell in ANSI.sub("", line).split("\t")]
            if header is None and len(cells) > 1 and cells[0] == "" and cells[1].startswith("GPU"):
                header = cells
            elif header is not None and cells[0].startswith("GPU") and cells[0][3:].isdigit():
                rows[int(cells[0][3:])] = cells
        if header is None or not rows:
            return None
        columns = {name: i for i, name in enumerate(header) if name}
        gpu_columns = {int(name[3:]): i for name, i in columns.items() if name.startswith("GPU") and name[3:].isdigit()}
        links, cpus, numa = {}, {}, {}
        for gpu, cells in rows.items():
            for other, i in gpu_columns.items():
                if other != gpu and i < len(cells) and cells[i]:
                    links[f"{gpu},{other}"] = cells[i]
            if "CPU Affinity" in columns and columns["CPU Affinity"] < len(cells):
                cpus[str(gpu)] = cells[columns["CPU Affinity"]]
            if "NUMA Affinity" in columns and columns["NUMA Affinity"] < len(cells):
                numa[str(gpu)] = cells[columns["NUMA Affinity"]]
        return Topology(gpus=tuple(sorted(rows)), links=links, cpu_affinity=cpus, numa_affinity=numa)
