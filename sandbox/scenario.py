"""Sandbox scenarios: a sandbox host put in the state of a real incident.

ct200-incident (DESIGN.md, "The problem"): the state the reference host was in
before the deploy existed:
- the venv at /opt/sglang/venv was made by uv: no pip in it; and the host has
  no ensurepip, so pip must be bootstrapped the offline get-pip way;
- sglang 0.5.23 in it (the real package, installed without its dependencies:
  its metadata requires compressed-tensors==0.18.0 and its compressed_tensors
  utils reference CompressionFormat.nvfp4_pack_quantized for every
  compressed-tensors model) beside compressed-tensors 0.8.1 and the machine's
  CPU torch. The model is Kimi K2.6's INT4 `pack-quantized` (models/sandbox-tiny.yaml),
  a format 0.8.1 has: it is SGLang that needs the upgrade, as on ct200;
- 0.8.1 pinned ==0.8.1 by another installed package (`vllm-stub` 0.6.5 plays
  vllm 0.6.5; the host's settings allow it to conflict);
- another systemd service (embedder.service, Restart=always) holding 55 GB on GPU 0;
- the model dir on a filesystem too small for the model (20 MiB for ~40 MB).

    python -m sandbox up --scenario ct200-incident
    python -m sandbox grow-disk sgc1 /srv/models 256     # the operator's fix
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import zipfile
from pathlib import Path

from sandbox import hosts as sandbox_hosts
from sandbox import stale

CACHE = Path("/var/cache/sglang-converge")
VENV = "/opt/sglang/venv"
MODEL_DISK = "/srv/models"
MODEL_DISK_MIB = 20
GROWN_DISK_MIB = 256
SGLANG = "sglang==0.5.23"
PIN_PACKAGE = "vllm-stub"
PIN_VERSION = "0.6.5"
STALE_UNIT = "embedder.service"
STALE_GIB = 55


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def pin_wheel(out_dir: Path = CACHE / "wheels") -> Path:
    """A tiny wheel that pins compressed-tensors==0.8.1, the way vllm 0.6.5 does."""
    out_dir.mkdir(parents=True, exist_ok=True)
    dist = PIN_PACKAGE.replace("-", "_")
    path = out_dir / f"{dist}-{PIN_VERSION}-py3-none-any.whl"
    if path.exists():
        return path
    info = f"{dist}-{PIN_VERSION}.dist-info"
    files = {
        f"{dist}/__init__.py": b'"""Stands in for vllm 0.6.5: it pins compressed-tensors==0.8.1."""\n',
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {PIN_PACKAGE}\nVersion: {PIN_VERSION}\n"
            "Summary: sandbox stand-in for vllm 0.6.5's exact compressed-tensors pin\n"
            "Requires-Dist: compressed-tensors==0.8.1\n"
        ).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: sglang-converge-sandbox\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/top_level.txt": f"{dist}\n".encode(),
    }
    record = [_record_line(name, data) for name, data in files.items()] + [f"{info}/RECORD,,"]
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    tmp.replace(path)
    return path


def pip_wheel(out_dir: Path = CACHE / "wheels") -> Path:
    """pip's own wheel, for the offline bootstrap (what an air-gapped operator uploads)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    found = sorted(out_dir.glob("pip-*.whl"))
    if not found:
        subprocess.run(["python3", "-m", "pip", "download", "-q", "--no-deps", "pip", "-d", str(out_dir)],
                       check=True)
        found = sorted(out_dir.glob("pip-*.whl"))
    return found[-1]


def _uv_binary() -> Path:
    uv = shutil.which("uv") or str(Path(__import__("sys").executable).parent / "uv")
    if not Path(uv).exists():
        raise RuntimeError("uv is not installed on the machine (it is a dev dependency: make setup)")
    return Path(uv)


def ct200_incident(host: sandbox_hosts.SandboxHost, log=print) -> None:
    """Put ``host`` in the state of the reference incident."""
    root = Path(host.root)
    pip_wheel()  # what the deploy uploads for the offline pip bootstrap (inventory/sandbox.py)
    # uv made the venv (no pip), and the host has no ensurepip
    shutil.copy2(_uv_binary(), root / "usr/local/bin/uv")
    wheel = pin_wheel()
    shutil.copy2(wheel, root / "var/tmp" / wheel.name)
    host.run("rm -rf /usr/lib/python3.11/ensurepip")
    log(f"{host.name}: uv venv {VENV} (no pip), {SGLANG} (no deps), compressed-tensors 0.8.1 + CPU torch, "
        f"{PIN_PACKAGE} {PIN_VERSION}")
    host.run(
        f"export UV_CACHE_DIR=/var/cache/uv; uv venv -q --python /usr/bin/python3 {VENV} && "
        f"uv pip install -q --python {VENV}/bin/python --find-links /opt/wheels torch==2.13.0+cpu && "
        f"uv pip install -q --python {VENV}/bin/python compressed-tensors==0.8.1 && "
        f"uv pip install -q --python {VENV}/bin/python --no-deps {SGLANG} && "
        f"uv pip install -q --python {VENV}/bin/python --no-deps /var/tmp/{wheel.name}",
        timeout=900,
    )
    log(f"{host.name}: {STALE_UNIT} (Restart=always) holding {STALE_GIB} GB on GPU 0")
    stale.start_stale(host, gpu=0, gib=STALE_GIB, unit=STALE_UNIT, restart_always=True)
    log(f"{host.name}: {MODEL_DISK} on a {MODEL_DISK_MIB} MiB filesystem (the model is ~40 MB)")
    sandbox_hosts.set_disk(host, MODEL_DISK, MODEL_DISK_MIB)


SCENARIOS = {"ct200-incident": ct200_incident}
