"""python -m rollout on a sandbox fleet (sgc10 router, sgc11..sgc14 servers):
a fleet preflight that changes nothing, a rolling rollout in batches of 2
after a canary, a no-op rollout that restarts nothing, and a failing canary
that stops the rollout (rolled back) with the other hosts untouched, and a
rollback on demand behind the router."""

import json
import re
import subprocess
import time
import uuid

import pytest

from core.paths import fetch_unit_name
from tests.integration.helpers import newcomer_env
from tests.integration.fleet_helpers import (
    ENV,
    FLEET_GROUP,
    ROOT,
    ROUTER,
    SERVERS,
    first_converge,
    fleet,
    override,
    rollout,
    started_us,
    summary,
)

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group(FLEET_GROUP)]

TIMINGS: dict[str, float] = {}
# fast restarts: the stand-in's fallback parser, 1 s load (the deploy still checks with SGLang's parser)
FAST = {"SANDBOX_SGLANG_PARSER": "fallback", "SANDBOX_LOAD_SECONDS": "1"}


@pytest.fixture(scope="module")
def hosts(request):
    started = time.monotonic()
    out = fleet(request)
    TIMINGS["fleet up + converged"] = time.monotonic() - started
    yield out
    print("\nrollout test timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in TIMINGS.items()))


@pytest.fixture(scope="module")
def rolled(hosts, tmp_path_factory):
    """The fleet after a rolling rollout that restarted every server (batches: canary, 2, 1)."""
    folder = override(tmp_path_factory.mktemp("roll"), extra_env={**FAST, "SGC_ROLLOUT": uuid.uuid4().hex[:8]})
    before = {name: started_us(hosts[name]) for name in SERVERS}
    started = time.monotonic()
    proc = rollout("--batch-size", "2", "--canary", "1", "--group-data", folder)
    TIMINGS["rolling rollout (4 restarts)"] = time.monotonic() - started
    return folder, before, proc


def test_the_fleet_took_the_model_from_the_hub_once_and_the_rest_from_the_canary(hosts):
    """Peer seeding: the canary (sgc11) downloads the revision, sgc12..14 copy it from sgc11 with rsync over
    ssh and verify it against the Hub's digests; the Hub serves about 1x the model's bytes in all. The
    canary builds the server venv with pip, the others copy it."""
    converge = first_converge()
    assert "rollout: seed: sgc12, sgc13, sgc14 copy what they lack from sgc11 (10.77.11.2)" in converge["out"], \
        converge["out"][-6000:]
    before, after = converge["hub_before"]["clients"], converge["hub_after"]["clients"]

    def file_bytes(name: str) -> int:
        address = f"10.77.{name[3:]}.2"
        return after.get(address, {}).get("file_bytes", 0) - before.get(address, {}).get("file_bytes", 0)

    marker = json.loads(hosts["sgc11"].run("cat /srv/models/tiny-revisions/0123456789ab/.sglang-converge.json").stdout)
    model_bytes = sum(marker["files"].values())
    assert file_bytes("sgc11") == model_bytes, (file_bytes("sgc11"), model_bytes)
    assert [file_bytes(name) for name in ("sgc12", "sgc13", "sgc14")] == [0, 0, 0]
    for name in ("sgc12", "sgc13", "sgc14"):
        host = hosts[name]
        journal = host.run(f"journalctl -u {fetch_unit_name('/srv/models/tiny-revisions/0123456789ab')} -o cat --no-pager").stdout
        assert re.search(rf"seed: copied \d+ files, {model_bytes} bytes from the peer", journal), journal[-3000:]
        assert "verified" in journal and "by digest" in journal
        theirs = json.loads(host.run("cat /srv/models/tiny-revisions/0123456789ab/.sglang-converge.json").stdout)
        assert theirs["digests"] == marker["digests"] and theirs["revision"] == marker["revision"]
        assert host.run("ls /etc/sglang/*seed-key /etc/sglang/*seed-known-hosts", check=False).returncode != 0
    # the server venv too: built with pip on the canary, copied by the later hosts (the same Python), checked
    # there like a built one, the same packages
    def freeze(name: str) -> str:
        return hosts[name].run("for v in /opt/sglang/venv-envs/*/; do echo $v; $v/bin/python -m pip freeze --all; done").stdout

    assert freeze("sgc11").strip() and "sglang" in freeze("sgc11")
    for name in ("sgc12", "sgc13", "sgc14"):
        assert re.search(rf"{name}\S*\s.*python env: seed: copied the venv from the peer root@10\.77\.11\.2:",
                         converge["out"]), converge["out"][-6000:]
        assert freeze(name) == freeze("sgc11")
        assert not hosts[name].run("ls -a /opt/sglang/venv-envs").stdout.count(".seeding-")
    # the peer's key for this rollout is gone (and was there: the copy needed it)
    keys = hosts["sgc11"].run("cat /root/.ssh/authorized_keys").stdout
    assert "sglang-converge-seed-" not in keys and keys.strip()


def test_preflight_reports_every_host_and_changes_nothing(hosts):
    units = {name: hosts[name].run("cat /etc/systemd/system/sglang.service").stdout for name in SERVERS}
    started = {name: started_us(hosts[name]) for name in SERVERS}
    proc = rollout("--batch-size", "2", "--data", "min_driver_version=\"999.1\"", "--data", 'extra_env={"X": "1"}')
    assert proc.returncode == 2, proc.out
    for name in SERVERS:
        assert f"rollout: preflight: {name}: NVIDIA driver 580.95.05 is older than min_driver_version 999.1" in proc.out
    assert "4 host(s) cannot take the deploy: nothing was changed on any host" in proc.out
    assert "Starting operation" not in proc.out
    for name in SERVERS:
        assert hosts[name].run("cat /etc/systemd/system/sglang.service").stdout == units[name]
        assert started_us(hosts[name]) == started[name]


def test_rolling_rollout_canary_then_batches_of_two(hosts, rolled):
    _folder, before, proc = rolled
    assert proc.returncode == 0, proc.out[-5000:]
    rows = summary(proc.out)
    assert [rows[n]["batch"] for n in [ROUTER, *SERVERS]] == ["router", "canary", "1", "1", "2"], rows
    for name in SERVERS:
        assert rows[name]["result"] == "ok" and rows[name]["restarted"] == "yes", rows
        assert rows[name]["ready"].endswith(" s"), rows
    assert rows[ROUTER]["restarted"] == "no"
    after = {name: started_us(hosts[name]) for name in SERVERS}
    assert all(after[n] > before[n] for n in SERVERS)
    # each batch was ready before the next one restarted
    canary, b1, b2 = after["sgc11"], [after["sgc12"], after["sgc13"]], after["sgc14"]
    ready = {n: float(rows[n]["ready"].split()[0]) for n in SERVERS}
    assert min(b1) - canary >= ready["sgc11"] * 1e6 * 0.9, (after, ready)
    assert b2 - max(b1) >= min(ready["sgc12"], ready["sgc13"]) * 1e6 * 0.9, (after, ready)
    # in the order of the inventory, every server back in the router
    workers = json.loads(hosts[ROUTER].run("curl -s localhost:30000/workers").stdout)["workers"]
    assert sorted(w["url"] for w in workers if w["is_healthy"]) == [f"http://10.77.{i}.2:30000" for i in (11, 12, 13, 14)]


def test_noop_rollout_restarts_nothing(hosts, rolled):
    folder, _before, _proc = rolled
    before = {name: started_us(hosts[name]) for name in SERVERS}
    router_before = started_us(hosts[ROUTER], "sglang-router.service")
    started = time.monotonic()
    proc = rollout("--batch-size", "2", "--canary", "1", "--group-data", folder)
    TIMINGS["no-op rollout"] = time.monotonic() - started
    assert proc.returncode == 0, proc.out[-5000:]
    rows = summary(proc.out)
    for name in [ROUTER, *SERVERS]:
        assert (rows[name]["result"], rows[name]["changed"], rows[name]["restarted"]) == ("ok", "no", "no"), rows
    assert {name: started_us(hosts[name]) for name in SERVERS} == before
    assert started_us(hosts[ROUTER], "sglang-router.service") == router_before


def test_dry_rollout_plans_every_batch_and_changes_nothing(hosts, rolled, tmp_path):
    folder = override(tmp_path, extra_env={**FAST, "SGC_ROLLOUT": "dry-" + uuid.uuid4().hex[:6]})
    before = {name: started_us(hosts[name]) for name in SERVERS}
    proc = rollout("--batch-size", "2", "--canary", "1", "--dry", "--group-data", folder)
    assert proc.returncode == 0, proc.out[-5000:]
    for name in SERVERS:
        assert f"[{name}] plan: restart sglang.service: environment file changed" in proc.out, proc.out[-5000:]
        assert f"[{name}] plan: take http://10.77.{name[3:]}.2:30000 out of the router" in proc.out
        assert f"rollout: plan {name}: " in proc.out
    rows = summary(proc.out)
    assert {rows[n]["result"] for n in SERVERS} == {"planned"}
    assert {name: started_us(hosts[name]) for name in SERVERS} == before


def status_rows(output: str) -> dict[str, list[str]]:
    """--status table rows: {host: [role, unit, serving, revision, drift, router, launch, error]}."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃]", line)[1:-1]]
        if len(cells) == 9 and re.fullmatch(r"sgc\d+", cells[0]):
            rows[cells[0]] = cells[1:]
    return rows


def test_status_shows_the_fleet_and_drift_and_changes_nothing(hosts, rolled, tmp_path):
    folder, _before, _proc = rolled
    before = {name: started_us(hosts[name]) for name in SERVERS}
    proc = rollout("--status", "--group-data", folder)
    assert proc.returncode == 0, proc.out[-5000:]
    assert "status: 5/5 host(s) as wanted and serving" in proc.out
    rows = status_rows(proc.out)
    assert rows[ROUTER][:3] == ["router", "active", "yes"] and rows[ROUTER][5] == "4/4 healthy"
    for name in SERVERS:
        role, unit, serving, revision, drift, router, launch, error = rows[name]
        assert (role, unit, serving, drift, router, error) == ("server", "active", "yes", "none", "healthy", "")
        assert launch.startswith("max_total"), launch  # the kept fingerprint (the cell may wrap)
        assert len(revision) == 12
    # settings the servers were not started with: drift, exit 1, and still nothing changes
    drifted = override(tmp_path, extra_env={**FAST, "SGC_ROLLOUT": "drift-" + uuid.uuid4().hex[:6]})
    proc = rollout("--status", "--group-data", drifted)
    assert proc.returncode == 1, proc.out[-5000:]
    rows = status_rows(proc.out)
    for name in SERVERS:
        assert rows[name][4] == "environment file changed", rows[name]
    assert "not: sgc11, sgc12, sgc13, sgc14" in proc.out
    assert {name: started_us(hosts[name]) for name in SERVERS} == before
    assert "Starting operation" not in proc.out


WATCHED = "/etc/sglang /etc/systemd/system/sglang.service /var/lib/sglang-converge/last-good"


def config_listing(host) -> str:
    """Every file of the server's configuration and of its last good copy: path, size, mtime."""
    return host.run(f"find {WATCHED} -printf '%p %s %T@\\n' | sort").stdout


def test_verify_runs_every_gate_on_every_server_and_changes_nothing(hosts, rolled):
    folder, _before, _proc = rolled
    before = {name: (started_us(hosts[name]), config_listing(hosts[name])) for name in SERVERS}
    assert "/var/lib/sglang-converge/last-good/sglang/speed.json " in before["sgc11"][1]  # the listing sees them
    proc = rollout("--verify", "--group-data", folder)
    assert proc.returncode == 0, proc.out[-5000:]
    rows = summary(proc.out)
    for name in SERVERS:
        assert (rows[name]["result"], rows[name]["restarted"]) == ("ok", "no"), rows
        found = re.search(rf"\[{name}\] verify: every gate passed in [\d.]+ s \(fingerprint [\d.]+ s, speed [\d.]+ s, "
                          rf"smoke [\d.]+ s\)", proc.out)
        assert found, proc.out[-5000:]
        assert f"[{name}] readiness: launch fingerprint as planned" in proc.out  # each gate's own line
        assert f"[{name}] readiness: smoke checks passed: 2 of 2" in proc.out
    assert {name: (started_us(hosts[name]), config_listing(hosts[name])) for name in SERVERS} == before
    assert json.loads(hosts[ROUTER].run("curl -s localhost:30000/workers").stdout)["workers"]  # still registered
    healthy = [w for w in json.loads(hosts[ROUTER].run("curl -s localhost:30000/workers").stdout)["workers"]
               if w["is_healthy"]]
    assert len(healthy) == 4, healthy


def test_failing_canary_stops_the_rollout_and_leaves_the_others_untouched(hosts, rolled, tmp_path):
    rolled_folder, _before, _proc = rolled
    units = {name: hosts[name].run("cat /etc/systemd/system/sglang.service").stdout for name in SERVERS}
    started = {name: started_us(hosts[name]) for name in SERVERS}
    # a flag SGLang's parser accepts but the server cannot start with: GPUs 7..14 of 8
    broken = override(tmp_path, extra_server_args=["--base-gpu-id", "7"])
    t0 = time.monotonic()
    proc = rollout("--batch-size", "2", "--canary", "1", "--group-data", rolled_folder, "--group-data", broken)
    TIMINGS["failing canary"] = time.monotonic() - t0
    try:
        assert proc.returncode == 1, proc.out[-5000:]
        rows = summary(proc.out)
        # the canary failed and was rolled back: its last good configuration serves again
        assert rows["sgc11"]["result"] == "failed", rows
        assert "rolled back: cause: RuntimeError: CUDA error: invalid device ordinal" in rows["sgc11"]["error"], rows
        assert "stopped after batch canary" in proc.out
        assert "not touched: sgc12, sgc13, sgc14" in proc.out
        for name in SERVERS[1:]:
            assert rows[name]["result"] == "not run", rows
            assert hosts[name].run("cat /etc/systemd/system/sglang.service").stdout == units[name]
            assert started_us(hosts[name]) == started[name]
        assert hosts["sgc11"].run("cat /etc/systemd/system/sglang.service").stdout == units["sgc11"]
        assert hosts["sgc11"].run("curl -s -o /dev/null -w '%{http_code}' localhost:30000/health").stdout == "200"
        assert started_us(hosts["sgc11"]) != started["sgc11"]  # restarted twice: the broken config, then the good
        # drained before the broken restart, back in the router once the rolled-back configuration served
        assert "sgc11] readiness: http://10.77.11.2:30000 is back in the router at" in proc.out, proc.out[-5000:]
        workers = json.loads(hosts[ROUTER].run("curl -s localhost:30000/workers").stdout)["workers"]
        assert sorted(w["url"] for w in workers if w["is_healthy"]) == [
            f"http://10.77.{i}.2:30000" for i in (11, 12, 13, 14)], workers
    finally:
        healed = rollout("--limit", "sgc11", "--group-data", rolled_folder)
        assert healed.returncode == 0, healed.out[-5000:]


def test_rollback_on_demand_puts_the_previous_good_configuration_back_behind_the_router(hosts, rolled):
    """After the rolling rollout (a new extra_env), `--rollback` puts one server's previous good
    configuration back (the one before the rollout), out of the router and back in; a second
    `--rollback` puts the rollout's back (the kept configurations swap); nothing else moves."""
    name, env = "sgc12", "/etc/sglang/sglang.env"
    kept = "/var/lib/sglang-converge/last-good"
    rolled_env, previous_env = (hosts[name].run(f"cat {path}").stdout for path in (env, f"{kept}/sglang.previous/env"))
    assert "SGC_ROLLOUT" in rolled_env and "SGC_ROLLOUT" not in previous_env  # positive control: they differ
    others = {n: started_us(hosts[n]) for n in SERVERS if n != name}
    for want in (previous_env, rolled_env):
        before = started_us(hosts[name])
        started = time.monotonic()
        proc = rollout("--rollback", "--limit", name)
        TIMINGS.setdefault("rollback on demand", time.monotonic() - started)
        assert proc.returncode == 0, proc.out[-5000:]
        assert "rollback: put back the configuration that served as of " in proc.out, proc.out[-5000:]
        rows = summary(proc.out)
        assert (rows[name]["result"], rows[name]["restarted"]) == ("ok", "yes"), rows
        assert "out of the router before the rollback" in proc.out
        assert hosts[name].run(f"cat {env}").stdout == want
        assert started_us(hosts[name]) > before
        assert hosts[name].run("curl -s -o /dev/null -w '%{http_code}' localhost:30000/health").stdout == "200"
        workers = json.loads(hosts[ROUTER].run("curl -s localhost:30000/workers").stdout)["workers"]
        assert "http://10.77.12.2:30000" in [w["url"] for w in workers if w["is_healthy"]], workers
    assert {n: started_us(hosts[n]) for n in others} == others
    # the rollout's configuration serves again: a rollout of its settings changes nothing
    again = rollout("--limit", name, "--group-data", rolled[0])
    assert again.returncode == 0 and summary(again.out)[name]["changed"] == "no", again.out[-5000:]


def test_the_readmes_stage_only_and_make_rollout_on_the_serving_fleet(hosts, rolled):
    """The README's `python -m rollout INVENTORY --stage-only` and `make rollout INVENTORY=... BATCH=2 CANARY=1`
    on the fleet as it serves the rolling rollout's settings: the stage of the default settings (the same
    packages and model) restarts nothing; `make rollout` then switches every server to them, canary first."""
    before = {n: started_us(hosts[n]) for n in SERVERS}
    staged = rollout("--stage-only")
    assert staged.returncode == 0, staged.out[-5000:]
    rows = summary(staged.out)
    assert [(rows[n]["result"], rows[n]["restarted"]) for n in SERVERS] == [("staged", "-")] * len(SERVERS), rows
    assert {n: started_us(hosts[n]) for n in SERVERS} == before
    env = newcomer_env()
    proc = subprocess.run(["make", "rollout", "INVENTORY=inventory/sandbox_fleet.py", "BATCH=2", "CANARY=1"], cwd=ROOT,
                          env={**env, **ENV, "COLUMNS": "200"}, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    rows = summary(out)
    assert [(rows[n]["result"], rows[n]["restarted"]) for n in SERVERS] == [("ok", "yes")] * len(SERVERS), rows
    assert [rows[n]["batch"] for n in SERVERS] == ["canary", "1", "1", "2"], rows
    assert all(started_us(hosts[n]) > before[n] for n in SERVERS)
    assert "SGC_ROLLOUT" not in hosts[SERVERS[0]].run("cat /etc/sglang/sglang.env").stdout  # the default settings
