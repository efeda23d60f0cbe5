"""Two SGLang servers on one sandbox host (inventory/sandbox_two.py): sgc240-a on GPUs 0-3
(sglang-a.service, port 30000) and sgc240-b on GPUs 4-7 (sglang-b.service, port 30001), TP 4 each,
the same model. One run converges both, over two ssh connections in parallel, with one download (the
second server attaches to the first's, or finds it done); a second run changes nothing; a change to b
alone (SGC_TWO_B_ENV: one more variable in its extra_env) restarts b and leaves a serving untouched.

The module's own host: sgc240, removed before (leftovers) and after.

    .venv/bin/python -m pytest -q tests/integration/test_two_servers.py
"""

from __future__ import annotations

import json

import pytest

from core.paths import LEGACY_FETCH_UNIT, STATE_DIR, fetch_unit_name
from sandbox import hosts as H
from sandbox import hubd
from tests.integration.helpers import boot_extra_host, grand_total, pyinfra, remove_host, unit_props

pytestmark = pytest.mark.sandbox

INDEX = 240
INVENTORY = "inventory/sandbox_two.py"
MODEL_DIR = "/srv/models/tiny-revisions/0123456789ab"  # the pinned revision of group_data/sandbox.py's model, shared by both
SERVERS = {"a": ("sglang-a.service", 30000, [0, 1, 2, 3]), "b": ("sglang-b.service", 30001, [4, 5, 6, 7])}


@pytest.fixture(scope="module")
def host():
    H.remove(H.host_name(INDEX))  # leftovers of an interrupted run: start from a fresh host
    booted = boot_extra_host(INDEX)
    try:
        yield booted
    finally:
        remove_host(booted)


def deploy(host, b_env: str = ""):
    """deploy.py over both entries of the machine (group `sandbox` of inventory/sandbox_two.py)."""
    return pyinfra("deploy.py", limit="sandbox", inventory=INVENTORY, timeout=1800,
                   env={"SGC_TWO_HOST": host.name, "SGC_TWO_B_ENV": b_env})


def hub_file_bytes(host) -> int:
    """The model bytes the sandbox Hub has served the host so far (it sees the guest's own address)."""
    return hubd.stats()["clients"].get(host.address, {}).get("file_bytes", 0)


def started(host) -> dict[str, str]:
    """Each unit's start time (monotonic us) and main pid: what a restart changes."""
    out = {}
    for name, (unit, _port, _gpus) in SERVERS.items():
        props = unit_props(host, unit)
        out[name] = f"{props['ExecMainStartTimestampMonotonic']} pid {props['MainPID']}"
    return out


@pytest.fixture(scope="module")
def converged(host):
    before = hub_file_bytes(host)
    run = deploy(host)
    return run, hub_file_bytes(host) - before


def test_one_run_converges_both_servers_with_one_download(host, converged):
    run, fetched = converged
    assert run.returncode == 0, run.out[-6000:]
    assert grand_total(run.out)[1] == 0, run.out[-6000:]
    for unit, port, gpus in SERVERS.values():
        assert host.run(f"systemctl is-active {unit}").stdout.strip() == "active"
        assert host.run(f"curl -fsS http://127.0.0.1:{port}/health", check=False).returncode == 0
        stem = unit.removesuffix(".service")
        env = host.run(f"cat /etc/sglang/{stem}.env").stdout
        assert f"CUDA_VISIBLE_DEVICES={','.join(map(str, gpus))}" in env, env
        # readiness and GPU balance are each server's own: its GPUs only, its unit only
        assert f"gpu_balance: GPUs {gpus} hold only {unit}'s memory" in run.out, run.out[-6000:]
        # restart stamp and last good configuration per unit, not per host
        assert host.run(f"test -f {STATE_DIR}/{stem}.json && test -f {STATE_DIR}/last-good/{stem}/stamp.json",
                        check=False).returncode == 0
    marker = json.loads(host.run(f"cat {MODEL_DIR}/.sglang-converge.json").stdout)
    assert fetched == sum(marker["files"].values()), (fetched, marker["files"])  # the Hub served the model once
    unit = fetch_unit_name(MODEL_DIR)
    journal = host.run(f"journalctl -u {unit} -o cat --no-pager").stdout
    assert "verified" in journal, journal[-3000:]
    assert host.run(f"systemctl show {LEGACY_FETCH_UNIT} --property=LoadState --value").stdout.strip() == "not-found"


def test_a_second_run_changes_nothing(host, converged):
    before = started(host)
    again = deploy(host)
    assert again.returncode == 0, again.out[-6000:]
    assert grand_total(again.out)[:2] == (0, 0), again.out[-6000:]
    assert started(host) == before


def test_a_change_to_one_server_restarts_only_that_one(host, converged):
    before = started(host)
    changed = deploy(host, b_env="SGC_TWO_MARK=1")
    assert changed.returncode == 0, changed.out[-6000:]
    after = started(host)
    assert after["a"] == before["a"], (before, after)  # untouched: same start, same pid
    assert after["b"] != before["b"] and int(after["b"].split()[0]) > int(before["b"].split()[0]), (before, after)
    assert "SGC_TWO_MARK=1" in host.run("cat /etc/sglang/sglang-b.env").stdout
    assert "SGC_TWO_MARK" not in host.run("cat /etc/sglang/sglang-a.env").stdout
    for _unit, port, _gpus in SERVERS.values():
        assert host.run(f"curl -fsS http://127.0.0.1:{port}/health", check=False).returncode == 0
    # and that is the new state: a run with the same settings changes nothing
    again = deploy(host, b_env="SGC_TWO_MARK=1")
    assert again.returncode == 0 and grand_total(again.out)[:2] == (0, 0), again.out[-6000:]
