"""Simulated GPUs of a sandbox host: the state behind the `nvidia-smi` stand-in.

Stdlib only: this file is copied into every sandbox guest
(/usr/local/lib/sandbox-gpu/gpusim.py) and imported there by the `nvidia-smi`
stand-in, the stale-process helper and the SGLang server stand-in.

State:
- LAYOUT_PATH (/etc/sandbox-gpu/layout.json): the host's GPUs, written by
  `python -m sandbox up` from a per-host layout (default: ct200, 8 x 96 GB SM120).
- REGISTRY_DIR (/run/sandbox-gpu/<pid>.json): one file per live process that
  "holds" GPU memory: {"pid", "starttime", "name", "gpus": {"<index>": MiB}}.
  A registration whose process is gone (or whose PID was reused: the
  starttime differs) is ignored and removed, so memory is freed when the
  process dies, like on a real GPU.

A reboot of the host clears the GPUs: REGISTRY_DIR lives on the guest's /run
(a fresh tmpfs at every boot) and the sandbox also deletes BOOT_CLEARED_PATHS
from the guest's disk before it starts the guest again (sandbox.hosts.reboot).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

LAYOUT_PATH = Path(os.environ.get("SANDBOX_GPU_LAYOUT", "/etc/sandbox-gpu/layout.json"))
REGISTRY_DIR = Path(os.environ.get("SANDBOX_GPU_REGISTRY", "/run/sandbox-gpu"))
# guest paths a reboot clears (GPU memory and processes): where the state lives
# by default, also should it ever sit on the guest's disk rather than its /run
BOOT_CLEARED_PATHS = ("/run/sandbox-gpu",)

CT200_GPU_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
CT200_GPU_MIB = 97887  # what nvidia-smi reports for a 96 GB RTX PRO 6000


def make_layout(
    count: int = 8,
    memory_mib: int = CT200_GPU_MIB,
    name: str = CT200_GPU_NAME,
    compute_cap: str = "12.0",
    driver_version: str = "580.95.05",
    p2p: str = "OK",
    host_tag: str = "0000",
) -> dict:
    """A GPU layout like ct200's: `count` identical PCIe GPUs.

    >>> make_layout(count=2)["gpus"][1]["index"]
    1
    """
    gpus = []
    for index in range(count):
        gpus.append(
            {
                "index": index,
                "uuid": f"GPU-5a1d{host_tag}-0000-4000-8000-{index:012x}",
                "name": name,
                "memory_total_mib": memory_mib,
                "compute_cap": compute_cap,
                "pci_bus_id": f"00000000:{0x18 + 0x10 * index:02X}:00.0",
            }
        )
    return {"driver_version": driver_version, "cuda_version": "13.0", "p2p": p2p, "gpus": gpus}


def load_layout(path: Path = LAYOUT_PATH) -> dict:
    return json.loads(path.read_text())


def _starttime(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the comm field may contain spaces: fields after the last ')' are fixed
    return stat.rsplit(")", 1)[1].split()[19]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def register(pid: int, gpus: dict[int, int], name: str | None = None) -> Path:
    """Record that process `pid` holds `gpus[index]` MiB on each GPU index."""
    REGISTRY_DIR.mkdir(parents=True, exist_ok=True)
    entry = {
        "pid": pid,
        "starttime": _starttime(pid),
        "name": name or _comm(pid),
        "gpus": {str(index): int(mib) for index, mib in gpus.items()},
    }
    path = REGISTRY_DIR / f"{pid}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(entry))
    tmp.replace(path)
    return path


def unregister(pid: int) -> None:
    (REGISTRY_DIR / f"{pid}.json").unlink(missing_ok=True)


@dataclass(frozen=True)
class Holding:
    pid: int
    name: str
    gpu_index: int
    used_mib: int


def live_holdings() -> list[Holding]:
    """Memory held by live processes; stale registrations are dropped."""
    holdings: list[Holding] = []
    if not REGISTRY_DIR.is_dir():
        return holdings
    for path in sorted(REGISTRY_DIR.glob("*.json")):
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        pid = int(entry["pid"])
        if _starttime(pid) is None or _starttime(pid) != entry.get("starttime"):
            path.unlink(missing_ok=True)
            continue
        for index, mib in sorted(entry["gpus"].items(), key=lambda kv: int(kv[0])):
            holdings.append(Holding(pid, entry.get("name", "?"), int(index), int(mib)))
    return holdings


def used_mib_by_gpu(layout: dict | None = None) -> dict[int, int]:
    layout = layout or load_layout()
    used = {gpu["index"]: 0 for gpu in layout["gpus"]}
    for holding in live_holdings():
        if holding.gpu_index in used:
            used[holding.gpu_index] += holding.used_mib
    return used


# ------------------------------------------------ values nvidia-smi cannot give
# Optional layout keys, honoured by the nvidia-smi stand-in and by the NVML
# stand-in (sandbox/nvml/nvml_sim.c = libnvidia-ml.so.1 in the guest, which
# reads the same layout + registry JSON):
# - gpu["unavailable"] / gpu["apps_unavailable"]: {nvidia-smi field name:
#   "[N/A]" or "[Not Supported]"}, printed instead of the value.
# - layout["p2p_matrix"]: {"r"|"w"|"n"|"a"|"p": N x N nvidia-smi P2P codes}.

NA = "[N/A]"
NOT_SUPPORTED = "[Not Supported]"
# query-gpu fields a unified-memory GPU (GH200 / GB10 class) reports as [N/A]
UNIFIED_MEMORY_FIELDS = ("memory.total", "memory.used", "memory.free", "memory.reserved")
# nvidia-smi's aliases -> the canonical names marks are stored under
_GPU_FIELD_ALIASES = {"gpu_name": "name", "gpu_serial": "serial", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id",
                      "compute_capability": "compute_cap"}  # fmt: skip
_APP_FIELD_ALIASES = {"name": "process_name", "used_memory": "used_gpu_memory"}


def mark_unavailable(layout: dict, fields, value: str | None = NA, gpus=None, apps: bool = False) -> dict:
    """Make nvidia-smi print `value` ("[N/A]" / "[Not Supported]") for `fields`.

    fields: nvidia-smi's canonical --query-gpu names (memory.total, compute_cap,
    ...) or, with apps=True, --query-compute-apps names (used_gpu_memory) for
    the processes on those GPUs. gpus: GPU indexes (default: all). The NVML
    stand-in then fails the matching call with NVML_ERROR_NOT_SUPPORTED (a
    process's usedGpuMemory becomes NVML_VALUE_NOT_AVAILABLE: None in pynvml).
    value=None clears the marks. Returns the layout (changed in place).

    >>> mark_unavailable(make_layout(count=1), ["memory.used"])["gpus"][0]["unavailable"]
    {'memory.used': '[N/A]'}
    """
    if isinstance(fields, str):
        fields = [fields]
    aliases = _APP_FIELD_ALIASES if apps else _GPU_FIELD_ALIASES
    fields = [aliases.get(f.lower(), f.lower()) for f in fields]
    key = "apps_unavailable" if apps else "unavailable"
    wanted = None if gpus is None else {int(i) for i in gpus}
    for gpu in layout["gpus"]:
        if wanted is not None and gpu["index"] not in wanted:
            continue
        marks = gpu.setdefault(key, {})
        for field in fields:
            if value is None:
                marks.pop(field, None)
            else:
                marks[field] = value
        if not marks:
            del gpu[key]
    return layout


def unavailable(gpu: dict, field: str, apps: bool = False) -> str | None:
    """The "[N/A]"-like text nvidia-smi prints for this field of this GPU, or None."""
    return gpu.get("apps_unavailable" if apps else "unavailable", {}).get(field)


P2P_CAPS = ("r", "w", "n", "a", "p")  # `nvidia-smi topo -p2p` letters, in NVML's caps-index order


def set_p2p_matrix(layout: dict, matrix: list[list[str]], caps: str = "rwap") -> dict:
    """Per-pair P2P codes (OK, CNS, GNS, TNS, NS, U; "X" on the diagonal) for `caps`.

    Rows/columns follow layout["gpus"]. Without a matrix every pair has
    layout["p2p"] (NVLink "n": NS). Returns the layout (changed in place).
    """
    n = len(layout["gpus"])
    if len(matrix) != n or any(len(row) != n for row in matrix):
        raise ValueError(f"p2p matrix must be {n} x {n}")
    for cap in caps:
        if cap not in P2P_CAPS:
            raise ValueError(f"unknown P2P capability {cap!r}: one of {P2P_CAPS}")
        layout.setdefault("p2p_matrix", {})[cap] = [
            ["X" if i == j else str(code) for j, code in enumerate(row)] for i, row in enumerate(matrix)
        ]
    return layout


def p2p_status(layout: dict, i: int, j: int, cap: str = "r") -> str:
    """The `nvidia-smi topo -p2p <cap>` code between the GPUs at positions i and j."""
    if i == j:
        return "X"
    matrix = layout.get("p2p_matrix", {}).get(cap)
    if matrix is not None:
        return str(matrix[i][j])
    return "NS" if cap == "n" else str(layout.get("p2p", "OK"))
