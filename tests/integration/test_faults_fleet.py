"""A rolling rollout with one unreachable host (python -m rollout on sgc265..sgc267,
inventory/sandbox_fleet.py without a router).

sgc265, first in the inventory (so the canary), has its sshd stopped inside the
guest: connecting is refused (port 22 closed). The fleet preflight reports it before any host
changes; with --max-failed 0 the rollout stops after the canary batch and the
later hosts are not touched; with --max-failed 1 the others converge, ready and
serving, and the rollout still exits 1. Once sshd is back (started through
nsenter from the machine) the next rollout converges it, and the one after
changes and restarts nothing anywhere.
The hosts boot staged (the venv and the revision: tests/integration/templates.py): what is
tested is the rollout's handling of the host it cannot reach, not the install.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.integration.fleet_helpers import rollout, summary, wait_for_ssh
from tests.integration.templates import staged_hosts

pytestmark = pytest.mark.sandbox

INDEXES = [265, 266, 267]  # this module's hosts (test_faults_controller.py: 260-264)
DOWN, OTHERS = "sgc265", ["sgc266", "sgc267"]
FLEET = {"SGC_FLEET_INDEXES": "265-267", "SGC_FLEET_ROUTER": ""}
VENVS = "/opt/sglang/venv-envs"  # the server's venvs, one per package set
UNIT_FILE = "/etc/systemd/system/sglang.service"
MODELS = "/srv/models"  # the model revisions' dirs (model_dir's default root)
BOOTED = "/root/.sgc-fleet-booted"  # touched at boot: touched() looks for anything newer
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def hosts():
    from sandbox import hosts as sandbox_api
    from tests.conftest import _sandbox_unavailable

    reason = _sandbox_unavailable()
    if reason:
        pytest.skip(reason)
    names = [sandbox_api.host_name(i) for i in INDEXES]
    for name in names:  # leftovers of an interrupted run: start from fresh hosts
        sandbox_api.remove(name)
    try:
        booted = staged_hosts(INDEXES)
        for host in booted:  # what the rollouts change from here on is newer than this
            host.run(f"touch {BOOTED}")
        wait_for_ssh(booted)
        yield {h.name: h for h in booted}
    finally:
        print("\nfleet fault timings: " + ", ".join(f"{k} {v:.0f} s" for k, v in TIMINGS.items()))
        for name in names:
            sandbox_api.remove(name)


@pytest.fixture(scope="module")
def unreachable(hosts):
    """sgc265 with its sshd stopped (the other hosts untouched)."""
    host = hosts[DOWN]
    host.run("systemctl stop ssh.service ssh.socket")
    assert host.run("true", check=False, timeout=30).returncode == 255  # refused: really unreachable
    return host


def run(*args: str) -> subprocess.CompletedProcess:
    started = time.monotonic()
    proc = rollout(*args, env=FLEET, timeout=900)
    TIMINGS[" ".join(args)] = time.monotonic() - started
    return proc


def touched(host) -> bool:
    """The deploy changed the host: the unit file is there, or something under the venvs or the
    models is newer than the boot (the hosts boot staged: the venv and the revision were there)."""
    changed = host.run(f"find {VENVS} {MODELS} -newer {BOOTED} -print -quit", check=False).stdout.strip()
    return bool(changed) or host.run(f"test -e {UNIT_FILE}", check=False).returncode == 0


def unit(host) -> dict[str, str]:
    out = host.run("systemctl show sglang.service --property=InvocationID,NRestarts,ActiveState").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def serves(host) -> bool:
    """/health 200 and /v1/models lists a model, asked on the host."""
    health = host.run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health", check=False).stdout
    models = host.run("curl -s http://127.0.0.1:30000/v1/models", check=False).stdout
    try:
        listed = [m.get("id") for m in json.loads(models or "{}").get("data", [])]
    except ValueError:
        listed = []
    return health == "200" and bool(listed)


def assert_unreachable_reported(row: dict[str, str]) -> None:
    assert row["result"] in ("failed", "preflight failed"), row
    # pyinfra's reason, e.g. "Could not connect ([Errno None] Unable to connect to port 22 on 10.78.11.2)"
    assert "cannot connect over ssh to 10." in row["error"] and "Could not connect (" in row["error"], row


def test_preflight_reports_the_unreachable_host_before_any_host_changes(hosts, unreachable):
    proc = run("--batch-size", "2")
    assert proc.returncode == 2, proc.out[-5000:]
    assert f"rollout: preflight: {DOWN}: cannot connect over ssh to {unreachable.address}" in proc.out, proc.out
    assert "1 host(s) cannot take the deploy: nothing was changed on any host" in proc.out
    assert "Starting operation" not in proc.out
    rows = summary(proc.out)
    assert_unreachable_reported(rows[DOWN])
    assert [touched(hosts[name]) for name in OTHERS] == [False, False]  # positive control: test 3


def test_max_failed_0_stops_after_the_unreachable_canary(hosts, unreachable):
    proc = run("--canary", "1", "--batch-size", "2", "--max-failed", "0", "--no-preflight")
    assert proc.returncode == 1, proc.out[-5000:]
    rows = summary(proc.out)
    assert rows[DOWN]["batch"] == "canary"
    assert_unreachable_reported(rows[DOWN])
    assert f"stopped after batch canary (1 failed host(s) > --max-failed 0): not touched: {', '.join(OTHERS)}" \
        in proc.out, proc.out[-5000:]
    assert [rows[name]["result"] for name in OTHERS] == ["not run", "not run"], rows
    assert [touched(hosts[name]) for name in OTHERS] == [False, False]  # positive control: test 3


def test_max_failed_1_converges_the_others(hosts, unreachable):
    proc = run("--canary", "1", "--batch-size", "2", "--max-failed", "1", "--no-preflight")
    assert proc.returncode == 1, proc.out[-5000:]  # a host failed: not "all ok", though tolerated
    assert "1 host(s) failed, within --max-failed 1: the other batches ran; failed: sgc265" in proc.out
    rows = summary(proc.out)
    assert_unreachable_reported(rows[DOWN])
    for name in OTHERS:
        assert rows[name]["batch"] == "1" and rows[name]["result"] == "ok", rows
        assert rows[name]["restarted"] == "yes" and rows[name]["ready"].endswith(" s"), rows
        assert touched(hosts[name]) and serves(hosts[name]) and unit(hosts[name])["ActiveState"] == "active"


def test_the_host_back_converges_then_nothing_changes(hosts, unreachable):
    """sshd back (its venv and revision staged at boot, like the others'); then a rollout
    converges it without touching the others, and the next one changes nothing anywhere."""
    from sandbox import hosts as sandbox_api

    target = unreachable
    init = sandbox_api.guest_init_pid(target)
    assert init, "no guest init to nsenter"
    subprocess.run(["nsenter", "-t", str(init), "-m", "-u", "-i", "-n", "-p", "systemctl", "start", "ssh.service"],
                   check=True, capture_output=True, text=True, timeout=60)
    wait_for_ssh([target])
    assert target.run("true", check=False, timeout=30).returncode == 0, "sshd is not back"
    others = {name: unit(hosts[name]) for name in OTHERS}
    proc = run("--batch-size", "3")
    assert proc.returncode == 0, proc.out[-5000:]
    rows = summary(proc.out)
    assert rows[DOWN]["result"] == "ok" and rows[DOWN]["restarted"] == "yes", rows
    assert serves(target)
    for name in OTHERS:
        assert (rows[name]["result"], rows[name]["restarted"]) == ("ok", "no"), rows
        assert unit(hosts[name]) == others[name]
    everyone = {name: unit(h) for name, h in hosts.items()}
    proc = run("--batch-size", "3")
    assert proc.returncode == 0, proc.out[-5000:]
    rows = summary(proc.out)
    assert {name: (row["result"], row["changed"], row["restarted"]) for name, row in rows.items()} == \
        {name: ("ok", "no", "no") for name in hosts}, rows
    assert {name: unit(h) for name, h in hosts.items()} == everyone  # nothing restarted
