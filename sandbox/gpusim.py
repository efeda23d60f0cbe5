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
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

LAYOUT_PATH = Path(os.environ.get("SANDBOX_GPU_LAYOUT", "/etc/sandbox-gpu/layout.json"))
REGISTRY_DIR = Path(os.environ.get("SANDBOX_GPU_REGISTRY", "/run/sandbox-gpu"))

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
