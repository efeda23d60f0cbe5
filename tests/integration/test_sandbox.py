"""The sandbox test bed itself: real systemd + sshd guests with simulated GPUs."""

from __future__ import annotations

import os
import re
import runpy
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sandbox import hosts as H
from sandbox.stale import start_stale, stop_stale
from tests.integration.helpers import SGC1_GROUP

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group(SGC1_GROUP)]  # sgc1: after test_demo.py

ROOT = Path(__file__).resolve().parents[2]


def compute_apps(host) -> list[list[str]]:
    out = host.run("nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid --format=csv,noheader,nounits").stdout
    return [line.split(", ") for line in out.splitlines()]


def test_hosts_boot_with_ssh_and_systemd(sandbox_hosts):
    assert [h.name for h in sandbox_hosts] == ["sgc1", "sgc2"]
    for host in sandbox_hosts:
        out = host.run("hostname; systemctl is-system-running; cat /proc/1/comm; systemctl is-active ssh")
        name, state, init, ssh = out.stdout.split()
        assert name == host.name
        assert state in ("running", "degraded")
        assert init == "systemd"
        assert ssh == "active"
    assert {h.address for h in sandbox_hosts} == {"10.77.1.2", "10.77.2.2"}


def test_state_file_and_inventory(sandbox_hosts):
    ours = {h.name for h in sandbox_hosts}  # other test modules' hosts may be up too
    loaded = [h for h in H.load_hosts() if h.name in ours]
    assert [(h.name, h.address, h.nspawn_pid) for h in loaded] == [
        (h.name, h.address, h.nspawn_pid) for h in sandbox_hosts
    ]
    assert loaded[0].gpus["count"] == 8
    inv = runpy.run_path(str(ROOT / "inventory" / "sandbox.py"))
    group = inv["sandbox"]
    assert [name for name, _ in group if name in ours] == ["sgc1", "sgc2"]
    data = group[0][1]
    assert data["ssh_hostname"] == "10.77.1.2"
    assert data["ssh_user"] == "root"
    assert Path(data["ssh_key"]).exists()
    assert all(key.startswith("ssh_") or key in ("hf_endpoint", "pip_wheel") for key in data)


def test_up_is_idempotent(sandbox_hosts):
    def lives(host):  # what a reboot or an sshd restart would change
        return host.run("systemctl show -p ExecMainStartTimestampMonotonic,MainPID ssh; "
                        "systemctl show -p UserspaceTimestampMonotonic").stdout

    before = [lives(h) for h in sandbox_hosts]
    again = H.up(2)
    assert [h.nspawn_pid for h in again] == [h.nspawn_pid for h in sandbox_hosts]
    assert [lives(h) for h in again] == before
    assert all(re.search(r"^MainPID=[1-9]", text, re.M) for text in before), before  # a live sshd compared


def test_nvidia_smi_on_guest(sandbox_hosts):
    uuids = set()
    for host in sandbox_hosts:
        out = host.run(
            "nvidia-smi --query-gpu=index,uuid,name,memory.total,compute_cap --format=csv,noheader"
        ).stdout.splitlines()
        assert len(out) == 8
        idx, uuid, name, mem, cap = out[0].split(", ")
        assert (idx, name, mem, cap) == ("0", "NVIDIA RTX PRO 6000 Blackwell Server Edition", "97887 MiB", "12.0")
        uuids.add(uuid)
        assert host.run("test -f /etc/sandbox-gpu/SIMULATED && test -x /usr/local/bin/nvidia-smi").returncode == 0
        assert "OK" in host.run("nvidia-smi topo -p2p r").stdout
    assert len(uuids) == 2  # a host tag per host


def test_guest_pip_sees_machine_wheels(sandbox_hosts):
    host = sandbox_hosts[0]
    # every wheel dir the machine has is in the guest, read-only, with the same files; the others are not
    # (asserted for each of H.WHEEL_DIRS, whichever the machine has)
    on_machine = {d: sorted(os.listdir(d)) for d in H.WHEEL_DIRS if os.path.isdir(d)}
    in_guest = {}
    for d in H.WHEEL_DIRS:
        listing = host.run(f"ls -1A {d}", check=False)
        if listing.returncode == 0:
            in_guest[d] = sorted(listing.stdout.splitlines())
    assert in_guest == on_machine
    read_only = [d for d in in_guest if host.run(f"! touch {d}/.sgc-rw-probe 2>/dev/null", check=False).returncode == 0]
    assert read_only == list(on_machine)
    conf = host.run("cat /etc/pip.conf").stdout
    assert conf.startswith("[global]")


def test_guests_share_the_machines_pip_cache(sandbox_hosts):
    """A file one guest's pip cache gets is in the machine's cache and in every other guest's: a wheel is
    downloaded once per machine (H.machine_pip_cache, bound at root's pip cache in each guest)."""
    cache = H.machine_pip_cache()
    assert cache is not None and cache.is_dir()
    probe = f".sgc-share-probe-{os.getpid()}"
    first, second = sandbox_hosts
    try:
        assert second.run(f"test -e {H.GUEST_PIP_CACHE}/{probe}", check=False).returncode != 0  # not there yet
        first.run(f"echo from-{first.name} > {H.GUEST_PIP_CACHE}/{probe}")
        assert (cache / probe).read_text() == f"from-{first.name}\n"
        assert second.run(f"cat {H.GUEST_PIP_CACHE}/{probe}").stdout == f"from-{first.name}\n"
    finally:
        (cache / probe).unlink(missing_ok=True)


