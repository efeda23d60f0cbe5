"""The NVML stand-in (sandbox/nvml/nvml_sim.c) under the REAL pynvml, against the nvidia-smi stand-in.

The library is compiled into a temp dir; the real nvidia-ml-py (pinned
PYNVML_VERSION, in .sandbox/nvml-venv, made here when missing) loads it
through LD_LIBRARY_PATH. SANDBOX_GPU_LAYOUT / SANDBOX_GPU_REGISTRY point both
stand-ins at one simulated state in a tmp dir; GPU memory is held by real
processes (sandbox/hold.py), as on a sandbox host.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox import gpusim
from sandbox.nvml import build as nvml_build

ROOT = Path(__file__).resolve().parents[2]
SMI = ROOT / "sandbox" / "nvidia_smi.py"
HOLD = ROOT / "sandbox" / "hold.py"
PYNVML_VERSION = "13.615.71"  # nvidia-ml-py: what sglang 0.5.23 resolves to (Requires-Dist: nvidia-ml-py)
VENV = ROOT / ".sandbox" / "nvml-venv"
MIB = 1024 * 1024

# `nvidia-smi topo -p2p` code -> nvmlGpuP2PStatus_t
P2P_STATUS = {"OK": 0, "CNS": 1, "GNS": 2, "TNS": 3, "NS": 5, "U": 6}
P2P_MATRIX = [
    ["X", "OK", "CNS", "NS"],
    ["OK", "X", "OK", "TNS"],
    ["CNS", "OK", "X", "GNS"],
    ["NS", "TNS", "GNS", "X"],
]
GPU_QUERY = "index,uuid,name,memory.total,memory.used,memory.free,compute_cap,driver_version,pci.bus_id,count"

# run by the venv's python: everything pynvml says about the state, as JSON
PROBE = r"""
import json, sys
import pynvml as n

def attempt(fn, *args):
    try:
        return {"value": fn(*args)}
    except n.NVMLError as err:
        return {"error": type(err).__name__, "code": err.value, "text": str(err)}

out = {"pynvml_file": n.__file__}
try:
    n.nvmlInit()
except n.NVMLError as err:
    out["init_error"] = type(err).__name__
    print(json.dumps(out)); sys.exit(0)
out["driver"] = n.nvmlSystemGetDriverVersion()
out["nvml_version"] = n.nvmlSystemGetNVMLVersion()
out["cuda"] = n.nvmlSystemGetCudaDriverVersion()
out["cuda_v2"] = n.nvmlSystemGetCudaDriverVersion_v2()
count = n.nvmlDeviceGetCount()
handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
gpus = []
for h in handles:
    g = {"index": n.nvmlDeviceGetIndex(h)}
    g["name"] = attempt(n.nvmlDeviceGetName, h)
    g["uuid"] = n.nvmlDeviceGetUUID(h)
    pci = n.nvmlDeviceGetPciInfo_v3(h)
    g["bus_id"], g["bus_id_legacy"] = str(pci.busId), str(pci.busIdLegacy)
    g["pci"] = [pci.domain, pci.bus, pci.device]
    mem = attempt(n.nvmlDeviceGetMemoryInfo, h)
    if "value" in mem:
        v = mem["value"]
        mem["value"] = {"total": v.total, "used": v.used, "free": v.free}
    g["memory"] = mem
    mem2 = attempt(n.nvmlDeviceGetMemoryInfo, h, n.nvmlMemory_v2)
    if "value" in mem2:
        v = mem2["value"]
        mem2["value"] = {"total": v.total, "used": v.used, "free": v.free, "reserved": v.reserved}
    g["memory_v2"] = mem2
    g["cc"] = attempt(n.nvmlDeviceGetCudaComputeCapability, h)
    g["procs"] = [[p.pid, p.usedGpuMemory] for p in n.nvmlDeviceGetComputeRunningProcesses(h)]
    g["procs_v2"] = [[p.pid, p.usedGpuMemory] for p in n.nvmlDeviceGetComputeRunningProcesses_v2(h)]
    g["p2p"] = {cap: [n.nvmlDeviceGetP2PStatus(h, peer, caps_index) for peer in handles]
                for cap, caps_index in (("r", n.NVML_P2P_CAPS_INDEX_READ[0]), ("w", n.NVML_P2P_CAPS_INDEX_WRITE),
                                        ("n", n.NVML_P2P_CAPS_INDEX_NVLINK), ("a", n.NVML_P2P_CAPS_INDEX_ATOMICS),
                                        ("p", n.NVML_P2P_CAPS_INDEX_PCI))}
    g["by_uuid_index"] = n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(g["uuid"]))
    gpus.append(g)
