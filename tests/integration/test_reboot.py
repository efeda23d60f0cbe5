"""A sandbox host reboots and keeps its disk (sandbox.hosts.reboot, in-guest `systemctl reboot`).

What the deploy relies on ("the server comes back by itself after a reboot")
needs hosts that reboot like real ones: files on disk are kept, /run and the
GPUs' memory are cleared, the address stays, enabled units start again. A
poweroff still ends the host, and removing it leaves nothing behind.

The module's own host: sgc200 (this module's index range is 200-209), removed
before (leftovers of an interrupted run) and after, also on a failure.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from sandbox import hosts as H
from sandbox.stale import start_stale
from tests.conftest import _sandbox_unavailable, netns_names
from tests.integration.helpers import ROOT

pytestmark = pytest.mark.sandbox

INDEX = 200
NAME = H.host_name(INDEX)
ADDRESS = H.guest_address(INDEX)
FIGURES: dict[str, float] = {}


@pytest.fixture(scope="module")
def _own_host():
    reason = _sandbox_unavailable()
    if reason:
        pytest.skip(reason)
    # a SIGTERM'd test run still removes the host (pytest handles KeyboardInterrupt)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    H.remove(NAME)  # leftovers of an interrupted run: start from a fresh host
    try:
        yield
    finally:
        H.remove(NAME)
        if FIGURES:
            print("\nreboot figures: " + ", ".join(f"{k} {v:.2f} s" for k, v in FIGURES.items()))


@pytest.fixture
def host(_own_host):
    """sgc200, running (booted again if an earlier test powered it off)."""
    return H.up(indexes=[INDEX])[0]


# --------------------------------------------------------------------------- helpers


def wait_for(what: str, probe, timeout: float, interval: float = 0.1):
    """probe() until it returns something truthy (returned); AssertionError after timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{NAME}: {what}: not within {timeout:.0f} s (last: {last!r})\n{H._log_tail(NAME)}")
        time.sleep(interval)


def boot_id(host) -> str:
    return host.run("cat /proc/sys/kernel/random/boot_id").stdout.strip()


def boot_id_or_none(host) -> str | None:
    """The boot id, or None while the host is down (ssh refused, dropped or hanging)."""
    try:
        proc = host.run("cat /proc/sys/kernel/random/boot_id", check=False, timeout=5)
    except subprocess.TimeoutExpired:
        return None
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else None


def exists(host, path: str) -> bool:
    return host.run(f"test -e {path}", check=False).returncode == 0


def eth0_addresses(host) -> list[str]:
    out = host.run("ip -4 -o addr show dev eth0").stdout
    return [line.split()[3] for line in out.splitlines()]


def compute_apps(host) -> list[list[str]]:
    out = host.run("nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits").stdout
    return [line.split(", ") for line in out.splitlines()]


def memory_used(host) -> list[int]:
    out = host.run("nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits").stdout
    return [int(v) for v in out.split()]


def gpu_count(host) -> int:
    return len(host.run("nvidia-smi --query-gpu=index --format=csv,noheader").stdout.split())


def write_markers(host, tag: str) -> dict[str, str]:
    """A file on disk (/srv, /root) and one in /run, each with unique content; checked present."""
    token = uuid.uuid4().hex
    files = {f"/srv/{tag}-kept": token, f"/root/{tag}-kept": token, f"/run/{tag}-gone": token}
    host.run("mkdir -p /srv && " + " && ".join(f"echo {token} > {path}" for path in files))
    for path in files:  # positive control: all three are there before the reboot
        assert host.run(f"cat {path}").stdout.strip() == token
    return files


def assert_disk_kept_run_cleared(host, files: dict[str, str]) -> None:
    for path, token in files.items():
        if path.startswith("/run/"):
            assert not exists(host, path), f"{path} survived the reboot"
        else:
            assert host.run(f"cat {path}").stdout.strip() == token, path


# --------------------------------------------------------------------------- tests


