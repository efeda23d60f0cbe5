"""The PCIe tree of a sandbox host's simulated GPUs: what the host-fitness facts read, SIMULATED.

core/host_fitness.py judges a host from the kernel command line (/proc/cmdline), each TP GPU's
sysfs device (/sys/bus/pci/devices/<bdf>: a link to its path through the bridges to a root port,
and its iommu_group link), the group's domain type (/sys/kernel/iommu_groups/<n>/type), the IOMMU
units (/sys/class/iommu) and each bridge's ACS control (``lspci -vvv``; facts/pci.py,
facts/kernel.py). A sandbox host presents all of it for its simulated GPUs (gpusim's pci_bus_id)
in the kernel's and pciutils' formats:

- write_tree() writes the tree into the guest's root, under TREE_DIR (/etc/sandbox-gpu/pci):
  sys/devices/pci0000:00, sys/bus/pci/devices, sys/kernel/iommu_groups, sys/class/iommu and
  proc/cmdline, with relative links as the kernel makes them; systemd-nspawn binds each read-only
  over the kernel's own at every boot (nspawn_binds()). The rest of the guest's /sys and /proc
  stays the kernel's.
- MODEL_PATH (/etc/sandbox-gpu/pci.json): the same devices for the lspci stand-in
  (sandbox/lspci.py behind /usr/local/bin/lspci in the guest: lspci_wrapper), with each bridge's
  ACS control; FAST_DIR: each device's ``lspci -vvv -s`` output, rendered by the stand-in at install.

The layout: the PCIe root every machine's sysfs has (pci0000:00, the one there is to bind over),
a root port and a PCIe switch per half of the GPUs (the halves the nvidia-smi stand-in's
``topo -m`` puts on two CPU sockets; a real dual-socket board has a root complex per socket), each
GPU below a switch downstream port; AMD's IOMMU (ivhd0 at 00:00.2). Every device name says
[SIMULATED] (lspci's lines, hence the preflight's findings).

The state, per host (layout["pci"]; sandbox.hosts.up(iommu=..., acs_redirect=...)):

- iommu: "pt" (the default: passthrough, domain type identity, iommu=pt on the command line),
  "off" (no IOMMU unit and no group; amd_iommu=off iommu=off), "dma-fq" (the kernel's default
  translation, no iommu option), "dma" (strict translation, iommu.strict=1).
- acs_redirect: the GPUs whose downstream port has ACSCtl ReqRedir+ CmpltRedir+; none by default
  (what ``setpci -s BRIDGE ECAP_ACS+0x6.w=0000`` leaves); "all": every root and downstream port,
  as a kernel without pci=noacs enables ACS at boot.

The default is a good host. write_tree rewrites in place (the bound directories and the command
line file keep their inodes): up() on a running host changes what its guest reads at once.
Stdlib only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

TREE_DIR = "/etc/sandbox-gpu/pci"  # in the guest's root
MODEL_PATH = "/etc/sandbox-gpu/pci.json"
ROOT_BUS = "pci0000:00"
# the parts of TREE_DIR nspawn binds over the kernel's /sys (the same relative layout: links resolve in both)
SYSFS_PARTS = (f"sys/devices/{ROOT_BUS}", "sys/bus/pci/devices", "sys/kernel/iommu_groups", "sys/class/iommu")
CMDLINE = "proc/cmdline"
# iommu setting -> (the groups' default domain type, None: no IOMMU; what the command line says)
IOMMU = {"pt": ("identity", "iommu=pt"), "off": (None, "amd_iommu=off iommu=off"), "dma-fq": ("DMA-FQ", ""),
         "dma": ("DMA", "iommu.strict=1")}
BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
# pciutils ls-ecaps.c cap_acs: the flags in its order; ACSCtl as a kernel sets it at boot (ROCm/rccl#547),
# and as setpci ECAP_ACS+0x6.w=0000 leaves it
ACS_CAP = "SrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+ DirectTrans+"
ACS_REDIRECT = "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"
ACS_CLEARED = "SrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-"
SIMULATED = "[SIMULATED]"


def settings(iommu: str = "pt", acs_redirect: str | list[int] | None = None) -> dict:
    """layout["pci"]: {"iommu": ..., "acs_redirect": "all" or GPU indexes}; acs_redirect as a string: "",
    "all" or "0,3".

    >>> settings("dma-fq", "0,3")
    {'iommu': 'dma-fq', 'acs_redirect': [0, 3]}
    """
    if iommu not in IOMMU:
        raise ValueError(f"iommu {iommu!r}: one of {sorted(IOMMU)}")
    if isinstance(acs_redirect, str):
        text = acs_redirect.strip()
        acs: str | list[int] = "all" if text == "all" else [int(i) for i in text.split(",") if i.strip()]
    else:
        acs = sorted(int(i) for i in acs_redirect or [])
    return {"iommu": iommu, "acs_redirect": acs}


def sysfs_address(bus_id: str) -> str:
    """nvidia-smi's 00000000:18:00.0 as sysfs names it (0000:18:00.0), like facts.pci.sysfs_address."""
    return bus_id.strip().lower()[-12:]


