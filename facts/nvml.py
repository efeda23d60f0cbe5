"""GPU memory and compute processes through NVML (pynvml), read with the
server venv's own python once that venv exists.

nvidia-smi documents that its text output may change between releases and
recommends NVML for tools; SGLang itself depends on nvidia-ml-py (``import
pynvml``), so its venv has the bindings. Where the venv has no python, pynvml
is not importable there, or NVML does not initialise, the fact falls back to
nvidia-smi's csv queries and says why (``source`` / ``note``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand

from facts._value import FactValue
from facts.gpu import smi_int, smi_text
from facts.systemd import unit_from_cgroup

MIB = 1024 * 1024

# Runs with the venv's python. Exit status 3 (after a "fallback: why" line): use nvidia-smi instead.
_NVML_PY = r"""
import json, sys
try:
    import pynvml as n
except Exception as err:
    print("fallback: pynvml is not importable in %s (%s: %s)" % (sys.prefix, type(err).__name__, err))
    sys.exit(3)
try:
    n.nvmlInit()
except Exception as err:
    print("fallback: NVML did not initialise through pynvml (%s: %s)" % (type(err).__name__, err))
    sys.exit(3)
try:
    from importlib.metadata import version
    dist = "nvidia-ml-py " + version("nvidia-ml-py")
except Exception:
    dist = "pynvml"
def text(value):
    return value.decode() if isinstance(value, bytes) else str(value)
def proc_name(pid):
    try:
        return text(n.nvmlSystemGetProcessName(pid))
    except Exception:
        try:
            return open("/proc/%d/comm" % pid).read().strip()
        except OSError:
            return "?"
out = []
try:
    out.append("source: nvml " + dist + ", driver " + text(n.nvmlSystemGetDriverVersion()))
    pids = set()
    for i in range(n.nvmlDeviceGetCount()):
        h = n.nvmlDeviceGetHandleByIndex(i)
        index, uuid = n.nvmlDeviceGetIndex(h), text(n.nvmlDeviceGetUUID(h))
        try:
            mem = n.nvmlDeviceGetMemoryInfo(h)
            total, used = mem.total, mem.used
        except n.NVMLError_NotSupported:
            total = used = None
        out.append("gpu: " + json.dumps({"index": index, "uuid": uuid, "name": text(n.nvmlDeviceGetName(h)),
                                         "total": total, "used": used}))
        for p in n.nvmlDeviceGetComputeRunningProcesses(h):
            pids.add(p.pid)
            out.append("app: " + json.dumps({"pid": p.pid, "used": p.usedGpuMemory, "gpu": index, "uuid": uuid,
                                             "name": proc_name(p.pid)}))
    n.nvmlShutdown()
except Exception as err:
    print("fallback: NVML query failed through pynvml (%s: %s)" % (type(err).__name__, err))
    sys.exit(3)
for pid in sorted(pids):
    try:
        for line in open("/proc/%d/cgroup" % pid):
            out.append("cgroup: %d %s" % (pid, line.rstrip("\n")))
    except OSError:
        pass