def test_reboot_keeps_disk_clears_run_same_address(host):
    files = write_markers(host, "api")
    before = boot_id(host)
    assert eth0_addresses(host) == [f"{ADDRESS}/24"]
    assert gpu_count(host) == 8
    supervisor = host.nspawn_pid
    old_nspawn = H.guest_nspawn_pid(host)
    assert old_nspawn and old_nspawn != supervisor

    started = time.monotonic()
    rebooted = H.reboot(NAME)
    FIGURES["reboot() to ssh-ready"] = time.monotonic() - started

    after = boot_id(host)
    assert after and after != before
    assert_disk_kept_run_cleared(host, files)
    assert rebooted.address == ADDRESS and eth0_addresses(host) == [f"{ADDRESS}/24"]
    assert host.run("hostname").stdout.strip() == NAME
    assert host.run("systemctl is-system-running", check=False).stdout.strip() in ("running", "degraded")
    assert gpu_count(host) == 8  # same layout
    # the same host (supervisor, state file entry), a new boot (nspawn)
    assert H.get_host(NAME).nspawn_pid == supervisor and H._alive(supervisor)
    assert H.guest_nspawn_pid(host) not in (None, old_nspawn)
    log = (H.VAR_DIR / NAME / "nspawn.log").read_text(errors="replace")
    assert f"systemd-nspawn exit {H.NSPAWN_REBOOT_EXIT}" in log


def test_reboot_frees_simulated_gpu_memory(host):
    pid = start_stale(host, gpu=1, gib=2)
    # positive controls: the holder shows in nvidia-smi, and GPU 1 has memory used
    assert [str(pid), "2048"] in compute_apps(host)
    assert memory_used(host)[1] == 2048
    # gpusim state where a disk would keep it (under the guest's /run tmpfs, on the
    # overlay): the supervisor clears it before each boot
    planted = Path(host.root) / "run/sandbox-gpu/999999.json"
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_text('{"pid": 999999, "starttime": "1", "name": "planted", "gpus": {"0": 1}}')
    assert planted.exists()
    before = boot_id(host)

    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "sandbox", "reboot", NAME], cwd=ROOT,
                          capture_output=True, text=True, timeout=H.REBOOT_TIMEOUT_S + 30)  # fmt: skip
    FIGURES["`python -m sandbox reboot` to ssh-ready"] = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{NAME}\t{ADDRESS}\trebooted in" in proc.stdout

    assert boot_id(host) != before
    assert compute_apps(host) == []
    assert memory_used(host) == [0] * 8
    assert host.run("ls -A /run/sandbox-gpu 2>/dev/null | wc -l").stdout.strip() == "0"
    assert not planted.exists()


def test_enabled_unit_comes_back_by_itself(host):
    unit = """[Unit]
Description=sandbox reboot probe ({})

[Service]
ExecStart=/bin/sleep infinity

[Install]
WantedBy=multi-user.target
"""
    host.run("cat > /etc/systemd/system/sgc-probe-enabled.service", input=unit.format("enabled"))
    host.run("cat > /etc/systemd/system/sgc-probe-started.service", input=unit.format("started only"))
    host.run("systemctl daemon-reload && systemctl enable --now sgc-probe-enabled.service "
             "&& systemctl start sgc-probe-started.service")  # fmt: skip
    # positive controls: both run now; only one is enabled
    state = host.run("systemctl is-active sgc-probe-enabled sgc-probe-started", check=False).stdout.split()
    assert state == ["active", "active"]
    assert host.run("systemctl is-enabled sgc-probe-started", check=False).stdout.strip() == "disabled"
    old_pid = host.run("systemctl show -P MainPID sgc-probe-enabled").stdout.strip()
    assert old_pid != "0"

    H.reboot(NAME)

    state = host.run("systemctl is-active sgc-probe-enabled sgc-probe-started", check=False).stdout.split()
    assert state == ["active", "inactive"]  # nobody started either: the enabled one came back
    new_pid = host.run("systemctl show -P MainPID sgc-probe-enabled").stdout.strip()
    assert new_pid != "0"
    assert host.run(f"cat /proc/{new_pid}/cmdline | tr '\\0' ' '").stdout.strip() == "/bin/sleep infinity"
    host.run("systemctl disable --now sgc-probe-enabled; rm -f /etc/systemd/system/sgc-probe-*.service; "
             "systemctl daemon-reload")  # fmt: skip


