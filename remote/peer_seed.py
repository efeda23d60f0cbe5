"""Part of remote/fetch_model.py (uploaded beside it): copy the files of a model
revision from a peer that holds it verified, before asking the Hub for anything
that is still missing. The standard library and the host's own rsync and ssh
only.

    fetch_model.py ... --seed-from root@10.0.0.11:/srv/models/kimi-k2.6 [--seed-port 22] \
        --seed-key /etc/sglang/sglang.seed-key --seed-known-hosts /etc/sglang/sglang.seed-known-hosts

The copy is rsync over ssh (the peer needs rsync, and the key the rollout put
in its authorized_keys for this rollout only; rollout/seeding.py), with the
peer's host keys pinned (StrictHostKeyChecking=yes against the file the
rollout wrote), BatchMode (never a prompt) and a 60 s I/O timeout. Only the
files the Hub lists for the revision and not yet on disk at their size are
asked for (--files-from): never the peer's marker, its caches or stray files.
rsync writes each file under <local-dir>/.cache/sglang-converge-seed/ and moves
it into place when it is complete, so a killed copy leaves no file that looks
whole; that dir is removed before and after the copy.

Nothing the peer sends is trusted: fetch_model.py then fetches whatever is
still missing from the Hub and hashes every file against the digests the Hub
publishes, exactly as after a Hub download (a file the peer got wrong is
deleted and fetched again from the Hub). A copy that fails (the peer
unreachable, the key refused, rsync missing, a timeout) is logged with rsync's
exit code and its last error line, and the run goes on with the Hub.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SEED_TMP = Path(".cache") / "sglang-converge-seed"  # rsync's temp files, under the local dir
IO_TIMEOUT_S = 60  # rsync --timeout: seconds without data before it gives up
CONNECT_TIMEOUT_S = 15
# rsync's exit codes that say where it failed (man rsync, EXIT VALUES)
RSYNC_EXITS = {
    5: "error starting the client-server protocol",
    10: "error in socket I/O",
    11: "error in file I/O",
    12: "error in the rsync protocol data stream",
    20: "interrupted",
    23: "partial transfer (some files could not be copied)",
    24: "some source files vanished",
    30: "timeout in data send/receive",
    35: "timeout waiting for the peer",
    255: "ssh failed",
}


@dataclass(frozen=True)
class Seeded:
    """What the copy from the peer did: whether it ran to its end, the bytes it brought, why not."""

    ok: bool
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    why: str = ""


def ssh_command(key_file: str, known_hosts: str, port: int) -> list[str]:
    """The ssh rsync runs: this key only, the peer's pinned host keys, never a prompt."""
    return ["ssh", "-i", key_file, "-p", str(port), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
            "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4", "-o", "LogLevel=ERROR"]


def rsync_command(source: str, local_dir: Path, files_from: Path, ssh: list[str]) -> list[str]:
    """rsync of the listed files from ``source`` ("user@host:/dir"), files only, mtimes kept."""
    return ["rsync", "--recursive", "--times", "--whole-file", "--no-motd", f"--timeout={IO_TIMEOUT_S}",
            f"--files-from={files_from}", f"--temp-dir={local_dir / SEED_TMP}",
            "-e", shlex.join(ssh), source.rstrip("/") + "/", str(local_dir) + "/"]


def _complete(local_dir: Path, wanted: dict[str, int]) -> dict[str, int]:
    """The wanted files now in the local dir at their size."""
    out = {}
    for name, size in wanted.items():
        try:
            if (local_dir / name).stat().st_size == size:
                out[name] = size
        except OSError:
            pass
    return out


def _on_disk(local_dir: Path, names: dict[str, int]) -> int:
    """Bytes of the wanted files now complete in the local dir, plus rsync's temp files."""
    total = sum(_complete(local_dir, names).values())
    tmp = local_dir / SEED_TMP
    if tmp.is_dir():
        for path in tmp.rglob("*"):
            try:
                total += path.stat().st_size if path.is_file() else 0
            except OSError:
                pass
    return total


def _why(code: int, stderr: str) -> str:
    """rsync's exit code, its meaning, and the line that says why: ssh's own, or the first of rsync's
    (its last lines are generic: "connection unexpectedly closed", "rsync error: ... (code N)")."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    specific = [line for line in lines if not line.startswith(("rsync error:", "rsync: connection unexpectedly"))]
    lines = [specific[0]] if specific else lines
    meaning = RSYNC_EXITS.get(code, "rsync failed") if code >= 0 else f"killed by signal {-code}"
    return f"rsync exited {code} ({meaning})" + (f": {lines[-1]}" if lines else "")


def copy_from_peer(source: str, local_dir: Path, wanted: dict[str, int], ssh: list[str], log) -> Seeded:
    """Copy ``wanted`` (file -> size, the ones not yet on disk) from the peer into ``local_dir``."""
    if not wanted:
        return Seeded(True)
    if shutil.which("rsync") is None:
        return Seeded(False, why="rsync is not installed on this host")
    tmp = local_dir / SEED_TMP
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    files_from = tmp.parent / "sglang-converge-seed.files"
    files_from.write_text("".join(f"{name}\n" for name in sorted(wanted)))
    total = sum(wanted.values())
    before = _on_disk(local_dir, wanted)
    log(f"seed: copying {len(wanted)} files ({total} bytes) from the peer {source} (rsync over ssh)")
    started = time.monotonic()
    done = threading.Event()

    def progress() -> None:
        interval = 5.0
        while not done.wait(interval):
            got = _on_disk(local_dir, wanted) - before
            elapsed = time.monotonic() - started
            log(f"seed: {got} of {total} bytes from the peer, {got / max(elapsed, 1e-6) / 1e6:.1f} MB/s")
            interval = 5.0 if elapsed < 60 else 30.0

    watcher = threading.Thread(target=progress, daemon=True)
    watcher.start()
    try:
        proc = subprocess.run(rsync_command(source, local_dir, files_from, ssh), capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, env={**os.environ, "LC_ALL": "C"})
    finally:
        done.set()
        watcher.join()
        shutil.rmtree(tmp, ignore_errors=True)
        files_from.unlink(missing_ok=True)
    seconds = time.monotonic() - started
    complete = _complete(local_dir, wanted)
    got = sum(complete.values())
    if proc.returncode != 0:
        return Seeded(False, len(complete), got, seconds, _why(proc.returncode, proc.stderr))
    return Seeded(True, len(complete), got, seconds)