print("\n".join(out))
"""

_SMI_FALLBACK = (
    "nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used --format=csv,noheader,nounits"
    ' | sed "s/^/smi-gpu: /" || exit 1; '
    "apps=$(nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid,process_name"
    " --format=csv,noheader,nounits) || exit 1; "
    'printf "%s\\n" "$apps" | grep . | sed "s/^/smi-app: /"; '
    'for pid in $(printf "%s\\n" "$apps" | cut -d, -f1 | sort -u); do '
    'sed "s|^|cgroup: $pid |" "/proc/$pid/cgroup" 2>/dev/null; done; true'
)


@dataclass(frozen=True)
class GpuMemory(FactValue):
    index: int
    uuid: str
    name: str
    total_bytes: int | None  # None: not reported (unified memory, some MIG modes)
    used_bytes: int | None


@dataclass(frozen=True)
class GpuApp(FactValue):
    pid: int
    name: str
    used_bytes: int | None  # None: NVML_VALUE_NOT_AVAILABLE / nvidia-smi [N/A]
    gpu_index: int
    gpu_uuid: str
    # innermost systemd unit of the process ("sglang.service", "session-3.scope"), or None
    unit: str | None


@dataclass(frozen=True)
class GpuUsage(FactValue):
    source: str  # "nvml" or "nvidia-smi"
    note: str  # which bindings and driver; for nvidia-smi: why NVML was not used
    gpus: list[GpuMemory]
    processes: list[GpuApp]

    @property
    def via(self) -> str:
        """Where the numbers come from, for messages."""
        return f"{self.source}: {self.note}" if self.note else self.source


def _smi_gpu(line: str) -> GpuMemory:
    index, uuid, name, total, used = [field.strip() for field in line.split(",", 4)]
    total_mib, used_mib = smi_int(total), smi_int(used)
    return GpuMemory(int(index), uuid, smi_text(name) or "?", None if total_mib is None else total_mib * MIB,
                     None if used_mib is None else used_mib * MIB)


class NvmlGpuUsage(FactBase[GpuUsage]):
    """
    Every GPU's memory (total, used, bytes) and every compute process on it
    (pid, name, bytes, GPU index and UUID, owning systemd unit from
    /proc/PID/cgroup), read through NVML with pynvml by ``python`` (the
    server venv's interpreter). Falls back to nvidia-smi, saying why, where
    that python or pynvml is missing or NVML does not initialise.

    Output lines: ``source: nvml nvidia-ml-py 13.615.71, driver 580.95.05``,
    ``gpu: {"index", "uuid", "name", "total", "used"}``, ``app: {"pid",
    "used", "gpu", "uuid", "name"}`` (JSON, bytes or null), ``cgroup: PID
    LINE``; the fallback: ``fallback: WHY`` then nvidia-smi's csv rows
    prefixed ``smi-gpu:`` / ``smi-app:`` (MiB, ``[N/A]`` kept).

    .. code:: python

        usage = host.get_fact(NvmlGpuUsage, python="/opt/sglang/venv/bin/python")
        usage.source  # "nvml", or "nvidia-smi" (usage.note says why)
        [(p.pid, p.unit, p.used_bytes) for p in usage.processes if p.gpu_index == 0]
    """

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "nvidia-smi"

    def command(self, python: str) -> StringCommand:
        return StringCommand(
            "set --", QuoteString(python), QuoteString(_NVML_PY), ";",
            'if [ -x "$1" ]; then "$1" -c "$2"; rc=$?; else echo "fallback: no python at $1 (the venv is not made yet)"; '
            "rc=3; fi; if [ $rc = 3 ]; then " + _SMI_FALLBACK + "; else exit $rc; fi",
        )  # fmt: skip

    def process(self, output: list[str]) -> GpuUsage:
        source, note = "nvml", ""
        gpus: list[GpuMemory] = []
        apps: list[tuple[int, str, int | None, int | None, str]] = []
        cgroups: dict[int, list[str]] = {}
        for line in output:
            kind, _, rest = line.partition(": ")
            if kind == "source":
                note = rest.removeprefix("nvml ")
            elif kind == "fallback":
                source, note = "nvidia-smi", rest
            elif kind == "gpu":
                g = json.loads(rest)
                gpus.append(GpuMemory(int(g["index"]), g["uuid"], g["name"], g["total"], g["used"]))
            elif kind == "app":
                a = json.loads(rest)
                apps.append((int(a["pid"]), a["name"], a["used"], int(a["gpu"]), a["uuid"]))
            elif kind == "smi-gpu":
                gpus.append(_smi_gpu(rest))
            elif kind == "smi-app":
                pid, used, uuid, name = [field.strip() for field in rest.split(",", 3)]
                mib = smi_int(used)
                apps.append((int(pid), name, None if mib is None else mib * MIB, None, uuid))
            elif kind == "cgroup":
                pid, cgroup_line = rest.split(" ", 1)
                cgroups.setdefault(int(pid), []).append(cgroup_line)
        index_of = {gpu.uuid: gpu.index for gpu in gpus}
        processes = [
            GpuApp(pid, name, used, index if index is not None else index_of.get(uuid, -1), uuid,
                   unit_from_cgroup(cgroups.get(pid, [])))
            for pid, name, used, index, uuid in apps
        ]
        return GpuUsage(source=source, note=note, gpus=gpus, processes=processes)