AMD = "Advanced Micro Devices, Inc. [AMD]"
SWITCH = "Broadcom / LSI PEX890xx PCIe Gen 5 Switch"


def _device(bdf: str, parent: str | None, cls: str, ids: str, name: str, **more) -> dict:
    """One device as the lspci stand-in prints it and the sysfs tree holds it."""
    return {"bdf": bdf, "parent": parent, "class": cls, "class_code": more.get("class_code", "0x060400"), "ids": ids,
            "name": f"{name} {SIMULATED}", "rev": more.get("rev", ""), "prog_if": more.get("prog_if", ""),
            "port": more.get("port"), "bus": more.get("bus"), "acs_cap": ACS_CAP if more.get("acs") else None,
            "acs": more.get("acs"), "driver": more.get("driver"), "iommu_group": None, "gpu": more.get("gpu")}


def _bridge(bdf: str, parent: str | None, port: str, ids: str, name: str, buses: tuple[int, int],
            acs: str | None) -> dict:
    return _device(bdf, parent, "PCI bridge", ids, name, rev="b0" if name == SWITCH else "",
                   prog_if="00 [Normal decode]", port=port, bus=[int(bdf[5:7], 16), *buses], acs=acs,
                   driver="pcieport")


def devices(layout: dict) -> list[dict]:
    """The host's PCI devices, parents first: host bridge, IOMMU, and per half of the GPUs a root port,
    a switch (upstream and downstream ports) and the GPUs (those whose pci_bus_id is a PCI address)."""
    pci = layout.get("pci") or settings()
    redirect = pci["acs_redirect"]
    gpus = [g for g in layout["gpus"] if BDF.match(sysfs_address(g.get("pci_bus_id") or ""))]
    found = [_device("0000:00:00.0", None, "Host bridge", "1022:153a", f"{AMD} Device 153a", class_code="0x060000"),
             _device("0000:00:00.2", None, "IOMMU", "1022:153b", f"{AMD} Device 153b", class_code="0x080600")]
    half = max(1, len(layout["gpus"]) // 2)  # nvidia-smi topo -m's two sockets (sandbox/nvidia_smi.py)
    halves = [[g for g in gpus if g["index"] < half], [g for g in gpus if g["index"] >= half]]
    for number, members in enumerate(h for h in halves if h):
        buses = [int(sysfs_address(g["pci_bus_id"])[5:7], 16) for g in members]
        upstream_bus = max(1, min(buses) - 8)
        root = f"0000:00:{1 + 2 * number:02x}.1"
        found.append(_bridge(root, None, "Root Port (Slot+)", "1022:153e", f"{AMD} Device 153e",
                             (upstream_bus, max(buses)), ACS_REDIRECT if redirect == "all" else ACS_CLEARED))
        upstream = f"0000:{upstream_bus:02x}:00.0"
        found.append(_bridge(upstream, root, "Upstream Port", "1000:c030", SWITCH, (upstream_bus + 1, max(buses)),
                             None))
        for slot, gpu in enumerate(members):
            address = sysfs_address(gpu["pci_bus_id"])
            bus = int(address[5:7], 16)
            down = f"0000:{upstream_bus + 1:02x}:{slot:02x}.0"
            on = redirect == "all" or gpu["index"] in redirect
            found.append(_bridge(down, upstream, "Downstream Port (Slot+)", "1000:c030", SWITCH, (bus, bus),
                                 ACS_REDIRECT if on else ACS_CLEARED))
            found.append(_device(address, down, "VGA compatible controller", "10de:2bb5",
                                 "NVIDIA Corporation Device 2bb5", class_code="0x030000", rev="a1",
                                 prog_if="00 [VGA controller]", driver="nvidia", gpu=gpu["index"]))
    if IOMMU[pci["iommu"]][0]:
        _groups(found)
    return found


def _groups(found: list[dict]) -> None:
    """IOMMU groups as a kernel forms them, roughly: a switch's downstream ports that do not redirect
    (ACS) and the GPUs below them share one group; a port that redirects isolates its GPU; every other
    device has a group of its own (the IOMMU itself has none)."""
    by_bdf = {d["bdf"]: d for d in found}
    shared: dict[str, int] = {}  # a switch's upstream port -> its shared group
    number = 0
    for device in found:
        if device["class"] == "IOMMU":
            continue
        port = device if (device["port"] or "").startswith("Downstream") else (
            by_bdf[device["parent"]] if device["gpu"] is not None else None)
        if port is not None and "ReqRedir+" not in (port["acs"] or ""):
            switch = port["parent"]
            if switch not in shared:
                shared[switch], number = number, number + 1
            device["iommu_group"] = shared[switch]
        else:
            device["iommu_group"], number = number, number + 1


def _sysfs_dirs(found: list[dict]) -> dict[str, str]:
    """bdf -> its device directory relative to /sys (devices/pci0000:00/<root port>/.../<bdf>)."""
    dirs: dict[str, str] = {}
    for device in found:
        above = dirs[device["parent"]] if device["parent"] else f"devices/{ROOT_BUS}"
        dirs[device["bdf"]] = f"{above}/{device['bdf']}"
    return dirs


def cmdline(layout: dict) -> str:
    """The simulated /proc/cmdline (says SIMULATED)."""
    pci = layout.get("pci") or settings()
    option = IOMMU[pci["iommu"]][1]
    return " ".join(w for w in ("BOOT_IMAGE=/boot/vmlinuz-6.8.0-sandbox root=/dev/sda1 ro quiet", option,
                                "sandbox=SIMULATED") if w) + "\n"


def _empty(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _link(target: Path, at: Path) -> None:
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(os.path.relpath(target, at.parent))


def write_tree(base: Path, layout: dict) -> list[dict]:
    """The sysfs parts and /proc/cmdline under ``base`` (TREE_DIR in a guest's root), rewritten in place;
    returns the devices (for MODEL_PATH)."""
    found = devices(layout)
    sysroot = base / "sys"
    for part in SYSFS_PARTS:
        _empty(base / part)
    domain_type = IOMMU[(layout.get("pci") or settings())["iommu"]][0]
    dirs = _sysfs_dirs(found)
    for device in found:
        where = sysroot / dirs[device["bdf"]]
        where.mkdir(parents=True)
        vendor, device_id = device["ids"].split(":")
        for name, value in (("vendor", f"0x{vendor}"), ("device", f"0x{device_id}"), ("class", device["class_code"])):
            (where / name).write_text(value + "\n")
        _link(sysroot / "bus/pci", where / "subsystem")
        _link(where, sysroot / "bus/pci/devices" / device["bdf"])
        group = device["iommu_group"]
        if group is not None:
            _link(sysroot / "kernel/iommu_groups" / str(group), where / "iommu_group")
            _link(where, sysroot / "kernel/iommu_groups" / str(group) / "devices" / device["bdf"])
            (sysroot / "kernel/iommu_groups" / str(group) / "type").write_text(f"{domain_type}\n")
    if domain_type:  # the unit (class/iommu/ivhd0 -> the IOMMU's device)
        unit = sysroot / dirs["0000:00:00.2"] / "iommu" / "ivhd0"
        unit.mkdir(parents=True)
        _link(unit, sysroot / "class/iommu/ivhd0")
    command_line = base / CMDLINE
    command_line.parent.mkdir(parents=True, exist_ok=True)
    with open(command_line, "w") as handle:  # in place: a bound file keeps its inode
        handle.write(cmdline(layout))
    return found


def model(layout: dict, found: list[dict]) -> str:
    """MODEL_PATH's text: the devices for the lspci stand-in."""
    return json.dumps({"SIMULATED": "the sandbox's PCI devices (sandbox/pcisim.py); lspci stand-in: sandbox/lspci.py",
                       "pci": layout.get("pci") or settings(), "devices": found}, indent=1) + "\n"


FAST_DIR = "/etc/sandbox-gpu/lspci-vvv"  # `lspci -vvv -s BDF` per device, rendered at install


def lspci_fast(found: list[dict]) -> dict[str, str]:
    """{bdf: what `lspci -vvv -s BDF` prints as root}: the lspci stand-in's own rendering, written under
    FAST_DIR for lspci_wrapper."""
    from . import lspci

    return {d["bdf"]: lspci.render(found, 3, wanted=lspci.selector(d["bdf"])) for d in found}


def lspci_wrapper(script: str, fast_dir: str = FAST_DIR, python: str = "/usr/bin/python3") -> str:
    """/usr/local/bin/lspci: the host-fitness fact's ``lspci -vvv -s BDF`` (once per bridge at every
    preflight: a Python start each, ~35 ms of CPU) as root prints the file rendered at install; anything
    else runs the stand-in ``script``."""
    return (f"#!/bin/sh\n# lspci stand-in of the sandbox (SIMULATED): sandbox/lspci.py, sandbox/pcisim.py\n"
            f'if [ $# -eq 3 ] && [ "$1" = -vvv ] && [ "$2" = -s ] && [ -f "{fast_dir}/$3" ]; then\n'
            f'  case "$3" in *[!0-9a-f:.]*) ;; *) [ "$(id -u)" = 0 ] && exec cat "{fast_dir}/$3";; esac\n'
            f"fi\nexec {python} {script} \"$@\"\n")


def _escape(path: str) -> str:
    return path.replace("\\", "\\\\").replace(":", "\\:")


def nspawn_binds(root: Path, sysfs: Path = Path("/sys")) -> tuple[list[str], str]:
    """systemd-nspawn's arguments that bind the tree written under ``root`` over the guest's /sys and
    /proc/cmdline, and what was left out and why ("" when nothing). A part of /sys the machine's kernel
    does not have (no IOMMU support: no /sys/class/iommu) cannot be a mount point in the guest's
    read-only sysfs: left out. /proc/cmdline's source is named as the guest sees it (nspawn binds below
    /proc after it mounted the guest's /proc, inside the guest's root)."""
    tree = root / TREE_DIR.lstrip("/")
    args: list[str] = []
    left_out: list[str] = []
    for part in SYSFS_PARTS:
        machine = sysfs / part.removeprefix("sys/")
        if not (tree / part).is_dir():
            left_out.append(f"{TREE_DIR}/{part} (not written)")
        elif not machine.is_dir():
            left_out.append(f"/{part} (not in this machine's sysfs)")
        else:
            args.append(f"--bind-ro=+{_escape(f'{TREE_DIR}/{part}')}:{_escape('/' + part)}")
    if left_out and any(part in item for item in left_out for part in SYSFS_PARTS[:2]):
        left_out.append("the rest: without the devices and their links no GPU is in sysfs")
        args = []
    if (tree / CMDLINE).is_file():
        args.append(f"--bind-ro={TREE_DIR}/{CMDLINE}:/{CMDLINE}")
    return args, "; ".join(left_out)
