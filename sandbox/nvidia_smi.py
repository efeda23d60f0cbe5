#!/usr/bin/python3
"""`nvidia-smi` stand-in for sandbox hosts: simulated GPUs, real output formats.

Installed in every sandbox guest as /usr/local/bin/nvidia-smi. Stdlib only;
the GPU state comes from gpusim (layout file + registrations of live
processes), imported from /usr/local/lib/sandbox-gpu/ (or from beside this
file when run from the source tree).

Supported:
  nvidia-smi                                  short table (says: simulated)
  nvidia-smi -L
  nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits] [-i IDS]
  nvidia-smi --query-compute-apps=FIELDS --format=csv[,noheader][,nounits] [-i IDS]
  nvidia-smi topo -p2p r|w|n|a|p    nvidia-smi topo -m

Fields gpusim marks unavailable (gpusim.mark_unavailable) print as the real
tool does: `[N/A]` / `[Not Supported]`, without a unit even in csv with units.
"""

from __future__ import annotations

import os
import sys
import time


def _import_gpusim():
    here = os.path.dirname(os.path.realpath(__file__))
    candidates = [os.environ.get("SANDBOX_GPU_LIB", ""), here, "/usr/local/lib/sandbox-gpu"]
    for path in candidates:
        if path and os.path.isfile(os.path.join(path, "gpusim.py")):
            sys.path.insert(0, path)
            break
    # like the real nvidia-smi (a binary), leave no file behind: no __pycache__ beside gpusim.py
    # (a --dry run reads the GPUs and must change nothing on the host: tests/integration/test_dry_run.py)
    sys.dont_write_bytecode = True
    import gpusim  # noqa: E402

    return gpusim


gpusim = _import_gpusim()

NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)

# --query-gpu: canonical name -> (unit or None, getter(gpu, ctx))
# ctx: {"used": {index: MiB}, "layout": layout, "count": n}
GPU_FIELDS = {
    "timestamp": (None, lambda g, c: time.strftime("%Y/%m/%d %H:%M:%S.000")),
    "driver_version": (None, lambda g, c: c["layout"].get("driver_version", "")),
    "count": (None, lambda g, c: str(c["count"])),
    "name": (None, lambda g, c: g["name"]),
    "serial": (None, lambda g, c: f"{1650000000000 + g['index']}"),
    "uuid": (None, lambda g, c: g["uuid"]),
    "pci.bus_id": (None, lambda g, c: g["pci_bus_id"]),
    "pci.domain": (None, lambda g, c: "0x" + g["pci_bus_id"].split(":")[0][-4:]),
    "pci.bus": (None, lambda g, c: "0x" + g["pci_bus_id"].split(":")[1]),
    "pci.device": (None, lambda g, c: "0x00"),
    "pci.device_id": (None, lambda g, c: "0x2BB510DE"),
    "index": (None, lambda g, c: str(g["index"])),
    "persistence_mode": (None, lambda g, c: "Enabled"),
    "pstate": (None, lambda g, c: "P8" if not c["used"].get(g["index"]) else "P1"),
    "memory.total": ("MiB", lambda g, c: str(g["memory_total_mib"])),
    "memory.reserved": ("MiB", lambda g, c: "0"),
    "memory.used": ("MiB", lambda g, c: str(c["used"].get(g["index"], 0))),
    "memory.free": (
        "MiB",
        lambda g, c: str(max(0, g["memory_total_mib"] - c["used"].get(g["index"], 0))),
    ),
    "compute_cap": (None, lambda g, c: g["compute_cap"]),
    "compute_mode": (None, lambda g, c: "Default"),
    "utilization.gpu": ("%", lambda g, c: "0"),
    "utilization.memory": ("%", lambda g, c: "0"),
    "temperature.gpu": (None, lambda g, c: "30"),
    "power.draw": ("W", lambda g, c: "35.00"),
    "power.limit": ("W", lambda g, c: "600.00"),
    "clocks.sm": ("MHz", lambda g, c: "180"),
    "clocks.max.sm": ("MHz", lambda g, c: "3090"),
}
GPU_ALIASES = {
    "gpu_name": "name",
    "gpu_serial": "serial",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
    "compute_capability": "compute_cap",
}

