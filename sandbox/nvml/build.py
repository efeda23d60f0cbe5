"""Build the NVML stand-in (libnvidia-ml.so.1 from nvml_sim.c) and install it into a guest.

    python -m sandbox.nvml.build [--out DIR]      # builds (or reuses) it, prints its path

build() compiles nvml_sim.c with the machine's gcc into
CACHE_DIR/nvml/libnvidia-ml-<digest>.so.1, the digest being that of the
source and the compiler flags: a changed source is rebuilt at the next `up`,
an unchanged one is reused. install_into(root) copies it into a guest root
where the driver's own library lives (/usr/lib/<multiarch>/libnvidia-ml.so.1
plus the libnvidia-ml.so symlink), so `import pynvml` in the guest loads it.

The library reads the same state as the nvidia-smi stand-in (sandbox/gpusim.py:
layout JSON + per-process registry JSON), so both always agree.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().with_name("nvml_sim.c")
SONAME = "libnvidia-ml.so.1"
# the CUDA driver stub of the real-server hosts (libcuda_stub.c), installed apart from the system's
# libraries: only a unit whose LD_LIBRARY_PATH names CUDA_STUB_DIR loads it
CUDA_STUB_SRC = SRC.with_name("libcuda_stub.c")
CUDA_STUB_SONAME = "libcuda.so.1"
CUDA_STUB_DIR = "/usr/local/lib/sandbox-gpu/cuda"
BASE_CFLAGS = ("-std=c11", "-O2", "-g0", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra", "-pthread")
CFLAGS = (*BASE_CFLAGS, f"-Wl,-soname,{SONAME}")
APT_PACKAGES = ("gcc", "libc6-dev")  # what the build needs on a Debian machine


class NvmlBuildError(RuntimeError):
    pass


def multiarch() -> str:
    """Debian's multiarch triplet of this machine (the guests share its architecture)."""
    machine = platform.machine()
    return {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu", "arm64": "aarch64-linux-gnu"}.get(
        machine, f"{machine}-linux-gnu"
    )


def guest_lib_dir() -> str:
    return f"/usr/lib/{multiarch()}"


def digest(src: Path = SRC, cflags: tuple[str, ...] = CFLAGS) -> str:
    h = hashlib.sha256(src.read_bytes())
    h.update("\0".join(cflags).encode())
    return h.hexdigest()[:16]


def default_cache_dir() -> Path:
    from sandbox import rootfs

    return rootfs.CACHE_DIR / "nvml"


def compiler(cc: str | None = None) -> str:
    cc = cc or os.environ.get("CC") or "gcc"
    path = shutil.which(cc)
    if path is None:
        raise NvmlBuildError(
            f"no C compiler ({cc}) to build the NVML stand-in: apt-get install {' '.join(APT_PACKAGES)}"
        )
    return path


def build(out_dir: Path | str | None = None, cc: str | None = None, src: Path = SRC,
          soname: str = SONAME) -> Path:
    """The compiled library (built when this source/flags digest has none yet)."""
    out = Path(out_dir) if out_dir is not None else default_cache_dir()
    cflags = (*BASE_CFLAGS, f"-Wl,-soname,{soname}")
    stem = soname.removesuffix(".so.1")
    target = out / f"{stem}-{digest(src, cflags)}.so.1"
    if target.is_file():
        return target
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{target.name}.tmp-{os.getpid()}"
    argv = [compiler(cc), *cflags, "-o", str(tmp), str(src)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            hint = ""
            if "No such file" in proc.stderr and ".h" in proc.stderr:
                hint = f"\n(C headers missing? apt-get install {' '.join(APT_PACKAGES)})"
            raise NvmlBuildError(f"building {src.name} failed ({proc.returncode}):\n{proc.stderr[-4000:]}{hint}")
        tmp.replace(target)  # atomic: concurrent builders each rename a complete file
    finally:
        tmp.unlink(missing_ok=True)
    return target


def install_into(root: Path | str, lib: Path | None = None) -> list[str]:
    """Put the library into a guest root (before boot or live); returns the guest paths.

    Files are replaced by rename: a process that has the old one loaded keeps it.
    """
    lib = lib or build()
    root = Path(root)
    libdir = root / guest_lib_dir().lstrip("/")
    libdir.mkdir(parents=True, exist_ok=True)
    dest = libdir / SONAME
    tmp = libdir / f".{SONAME}.sgc-tmp"
    shutil.copyfile(lib, tmp)
    os.chmod(tmp, 0o755)
    tmp.replace(dest)
    link = libdir / "libnvidia-ml.so"
    tmp_link = libdir / ".libnvidia-ml.so.sgc-tmp"
    tmp_link.unlink(missing_ok=True)
    tmp_link.symlink_to(SONAME)
    tmp_link.replace(link)
    return [f"{guest_lib_dir()}/{SONAME}", f"{guest_lib_dir()}/libnvidia-ml.so"]


def install_cuda_stub_into(root: Path | str) -> str:
    """Put the libcuda.so.1 stub into a guest root's CUDA_STUB_DIR; returns its guest path."""
    lib = build(src=CUDA_STUB_SRC, soname=CUDA_STUB_SONAME)
    libdir = Path(root) / CUDA_STUB_DIR.lstrip("/")
    libdir.mkdir(parents=True, exist_ok=True)
    tmp = libdir / f".{CUDA_STUB_SONAME}.sgc-tmp"
    shutil.copyfile(lib, tmp)
    os.chmod(tmp, 0o755)
    tmp.replace(libdir / CUDA_STUB_SONAME)
    return f"{CUDA_STUB_DIR}/{CUDA_STUB_SONAME}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help=f"output directory (default: {default_cache_dir()})")
    args = parser.parse_args(argv)
    try:
        print(build(args.out))
    except NvmlBuildError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
