"""The post-ready GPU balance check and pynvml in the server's venv, on a converged sandbox host
(the shared sgc280: tests/integration/helpers.py).

The venv gets nvidia-ml-py (group_data/sandbox.py, as sglang requires it); the guest's
libnvidia-ml.so.1 is the NVML stand-in over the same simulated GPUs as nvidia-smi. A stale
process of another service (sandbox.stale) that the deploy is told to leave alone
(stale_policy=ignore) shares GPU 3: the balance check fails naming the GPU and the process;
once it is stopped, the next run passes and changes nothing.
"""

from __future__ import annotations

import json
import shlex

import pytest

from sandbox import stale
from tests.integration.helpers import SHARED_CONVERGED_GROUP, sandbox_server_venv, grand_total, shared_converged_host
from tests.integration.helpers import timed as timed_run

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group(SHARED_CONVERGED_GROUP)]

PYTHON = f"{sandbox_server_venv()}/bin/python"
MIB = 1024 * 1024
TIMINGS: dict[str, float] = {}

# run by the venv's python in the guest: GPUs, memory and compute processes as pynvml sees them
PROBE = r"""
import json, pynvml as n
n.nvmlInit()
out = []
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    mem = n.nvmlDeviceGetMemoryInfo(h)
    out.append({"index": n.nvmlDeviceGetIndex(h), "uuid": n.nvmlDeviceGetUUID(h), "name": n.nvmlDeviceGetName(h),
                "total": mem.total, "used": mem.used,
                "procs": sorted([p.pid, p.usedGpuMemory] for p in n.nvmlDeviceGetComputeRunningProcesses(h))})
n.nvmlShutdown()
print(json.dumps({"gpus": out, "pynvml": n.__file__}))
"""


# the PIDs in sglang.service's cgroup (the guest has hybrid cgroups: the name=systemd hierarchy)
IN_UNIT = "for p in /proc/[0-9]*; do grep -qs ':/system.slice/sglang.service$' $p/cgroup && echo ${p#/proc/}; done; true"


def timed(name: str, *args, **kwargs):
    return timed_run(TIMINGS, name, *args, **kwargs)


@pytest.fixture(scope="module")
def host(request):
    yield shared_converged_host(request, TIMINGS)  # converged by this module when it runs first
    print("\ngpu balance timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in TIMINGS.items()))


def pynvml_view(host) -> dict:
    return json.loads(host.run(f"{PYTHON} -c {shlex.quote(PROBE)}", timeout=60).stdout)


def smi_view(host) -> dict:
    gpus = host.run("nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used --format=csv,noheader,nounits")
    apps = host.run("nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid --format=csv,noheader,nounits")
    procs: dict[str, list] = {}
    for line in apps.stdout.splitlines():
        pid, used, uuid = line.split(", ")
        procs.setdefault(uuid, []).append([int(pid), int(used) * MIB])
    out = []
    for line in gpus.stdout.splitlines():
        index, uuid, name, total, used = line.split(", ")
        out.append({"index": int(index), "uuid": uuid, "name": name, "total": int(total) * MIB,
                    "used": int(used) * MIB, "procs": sorted(procs.get(uuid, []))})
    return {"gpus": out}


def test_converge_checks_the_balance_after_readiness(host):
    out = host.converge_out
    assert "ready: sglang.service serves tiny" in out, out
    # the server started this run: judged after readiness, through NVML, one line per GPU (index, GB, processes)
    lines = [line.split("] ", 1)[1] for line in out.splitlines() if "] gpu_balance: GPU " in line]
    assert len(lines) == 8, out
    for index, line in enumerate(lines):
        assert line.startswith(f"gpu_balance: GPU {index}: 87.24 GB used of 102.64 GB; pid "), line
        assert line.endswith(" (python3, sglang.service) 87.24 GB"), line  # one TP rank per GPU, in the unit
    assert "gpu_balance: GPUs [0, 1, 2, 3, 4, 5, 6, 7] hold only sglang.service's memory (max/min 1.000 <= 1.1; " \
           "nvml: nvidia-ml-py 13.615.71" in out, out


def test_pynvml_in_the_venv_sees_what_nvidia_smi_sees(host):
    stale_pid = stale.start_stale(host, gpu=5, gib=1, name="probe-holder")
    try:
        nvml = pynvml_view(host)
        assert nvml["pynvml"].startswith(PYTHON.removesuffix("bin/python"))  # the venv's own nvidia-ml-py
        smi = smi_view(host)
        assert nvml["gpus"] == smi["gpus"]
        assert [stale_pid, 1024 * MIB] in nvml["gpus"][5]["procs"] and len(nvml["gpus"]) == 8
        in_unit = {int(pid) for pid in host.run(IN_UNIT).stdout.split()}
        assert all(pid in in_unit for gpu in nvml["gpus"] for pid, _ in gpu["procs"] if pid != stale_pid)
    finally:
        stale.stop_stale(host, pid=stale_pid)


def test_a_stale_process_on_one_gpu_fails_the_check_then_the_next_run_passes_and_changes_nothing(host):
    pid = stale.start_stale(host, gpu=3, gib=2, unit="other-llm")
    try:
        # told to leave other processes alone, the deploy changes nothing, and the check says why the GPUs are not ours
        proc = timed("stale shares GPU 3", "deploy.py", "--data", "stale_policy=ignore", limit=host.name)
        assert proc.returncode != 0, proc.out
        assert (f"gpu_balance: GPU 3 is shared: pid {pid} (python3, other-llm.service) holds 2.15 GB there "
                "beside sglang.service") in proc.out, proc.out
        assert f"pid {pid} (python3, other-llm.service) 2.15 GB" in proc.out  # GPU 3's line
        assert "GPU 2 is shared" not in proc.out
    finally:
        stale.stop_stale(host, unit="other-llm")
    again = timed("no-op after it stopped", "deploy.py", limit=host.name)
    assert again.returncode == 0, again.out
    assert grand_total(again.out)[:2] == (0, 0), again.out
    assert "gpu_balance: GPU 3: " in again.out and "other-llm" not in again.out
    assert "gpu_balance: GPUs [0, 1, 2, 3, 4, 5, 6, 7] hold only sglang.service's memory" in again.out