# --query-compute-apps: canonical name -> (unit, getter(holding, gpu))
APP_FIELDS = {
    "timestamp": (None, lambda h, g: time.strftime("%Y/%m/%d %H:%M:%S.000")),
    "gpu_name": (None, lambda h, g: g["name"]),
    "gpu_bus_id": (None, lambda h, g: g["pci_bus_id"]),
    "gpu_serial": (None, lambda h, g: f"{1650000000000 + g['index']}"),
    "gpu_uuid": (None, lambda h, g: g["uuid"]),
    "pid": (None, lambda h, g: str(h.pid)),
    "process_name": (None, lambda h, g: h.name),
    "used_gpu_memory": ("MiB", lambda h, g: str(h.used_mib)),
}
APP_ALIASES = {"name": "process_name", "used_memory": "used_gpu_memory"}


class UsageError(Exception):
    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def _parse_fields(spec: str, fields: dict, aliases: dict) -> list[str]:
    out = []
    for raw in spec.split(","):
        name = raw.strip()
        if not name:
            continue
        canonical = aliases.get(name.lower(), name.lower())
        if canonical not in fields:
            raise UsageError(f'Field "{name}" is not a valid field to query.\n', 2)
        out.append(canonical)
    if not out:
        raise UsageError("No fields specified to query.\n", 2)
    return out


def _parse_format(spec: str | None) -> tuple[bool, bool]:
    """-> (header, units)"""
    if spec is None:
        raise UsageError('"--format" option must be specified along with the query option.\n', 2)
    parts = [p.strip().lower() for p in spec.split(",") if p.strip()]
    if "csv" not in parts:
        raise UsageError(f'"{spec}" is not a valid format. Only "csv" is supported.\n', 2)
    for p in parts:
        if p not in ("csv", "noheader", "nounits"):
            raise UsageError(f'"{p}" is not a valid format option.\n', 2)
    return "noheader" not in parts, "nounits" not in parts


def _select_gpus(layout: dict, ids: str | None) -> list[dict]:
    gpus = layout["gpus"]
    if ids is None:
        return gpus
    chosen = []
    for token in ids.split(","):
        token = token.strip()
        match = None
        for gpu in gpus:
            if token == str(gpu["index"]) or token == gpu["uuid"] or token.upper() in (
                gpu["pci_bus_id"].upper(),
                gpu["pci_bus_id"][4:].upper(),
            ):
                match = gpu
        if match is None:
            raise UsageError("No devices were found\n", 6)
        if match not in chosen:
            chosen.append(match)
    return sorted(chosen, key=lambda g: g["index"])


def _header(fields: list[str], table: dict, units: bool) -> str:
    cols = []
    for f in fields:
        unit = table[f][0]
        cols.append(f"{f} [{unit}]" if unit else f)
    return ", ".join(cols)


def _value(field: str, table: dict, value: str, units: bool) -> str:
    unit = table[field][0]
    if value.startswith("[") and value.endswith("]"):  # [N/A], [Not Supported]: as is, no unit
        return value
    if units and unit:
        return f"{value} %" if unit == "%" else f"{value} {unit}"
    return value


def _gpu_value(field: str, gpu: dict, ctx: dict) -> str:
    """The field's text: its value, or what gpusim marks it as ("[N/A]", "[Not Supported]")."""
    return gpusim.unavailable(gpu, field) or GPU_FIELDS[field][1](gpu, ctx)


def _app_value(field: str, holding, gpu: dict) -> str:
    return gpusim.unavailable(gpu, field, apps=True) or APP_FIELDS[field][1](holding, gpu)