def test_stale_unit_with_restart_always(sandbox_hosts):
    host = sandbox_hosts[0]
    pid = start_stale(host, gpu=0, gib=55, unit="other-llm", restart_always=True)
    try:
        apps = compute_apps(host)
        assert len(apps) == 1 and apps[0][:2] == [str(pid), "56320"]
        used = host.run("nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0").stdout.strip()
        assert used == "56320"
        cgroup = host.run(f"cat /proc/{pid}/cgroup").stdout
        assert "other-llm.service" in cgroup
        # a plain kill is undone by Restart=always
        host.run(f"kill -9 {pid}")
        deadline = time.monotonic() + 15
        new = []
        while time.monotonic() < deadline:
            new = [row for row in compute_apps(host) if row[0] != str(pid)]
            if new:
                break
            time.sleep(0.2)
        assert new, "Restart=always did not bring the holder back"
    finally:
        stop_stale(host, unit="other-llm")
    assert compute_apps(host) == []
    assert host.run("nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0").stdout.strip() == "0"


def test_stale_detached_process(sandbox_hosts):
    host = sandbox_hosts[1]
    pid = start_stale(host, gpu=2, gib=1)
    try:
        assert [str(pid), "1024"] == compute_apps(host)[0][:2]
        assert host.run(f"cat /proc/{pid}/cgroup").stdout.count("session-") >= 1
    finally:
        stop_stale(host, pid=pid)
    deadline = time.monotonic() + 30  # a bound only: the loop ends when the holder is gone
    while compute_apps(host) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert compute_apps(host) == []


def test_set_disk_and_grow_disk(sandbox_hosts):
    host = sandbox_hosts[0]
    H.set_disk(host, "/srv/models", 64)
    size = int(host.run("df -B1 --output=size /srv/models | tail -n1").stdout)
    assert size == 64 * 1024 * 1024
    assert H.free_bytes(host, "/srv/models") == 64 * 1024 * 1024
    host.run("head -c 1048576 /dev/zero > /srv/models/blob")
    assert H.free_bytes(host, "/srv/models") == 63 * 1024 * 1024
    H.grow_disk(host, "/srv/models", 256)
    assert H.free_bytes(host, "/srv/models") == 255 * 1024 * 1024
    assert host.run("stat -c %s /srv/models/blob").stdout.strip() == "1048576"
    host.run("umount /srv/models")


def test_pyinfra_reaches_the_hosts(run_pyinfra):
    # limited to this module's hosts: other workers' hosts may be booting or going away meanwhile
    proc = run_pyinfra("exec", "--", "cat /etc/hostname", limit="sgc[12]")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    # pyinfra pads host names to the longest one in the inventory
    assert re.search(r"\[sgc1\]\s+sgc1", out) and re.search(r"\[sgc2\]\s+sgc2", out), out


def _leftovers() -> list[str]:
    left = []
    left += [f"link {d.name}" for d in Path("/sys/class/net").iterdir() if d.name.startswith("sgc-")]
    nat = subprocess.run(["iptables", "-w", "-t", "nat", "-S"], capture_output=True, text=True).stdout
    left += [f"nat {line}" for line in nat.splitlines() if "sgc-" in line]
    left += [f"mount {line.split()[1]}" for line in Path("/proc/self/mounts").read_text().splitlines()
             if "/sglang-converge/" in line.split()[1] or line.split()[1].startswith(f"{H.VAR_DIR}/")]  # fmt: skip
    for root in H.cgroup_roots():
        left += [f"cgroup {d}" for d in root.glob("sgc-*")]
    left += [f"nspawn {pid}" for pids in H._scan_nspawn_pids().values() for pid in pids]
    return left


@pytest.mark.runs_last  # it removes every other module's hosts: after the session's last user of them
def test_down_cleans_up_also_after_a_crash(sandbox_hosts):
    """Runs last in the session: kills a guest's nspawn hard and loses the state file, then down()."""
    from tests.conftest import netns_names

    ours = {h.name for h in sandbox_hosts}
    for other in [h for h in H.load_hosts() if h.name not in ours]:
        H.remove(other.name)  # another module's hosts (e.g. the fleet): down() must find only ours
    expected_netns = [ns for ns in netns_names() if ns not in {h.netns for h in sandbox_hosts}]
    # positive control: before down(), _leftovers() finds each of our hosts' link, NAT rule, mount,
    # cgroup and nspawn processes, and netns_names() their namespaces
    before = _leftovers()
    assert {h.netns for h in sandbox_hosts} <= set(netns_names())
    assert H.cgroup_roots(), "no cgroup hierarchy found"
    for h in sandbox_hosts:
        assert f"link {H.veth_host(h.index)}" in before, before
        assert any(x.startswith("nat ") and H.cgroup_name(h.name) in x for x in before), before
        assert any(x.startswith(f"mount {H.VAR_DIR}/{h.name}/") for x in before), before
        assert any(f"cgroup {root / H.cgroup_name(h.name)}" in before for root in H.cgroup_roots()), before
        assert H._scan_nspawn_pids().get(h.name), before
    victim = sandbox_hosts[1]
    os.kill(victim.nspawn_pid, signal.SIGKILL)  # the guest's systemd lives on, orphaned
    H.STATE_FILE.unlink()
    removed = H.down()
    assert removed == ["sgc1", "sgc2"]
    assert netns_names() == expected_netns
    assert set(expected_netns) <= set(sandbox_hosts.netns_before)  # nothing of ours is left
    assert _leftovers() == []
    # bring the session's hosts back for any later test
    sandbox_hosts[:] = H.up(len(sandbox_hosts))
    assert sandbox_hosts[1].run("systemctl is-system-running", check=False).stdout.strip() in ("running", "degraded")
