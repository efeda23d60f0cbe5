"""The NVML stand-in on a booted sandbox host: the real pynvml, inside the guest, sees what nvidia-smi sees.

The host (sgc212, this module's own) gets /usr/lib/<multiarch>/libnvidia-ml.so.1
at `up`; a venv in the guest gets nvidia-ml-py (pip through the guest's pip
settings; offline: pynvml.py copied from the machine's .sandbox/nvml-venv).
GPU memory is held by stale processes started with sandbox.stale, detached
and as a systemd unit, exactly as the deploy's tests do.
"""

from __future__ import annotations

import json
import shlex

import pytest

from sandbox import stale
from sandbox.nvml import build as nvml_build
from tests.integration.helpers import boot_extra_host, remove_host
from tests.unit.test_nvml_sim import PYNVML_VERSION, pynvml_source

pytestmark = pytest.mark.sandbox

INDEX = 212
GUEST_VENV = "/opt/nvml-probe"
MIB = 1024 * 1024

# runs in the guest: GPUs, memory and processes as pynvml reports them, and which libnvidia-ml it loaded
PROBE = r"""
import json
import pynvml as n
n.nvmlInit()
gpus = []
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    mem = n.nvmlDeviceGetMemoryInfo(h)
    gpus.append({
        "index": n.nvmlDeviceGetIndex(h), "uuid": n.nvmlDeviceGetUUID(h), "name": n.nvmlDeviceGetName(h),
        "total": mem.total, "used": mem.used, "cc": "%d.%d" % n.nvmlDeviceGetCudaComputeCapability(h),
        "bus_id": str(n.nvmlDeviceGetPciInfo(h).busId),
        "procs": [[p.pid, p.usedGpuMemory] for p in n.nvmlDeviceGetComputeRunningProcesses(h)],
        "p2p_read": [n.nvmlDeviceGetP2PStatus(h, n.nvmlDeviceGetHandleByIndex(j), 0)
                     for j in range(n.nvmlDeviceGetCount())],
    })
driver = n.nvmlSystemGetDriverVersion()
n.nvmlShutdown()
libs = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libnvidia-ml" in line})
print(json.dumps({"driver": driver, "gpus": gpus, "libs": libs, "pynvml": n.__file__}))
"""


@pytest.fixture(scope="module")
def host():
    host = boot_extra_host(INDEX)
    try:
        yield host
    finally:
        remove_host(host)


@pytest.fixture(scope="module")
def guest_python(host) -> str:
    """The guest venv's python, with the pinned nvidia-ml-py (or its pynvml.py) importable."""
    py = f"{GUEST_VENV}/bin/python"
    proc = host.run(
        f"python3 -m venv {GUEST_VENV} && {GUEST_VENV}/bin/pip install -q nvidia-ml-py=={PYNVML_VERSION}",
        check=False,
        timeout=300,
    )
    if proc.returncode != 0:  # no package index reachable from the guest: the same file, copied
        site = host.run(f"{py} -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'").stdout.strip()
        host.run(f"cat > {shlex.quote(site)}/pynvml.py", input=pynvml_source().read_text())
    return py


def smi_rows(host, *args: str) -> list[list[str]]:
    out = host.run(shlex.join(["nvidia-smi", *args]))
    return [line.split(", ") for line in out.stdout.splitlines() if line.strip()]


def nvml(host, python: str) -> dict:
    return json.loads(host.run(f"{python} -c {shlex.quote(PROBE)}", timeout=60).stdout)


def test_pynvml_in_guest_matches_nvidia_smi_with_stale_processes(host, guest_python):
    detached = stale.start_stale(host, gpu=1, gib=3, name="other-llm")
    unit_pid = stale.start_stale(host, gpu="0,2", gib=1.5, unit="nvml-probe-holder")
    try:
        data = nvml(host, guest_python)
        assert data["libs"] == [f"{nvml_build.guest_lib_dir()}/libnvidia-ml.so.1"], data["libs"]
        assert data["pynvml"].startswith(GUEST_VENV)

        rows = smi_rows(host, "--query-gpu=index,uuid,name,memory.total,memory.used,compute_cap,driver_version,"
                        "pci.bus_id", "--format=csv,noheader,nounits")  # fmt: skip
        assert len(rows) == len(data["gpus"]) == host.gpus["count"] == 8
        for g, (index, uuid, name, total, used, cc, driver, bus_id) in zip(data["gpus"], rows, strict=True):
            assert (g["index"], g["uuid"], g["name"], g["cc"], g["bus_id"]) == (int(index), uuid, name, cc, bus_id)
            assert (g["total"], g["used"]) == (int(total) * MIB, int(used) * MIB)
            assert data["driver"] == driver
            assert g["p2p_read"] == [0] * 8  # layout p2p "OK" (self: OK)
        assert [g["used"] // MIB for g in data["gpus"][:3]] == [1536, 3072, 1536]

        apps = smi_rows(host, "--query-compute-apps=pid,used_memory,gpu_uuid", "--format=csv,noheader,nounits")
        smi_procs = sorted((uuid, int(pid), int(mib) * MIB) for pid, mib, uuid in apps)
        nvml_procs = sorted((g["uuid"], pid, used) for g in data["gpus"] for pid, used in g["procs"])
        assert nvml_procs == smi_procs
        uuids = [g["uuid"] for g in data["gpus"]]
        assert (uuids[1], detached, 3072 * MIB) in nvml_procs
        assert (uuids[0], unit_pid, 1536 * MIB) in nvml_procs and (uuids[2], unit_pid, 1536 * MIB) in nvml_procs
    finally:
        stale.stop_stale(host, unit="nvml-probe-holder")
        stale.stop_stale(host, pid=detached)

    # the memory is freed as the processes end: NVML and nvidia-smi agree again
    for _ in range(50):
        data = nvml(host, guest_python)
        if not any(g["procs"] for g in data["gpus"]):
            break
    assert [g["procs"] for g in data["gpus"]] == [[]] * 8
    assert all(g["used"] == 0 for g in data["gpus"])
    assert smi_rows(host, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits") == []
