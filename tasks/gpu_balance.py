"""GPU balance: once the server is ready, its TP ranks' GPUs hold its memory,
evenly, and nothing else.

Fact: ``NvmlGpuUsage`` (facts/nvml.py), read through NVML with the venv's
pynvml: per GPU the memory used and every compute process (pid, bytes), each
matched to its systemd unit through /proc/PID/cgroup. Every GPU in gpu_ids
must hold memory of the server's unit (its TP ranks run in that unit's
cgroup), the largest share at most ``BALANCE_TOLERANCE`` times the smallest,
and no process of anything else. SGLang checks the same balance once, at
start ("The memory capacity is unbalanced"); this step says it after every
deploy, naming the GPU and the process that shares it.

A check: it changes nothing (a no-op with the per-GPU summary, or a
failure). pyinfra runs an operation's body again while executing, after the
steps before it: that run reads NVML live, after readiness, and decides.
While preparing (the plan, --dry), a server this run (re)starts is not
judged (its GPUs are not its yet); a running one is, except that a process
sharing a GPU is left to the stale GPU processes step (it stops it, or fails
the deploy) unless stale_policy is "ignore".
"""

from __future__ import annotations

import os.path
from dataclasses import dataclass, field

from pyinfra import host
from pyinfra.api import deploy, operation

from core.ops import fail_command, gb, plan, preparing, report
from core.render import render
from core.stamps import restart_reasons
from facts.nvml import GpuApp, GpuUsage, NvmlGpuUsage
from tasks.spec import Spec

# max/min of the server's memory over its GPUs (SGLang's own start check: min free >= 0.9 x local free)
BALANCE_TOLERANCE = 1.1


@dataclass
class Verdict:
    lines: list[str] = field(default_factory=list)  # one per GPU: index, used GB, processes
    shared: list[str] = field(default_factory=list)  # another process on one of the GPUs
    problems: list[str] = field(default_factory=list)  # a GPU without the server's memory, imbalance
    notes: list[str] = field(default_factory=list)  # what could not be judged, and why
    ratio: float | None = None

    @property
    def failures(self) -> list[str]:
        return self.shared + self.problems


def _who(process: GpuApp) -> str:
    return f"pid {process.pid} ({os.path.basename(process.name)}, {process.unit or 'no systemd unit'})"


def _bytes(value: int | None) -> str:
    return "[N/A]" if value is None else gb(value)


def _gpu_line(index: int, usage: GpuUsage, own: list[GpuApp], others: list[GpuApp]) -> str:
    gpu = next(g for g in usage.gpus if g.index == index)
    held = ", ".join(f"{_who(p)} {_bytes(p.used_bytes)}" for p in own + others) or "no process"
    return f"GPU {index}: {_bytes(gpu.used_bytes)} used of {_bytes(gpu.total_bytes)}; {held}"


def judge(usage: GpuUsage, gpu_ids: list[int], own_unit: str, tolerance: float = BALANCE_TOLERANCE) -> Verdict:
    """Per GPU of gpu_ids: used memory and processes; problems when another
    process shares a GPU, a GPU holds none of the server's memory, or the
    server's memory is unbalanced across its GPUs."""
    verdict = Verdict()
    known = {gpu.index for gpu in usage.gpus}
    own_bytes: dict[int, int | None] = {}
    for index in gpu_ids:
        if index not in known:
            verdict.problems.append(f"GPU {index} (in gpu_ids) is not on this host ({usage.source} lists {sorted(known)})")
            continue
        on_gpu = [p for p in usage.processes if p.gpu_index == index]
        own = [p for p in on_gpu if p.unit == own_unit]
        others = [p for p in on_gpu if p.unit != own_unit]
        verdict.lines.append(_gpu_line(index, usage, own, others))
        for process in others:
            verdict.shared.append(f"GPU {index} is shared: {_who(process)} holds {_bytes(process.used_bytes)} "
                                    f"there beside {own_unit}")
        if not own:
            verdict.problems.append(f"GPU {index} holds no memory of {own_unit}: none of its TP ranks uses it")
            continue
        sizes = [p.used_bytes for p in own]
        own_bytes[index] = None if None in sizes else sum(s for s in sizes if s is not None)
    _balance(verdict, own_bytes, own_unit, tolerance)
    return verdict


