#!/usr/bin/python3
"""`lspci` stand-in for sandbox hosts: the simulated PCI devices (sandbox/pcisim.py), pciutils' format.

Installed in every sandbox guest as /usr/local/lib/sandbox-gpu/lspci.py behind /usr/local/bin/lspci
(sandbox.pcisim.lspci_wrapper: ``lspci -vvv -s BDF`` as root, what the host-fitness fact runs once
per bridge, prints what render() wrote at install, without a Python start); reads
/etc/sandbox-gpu/pci.json (or $SANDBOX_PCI_MODEL). Every device's name says [SIMULATED]. Stdlib only.

Supported (as pciutils 3.9 prints them):
  lspci [-D] [-k] [-v|-vv|-vvv] [-s [[[[<domain>]:]<bus>]:][<slot>][.[<func>]]]
  -v: each device's Flags, bus numbers, capabilities and driver; -vv and up: Control/Status, the
  IOMMU group and the ACS capability's ACSCap/ACSCtl lines (pciutils ls-ecaps.c cap_acs). As an
  unprivileged user the capabilities read "<access denied>", as the real lspci's do.
"""

from __future__ import annotations

import json
import os
import sys

MODEL_PATH = os.environ.get("SANDBOX_PCI_MODEL", "/etc/sandbox-gpu/pci.json")
USAGE = """Usage: lspci [<switches>]

Basic display modes:
-v\t\tBe verbose (-vv or -vvv for higher verbosity)
-k\t\tShow kernel drivers handling each device
-D\t\tAlways show domain numbers

Selection of devices:
-s [[[[<domain>]:]<bus>]:][<slot>][.[<func>]]\tShow only devices in selected slots

(the sandbox's SIMULATED lspci: sandbox/lspci.py)
"""


class UsageError(Exception):
    pass


def parse_args(argv: list[str]) -> tuple[int, bool, bool, str | None]:
    """(verbosity, -D, -k, -s's selector) from getopt-style switches ("-vvv", "-s", "-s00:01.1")."""
    verbose, domains, kernel, select = 0, False, False, None
    args = list(argv)
    while args:
        arg = args.pop(0)
        if not arg.startswith("-") or arg == "-":
            raise UsageError(f"lspci: Unexpected argument: {arg}")
        letters = arg[1:]
        while letters:
            letter, letters = letters[0], letters[1:]
            if letter == "v":
                verbose += 1
            elif letter == "D":
                domains = True
            elif letter == "k":
                kernel = True
            elif letter == "s":
                if not letters and not args:
                    raise UsageError("lspci: option requires an argument -- 's'")
                select, letters = (letters, "") if letters else (args.pop(0), "")
            else:
                raise UsageError(f"lspci: invalid option -- '{letter}'")
    return verbose, domains, kernel, select


def selector(text: str) -> tuple[int | None, int | None, int | None, int | None]:
    """-s's [[[[<domain>]:]<bus>]:][<slot>][.[<func>]] as (domain, bus, slot, func); None: any."""
    def number(part: str, limit: int) -> int | None:
        if part in ("", "*"):
            return None
        value = int(part, 16)
        if value > limit:
            raise ValueError(part)
        return value

    try:
        left, _, func = text.partition(".")
        parts = left.split(":")
        if len(parts) > 3:
            raise ValueError(text)
        slot = parts[-1]
        bus = parts[-2] if len(parts) >= 2 else ""
        domain = parts[-3] if len(parts) == 3 else ""
        return number(domain, 0xFFFF), number(bus, 0xFF), number(slot, 0x1F), number(func, 7)
    except ValueError:
        raise UsageError(f"lspci: -s: Invalid slot number: {text}") from None


def matches(bdf: str, wanted: tuple[int | None, ...]) -> bool:
    domain, bus, rest = bdf.split(":")
    slot, func = rest.split(".")
    have = (int(domain, 16), int(bus, 16), int(slot, 16), int(func, 16))
    return all(w is None or w == h for w, h in zip(wanted, have, strict=True))