def query_gpu(layout: dict, spec: str, fmt: str | None, ids: str | None) -> str:
    fields = _parse_fields(spec, GPU_FIELDS, GPU_ALIASES)
    header, units = _parse_format(fmt)
    gpus = _select_gpus(layout, ids)
    ctx = {"used": gpusim.used_mib_by_gpu(layout), "layout": layout, "count": len(layout["gpus"])}
    lines = [_header(fields, GPU_FIELDS, units)] if header else []
    for gpu in gpus:
        lines.append(", ".join(_value(f, GPU_FIELDS, _gpu_value(f, gpu, ctx), units) for f in fields))
    return "".join(line + "\n" for line in lines)


def query_apps(layout: dict, spec: str, fmt: str | None, ids: str | None) -> str:
    fields = _parse_fields(spec, APP_FIELDS, APP_ALIASES)
    header, units = _parse_format(fmt)
    gpus = {g["index"]: g for g in _select_gpus(layout, ids)}
    lines = [_header(fields, APP_FIELDS, units)] if header else []
    holdings = sorted(gpusim.live_holdings(), key=lambda h: (h.gpu_index, h.pid))
    for h in holdings:
        gpu = gpus.get(h.gpu_index)
        if gpu is None:
            continue
        lines.append(", ".join(_value(f, APP_FIELDS, _app_value(f, h, gpu), units) for f in fields))
    return "".join(line + "\n" for line in lines)


def list_gpus(layout: dict, ids: str | None) -> str:
    return "".join(
        f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n" for g in _select_gpus(layout, ids)
    )


P2P_LEGEND = """
Legend:

  X    = Self
  OK   = Status Ok
  CNS  = Chipset not supported
  GNS  = GPU not supported
  TNS  = Topology not supported
  NS   = Not supported
  U    = Unknown
"""

