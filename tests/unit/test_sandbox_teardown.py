"""sandbox/hosts.py removes a guest by killing it, not by an orderly poweroff: the
guest's services (an SGLang stand-in waits up to its watchdog's 5 s tick on SIGTERM)
would only slow every test's teardown down. A stand-in guest here: a supervisor-like
sh that would take its time on SIGTERM, with a child. kill() cuts a guest's power the
same way but keeps its disk, address and state entry, and up() boots it again on that disk."""

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


# --- kill(): the power cut that keeps the disk ------------------------------------------------


def _killable_host(tmp_path: Path, monkeypatch, name: str = "sgc97") -> tuple[subprocess.Popen, int, Path]:
    """A state file (under tmp_path) with one host whose supervisor is a sh named like ours, with a child,
    and a file on its disk (the overlay's upper dir)."""
    _popen_reaps(monkeypatch)
    monkeypatch.setattr(H, "STATE_DIR", tmp_path / "run")
    monkeypatch.setattr(H, "STATE_FILE", tmp_path / "run" / "hosts.json")
    monkeypatch.setattr(H, "VAR_DIR", tmp_path / "var")
    monkeypatch.setattr(H, "NSPAWN_PROPAGATE_DIR", tmp_path / "propagate")
    monkeypatch.setattr(H, "_cgroup_dirs", lambda name: [])
    disk = tmp_path / "var" / name / "upper" / "opt" / "sglang-router" / "installed"
    disk.parent.mkdir(parents=True)
    disk.write_text("venv\n")
    merged = tmp_path / "var" / name / "merged"
    merged.mkdir()
    proc = subprocess.Popen([H.SUPERVISOR_ARGV0, "-c", f"sleep 300 & echo $! > child; wait; : {merged}/"],
                            executable="/bin/sh", cwd=tmp_path)
    child = tmp_path / "child"
    while not child.exists() or not child.read_text().strip():
        pass
    with H._state_lock():
        H._write_state({"version": 1, "hosts": {name: {
            "name": name, "index": 97, "address": "10.77.97.2", "ssh_key": "/k", "nspawn_pid": proc.pid,
            "root": str(merged), "gpus": {}}}})
    return proc, int(child.read_text()), disk


def test_kill_cuts_the_power_and_keeps_the_disk_and_the_entry(tmp_path, monkeypatch):
    proc, child, disk = _killable_host(tmp_path, monkeypatch)
    try:
        assert H._is_running(H._read_state()["hosts"]["sgc97"])  # positive control: it ran
        H.kill("sgc97")
        assert proc.wait(timeout=30) == -9  # killed at once, never asked
        entry = H._read_state()["hosts"]["sgc97"]  # still listed: the inventories see it (unreachable)
        assert entry[H.KILLED] is True and not H._is_running(entry)
        assert disk.read_text() == "venv\n"  # what was written in the guest is kept for up()
        assert [row["state"] for row in H.status()] == ["stopped"]
    finally:
        os.kill(child, 9)  # the cgroup sweep takes such children on a real guest (_cgroup_dirs is empty here)


def test_kill_of_an_unknown_host_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(H, "STATE_DIR", tmp_path)
    monkeypatch.setattr(H, "STATE_FILE", tmp_path / "hosts.json")
    try:
        H.kill("sgc98")
    except KeyError as err:
        assert "no sandbox host 'sgc98' is up" in str(err)
    else:
        raise AssertionError("kill() of a host that is not up did not refuse")


def test_up_boots_a_killed_host_on_its_disk_and_a_missing_disk_is_refused(tmp_path, monkeypatch):
    proc, child, disk = _killable_host(tmp_path, monkeypatch)
    try:
        H.kill("sgc97")
        proc.wait(timeout=30)
    finally:
        os.kill(child, 9)
    booted: list[str] = []
    for name in ("ensure_tools", "ensure_ssh_key"):
        monkeypatch.setattr(H.rootfs, name, lambda: None)
    monkeypatch.setattr(H.rootfs, "ensure_rootfs", lambda: tmp_path / "rootfs")
    monkeypatch.setattr(H, "_ensure_inotify", lambda guests: None)
    monkeypatch.setattr(H, "_wait_booted", lambda host, timeout, abort: "running")
    monkeypatch.setattr(H, "_start_guest", lambda *args: (_ for _ in ()).throw(AssertionError("a fresh disk")))
    monkeypatch.setattr(H, "_teardown", lambda *args, **kwargs: None)
    monkeypatch.setattr(H, "install_guest_files", lambda root, name, layout: None)
    monkeypatch.setattr(H, "_launch_guest", lambda index, merged, layout: booted.append(str(merged)) or H.SandboxHost(
        name="sgc97", index=97, address="10.77.97.2", ssh_key="/k", nspawn_pid=1, root=str(merged)))
    import sandbox.hubd

    monkeypatch.setattr(sandbox.hubd, "start", lambda: None)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    try:  # the overlay is not mounted here: nothing to boot on
        H.up(indexes=[97])
    except RuntimeError as err:
        assert "sgc97: killed, but its disk" in str(err) and "remove it and up it again" in str(err)
    else:
        raise AssertionError("up() booted a killed host whose disk is gone")
    assert booted == [] and H._read_state()["hosts"]["sgc97"][H.KILLED] is True
    monkeypatch.setattr(H, "_is_mountpoint", lambda path: True)  # its overlay and netns there, as after a kill
    (tmp_path / "netns").mkdir()
    (tmp_path / "netns" / H.netns_name(97)).write_text("")
    monkeypatch.setattr(H, "NETNS_DIR", tmp_path / "netns")
    [host] = H.up(indexes=[97])
    assert booted == [str(tmp_path / "var" / "sgc97" / "merged")] and host.name == "sgc97"
    assert H.KILLED not in H._read_state()["hosts"]["sgc97"]  # running again
    assert disk.read_text() == "venv\n"
