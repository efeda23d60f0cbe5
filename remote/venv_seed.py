"""Copy a server venv from a peer that built and verified the same package set.

Run on the host by the interpreter the venv is built on (the spec's
``venv_python``), during a rollout that offered a peer (core/seeding.py):

    python3 venv_seed.py --from root@10.0.0.5:/opt/sglang/venv-envs/95f9894a772e \\
        --into /opt/sglang/venv-envs/95f9894a772e --port 22 --key KEY --known-hosts KNOWN

A venv is not relocatable, but it is at the same path on every host (the dir is
named by the digest of what it is built from), so a copy is the venv the build
would make. rsync (over ssh, the rollout's key only: remote/peer_seed.py) copies
it into ``<envs dir>/.seeding-<digest>``; the copy is used only when it was made
on the same Python (pyvenv.cfg's version and home against this interpreter) and
its compiled modules are for this platform (their ABI tags against this
interpreter's EXT_SUFFIX), and only then renamed into place. The steps after it
check it as they check a venv they built (every pinned package read back,
compressed-tensors and its members, SGLang's parser on the new command line).

Any failure - unreachable peer, rsync missing, another Python - removes the copy
and says why on a ``seed:`` line; the caller then builds the venv as without a
peer. Exit 0 in both cases; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_seed import IO_TIMEOUT_S, _why, ssh_command  # noqa: E402 (uploaded beside this script)

ABI_TAG = re.compile(r"\.(cpython-\d+[a-z]*-[^.]+)\.so$")


def pyvenv_cfg(venv: Path) -> dict[str, str]:
    """pyvenv.cfg's ``key = value`` lines."""
    found = {}
    for line in (venv / "pyvenv.cfg").read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            found[key.strip()] = value.strip()
    return found


def mismatch(venv: Path) -> str:
    """Why the copied venv cannot run on this interpreter ("" when it can)."""
    try:
        cfg = pyvenv_cfg(venv)
    except OSError as err:
        return f"no pyvenv.cfg in the copy ({err.strerror})"
    version = cfg.get("version") or cfg.get("version_info", "")
    if not version.startswith(platform.python_version()):
        return f"it was built on Python {version or '?'}, this host's {sys.executable} is {platform.python_version()}"
    home = cfg.get("home", "")
    if os.path.realpath(home) != os.path.realpath(os.path.dirname(sys.executable)):
        return f"its home is {home}, this host's interpreter is in {os.path.dirname(sys.executable)}"
    if not os.path.exists(venv / "bin" / "python"):
        return "its bin/python does not resolve on this host"
    local = (sysconfig.get_config_var("EXT_SUFFIX") or "").strip(".").removesuffix(".so")
    for root, _dirs, files in os.walk(venv / "lib"):
        for name in files:
            tag = ABI_TAG.search(name)
            if tag and local and tag.group(1) != local:
                return f"{os.path.join(root, name)} is built for {tag.group(1)}, this host's Python loads {local}"
    return ""


def seed(source: str, into: Path, ssh: list[str], exclude: list[str] | None = None) -> str:
    """Copy ``source`` into ``into`` (but the top-level names in ``exclude``: the peer's own markers and
    lock); the line that says what happened."""
    if into.exists():
        return f"seed: {into} exists: not copied"
    if shutil.which("rsync") is None:
        return "seed: rsync is not installed on this host: building the venv here"
    partial = into.parent / f".seeding-{into.name}"
    shutil.rmtree(partial, ignore_errors=True)  # a copy cut off by an earlier run
    into.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    argv = ["rsync", "--archive", "--hard-links", "--whole-file", "--no-motd", f"--timeout={IO_TIMEOUT_S}",
            *[f"--exclude=/{name}" for name in exclude or []], "-e", shlex.join(ssh),
            source.rstrip("/") + "/", str(partial) + "/"]
    proc = subprocess.run(argv, capture_output=True, text=True)
    why = _why(proc.returncode, proc.stderr) if proc.returncode != 0 else mismatch(partial)
    if why:
        shutil.rmtree(partial, ignore_errors=True)
        return f"seed: the venv copy from the peer {source} is not used: {why}; building the venv here"
    files = size = 0
    for root, _dirs, names in os.walk(partial):
        for name in names:
            files += 1
            try:
                size += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    os.rename(partial, into)
    took = time.monotonic() - started
    return (f"seed: copied the venv from the peer {source}: {files} files, {size} bytes in {took:.1f} s "
            f"(same Python {platform.python_version()}, same ABI); checked below like a built one")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="source", required=True, help="user@address:/dir on the peer")
    parser.add_argument("--into", required=True, type=Path)
    parser.add_argument("--port", type=int, default=22)
    parser.add_argument("--key", required=True)
    parser.add_argument("--known-hosts", required=True)
    parser.add_argument("--exclude", action="append", default=[], help="a top-level name not to copy (repeatable)")
    args = parser.parse_args(argv)
    print(seed(args.source, args.into, ssh_command(args.key, args.known_hosts, args.port), args.exclude), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