out["gpus"] = gpus
try:
    n.nvmlDeviceGetHandleByIndex(count)
    out["out_of_range"] = "no error"
except n.NVMLError as err:
    out["out_of_range"] = type(err).__name__
    out["out_of_range_is_invalid_argument"] = isinstance(err, n.NVMLError_InvalidArgument)
out["process_names"] = {str(p): attempt(n.nvmlSystemGetProcessName, p).get("value")
                        for g in gpus for p, _ in g["procs"]}
out["by_missing_uuid"] = attempt(n.nvmlDeviceGetHandleByUUID, "GPU-nope").get("error")
out["unknown_function"] = attempt(n.nvmlDeviceGetPowerUsage, handles[0]).get("error")
n.nvmlShutdown()
out["after_shutdown"] = attempt(n.nvmlShutdown).get("error")
print(json.dumps(out))
"""


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def nvml_dir(tmp_path_factory) -> Path:
    """A directory holding the freshly compiled libnvidia-ml.so.1."""
    if shutil.which(os.environ.get("CC") or "gcc") is None:
        pytest.skip(f"no C compiler: apt-get install {' '.join(nvml_build.APT_PACKAGES)}")
    out = tmp_path_factory.mktemp("nvml")
    lib = nvml_build.build(out)
    (out / nvml_build.SONAME).symlink_to(lib.name)
    return out


@pytest.fixture(scope="session")
def pynvml_python() -> Path:
    return ensure_pynvml_venv()


def pynvml_source() -> Path:
    """pynvml.py of the pinned nvidia-ml-py (one pure-Python file) in .sandbox/nvml-venv."""
    found = sorted(ensure_pynvml_venv().parent.parent.glob("lib/python3*/site-packages/pynvml.py"))
    assert found, f"no pynvml.py in {VENV}"
    return found[0]


def ensure_pynvml_venv() -> Path:
    """python of .sandbox/nvml-venv with nvidia-ml-py==PYNVML_VERSION (made once, under a lock)."""
    python = VENV / "bin" / "python"
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / ".nvml-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _installed_version(python) != PYNVML_VERSION:  # made by `make test-venvs`, or here
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True, timeout=300)
            proc = subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                 f"nvidia-ml-py=={PYNVML_VERSION}"],
                capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            if proc.returncode != 0:
                pytest.skip(f"cannot pip install nvidia-ml-py=={PYNVML_VERSION} into {VENV}:\n{proc.stderr[-2000:]}")
    return python


def _installed_version(python: Path) -> str | None:
    if not python.exists():
        return None
    code = "import importlib.metadata as m; print(m.version('nvidia-ml-py'))"
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    return proc.stdout.strip() if proc.returncode == 0 else None


@pytest.fixture
def state(tmp_path):
    """A 4-GPU simulated state (P2P matrix set) in tmp_path; hold(gpus, mib) starts a holder."""
    layout = gpusim.make_layout(count=4, host_tag="00aa")
    gpusim.set_p2p_matrix(layout, P2P_MATRIX)
    layout_path = tmp_path / "layout.json"
    registry = tmp_path / "registry"
    env = dict(os.environ, SANDBOX_GPU_LAYOUT=str(layout_path), SANDBOX_GPU_REGISTRY=str(registry))
    env.pop("LD_LIBRARY_PATH", None)
    procs: dict[int, subprocess.Popen] = {}

    def write(new_layout: dict) -> None:
        layout_path.write_text(json.dumps(new_layout, indent=2) + "\n")

    def hold(gpus: str, mib: int, name: str | None = None) -> int:
        argv = [sys.executable, str(HOLD), "--gpu", gpus, "--mib", str(mib)]
        proc = subprocess.Popen(argv + (["--name", name] if name else []), env=env, stdout=subprocess.DEVNULL)
        procs[proc.pid] = proc
        deadline = time.monotonic() + 15
        while not (registry / f"{proc.pid}.json").exists():
            assert proc.poll() is None, "hold.py exited"
            assert time.monotonic() < deadline, "hold.py did not register"
            time.sleep(0.02)
        return proc.pid

    write(layout)
    yield {"layout": layout, "write": write, "hold": hold, "procs": procs, "env": env, "registry": registry,
           "path": layout_path}  # fmt: skip
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs.values():
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def probe(python: Path, lib_dir: Path, env: dict) -> dict:
    proc = subprocess.run(
        [str(python), "-c", PROBE], env=dict(env, LD_LIBRARY_PATH=str(lib_dir)),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def smi(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SMI), *args], env=env, capture_output=True, text=True, timeout=30)


def smi_rows(env: dict, *args: str) -> list[list[str]]:
    out = smi(env, *args)
    assert out.returncode == 0, out.stdout
    return [line.split(", ") for line in out.stdout.splitlines() if line.strip()]


def smi_p2p(env: dict, cap: str) -> list[list[str]]:
    out = smi(env, "topo", "-p2p", cap)
    assert out.returncode == 0, out.stdout
    rows = [line.split() for line in out.stdout.split("Legend:")[0].splitlines()[1:] if line.strip()]
    return [row[1:] for row in rows]


# ------------------------------------------------------------------ tests


def test_build_is_cached_by_source_digest(tmp_path):
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    first = nvml_build.build(tmp_path)
    mtime = first.stat().st_mtime_ns
    again = nvml_build.build(tmp_path)
    assert again == first and again.stat().st_mtime_ns == mtime
    assert nvml_build.digest() in first.name
    proc = subprocess.run(["readelf", "-d", str(first)], capture_output=True, text=True)  # binutils: gcc's dependency
    assert proc.returncode == 0, proc.stderr
    assert "(SONAME)" in proc.stdout and "[libnvidia-ml.so.1]" in proc.stdout, proc.stdout


def test_install_into_guest_root(tmp_path, nvml_dir):
    paths = nvml_build.install_into(tmp_path / "root", nvml_dir / nvml_build.SONAME)
    libdir = tmp_path / "root" / nvml_build.guest_lib_dir().lstrip("/")
    assert paths == [f"{nvml_build.guest_lib_dir()}/libnvidia-ml.so.1", f"{nvml_build.guest_lib_dir()}/libnvidia-ml.so"]
    assert (libdir / "libnvidia-ml.so.1").is_file() and not (libdir / "libnvidia-ml.so.1").is_symlink()
    assert os.readlink(libdir / "libnvidia-ml.so") == "libnvidia-ml.so.1"
    nvml_build.install_into(tmp_path / "root", nvml_dir / nvml_build.SONAME)  # again: replaced in place
    assert sorted(p.name for p in libdir.iterdir()) == ["libnvidia-ml.so", "libnvidia-ml.so.1"]


def test_exports_what_pynvml_calls(nvml_dir):
    lib = ctypes.CDLL(str(nvml_dir / nvml_build.SONAME))
    for name in (
        "nvmlInit_v2", "nvmlInitWithFlags", "nvmlShutdown", "nvmlErrorString", "nvmlSystemGetDriverVersion",
        "nvmlSystemGetNVMLVersion", "nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2",
        "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetName", "nvmlDeviceGetUUID",
        "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetP2PStatus", "nvmlDeviceGetIndex",
        "nvmlDeviceGetHandleByUUID",
    ):  # fmt: skip
        assert hasattr(lib, name), name
    assert not hasattr(lib, "nvmlDeviceGetPowerUsage")  # unknown: FunctionNotFound in pynvml
    assert not hasattr(lib, "load_layout")  # internals stay hidden


def test_uninitialized_calls_fail_without_pynvml(nvml_dir, state):
    """Plain ctypes (no pynvml): NVML_ERROR_UNINITIALIZED before init, as the real library."""
    code = (
        "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); c = ctypes.c_uint(7);"
        "before = lib.nvmlDeviceGetCount_v2(ctypes.byref(c));"
        "init = lib.nvmlInit_v2(); after = lib.nvmlDeviceGetCount_v2(ctypes.byref(c));"
        "lib.nvmlErrorString.restype = ctypes.c_char_p;"
        "print(before, init, after, c.value, lib.nvmlShutdown(), lib.nvmlShutdown(), lib.nvmlErrorString(1).decode())"
    )
    out = subprocess.run([sys.executable, "-c", code, str(nvml_dir / nvml_build.SONAME)], env=state["env"],
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "0", "0", "4", "0", "1", "Uninitialized"]


def test_pynvml_sees_what_nvidia_smi_prints(nvml_dir, pynvml_python, state):
    a = state["hold"]("0", 1500, name="stale-a")
    b = state["hold"]("1,3", 4096, name="python3")
    c = state["hold"]("1", 100)
    env = state["env"]
    data = probe(pynvml_python, nvml_dir, env)
    assert str(VENV) in data["pynvml_file"]

    gpus_smi = smi_rows(env, f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits")
    assert len(data["gpus"]) == len(gpus_smi) == 4
    assert data["driver"] == gpus_smi[0][7] == "580.95.05"
    assert data["nvml_version"] == "13.580.95.05"
    assert data["cuda"] == data["cuda_v2"] == 13000
    for g, row in zip(data["gpus"], gpus_smi, strict=True):
        index, uuid, name, total, used, free, cc, _driver, bus_id, count = row
        assert g["index"] == int(index) and g["by_uuid_index"] == int(index)
        assert g["uuid"] == uuid and g["name"]["value"] == name and g["bus_id"] == bus_id
        assert g["bus_id_legacy"] == bus_id[4:]
        assert g["pci"] == [int(x, 16) for x in bus_id.split(".")[0].split(":")]
        mem = g["memory"]["value"]
        assert mem["total"] == int(total) * MIB and mem["used"] == int(used) * MIB and mem["free"] == int(free) * MIB
        mem2 = g["memory_v2"]["value"]
        assert mem2 == {**mem, "reserved": 0}
        assert "{}.{}".format(*g["cc"]["value"]) == cc == "12.0"
        assert int(count) == 4
    assert [g["memory"]["value"]["used"] // MIB for g in data["gpus"]] == [1500, 4196, 0, 4096]

    apps = smi_rows(env, "--query-compute-apps=pid,used_memory,gpu_uuid", "--format=csv,noheader,nounits")
    smi_procs = sorted((uuid, int(pid), int(mib) * MIB) for pid, mib, uuid in apps)
    nvml_procs = sorted((g["uuid"], pid, used) for g in data["gpus"] for pid, used in g["procs"])
    assert nvml_procs == smi_procs
    uuids = [g["uuid"] for g in data["gpus"]]
    assert nvml_procs == sorted([
        (uuids[0], a, 1500 * MIB), (uuids[1], b, 4096 * MIB), (uuids[3], b, 4096 * MIB), (uuids[1], c, 100 * MIB),
    ])  # fmt: skip
    assert [g["procs_v2"] for g in data["gpus"]] == [g["procs"] for g in data["gpus"]]
    names = {pid: name for pid, name, _ in smi_rows(env, "--query-compute-apps=pid,process_name,gpu_uuid",
                                                     "--format=csv,noheader")}  # fmt: skip
    assert data["process_names"] == names and names[str(a)] == "stale-a"
    assert [pid for pid, _ in data["gpus"][1]["procs"]] == sorted([b, c])

    for cap in "rwnap":
        matrix = smi_p2p(env, cap)
        assert [len(row) for row in matrix] == [4] * 4 and [len(g["p2p"][cap]) for g in data["gpus"]] == [4] * 4
        for i, g in enumerate(data["gpus"]):
            for j, status in enumerate(g["p2p"][cap]):
                if i != j:
                    assert status == P2P_STATUS[matrix[i][j]], (cap, i, j)
    assert data["gpus"][0]["p2p"]["r"][1:] == [0, 1, 5]
    assert data["gpus"][0]["p2p"]["n"][1:] == [5, 5, 5]  # PCIe: no NVLink

    assert data["out_of_range"] == "NVMLError_InvalidArgument" and data["out_of_range_is_invalid_argument"]
    assert data["by_missing_uuid"] == "NVMLError_NotFound"
    assert data["unknown_function"] == "NVMLError_FunctionNotFound"
    assert data["after_shutdown"] == "NVMLError_Uninitialized"


def test_dead_and_reused_pids_hold_nothing(nvml_dir, pynvml_python, state):
    live = state["hold"]("3", 64)  # positive control: a live holder is seen by both
    a = state["hold"]("2", 2048)
    state["procs"][a].kill()  # SIGKILL: no unregister, the registration stays behind
    state["procs"][a].wait(timeout=60)
    assert (state["registry"] / f"{a}.json").exists()
    # our own PID, registered with another starttime: a reused PID
    state["registry"].mkdir(exist_ok=True)
    (state["registry"] / f"{os.getpid()}.json").write_text(
        json.dumps({"pid": os.getpid(), "starttime": "1", "name": "old", "gpus": {"2": 999}})
    )
    data = probe(pynvml_python, nvml_dir, state["env"])
    assert data["gpus"][2]["procs"] == [] and data["gpus"][2]["memory"]["value"]["used"] == 0
    assert data["gpus"][3]["procs"] == [[live, 64 * MIB]] and data["gpus"][3]["memory"]["value"]["used"] == 64 * MIB
    rows = smi_rows(state["env"], "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    assert rows == [[str(live), "64"]]


def test_unavailable_fields_print_like_nvidia_smi_and_fail_in_nvml(nvml_dir, pynvml_python, state):
    layout = state["layout"]
    gpusim.mark_unavailable(layout, gpusim.UNIFIED_MEMORY_FIELDS, gpusim.NA, gpus=[1])
    gpusim.mark_unavailable(layout, ["used_memory"], gpusim.NA, gpus=[1], apps=True)  # alias of used_gpu_memory
    gpusim.mark_unavailable(layout, ["compute_cap"], gpusim.NOT_SUPPORTED, gpus=[2])
    state["write"](layout)
    pid = state["hold"]("0,1", 512)
    env = state["env"]

    rows = smi_rows(env, "--query-gpu=index,memory.total,memory.used,memory.free,compute_cap",
                    "--format=csv,noheader,nounits")  # fmt: skip
    assert rows[0] == ["0", "97887", "512", "97375", "12.0"]
    assert rows[1] == ["1", "[N/A]", "[N/A]", "[N/A]", "12.0"]
    assert rows[2] == ["2", "97887", "0", "97887", "[Not Supported]"]
    with_units = smi(env, "--query-gpu=memory.total,memory.used,compute_cap", "--format=csv", "-i", "1,2")
    assert with_units.stdout.splitlines() == [
        "memory.total [MiB], memory.used [MiB], compute_cap",
        "[N/A], [N/A], 12.0",
        "97887 MiB, 0 MiB, [Not Supported]",
    ]
    apps = smi_rows(env, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    assert apps == [[str(pid), "512"], [str(pid), "[N/A]"]]
    assert "Not Supported" in smi(env).stdout  # the summary table's memory cell

    data = probe(pynvml_python, nvml_dir, env)
    g0, g1, g2 = data["gpus"][:3]
    assert g0["memory"]["value"]["used"] == 512 * MIB and g0["procs"] == [[pid, 512 * MIB]]
    assert g1["memory"]["error"] == g1["memory_v2"]["error"] == "NVMLError_NotSupported"
    assert g1["procs"] == [[pid, None]]  # NVML_VALUE_NOT_AVAILABLE -> None in pynvml
    assert g2["cc"]["error"] == "NVMLError_NotSupported" and g2["cc"]["text"] == "Not Supported"
    assert g2["memory"]["value"]["total"] == 97887 * MIB


def test_no_layout_is_driver_not_loaded(nvml_dir, pynvml_python, state):
    state["path"].unlink()
    assert smi(state["env"], "-L").returncode == 9  # nvidia-smi: cannot talk to the driver
    assert probe(pynvml_python, nvml_dir, state["env"])["init_error"] == "NVMLError_DriverNotLoaded"