def test_in_guest_systemctl_reboot_comes_back_the_same_way(host):
    files = write_markers(host, "guest")
    before = boot_id(host)
    supervisor = host.nspawn_pid

    started = time.monotonic()
    try:  # the connection drops as the guest goes down
        host.run("systemctl reboot", check=False, timeout=15)
    except subprocess.TimeoutExpired:
        pass
    after = wait_for("a new boot id after `systemctl reboot`",
                     lambda: (b := boot_id_or_none(host)) and b != before and b, H.REBOOT_TIMEOUT_S)  # fmt: skip
    state = H.wait_booted(NAME)
    FIGURES["`systemctl reboot` to ssh-ready"] = time.monotonic() - started

    assert after != before and state in ("running", "degraded")
    assert_disk_kept_run_cleared(host, files)
    assert eth0_addresses(host) == [f"{ADDRESS}/24"]
    assert H.get_host(NAME).nspawn_pid == supervisor and H._alive(supervisor)
    assert [h["state"] for h in H.status() if h["name"] == NAME] in (["running"], ["degraded"])


def test_reboot_timeout_raises_with_host_and_log(host):
    before = boot_id(host)
    with pytest.raises(RuntimeError) as err:
        H.reboot(NAME, timeout=0.01)  # far too short to go down and boot again
    message = str(err.value)
    assert message.startswith(f"{NAME}: ") and "within 0.0 s" in message
    # then the last lines of its log (the supervisor logs each boot: never empty)
    tail = message.splitlines()[1:]
    log = (H.VAR_DIR / NAME / "nspawn.log").read_text(errors="replace").splitlines()
    assert tail and all(line in log for line in tail), message
    # the reboot itself goes on: the host comes back
    wait_for("a new boot id", lambda: (b := boot_id_or_none(host)) and b != before and b, H.REBOOT_TIMEOUT_S)
    assert H.wait_booted(NAME) in ("running", "degraded")


def test_poweroff_ends_the_host(host):
    supervisor = host.nspawn_pid
    # positive controls: running, supervised, sshd answers
    assert H._alive(supervisor) and H._scan_nspawn_pids().get(NAME)
    socket.create_connection((ADDRESS, 22), timeout=2).close()

    try:
        host.run("systemctl poweroff", check=False, timeout=15)
    except subprocess.TimeoutExpired:
        pass
    wait_for("the nspawn supervisor to exit after a poweroff", lambda: not H._alive(supervisor), 30)

    assert H._scan_nspawn_pids().get(NAME) is None  # no nspawn started again
    assert [h["state"] for h in H.status() if h["name"] == NAME] == ["stopped"]
    with pytest.raises(OSError):
        socket.create_connection((ADDRESS, 22), timeout=2).close()
    log = (H.VAR_DIR / NAME / "nspawn.log").read_text(errors="replace")
    assert "systemd-nspawn exited 0: the host is down" in log
    with pytest.raises(RuntimeError, match=f"{NAME}: not running"):
        H.reboot(NAME)


def _ours_left() -> list[str]:
    left = [f"netns {ns}" for ns in netns_names() if ns == H.netns_name(INDEX)]
    left += [f"link {d.name}" for d in Path("/sys/class/net").iterdir() if d.name == H.veth_host(INDEX)]
    mounts = subprocess.run(["mount"], capture_output=True, text=True).stdout
    left += [f"mount {line}" for line in mounts.splitlines() if f"/{NAME}/" in line or H.cgroup_name(NAME) in line]
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    left += [f"process {line}" for line in ps.splitlines() if f"/{NAME}/" in line or f"-{NAME}/" in line]
    left += [f"nspawn {pid}" for pid in H._scan_nspawn_pids().get(NAME, [])]
    for root in H.cgroup_roots():
        left += [f"cgroup {d}" for d in root.glob(H.cgroup_name(NAME))]
    for table in ("nat", "filter"):
        rules = subprocess.run(["iptables", "-w", "-t", table, "-S"], capture_output=True, text=True).stdout
        left += [f"{table} {line}" for line in rules.splitlines() if H.cgroup_name(NAME) in line]
    left += [f"dir {p}" for p in (H.VAR_DIR / NAME, Path("/run/systemd/nspawn/propagate") / NAME) if p.exists()]
    left += [f"state {h.name}" for h in H.load_hosts() if h.name == NAME]
    return left


def test_remove_after_reboots_leaves_nothing(host):
    H.reboot(NAME)  # a host that rebooted (a second nspawn) is removed as cleanly
    assert _ours_left() != []  # positive control: the check sees a running host
    started = time.monotonic()
    H.remove(NAME)
    FIGURES["remove"] = time.monotonic() - started
    assert _ours_left() == []