def _balance(verdict: Verdict, own_bytes: dict[int, int | None], own_unit: str, tolerance: float) -> None:
    unknown = [index for index, size in own_bytes.items() if size is None]
    if unknown:
        verdict.notes.append(f"memory per process unknown ([N/A]) on GPU(s) {unknown}: balance not checked")
        return
    sizes = {index: size for index, size in own_bytes.items() if size is not None}
    if len(sizes) < 2:
        return
    low, high = min(sizes, key=lambda i: sizes[i]), max(sizes, key=lambda i: sizes[i])
    verdict.ratio = sizes[high] / sizes[low] if sizes[low] else float("inf")
    if verdict.ratio > tolerance:
        verdict.problems.append(
            f"{own_unit}'s GPU memory is unbalanced: GPU {high} holds {gb(sizes[high])}, GPU {low} "
            f"{gb(sizes[low])} (max/min {verdict.ratio:.2f}, allowed <= {tolerance:g})")


def summary(verdict: Verdict, gpu_ids: list[int], own_unit: str, usage: GpuUsage, tolerance: float) -> str:
    ratio = f"max/min {verdict.ratio:.3f} <= {tolerance:g}" if verdict.ratio is not None else "balance not compared"
    return f"GPUs {gpu_ids} hold only {own_unit}'s memory ({ratio}; {usage.via})"


def failure(lines: list[str], notes: list[str]) -> str:
    return "gpu_balance: " + "\ngpu_balance: ".join(lines + notes)


def restart_pending(spec: Spec) -> bool:
    """The server is (re)started by this run: judge it after readiness, not now."""
    return bool(restart_reasons(spec, render(spec)))


@operation()
def gpu_memory_balanced(spec: Spec, tolerance: float = BALANCE_TOLERANCE):
    """
    Check that every GPU of ``spec.gpu_ids`` holds the server's memory
    (processes of its unit), balanced within ``tolerance`` (max/min), and no
    other process; one plan line per GPU (index, used GB, processes). Fails
    naming the GPU and the foreign process (pid, name, unit, bytes). Changes
    nothing.

    .. code:: python

        gpu_memory_balanced(spec=spec)
    """
    gpu_ids = list(spec.gpu_ids)
    say = plan if preparing() else report  # plan lines while preparing, report lines while executing
    if preparing() and restart_pending(spec):
        plan(f"gpu_balance: after readiness, check that GPUs {gpu_ids} hold only {spec.unit_name}'s memory, "
             f"balanced (max/min <= {tolerance:g}), through NVML")
        host.noop(f"{spec.unit_name} is (re)started by this run: judged after readiness")
        return
    usage = host.get_fact(NvmlGpuUsage, python=spec.python_bin)  # while executing: now, after readiness
    verdict = judge(usage, gpu_ids, spec.unit_name, tolerance)
    for line in verdict.lines + verdict.notes:
        say(f"gpu_balance: {line}")
    deferred = preparing() and spec.stale_policy != "ignore" and bool(verdict.shared)
    failures = verdict.problems if deferred else verdict.failures
    if failures:
        message = failure(failures, verdict.notes)
        plan(message)
        yield fail_command(message)
        return
    if deferred:
        plan("gpu_balance: the stale GPU processes step deals with the shared GPU(s) first "
             f"(stale_policy = {spec.stale_policy!r}); judged again after readiness")
        host.noop("GPU(s) shared now: left to the stale GPU processes step, judged again after readiness")
        return
    summary_line = summary(verdict, gpu_ids, spec.unit_name, usage, tolerance)
    report(f"gpu_balance: {summary_line}")
    host.noop(summary_line)


@deploy("GPU balance")
def gpu_balance(spec: Spec) -> None:
    """The server's GPUs hold its memory, balanced, and nothing else's (changes nothing)."""
    gpu_memory_balanced(spec=spec, name=f"GPUs {','.join(map(str, spec.gpu_ids))} hold only {spec.unit_name}")
