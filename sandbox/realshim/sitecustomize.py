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

It also counts what the rank holds once SGLang has loaded the model: an import hook wraps
``ModelRunner.load_model`` (srt/model_executor/model_runner.py:1270) and, when it returns, logs

    sandbox shim (simulated GPU): TP<rank> of <tp> loaded <Class>: <n> parameter bytes (<k> tensors), <m> buffer bytes

to stderr (the journal): the exact bytes of the rank's parameters (shared ones once, as
``Module.parameters()`` counts them) that the memory plan's weights per GPU are held to
(tests/integration/test_real_server.py). On a CPU SGLang's own "mem usage=" is the host's free
memory before and after, too coarse for a model of a few MB.

Inactive without SANDBOX_GPU_SHIM_MIB. Standard library only (torch is SGLang's).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
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


def _count_loaded(runner) -> None:
    model = getattr(runner, "model", None)
    if model is None or getattr(runner, "is_draft_worker", False):
        return
    params = list(model.parameters())
    held = sum(p.numel() * p.element_size() for p in params)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    rank, tp = scheduler_rank(_title()) or 0, getattr(getattr(runner, "server_args", None), "tp_size", None)
    print(f"sandbox shim (simulated GPU): TP{rank} of {tp or '?'} loaded {type(model).__name__}: {held} parameter "
          f"bytes ({len(params)} tensors), {buffers} buffer bytes", file=sys.stderr, flush=True)


class _WrapLoadModel(importlib.abc.MetaPathFinder):
    """Wraps ModelRunner.load_model when SGLang's model_runner module is first imported."""

    MODULE = "sglang.srt.model_executor.model_runner"

    def find_spec(self, fullname, path, target=None):
        if fullname != self.MODULE:
            return None
        sys.meta_path.remove(self)  # find the real spec without this finder (and wrap only once)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            runner = getattr(module, "ModelRunner", None)
            load = getattr(runner, "load_model", None)
            if load is None:
                return

            def load_model(self, *args, **kwargs):
                result = load(self, *args, **kwargs)
                try:
                    _count_loaded(self)
                except Exception as err:  # noqa: BLE001 - a count that fails must not fail the start
                    print(f"sandbox shim (simulated GPU): no parameter count: {err!r}", file=sys.stderr, flush=True)
                return result

            runner.load_model = load_model

        spec.loader.exec_module = exec_and_wrap
        return spec


def _start() -> None:
    mib = os.environ.get("SANDBOX_GPU_SHIM_MIB", "")
    if mib.isdigit() and int(mib) > 0:
        threading.Thread(target=_watch, args=(int(mib),), name="sandbox-gpu-shim", daemon=True).start()
        sys.meta_path.insert(0, _WrapLoadModel())


_start()
