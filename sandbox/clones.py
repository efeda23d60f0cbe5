"""Clones of a converged sandbox host: many converged hosts for the price of one converge.

A host's overlay upper dir holds everything its converge wrote over the cached
rootfs (the venv, the model, unit files, stamps). snapshot() copies it, with the
guest frozen, to a layer of its own; hosts.up(indexes=[...], snapshot=layer)
boots hosts whose overlay is their own upper dir over that layer over the
rootfs. Each clone still gets its own identity the way every host does
(hosts._prepare_root: hostname, /etc/hosts, its address and network namespace,
its GPU layout with its own UUIDs), and a fresh machine-id per boot (the layer's
/etc/machine-id is emptied, like the rootfs's). The ssh host keys are the
rootfs's, shared by every sandbox host anyway.

What a snapshot drops (snapshot_drops): the template's machine-id, its
persistent journal, and the simulated GPUs' state (the processes holding GPU
memory do not run in a clone until its own server starts).

    from sandbox import clones, hosts
    layer = clones.snapshot("sgc100", "scale")
    hosts.up(indexes=[101, 102], snapshot=layer)
    ...
    hosts.remove("sgc101"); hosts.remove("sgc102")
    clones.remove_snapshot("scale")   # refused while a host runs on it
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from . import gpusim, hosts

SNAPSHOT_DIR = Path(os.environ.get("SGC_SNAPSHOT_DIR", str(hosts.VAR_DIR.parent / "snapshots")))
FROZEN_TIMEOUT_S = 10.0


def snapshot_path(label: str) -> Path:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", label):
        raise ValueError(f"snapshot label {label!r}: letters, digits, _ . - only")
    return SNAPSHOT_DIR / label


def snapshot_drops() -> list[str]:
    """Paths (relative to the layer) a snapshot leaves out: the template's own boot state."""
    return ["var/log/journal", *(p.lstrip("/") for p in gpusim.BOOT_CLEARED_PATHS)]


def _freezer(name: str) -> list[Path]:
    """cgroup2 freeze files of the guest's cgroups (none on a machine without them)."""
    return [f for d in hosts._cgroup_dirs(name) if (f := d / "cgroup.freeze").exists()]


def _set_frozen(files: list[Path], frozen: bool) -> None:
    for f in files:
        f.write_text("1\n" if frozen else "0\n")
    deadline = time.monotonic() + FROZEN_TIMEOUT_S
    for f in files:
        events = f.with_name("cgroup.events")
        while f"frozen {int(frozen)}" not in events.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)


def snapshot(name: str, label: str) -> Path:
    """Copy host `name`'s changes over the rootfs (its overlay upper dir) to a layer.

    The guest is frozen while it is copied (a consistent copy; it goes on
    afterwards). An existing layer of the same label is replaced, unless a
    host runs on it (RuntimeError)."""
    host = hosts.get_host(name)
    upper = hosts._host_dir(host.name) / "upper"
    dest = snapshot_path(label)
    if users(label):
        raise RuntimeError(f"snapshot {label}: hosts run on it ({', '.join(users(label))}): remove them first")
    host.run("sync", timeout=60)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    freeze = _freezer(host.name)
    _set_frozen(freeze, True)
    try:
        # cp -a: whiteouts (0/0 char devices) and trusted.overlay.* xattrs (opaque dirs) kept
        subprocess.run(["cp", "-a", str(upper), str(tmp)], check=True, capture_output=True, text=True)
    finally:
        _set_frozen(freeze, False)
    for rel in snapshot_drops():
        target = tmp / rel
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
    if (tmp / "etc").is_dir():
        (tmp / "etc/machine-id").write_text("")  # each clone's systemd makes its own per boot
    remove_snapshot(label)
    tmp.rename(dest)
    return dest


def users(label: str) -> list[str]:
    """Overlay mounts (host names) that have this snapshot as a layer."""
    layer = str(snapshot_path(label))
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[2] == "overlay" and f"lowerdir={layer}:" in parts[3]:
            found.append(parts[0].removeprefix(f"{hosts.PREFIX}-"))
    return found


def remove_snapshot(label: str) -> None:
    """Delete a snapshot layer (RuntimeError while a host runs on it)."""
    left = users(label)
    if left:
        raise RuntimeError(f"snapshot {label}: hosts run on it ({', '.join(left)}): remove them first")
    shutil.rmtree(snapshot_path(label), ignore_errors=True)
    try:
        SNAPSHOT_DIR.rmdir()  # the last one
    except OSError:
        pass


def disk_bytes(path: Path) -> int:
    """Bytes a directory tree takes on disk (du), 0 when it is gone."""
    proc = subprocess.run(["du", "-sxB1", str(path)], capture_output=True, text=True)
    return int(proc.stdout.split()[0]) if proc.returncode == 0 and proc.stdout else 0
