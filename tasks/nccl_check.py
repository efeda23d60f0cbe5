"""NCCL check: a bounded all-reduce over the TP GPUs before SGLang first starts on them.

A host whose GPUs cannot all-reduce (IOMMU translation, ACS redirect, a P2P level too high for the
board) hangs SGLang's start at its first collective: a slow load until ``start_stall_s`` (900 s)
with no hint of the cause. This step runs remote/allreduce_check.py with the server venv's torch
and the unit's environment as far as it bears on NCCL, CUDA and torch (CHECK_ENV_PREFIXES: never a
secret of extra_env in argv), bounded by ``allreduce_timeout_s``, and fails naming the env it used
and what to try; a bus bandwidth under ``allreduce_min_busbw_gbs`` fails
it too. A passing result is kept with what it was measured on (the driver, the kernel command
line, the TP GPUs' PCI addresses, the NCCL env): the next run repeats nothing until one changes.

It does not run while this server's unit is active on those GPUs (a serving server's own
all-reduces pass; the check would take memory from it): said in the plan, not recorded. On the
sandbox's simulated GPUs it runs gloo on the CPU and says so.

Facts: ``FileText`` (the kept result), ``SystemdUnitState``, ``NvidiaGpus``, ``KernelCmdline``,
``SimulatedGpus``.
"""

from __future__ import annotations

import hashlib
import json
import shlex

from pyinfra import host
from pyinfra.api import StringCommand, deploy, operation

from core.paths import REMOTE_SRC_DIR, STATE_DIR
from facts.files import FileText
from facts.gpu import NvidiaGpus, SimulatedGpus
from facts.kernel import KernelCmdline
from facts.systemd import SystemdUnitState
from tasks.spec import Spec

SCRIPT = REMOTE_SRC_DIR / "allreduce_check.py"
# the unit's variables the check runs with: what bears on NCCL, CUDA and torch (and the sandbox's stall
# fault). Never the rest of extra_env: it may hold a secret, and a command line is world-readable (ps).
CHECK_ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_", "PYTORCH_", "GLOO_", "LD_LIBRARY_PATH", "SGC_ALLREDUCE_")


def check_env(unit_env: dict[str, str]) -> dict[str, str]:
    """The unit's variables the check runs with (CHECK_ENV_PREFIXES)."""
    return {k: v for k, v in unit_env.items() if k.startswith(CHECK_ENV_PREFIXES)}


def result_path(unit_stem: str) -> str:
    return f"{STATE_DIR}/allreduce-{unit_stem}.json"


def check_key(driver: str | None, cmdline: dict[str, str], bus_ids: list[str], env: dict[str, str]) -> str:
    """What a kept result was measured on: a change of any of these runs the check again."""
    nccl = {k: v for k, v in sorted(env.items()) if k.startswith(("NCCL_", "CUDA_VISIBLE_DEVICES"))}
    text = json.dumps({"driver": driver, "cmdline": cmdline, "gpus": bus_ids, "env": nccl}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_command(python: str, gpu_ids: list[int], env: dict[str, str], key: str, out: str, timeout_s: float,
                  min_busbw_gbs: float | None, simulated: bool) -> str:
    """The script written to a temp dir (its ranks are spawned: they import it by path) and run there."""
    args = ["--gpus", ",".join(map(str, gpu_ids)), "--timeout", f"{timeout_s:g}", "--key", key, "--out", out]
    if min_busbw_gbs:
        args += ["--min-busbw-gbs", f"{min_busbw_gbs:g}"]
    if simulated:
        args.append("--simulated")
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    return ('d=$(mktemp -d) && printf %s ' + shlex.quote(SCRIPT.read_text()) + ' > "$d/allreduce_check.py" && '
            f'env {assigns} {shlex.quote(python)} "$d/allreduce_check.py" ' + " ".join(shlex.quote(a) for a in args)
            + '; rc=$?; rm -rf "$d"; exit $rc')


@operation()
def allreduce_checked(python: str, gpu_ids: list[int], env: dict[str, str], key: str, out: str, unit: str,
                      timeout_s: float = 120.0, min_busbw_gbs: float | None = None, simulated: bool = False,
                      enabled: bool = True):
    """
    An all-reduce over ``gpu_ids`` passes within ``timeout_s`` (and at ``min_busbw_gbs`` or more), run
    with ``env``; skipped when the result kept in ``out`` was measured with the same ``key``, or while
    ``unit`` is active on the GPUs.

    + python: the server venv's python (its torch)
    + gpu_ids: the TP GPUs (nvidia-smi indexes)
    + env: the unit's environment (NCCL_*, CUDA_DEVICE_ORDER)
    + key: what the result is measured on (check_key)
    + out: where the passing result is kept (root-only)
    + unit: the server's systemd unit
    + timeout_s: seconds for the all-reduces once every rank is up
    + min_busbw_gbs: the bus bandwidth floor in GB/s (None: none)
    + simulated: gloo on the CPU (the sandbox's simulated GPUs)
    + enabled: False: nothing runs, and the plan says the check is off (allreduce_check)

    .. code:: python

        allreduce_checked(python="/opt/sglang/venv/bin/python", gpu_ids=[0, 1], env=spec.unit_env,
                          key=key, out="/var/lib/sglang-converge/allreduce-sglang.json", unit="sglang.service")
    """
    if not enabled:
        host.noop("NCCL check: off (allreduce_check = False)")
        return
    if len(gpu_ids) < 2:
        host.noop("NCCL check: one GPU, no all-reduce")
        return
    kept_text = host.get_fact(FileText, path=out)
    try:
        kept = json.loads(kept_text) if kept_text else None
    except ValueError:
        kept = None
    if kept and kept.get("ok") and kept.get("key") == key:
        host.noop(f"NCCL check: all-reduce over GPUs {gpu_ids} passed at {kept.get('busbw_gbs')} GB/s bus bandwidth "
                  f"({kept.get('backend')}; kept, nothing it was measured on changed)")
        return
    state = host.get_fact(SystemdUnitState, unit=unit)
    if state.load_state == "loaded" and state.active_state in ("active", "activating", "reloading"):
        host.noop(f"NCCL check: not run while {unit} is active on GPUs {gpu_ids} (its own all-reduces run there)")
        return
    yield StringCommand(check_command(python, gpu_ids, env, key, out, timeout_s, min_busbw_gbs, simulated))


@deploy("NCCL check")
def nccl_check(spec: Spec):
    if not spec.allreduce_check:
        allreduce_checked(name="all-reduce check off (allreduce_check = False)", python="", gpu_ids=list(spec.gpu_ids),
                          env={}, key="", out=result_path(spec.unit_stem), unit=spec.unit_name, enabled=False)
        return
    gpus = {gpu.index: gpu for gpu in host.get_fact(NvidiaGpus)}
    bus_ids = [gpus[i].pci_bus_id or "" for i in spec.gpu_ids if i in gpus]
    driver = next((gpus[i].driver_version for i in spec.gpu_ids if i in gpus), None)
    env = check_env(spec.unit_env)
    allreduce_checked(
        name=f"all-reduce over GPUs {spec.gpu_ids} within {spec.allreduce_timeout_s:g} s",
        python=f"{spec.server_venv}/bin/python", gpu_ids=list(spec.gpu_ids), env=env,
        key=check_key(driver, host.get_fact(KernelCmdline), bus_ids, env), out=result_path(spec.unit_stem),
        unit=spec.unit_name, timeout_s=spec.allreduce_timeout_s, min_busbw_gbs=spec.allreduce_min_busbw_gbs,
        simulated=host.get_fact(SimulatedGpus),
    )
