"""Where the GPUs sit on PCIe: the bridges between each GPU and its root complex with their ACS
control (``lspci -vvv``), and each GPU's IOMMU group and its domain type (sysfs). ACS redirect on
those bridges, or an IOMMU that translates the GPUs' addresses, sends peer traffic up to the root
complex: NCCL's first all-reduce can hang there while nvidia-smi reports P2P OK
(core/host_fitness.py).

The GPUs are named by their sysfs address, ``0000:c1:00.0`` (``sysfs_address`` turns nvidia-smi's
``00000000:C1:00.0`` into it)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from pyinfra.api import FactBase, QuoteString, StringCommand

from facts._value import FactValue

BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def sysfs_address(bus_id: str) -> str:
    """nvidia-smi's pci.bus_id (``00000000:C1:00.0``) as sysfs names the device (``0000:c1:00.0``)."""
    return bus_id.strip().lower()[-12:]


def _addresses(bus_ids: str) -> list[QuoteString]:
    found = [sysfs_address(b) for b in bus_ids.split()]
    bad = [b for b in found if not BDF.match(b)]
    if bad:
        raise ValueError(f"not PCI addresses: {bad}")
    return [QuoteString(b) for b in found]


@dataclass(frozen=True)
class IommuDevice(FactValue):
    present: bool  # the device is in sysfs (False: a simulated GPU, a wrong address)
    group: int | None = None  # its IOMMU group (None: no IOMMU group: the IOMMU is off for it)
    domain_type: str | None = None  # the group's default domain: identity (passthrough), DMA, DMA-FQ, ...


@dataclass(frozen=True)
class IommuView(FactValue):
    units: tuple[str, ...]  # /sys/class/iommu: the IOMMU hardware units the kernel runs (dmar0, ivhd0, ...)
    devices: dict[str, IommuDevice] = field(default_factory=dict)


class IommuGroups(FactBase[IommuView]):
    """
    The IOMMU units the kernel runs, and for each given device its IOMMU group and the group's
    domain type (``/sys/kernel/iommu_groups/<n>/type``: "identity" is passthrough, "DMA" and
    "DMA-FQ" translate; Documentation/ABI/testing/sysfs-kernel-iommu_groups).

    .. code:: python

        view = host.get_fact(IommuGroups, bus_ids="0000:01:00.0 0000:02:00.0")
        view.devices["0000:01:00.0"].domain_type     # "identity"
    """

    def command(self, bus_ids: str) -> StringCommand:
        return StringCommand(
            "set --", *_addresses(bus_ids), "; for c in /sys/class/iommu/*; do [ -e \"$c\" ] && echo \"unit ${c##*/}\"; "
            'done; for d in "$@"; do p=/sys/bus/pci/devices/$d; [ -e "$p" ] || { echo "device $d missing"; continue; }; '
            'g=$(readlink "$p/iommu_group" 2>/dev/null); g=${g##*/}; [ -n "$g" ] || { echo "device $d nogroup"; '
            'continue; }; echo "device $d group $g $(cat /sys/kernel/iommu_groups/$g/type 2>/dev/null || echo -)"; '
            "done; true",
        )

    def process(self, output: list[str]) -> IommuView:
        units, devices = [], {}
        for line in output:
            words = line.split()
            if len(words) == 2 and words[0] == "unit":
                units.append(words[1])
            elif len(words) >= 3 and words[0] == "device":
                if words[2] == "missing":
                    devices[words[1]] = IommuDevice(present=False)
                elif words[2] == "nogroup":
                    devices[words[1]] = IommuDevice(present=True)
                elif words[2] == "group" and len(words) >= 4:
                    kind = words[4] if len(words) > 4 and words[4] != "-" else None
                    devices[words[1]] = IommuDevice(present=True, group=int(words[3]), domain_type=kind)
        return IommuView(units=tuple(units), devices=devices)


@dataclass(frozen=True)
class Bridge(FactValue):
    address: str
    description: str  # lspci's line for it, e.g. "PCI bridge: Broadcom / LSI PEX890xx ..."
    acs_control: dict[str, bool] | None  # ACSCtl flags (ReqRedir, CmpltRedir, ...); None: no ACS capability
    # lspci printed "Capabilities: <access denied>" (pciutils ls-caps.c show_caps: the config space past
    # the first 64 bytes is root's): its ACS is unknown, not absent
    capabilities_denied: bool = False


@dataclass(frozen=True)
class PciPaths(FactValue):
    lspci: bool  # lspci is installed (without it no bridge's ACS is known)
    paths: dict[str, tuple[str, ...]]  # GPU -> the bridges above it, root port first (missing GPUs absent)
    bridges: dict[str, Bridge] = field(default_factory=dict)
    missing: tuple[str, ...] = ()  # GPUs not in sysfs


def acs_flags(text: str) -> dict[str, bool]:
    """``ACSCtl: SrcValid+ TransBlk- ReqRedir+ ...`` (pciutils ls-ecaps.c cap_acs) as {flag: on}."""
    return {m[1]: m[2] == "+" for m in re.finditer(r"(\w+)([+-])", text.split(":", 1)[-1])}


class PciAcsPaths(FactBase[PciPaths]):
    """
    The PCIe bridges between each given GPU and its root complex (the sysfs path of the device),
    and each bridge's ACS control from ``lspci -vvv`` (root needed for extended capabilities).

    .. code:: python

        paths = host.get_fact(PciAcsPaths, bus_ids="0000:c1:00.0")
        [paths.bridges[b].acs_control for b in paths.paths["0000:c1:00.0"]]
    """

    def command(self, bus_ids: str) -> StringCommand:
        return StringCommand(
            "set --", *_addresses(bus_ids), "; command -v lspci >/dev/null 2>&1 && echo lspci; "
            'for d in "$@"; do p=$(readlink -f "/sys/bus/pci/devices/$d" 2>/dev/null); '
            '[ -n "$p" ] && [ -e "$p" ] && echo "path $d $p" || echo "missing $d"; done; '
            'for b in $(for d in "$@"; do readlink -f "/sys/bus/pci/devices/$d" 2>/dev/null; done | tr / "\\n" | '
            "grep -E '^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]$' | sort -u); do "
            'case " $* " in *" $b "*) continue;; esac; echo "bridge $b"; '
            "lspci -vvv -s \"$b\" 2>/dev/null | grep -E '^[0-9a-f]|ACSCtl:|<access denied>'; done; true",
        )

    def process(self, output: list[str]) -> PciPaths:
        has_lspci, paths, missing = False, {}, []
        bridges: dict[str, Bridge] = {}
        current: str | None = None
        for line in output:
            words = line.split()
            if line.strip() == "lspci":
                has_lspci = True
            elif len(words) == 3 and words[0] == "path":
                found = [part for part in words[2].split("/") if BDF.match(part)]
                paths[words[1]] = tuple(part for part in found if part != words[1])
            elif len(words) == 2 and words[0] == "missing":
                missing.append(words[1])
            elif len(words) == 2 and words[0] == "bridge":
                current = words[1]
                bridges[current] = Bridge(current, "", None)
            elif current and "ACSCtl:" in line:
                bridges[current] = replace(bridges[current], acs_control=acs_flags(line))
            elif current and "<access denied>" in line:
                bridges[current] = replace(bridges[current], capabilities_denied=True)
            elif current and line and not line[0].isspace():
                bridges[current] = replace(bridges[current], description=line.split(" ", 1)[-1].strip())
        return PciPaths(lspci=has_lspci, paths=paths, bridges=bridges, missing=tuple(missing))