def header(device: dict, verbose: int, domains: bool) -> str:
    address = device["bdf"] if domains else device["bdf"][5:]
    line = f"{address} {device['class']}: {device['name']}"
    if device.get("rev"):
        line += f" (rev {device['rev']})"
    if verbose and device.get("prog_if"):
        line += f" (prog-if {device['prog_if']})"
    return line


def details(device: dict, verbose: int, kernel: bool) -> list[str]:
    """The lines below the header (tab-indented) for -v/-vv/-vvv, or -k's driver lines."""
    lines: list[str] = []
    group = device.get("iommu_group")
    bridge = device.get("bus") is not None
    if verbose >= 2:
        lines.append("\tControl: I/O- Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR+ FastB2B- "
                     "DisINTx+")
        lines.append("\tStatus: Cap+ 66MHz- UDF- FastB2B- ParErr- DEVSEL=fast >TAbort- <TAbort- <MAbort- >SERR- "
                     "<PERR- INTx-")
        lines.append("\tLatency: 0, Cache Line Size: 64 bytes")
        if group is not None:
            lines.append(f"\tIOMMU group: {group}")
    elif verbose:
        lines.append("\tFlags: bus master, fast devsel, latency 0" + (f", IOMMU group {group}" if group is not None
                                                                       else ""))
    if verbose and bridge:
        primary, secondary, subordinate = device["bus"]
        lines.append(f"\tBus: primary={primary:02x}, secondary={secondary:02x}, subordinate={subordinate:02x}, "
                     "sec-latency=0")
    if verbose:
        if os.geteuid() != 0:
            lines.append("\tCapabilities: <access denied>")
        elif device.get("port"):
            lines.append(f"\tCapabilities: [68] Express (v2) {device['port']}, MSI 00")
            if device.get("acs"):
                lines.append("\tCapabilities: [2a0 v1] Access Control Services")
                if verbose >= 2:
                    lines.append(f"\t\tACSCap:\t{device['acs_cap']}")
                    lines.append(f"\t\tACSCtl:\t{device['acs']}")
        elif device.get("gpu") is not None:
            lines.append("\tCapabilities: [60] Power Management version 3")
            lines.append("\tCapabilities: [78] Express (v2) Legacy Endpoint, MSI 00")
    if (verbose or kernel) and device.get("driver"):
        lines.append(f"\tKernel driver in use: {device['driver']}")
        if device["driver"] != "pcieport":  # built into the kernel
            lines.append(f"\tKernel modules: {device['driver']}")
    return lines


def main(argv: list[str]) -> int:
    try:
        verbose, domains, kernel, select = parse_args(argv)
        wanted = selector(select) if select is not None else (None, None, None, None)
    except UsageError as err:
        sys.stderr.write(f"{err}\n\n{USAGE}")
        return 2
    try:
        with open(MODEL_PATH) as handle:
            found = json.load(handle)["devices"]
    except (OSError, ValueError, KeyError) as err:
        sys.stderr.write(f"pcilib: Cannot open {MODEL_PATH} (the sandbox's SIMULATED PCI devices): {err}\n")
        return 1
    sys.stdout.write(render(found, verbose, domains, kernel, wanted))
    return 0


def render(found: list[dict], verbose: int = 0, domains: bool = False, kernel: bool = False,
           wanted: tuple[int | None, ...] = (None, None, None, None)) -> str:
    """What lspci prints for these devices (sorted by address, those ``wanted`` selects)."""
    out = []
    for device in sorted(found, key=lambda d: d["bdf"]):
        if not matches(device["bdf"], wanted):
            continue
        out.append(header(device, verbose, domains))
        out.extend(details(device, verbose, kernel))
        if verbose:
            out.append("")
    return "".join(line + "\n" for line in out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
