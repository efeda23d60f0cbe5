"""Host fitness for PCIe multi-GPU tensor parallelism: what hangs NCCL, seen before the launch.

On 8x RTX PRO 6000 hosts NCCL's first all-reduce hangs when GPU peer traffic goes through IOMMU
translation or ACS redirect on the PCIe bridges, while nvidia-smi reports P2P OK (NVIDIA/nccl
#2079 and #1999, local-inference-lab/rtx6kpro#15, vllm#33041). Each finding names the GPUs, the
bridge or setting, and the fix:

- an IOMMU that translates for the TP GPUs (their IOMMU group's domain type DMA or DMA-FQ, not
  identity): boot with ``iommu=pt`` (or the IOMMU off: ``intel_iommu=off`` / ``amd_iommu=off``);
- ACS redirect (ACSCtl ReqRedir+ or CmpltRedir+) on a bridge between a TP GPU and its root
  complex: ``setpci -s <bridge> ECAP_ACS+0x6.w=0000`` at every boot (NCCL's troubleshooting
  guide), or ``pci=noacs`` where the kernel has it;
- nvidia_uvm's HMM on (``uvm_disable_hmm`` N): a warning (operators report NCCL lockups without
  ``options nvidia_uvm uvm_disable_hmm=1``: rtx6kpro models/kimi-k25.md).

``host_fitness`` decides what a finding does: "fail" (the default) refuses the host in the
preflight, "warn" prints it, "off" reads nothing. GPUs not in sysfs cannot be judged: said, not
failed. The sandbox presents its simulated GPUs' PCIe tree in sysfs, /proc/cmdline and lspci
(sandbox/pcisim.py): they are judged like real ones, and the preflight says SIMULATED.

The P2P level follows from the topology: TP GPUs that meet only across the CPU interconnect
(``nvidia-smi topo -m``: SYS) get ``NCCL_P2P_LEVEL=SYS``, else NCCL falls back to shared memory
there (Kimi at 25-44 tok/s instead of 73-90: rtx6kpro models/kimi-k25.md, optimization/
nccl-tuning.md). Not where P2P is known broken (NCCL_P2P_DISABLE), set by hand in extra_env, or
where a finding above stands (P2P would hang there).

    fitness = host_fitness(spec, gpus)     # Fitness: problems, notes, p2p_level and why
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyinfra import host

from facts.cpu import CpuSockets
from facts.gpu import SimulatedGpus
from facts.gpu_topology import GpuTopology, Topology
from facts.kernel import KernelCmdline, NvidiaUvmHmm
from facts.pci import BDF, IommuDevice, IommuGroups, IommuView, PciAcsPaths, PciPaths, sysfs_address

if TYPE_CHECKING:
    from facts.gpu import Gpu
    from tasks.spec import Spec

TRANSLATING = ("DMA", "DMA-FQ")  # sysfs-kernel-iommu_groups: "identity" is passthrough
REDIRECT_FLAGS = ("ReqRedir", "CmpltRedir")
SOURCES = "NVIDIA/nccl#2079, #1999, local-inference-lab/rtx6kpro#15"


@dataclass
class Fitness:
    findings: list[str] = field(default_factory=list)  # what hangs NCCL, each with its fix
    notes: list[str] = field(default_factory=list)  # warnings and what could not be judged
    p2p_level: str | None = None  # NCCL_P2P_LEVEL the topology asks for
    p2p_why: str = ""


def _gpu_list(indexes: list[int]) -> str:
    return "GPU " + ", ".join(map(str, indexes)) if len(indexes) == 1 else "GPUs " + ", ".join(map(str, indexes))


def iommu_findings(used: dict[str, int], view: IommuView, cmdline: dict[str, str]) -> list[str]:
    """IOMMU translation for the TP GPUs (``used``: sysfs address -> GPU index)."""
    by_type: dict[str, list[int]] = {}
    for address, index in used.items():
        device = view.devices.get(address)
        if device and device.present and device.domain_type in TRANSLATING:
            by_type.setdefault(device.domain_type, []).append(index)
    vendor = "amd_iommu" if any(u.startswith("ivhd") for u in view.units) else "intel_iommu"
    found = []
    for kind, indexes in sorted(by_type.items()):
        now = " ".join(f"{k}={cmdline[k]}" if cmdline[k] else k for k in ("iommu", vendor) if k in cmdline)
        found.append(f"IOMMU translation on for {_gpu_list(sorted(indexes))} (IOMMU domain type {kind}; kernel "
                     f"command line: {now or 'no iommu option'}): their peer traffic goes through the IOMMU and "
                     f"NCCL's first all-reduce can hang while nvidia-smi reports P2P OK ({SOURCES}); fix: add "
                     f"iommu=pt to the kernel command line (GRUB_CMDLINE_LINUX in /etc/default/grub, update-grub, "
                     f"reboot), or turn the IOMMU off ({vendor}=off)")
    return found


def bridges_above(used: dict[str, int], paths: PciPaths) -> dict[str, list[int]]:
    """Each bridge between a TP GPU and its root complex -> the GPU indexes below it."""
    below: dict[str, list[int]] = {}
    for address, index in used.items():
        for bridge in paths.paths.get(address, ()):
            below.setdefault(bridge, []).append(index)
    return below


def acs_findings(used: dict[str, int], paths: PciPaths) -> list[str]:
    """ACS redirect on the bridges between the TP GPUs and their root complexes."""
    found = []
    for bridge, indexes in sorted(bridges_above(used, paths).items()):
        info = paths.bridges.get(bridge)
        flags = [f"{flag}+" for flag in REDIRECT_FLAGS if info and info.acs_control and info.acs_control.get(flag)]
        if flags:
            what = f" ({info.description})" if info and info.description else ""
            found.append(f"ACS redirect on PCIe bridge {bridge}{what} above {_gpu_list(sorted(indexes))} (ACSCtl "
                         f"{' '.join(flags)}): peer traffic is sent up to the root complex and NCCL's first all-reduce "
                         f"can hang while nvidia-smi reports P2P OK ({SOURCES}); fix: setpci -s {bridge} "
                         "ECAP_ACS+0x6.w=0000 at every boot (a systemd unit before the server; NCCL's troubleshooting "
                         "guide, PCI Access Control Services), or pci=noacs where the kernel has it")
    return found


def unread_bridges(used: dict[str, int], paths: PciPaths) -> list[str]:
    """The bridges above the TP GPUs whose capabilities lspci could not read (not root): ACS unknown."""
    return sorted(b for b in bridges_above(used, paths) if b in paths.bridges and paths.bridges[b].capabilities_denied)


def sys_pairs(indexes: list[int], topo: Topology | None) -> list[tuple[int, int]]:
    """The pairs of ``indexes`` that meet only across the CPU interconnect (nvidia-smi topo -m: SYS)."""
    if topo is None or not topo.gpus:
        return []
    return [(a, b) for a in indexes for b in indexes if a < b and topo.link(a, b) == "SYS"]


def p2p_level(indexes: list[int], topo: Topology | None, sockets: int | None) -> tuple[str | None, str]:
    """("SYS", why) when two TP GPUs meet only across the CPU interconnect; (None, why) otherwise."""
    if topo is None or not topo.gpus or len(indexes) < 2:
        return None, "" if len(indexes) < 2 else "the GPU topology is unknown (nvidia-smi topo -m): NCCL picks"
    pairs = sys_pairs(indexes, topo)
    if not pairs:
        return None, "the TP GPUs meet within a CPU socket (nvidia-smi topo -m): NCCL picks the level"
    a, b = pairs[0]
    boards = f"; {sockets} CPU sockets" if sockets else ""
    return "SYS", (f"{len(pairs)} pair(s) of TP GPUs meet only across the CPU interconnect (nvidia-smi topo -m: "
                   f"SYS, e.g. GPU {a} and GPU {b}{boards}): without it NCCL falls back to shared memory there "
                   "(Kimi at 25-44 tok/s instead of 73-90: rtx6kpro optimization/nccl-tuning.md)")


def decide_p2p(spec: Spec, indexes: list[int], topo: Topology | None, sockets: int | None,
               findings: list[str]) -> tuple[str | None, str]:
    """NCCL_P2P_LEVEL from the topology, unless set by hand, P2P is known broken or a finding stands."""
    level, why = p2p_level(indexes, topo, sockets)
    set_by_hand = sorted(k for k in spec.extra_env if k.startswith("NCCL_P2P_"))
    if level and set_by_hand:
        return None, f"NCCL_P2P_* set in extra_env ({', '.join(set_by_hand)}); the topology would ask for SYS"
    if level and spec.p2p_ok is False:
        return None, "P2P is known broken between the GPUs (NCCL_P2P_DISABLE=1)"
    if level and findings:
        return None, "NCCL_P2P_LEVEL=SYS held back: P2P would hang on this host until the findings are fixed"
    return level, why


def judge(spec: Spec, gpus: list[Gpu], cmdline: dict[str, str], hmm_off: bool | None, view: IommuView,
          paths: PciPaths, topo: Topology | None, sockets: int | None) -> Fitness:
    """The verdicts from the facts (no host access)."""
    fitness = Fitness()
    used_gpus = [gpu for gpu in gpus if gpu.index in spec.gpu_ids]
    indexes = sorted(gpu.index for gpu in used_gpus)
    if len(used_gpus) < 2:
        return fitness  # no peer traffic
    used = {sysfs_address(gpu.pci_bus_id): gpu.index for gpu in used_gpus if gpu.pci_bus_id}
    missing = sorted(index for address, index in used.items() if address in paths.missing
                     or not view.devices.get(address, None) or not view.devices[address].present)
    if missing:
        fitness.notes.append(f"host fitness: {_gpu_list(missing)} not in sysfs (simulated GPUs?): IOMMU and ACS "
                             "not checked for them")
    if not paths.lspci:
        fitness.notes.append("host fitness: lspci is not installed (apt install pciutils): ACS on the GPUs' bridges "
                             "not checked")
    unread = unread_bridges(used, paths)
    if unread:
        fitness.notes.append(f"host fitness: ACS not checked on PCIe bridge(s) {', '.join(unread)}: lspci printed "
                             "'Capabilities: <access denied>' (it ran without root); run the deploy as root "
                             "(ssh_user root, or _sudo=True)")
    fitness.findings = iommu_findings(used, view, cmdline) + acs_findings(used, paths)
    if hmm_off is False:
        fitness.notes.append("WARNING: nvidia_uvm's HMM is on (uvm_disable_hmm=N): operators of 8x RTX PRO 6000 "
                             "report NCCL lockups without it off (rtx6kpro models/kimi-k25.md); fix: "
                             "'options nvidia_uvm uvm_disable_hmm=1' in /etc/modprobe.d/, then reload nvidia_uvm")
    fitness.p2p_level, fitness.p2p_why = decide_p2p(spec, indexes, topo, sockets, fitness.findings)
    return fitness


def host_fitness(spec: Spec, gpus: list[Gpu]) -> Fitness:
    """Read the facts and judge. With host_fitness "off" only the topology is read (the P2P level); the CPU
    sockets only when it has SYS pairs. On the sandbox's simulated GPUs the facts read its SIMULATED tree
    (sandbox/pcisim.py), said in a note."""
    used = sorted(g.index for g in gpus if g.index in spec.gpu_ids)
    if len(used) < 2:
        return Fitness()
    topo = host.get_fact(GpuTopology)
    sockets = host.get_fact(CpuSockets) if sys_pairs(used, topo) else None
    if spec.host_fitness == "off":
        fitness = Fitness()
        fitness.p2p_level, fitness.p2p_why = decide_p2p(spec, used, topo, sockets, [])
        return fitness
    bus_ids = " ".join(a for a in (sysfs_address(g.pci_bus_id or "") for g in gpus if g.index in spec.gpu_ids)
                       if BDF.match(a))
    view = host.get_fact(IommuGroups, bus_ids=bus_ids) if bus_ids else IommuView(units=())
    paths = host.get_fact(PciAcsPaths, bus_ids=bus_ids) if bus_ids else PciPaths(lspci=False, paths={})
    fitness = judge(spec, gpus, host.get_fact(KernelCmdline), host.get_fact(NvidiaUvmHmm), view, paths, topo, sockets)
    in_sysfs = bool(bus_ids) and all(view.devices.get(a, IommuDevice(present=False)).present for a in bus_ids.split())
    # == True: pyinfra-testing hands an unkeyed fact's False over in an object that is truthy but compares equal
    if in_sysfs and host.get_fact(SimulatedGpus) == True:  # noqa: E712
        fitness.notes.append(f"host fitness: {_gpu_list(used)} judged on the sandbox's SIMULATED PCIe tree "
                             f"(IOMMU {_iommu_state(view, bus_ids.split())}; the {len(paths.bridges)} bridge(s) above them "
                             "read by its lspci stand-in)")
    return fitness


def _iommu_state(view: IommuView, addresses: list[str]) -> str:
    """What the IOMMU does for these devices, in a few words: "off", "identity", "DMA-FQ", ..."""
    kinds = sorted({view.devices[a].domain_type or "no group" for a in addresses if a in view.devices})
    return "off" if not view.units and kinds == ["no group"] else "domain " + "/".join(kinds)