TOPO_LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def topo(layout: dict, argv: list[str]) -> str:
    gpus = layout["gpus"]
    n = len(gpus)
    if argv and argv[0] in ("-p2p", "--p2p") or (argv and argv[0].startswith("-p2p")):
        if argv[0].startswith("-p2p") and len(argv[0]) > 4:
            cap = argv[0][4:].lstrip("=")
        elif len(argv) > 1:
            cap = argv[1]
        else:
            raise UsageError("Missing P2P capability: one of r, w, n, a, p.\n", 2)
        if cap not in ("r", "w", "n", "a", "p"):
            raise UsageError(f'"{cap}" is not a valid P2P capability: one of r, w, n, a, p.\n', 2)
        out = [" \t" + "".join(f"GPU{g['index']}\t" for g in gpus)]
        for i in range(n):
            cells = "".join(gpusim.p2p_status(layout, i, j, cap) + "\t" for j in range(n))
            out.append(f" GPU{gpus[i]['index']}\t{cells}")
        return "\n".join(out) + "\n" + P2P_LEGEND
    if argv and argv[0] in ("-m", "--matrix"):
        half = max(1, n // 2)
        head = "\t" + "".join(f"GPU{g['index']}\t" for g in gpus) + "CPU Affinity\tNUMA Affinity\tGPU NUMA ID"
        out = [head]
        for i in range(n):
            cells = []
            for j in range(n):
                if i == j:
                    cells.append("X")
                else:
                    # one PCIe switch per half (sandbox/pcisim.py), the halves on two CPU sockets
                    cells.append("PIX" if (i < half) == (j < half) else "SYS")
            numa = 0 if i < half else 1
            out.append(f"GPU{gpus[i]['index']}\t" + "\t".join(cells) + f"\t{numa * 64}-{numa * 64 + 63}\t{numa}\t\tN/A")
        return "\n".join(out) + "\n" + TOPO_LEGEND
    raise UsageError("Usage: nvidia-smi topo -m | -p2p {r,w,n,a,p}\n", 2)


def summary(layout: dict) -> str:
    used = gpusim.used_mib_by_gpu(layout)
    bar = "+" + "-" * 89 + "+"
    rows = [
        time.strftime("%a %b %d %H:%M:%S %Y"),
        bar,
        "| {:<88}|".format(
            "NVIDIA-SMI {0:<20} Driver Version: {0:<14} CUDA Version: {1}".format(
                layout.get("driver_version", "?"), layout.get("cuda_version", "?")
            )
        ),
        "| {:<88}|".format("SIMULATED GPUs (sglang-converge sandbox): no real device, state from gpusim"),
        bar.replace("-", "="),
    ]
    for g in layout["gpus"]:
        mem = f"{used.get(g['index'], 0)}MiB / {g['memory_total_mib']}MiB"
        if any(gpusim.unavailable(g, f) for f in ("memory.used", "memory.total")):
            mem = "Not Supported"  # the table's text for memory it cannot report (unified memory)
        rows.append("| {:<88}|".format(f"{g['index']:>3}  {g['name'][:46]:<46} {g['pci_bus_id'][4:]:>16}  {mem}"))
    rows.append(bar)
    rows.append("")
    rows.append(bar)
    rows.append("| {:<88}|".format("Processes:"))
    rows.append("|  {:<5}{:<10}{:<54}{:>17} |".format("GPU", "PID", "Process name", "GPU Memory Usage"))
    rows.append(bar.replace("-", "="))
    holdings = sorted(gpusim.live_holdings(), key=lambda h: (h.gpu_index, h.pid))
    if not holdings:
        rows.append("| {:<88}|".format(" No running processes found"))
    by_index = {g["index"]: g for g in layout["gpus"]}
    for h in holdings:
        usage = f"{h.used_mib}MiB"
        if h.gpu_index in by_index and gpusim.unavailable(by_index[h.gpu_index], "used_gpu_memory", apps=True):
            usage = "N/A"
        rows.append(f"|  {h.gpu_index:<5}{h.pid:<10}{h.name[:53]:<54}{usage:>17} |")
    rows.append(bar)
    return "\n".join(rows) + "\n"


def _take(argv: list[str], i: int, opt: str) -> tuple[str, int]:
    arg = argv[i]
    if "=" in arg and arg.startswith("--"):
        return arg.split("=", 1)[1], i + 1
    if arg.startswith("-i") and arg not in ("-i",) and not arg.startswith("--"):
        return arg[2:], i + 1
    if i + 1 >= len(argv):
        raise UsageError(f'Option "{opt}" requires a value.\n', 2)
    return argv[i + 1], i + 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "topo":
            layout = _load()
            sys.stdout.write(topo(layout, argv[1:]))
            return 0
        query_gpu_spec = query_apps_spec = fmt = ids = None
        list_flag = False
        i = 0
        while i < len(argv):
            arg = argv[i]
            if arg.startswith("--query-gpu"):
                query_gpu_spec, i = _take(argv, i, "--query-gpu")
            elif arg.startswith("--query-compute-apps"):
                query_apps_spec, i = _take(argv, i, "--query-compute-apps")
            elif arg.startswith("--format"):
                fmt, i = _take(argv, i, "--format")
            elif arg == "-i" or arg.startswith("--id") or (arg.startswith("-i") and not arg.startswith("--")):
                ids, i = _take(argv, i, "--id")
            elif arg in ("-L", "--list-gpus"):
                list_flag, i = True, i + 1
            elif arg in ("-h", "--help"):
                sys.stdout.write(__doc__ or "")
                return 0
            else:
                raise UsageError("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n", 2)
        layout = _load()
        if query_gpu_spec is not None:
            sys.stdout.write(query_gpu(layout, query_gpu_spec, fmt, ids))
        elif query_apps_spec is not None:
            sys.stdout.write(query_apps(layout, query_apps_spec, fmt, ids))
        elif list_flag:
            sys.stdout.write(list_gpus(layout, ids))
        else:
            sys.stdout.write(summary(layout))
        return 0
    except UsageError as err:
        sys.stdout.write(str(err))
        return err.code


def _load() -> dict:
    try:
        return gpusim.load_layout(gpusim.LAYOUT_PATH)
    except (OSError, ValueError):
        raise UsageError(NO_DRIVER, 9) from None


if __name__ == "__main__":
    sys.exit(main())
