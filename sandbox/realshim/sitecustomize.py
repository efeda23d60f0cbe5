"""The sandbox's GPU shim for the REAL SGLang server (group_data/sandbox_real.py): the only
simulated part of those hosts.

The real server runs on the guest's CPU, so nothing would hold memory on the sandbox's
simulated GPUs and the GPU steps (NVML balance, stale processes) would judge an empty host.
This sitecustomize, on the unit's PYTHONPATH, runs in every Python process of the unit
(SGLang spawns its TP schedulers with multiprocessing's "spawn": fresh interpreters that
import it too). When the process's title becomes SGLang's scheduler title
(sglang/srt/managers/scheduler.py: ``setproctitle(f"sglang::scheduler{prefix}")``, prefix
" TP<rank>" -> "_TP<rank>"), it registers the process with the GPU simulation
(gpusim.register) on the GPU of its rank (CUDA_VISIBLE_DEVICES[rank]), holding
SANDBOX_GPU_SHIM_MIB MiB. The registration ends with the process, as GPU memory does.
Inactive without SANDBOX_GPU_SHIM_MIB. Standard library only.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time

SIM_DIR = "/usr/local/lib/sandbox-gpu"
POLL_S = 0.2
GIVE_UP_S = 900.0  # a process not titled a scheduler by then is none
_TITLE = b"sglang::scheduler"
_TP_RANK = re.compile(rb"_TP(\d+)")


def _title() -> bytes:
    try:
        with open("/proc/self/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def scheduler_rank(title: bytes) -> int | None:
    """The TP rank of an SGLang scheduler's process title (argv[0]), None for any other process."""
    title = title.split(b"\0")[0]
    if not title.startswith(_TITLE):
        return None
    rank_match = _TP_RANK.search(title)
    return int(rank_match.group(1)) if rank_match else 0  # no TP part: TP 1


def _watch(mib: int) -> None:
    deadline = time.monotonic() + GIVE_UP_S
    while time.monotonic() < deadline:
        rank = scheduler_rank(_title())
        if rank is not None:
            visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",") if v.strip()]
            gpu = int(visible[rank]) if rank < len(visible) else rank
            if SIM_DIR not in sys.path:
                sys.path.append(SIM_DIR)
            import gpusim

            gpusim.register(os.getpid(), {gpu: mib}, name=f"sglang::scheduler_TP{rank}")
            return
        time.sleep(POLL_S)


def _start() -> None:
    mib = os.environ.get("SANDBOX_GPU_SHIM_MIB", "")
    if mib.isdigit() and int(mib) > 0:
        threading.Thread(target=_watch, args=(int(mib),), name="sandbox-gpu-shim", daemon=True).start()


_start()
