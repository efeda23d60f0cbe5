"""The nvidia-smi stand-in (sandbox/nvidia_smi.py), run locally as a script.

SANDBOX_GPU_LAYOUT / SANDBOX_GPU_REGISTRY point gpusim at a tmp dir; the test
process registers itself as a GPU memory holder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox import gpusim

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "sandbox" / "nvidia_smi.py"
HOLD = ROOT / "sandbox" / "hold.py"

ALL_GPU_FIELDS = "index,uuid,name,memory.total,memory.used,memory.free,compute_cap,driver_version,pci.bus_id,count"
APP_FIELDS = "pid,process_name,used_memory,used_gpu_memory,gpu_uuid,gpu_bus_id,gpu_name"


@pytest.fixture
def gpu_env(tmp_path, monkeypatch):
    layout_path = tmp_path / "layout.json"
    registry = tmp_path / "registry"
    layout_path.write_text(json.dumps(gpusim.make_layout(host_tag="0001")))
    monkeypatch.setattr(gpusim, "REGISTRY_DIR", registry)
    env = dict(os.environ, SANDBOX_GPU_LAYOUT=str(layout_path), SANDBOX_GPU_REGISTRY=str(registry))
    yield {"env": env, "layout": layout_path, "registry": registry}
    gpusim.unregister(os.getpid())


def smi(gpu_env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], env=gpu_env["env"], text=True, capture_output=True, timeout=30
    )


def test_query_gpu_header_units_and_values(gpu_env):
    out = smi(gpu_env, f"--query-gpu={ALL_GPU_FIELDS}", "--format=csv")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == (
        "index, uuid, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], "
        "compute_cap, driver_version, pci.bus_id, count"
    )
    assert len(lines) == 9
    cols = lines[1].split(", ")
    assert cols[0] == "0"
    assert cols[1] == "GPU-5a1d0001-0000-4000-8000-000000000000"
    assert cols[2] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert cols[3:6] == ["97887 MiB", "0 MiB", "97887 MiB"]
    assert cols[6:] == ["12.0", "580.95.05", "00000000:18:00.0", "8"]
    assert lines[8].split(", ")[8] == "00000000:88:00.0"


def test_query_gpu_noheader_nounits(gpu_env):
    out = smi(gpu_env, "--query-gpu=index,memory.total,memory.used", "--format=csv,noheader,nounits")
    assert out.returncode == 0
    assert out.stdout.splitlines() == [f"{i}, 97887, 0" for i in range(8)]


def test_nounits_keeps_header_units(gpu_env):
    out = smi(gpu_env, "--query-gpu=memory.used", "--format=csv,nounits")
    assert out.stdout.splitlines()[:2] == ["memory.used [MiB]", "0"]


def test_memory_used_and_compute_apps_from_registrations(gpu_env):
    gpusim.register(os.getpid(), {0: 56320, 3: 1024}, name="stale-llm")
    out = smi(gpu_env, "--query-gpu=index,memory.used,memory.free", "--format=csv,noheader,nounits")
    rows = [line.split(", ") for line in out.stdout.splitlines()]
    assert rows[0] == ["0", "56320", str(97887 - 56320)]
    assert rows[3] == ["3", "1024", str(97887 - 1024)]
    assert rows[1] == ["1", "0", "97887"]

    apps = smi(gpu_env, f"--query-compute-apps={APP_FIELDS}", "--format=csv")
    lines = apps.stdout.splitlines()
    assert lines[0] == (
        "pid, process_name, used_gpu_memory [MiB], used_gpu_memory [MiB], gpu_uuid, gpu_bus_id, gpu_name"
    )
    pid = str(os.getpid())
    assert lines[1].split(", ")[:4] == [pid, "stale-llm", "56320 MiB", "56320 MiB"]
    assert lines[1].split(", ")[4] == "GPU-5a1d0001-0000-4000-8000-000000000000"
    assert lines[2].split(", ")[:3] == [pid, "stale-llm", "1024 MiB"]
    assert len(lines) == 3

    short = smi(gpu_env, "--query-compute-apps=pid,used_memory,gpu_uuid", "--format=csv,noheader,nounits")
    assert short.stdout.splitlines()[0] == f"{pid}, 56320, GPU-5a1d0001-0000-4000-8000-000000000000"

    only3 = smi(gpu_env, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits", "-i", "3")
    assert only3.stdout.splitlines() == [f"{pid}, 1024"]
    ids = smi(gpu_env, "--query-gpu=index", "--format=csv,noheader", "--id=1,3")
    assert ids.stdout.splitlines() == ["1", "3"]


def test_compute_apps_none(gpu_env):
    out = smi(gpu_env, "--query-compute-apps=pid,used_memory", "--format=csv")
    assert out.returncode == 0
    assert out.stdout == "pid, used_gpu_memory [MiB]\n"
    out = smi(gpu_env, "--query-compute-apps=pid,used_memory", "--format=csv,noheader")
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""


def test_dead_process_holds_nothing(gpu_env):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        gpusim.register(child.pid, {0: 4096})
        out = smi(gpu_env, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0")
        assert out.stdout.strip() == "4096"
    finally:
        child.kill()
        child.wait()
    out = smi(gpu_env, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0")
    assert out.stdout.strip() == "0"


def test_unknown_field(gpu_env):
    out = smi(gpu_env, "--query-gpu=index,bogus.field", "--format=csv")
    assert out.returncode == 2
    assert 'Field "bogus.field" is not a valid field to query.' in out.stdout
    out = smi(gpu_env, "--query-compute-apps=pid,memory.total", "--format=csv")
    assert out.returncode == 2


def test_bad_id(gpu_env):
    out = smi(gpu_env, "--query-gpu=index", "--format=csv", "-i", "9")
    assert out.returncode == 6
    assert "No devices were found" in out.stdout


def test_list_gpus(gpu_env):
    out = smi(gpu_env, "-L")
    lines = out.stdout.splitlines()
    assert len(lines) == 8
    assert lines[0] == (
        "GPU 0: NVIDIA RTX PRO 6000 Blackwell Server Edition (UUID: GPU-5a1d0001-0000-4000-8000-000000000000)"
    )


def test_topo_p2p(gpu_env):
    out = smi(gpu_env, "topo", "-p2p", "r")
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert lines[0] == " \t" + "".join(f"GPU{i}\t" for i in range(8))
    assert lines[1] == " GPU0\tX\t" + "OK\t" * 7
    assert lines[8] == " GPU7\t" + "OK\t" * 7 + "X\t"
    assert "Legend:" in out.stdout and "NS   = Not supported" in out.stdout
    # NVLink: not on PCIe cards
    assert " GPU0\tX\tNS\t" in smi(gpu_env, "topo", "-p2p", "n").stdout


def test_topo_p2p_not_supported(gpu_env):
    gpu_env["layout"].write_text(json.dumps(gpusim.make_layout(count=2, p2p="NS")))
    out = smi(gpu_env, "topo", "-p2p", "w")
    assert out.stdout.splitlines()[1:3] == [" GPU0\tX\tNS\t", " GPU1\tNS\tX\t"]


def test_plain_table_says_simulated(gpu_env):
    out = smi(gpu_env)
    assert out.returncode == 0
    assert "SIMULATED" in out.stdout
    assert "97887MiB" in out.stdout
    assert "No running processes found" in out.stdout


def test_no_layout_is_no_driver(gpu_env):
    gpu_env["layout"].unlink()
    out = smi(gpu_env, "--query-gpu=index", "--format=csv")
    assert out.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in out.stdout


def test_other_gpu_counts(gpu_env):
    gpu_env["layout"].write_text(
        json.dumps(gpusim.make_layout(count=2, memory_mib=24576, compute_cap="8.9", name="NVIDIA L4"))
    )
    out = smi(gpu_env, "--query-gpu=index,name,memory.total,compute_cap,count", "--format=csv,noheader")
    assert out.stdout.splitlines() == ["0, NVIDIA L4, 24576 MiB, 8.9, 2", "1, NVIDIA L4, 24576 MiB, 8.9, 2"]


def test_hold_registers_and_exits_on_sigterm(gpu_env):
    proc = subprocess.Popen(
        [sys.executable, str(HOLD), "--gpu", "0,1", "--mib", "56320", "--name", "holder"],
        env=gpu_env["env"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        reg = gpu_env["registry"] / f"{proc.pid}.json"
        deadline = time.monotonic() + 30  # a bound only
        while not reg.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert reg.exists()
        out = smi(gpu_env, "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits")
        assert out.stdout.splitlines() == [f"{proc.pid}, holder, 56320"] * 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not reg.exists()
    out = smi(gpu_env, "--query-compute-apps=pid", "--format=csv,noheader")
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""  # the same query listed the holder while it ran


def test_unified_memory_gpu_prints_na_and_the_deploys_fact_parses_it(gpu_env):
    """A GB10-class GPU (unified memory): the real tool prints [N/A] for memory, also with
    nounits; the deploy's NvidiaGpus fact (the same query) reads them as unknown (None)."""
    from facts.gpu import NvidiaGpus

    layout = gpusim.make_layout(count=1, name="NVIDIA GB10", compute_cap="12.1", host_tag="0001")
    gpusim.mark_unavailable(layout, gpusim.UNIFIED_MEMORY_FIELDS)
    gpu_env["layout"].write_text(json.dumps(layout))
    fact = NvidiaGpus()
    out = smi(gpu_env, *fact.command().split()[1:])
    assert out.returncode == 0, out.stdout
    assert out.stdout.splitlines() == [
        "0, GPU-5a1d0001-0000-4000-8000-000000000000, NVIDIA GB10, [N/A], [N/A], 12.1, 580.95.05, 00000000:18:00.0"
    ]
    (gpu,) = fact.process(out.stdout.splitlines())
    assert (gpu.memory_total_mib, gpu.memory_used_mib, gpu.memory_free_mib) == (None, None, None)
    assert (gpu.name, gpu.compute_cap, gpu.driver_version) == ("NVIDIA GB10", "12.1", "580.95.05")
