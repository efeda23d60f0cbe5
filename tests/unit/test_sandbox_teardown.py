"""sandbox/hosts.py removes a guest by killing it, not by an orderly poweroff: the
guest's services (an SGLang stand-in waits up to its watchdog's 5 s tick on SIGTERM)
would only slow every test's teardown down. A stand-in guest here: a supervisor-like
sh that would take its time on SIGTERM, with a child."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from sandbox import hosts as H


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] if Path(f"/proc/{pid}").exists() else "X"
    return state not in ("Z", "X")


def _guest(tmp_path: Path) -> tuple[subprocess.Popen, int, Path]:
    marker = tmp_path / "got-sigterm"
    script = (f"trap 'echo term > {marker}; sleep 30' TERM\n"
              "sleep 300 & echo $! > child; while :; do wait; done\n")
    proc = subprocess.Popen(["/bin/sh", "-c", script], cwd=tmp_path)
    child = tmp_path / "child"
    while not child.exists() or not child.read_text().strip():
        pass
    return proc, int(child.read_text()), marker


def _popen_reaps(monkeypatch) -> None:
    """Leave reaping to Popen: _stop_pids' own waitpid would take the guest's exit status first
    (Popen.wait then reports 0), depending on how soon the killed process is gone."""
    monkeypatch.setattr(H, "_reap", lambda pids: None)


def test_remove_kills_the_guest_without_sigterm(tmp_path, monkeypatch):
    _popen_reaps(monkeypatch)
    monkeypatch.setattr(H, "_cgroup_dirs", lambda name: [])
    proc, child, marker = _guest(tmp_path)
    try:
        H._stop_pids([proc.pid], "sgc-test")
        assert proc.wait(timeout=30) == -9  # killed, not asked
        assert not marker.exists()  # no SIGTERM reached it: nothing waited for an orderly stop
    finally:
        os.kill(child, 9)  # the cgroup sweep takes such children on a real guest (_cgroup_dirs is empty here)


def test_the_cgroup_sweep_takes_what_is_left(tmp_path, monkeypatch):
    """Positive control of the sweep: the guest's processes in its cgroup go too."""
    _popen_reaps(monkeypatch)
    proc, child, _ = _guest(tmp_path)
    monkeypatch.setattr(H, "_cgroup_dirs", lambda name: [tmp_path / "cg"])
    monkeypatch.setattr(H, "_cgroup_pids", lambda d: {p for p in (proc.pid, child) if _alive(p)})
    H._stop_pids([proc.pid], "sgc-test")
    assert proc.wait(timeout=30) == -9
    assert not _alive(child)
