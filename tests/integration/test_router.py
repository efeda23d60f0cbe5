"""SGLang's real router (sglang-router from PyPI on sgc10) in front of the
sandbox servers (sgc11..sgc14): a rolling restart of every server while
clients send chat requests through the router loses no request; a router
restart gets its workers registered again; the router's guest killed in the
middle of a rollout stops it (naming the router and the server left out of
it), and once the router is back the next rollout puts every server back."""

import json
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

from tests.integration.clients import CLIENTS, Clients
from tests.integration.fleet_helpers import (
    FLEET_GROUP,
    ENV,
    ROOT,
    ROUTER,
    ROUTER_URL,
    SERVERS,
    fleet,
    override,
    rollout,
    started_us,
    summary,
    wait_for_ssh,
)

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group(FLEET_GROUP)]


@pytest.fixture(scope="module")
def hosts(request):
    return fleet(request)


def healthy_workers(router_host) -> list[str]:
    body = json.loads(router_host.run("curl -s localhost:30000/workers").stdout)
    return sorted(w["url"] for w in body["workers"] if w["is_healthy"])


def test_rolling_restart_through_the_router_fails_no_request(hosts, tmp_path):
    assert healthy_workers(hosts[ROUTER]) == [f"http://10.77.{i}.2:30000" for i in (11, 12, 13, 14)]
    before = {name: started_us(hosts[name]) for name in SERVERS}
    # requests 4x longer than the stand-in's default, so drains have work to wait for: the speed gate
    # would fail that restart (as it should: tests/integration/test_start_gates.py), so it is off here
    folder = override(tmp_path, extra_env={"SANDBOX_SGLANG_PARSER": "fallback", "SANDBOX_LOAD_SECONDS": "1",
                                           "SANDBOX_GEN_DELAY_S": "0.2", "SGC_ROUTER_TEST": uuid.uuid4().hex[:8]},
                      perf_tolerance=0)
    with Clients(ROUTER_URL) as clients:
        time.sleep(2)  # traffic before the first drain
        started = time.monotonic()
        proc = rollout("--batch-size", "1", "-q", "--group-data", folder)
        took = time.monotonic() - started
        time.sleep(2)
    assert proc.returncode == 0, proc.out[-5000:]
    rows = summary(proc.out)
    assert all(rows[name]["restarted"] == "yes" for name in SERVERS), rows
    assert all(started_us(hosts[name]) > before[name] for name in SERVERS)
    sent = len(clients.latencies) + len(clients.failures)
    stats = clients.percentiles()
    print(f"\nrouter rolling restart of {len(SERVERS)} servers in {took:.1f} s: {sent} requests through the router "
          f"({CLIENTS} clients), {len(clients.failures)} failed; latency p50 {stats['p50'] * 1000:.0f} ms, "
          f"p95 {stats['p95'] * 1000:.0f} ms, p99 {stats['p99'] * 1000:.0f} ms")
    assert clients.failures == [], clients.failures[:5]
    assert sent > 50
    assert healthy_workers(hosts[ROUTER]) == [f"http://10.77.{i}.2:30000" for i in (11, 12, 13, 14)]


def test_router_restart_registers_its_workers_again(hosts, tmp_path):
    router_before = started_us(hosts[ROUTER], "sglang-router.service")
    folder = tmp_path / "routers"
    folder.mkdir()
    (folder / "routers.py").write_text('router_extra_args = ["--log-level", "warn"]\n')
    proc = rollout("--limit", ROUTER, "-q", "--group-data", str(folder))
    assert proc.returncode == 0, proc.out[-5000:]
    assert summary(proc.out)[ROUTER]["restarted"] == "yes"
    assert started_us(hosts[ROUTER], "sglang-router.service") > router_before
    assert "--log-level warn" in hosts[ROUTER].run("systemctl cat sglang-router.service").stdout
    assert healthy_workers(hosts[ROUTER]) == [f"http://10.77.{i}.2:30000" for i in (11, 12, 13, 14)]
    restored = rollout("--limit", ROUTER, "-q")
    assert restored.returncode == 0, restored.out[-5000:]
    assert healthy_workers(hosts[ROUTER]) == [f"http://10.77.{i}.2:30000" for i in (11, 12, 13, 14)]


ALL = [f"http://10.77.{i}.2:30000" for i in (11, 12, 13, 14)]


def rollout_in_background(*args: str) -> tuple[subprocess.Popen, list[str]]:
    """The command fleet_helpers.rollout runs, started: (the process, its output lines as they come)."""
    argv = [sys.executable, "-m", "rollout", "inventory/sandbox_fleet.py", *args]
    proc = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **ENV, "COLUMNS": "200"}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout or []:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    return proc, lines


def wait_for_line(proc: subprocess.Popen, lines: list[str], text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not any(text in line for line in list(lines)):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no line with {text!r} within {timeout:.0f} s (exit {proc.poll()}):\n"
                                 + "".join(lines)[-5000:])
        time.sleep(0.05)


def router_back(hosts) -> None:
    """Boot the killed router guest again on its disk (its venv and unit kept), until ssh answers."""
    from sandbox import hosts as sandbox_api

    [router] = sandbox_api.up(indexes=[int(ROUTER[3:])])
    wait_for_ssh([router])
    hosts[ROUTER] = router  # its new nspawn pid, for the tests after this one


def worker_id(router_host, url: str) -> str | None:
    body = json.loads(router_host.run("curl -s localhost:30000/workers").stdout)
    return next((w["id"] for w in body["workers"] if w["url"].rstrip("/") == url), None)


def invocations_since(host, since: float) -> list[tuple[str, list[str]]]:
    """sglang.service's journal since ``since`` (epoch s), per start of the unit, in order: [(id, lines)]."""
    out = host.run(f"journalctl -u sglang.service -o json --no-pager --since @{int(since)}", timeout=60).stdout
    runs: dict[str, list[str]] = {}
    for line in out.splitlines():
        entry = json.loads(line)
        if entry.get("_SYSTEMD_INVOCATION_ID") and isinstance(entry.get("MESSAGE"), str):
            runs.setdefault(entry["_SYSTEMD_INVOCATION_ID"], []).append(entry["MESSAGE"])
    return list(runs.items())


def chat_requests_from_outside(lines: list[str]) -> list[str]:
    """The access lines of chat requests not sent from the host itself (the router's; the gates' come from 127.0.0.1)."""
    return [line for line in lines if '"POST /v1/chat/completions' in line and "INFO:     127.0.0.1:" not in line]


def test_a_canary_failing_a_gate_is_rolled_back_and_the_router_sends_the_bad_config_nothing(hosts, tmp_path):
    """Issue 20.6/20.7: the canary's new configuration starts and answers /health, but its KV pool is a tenth of
    the plan (the launch fingerprint fails): rolled back like a crash, the rollout stops after the canary, no
    client request fails, and the router sent the bad configuration not one request; the last good one serves
    in the router again (and gets the router's requests: the positive control)."""
    assert healthy_workers(hosts[ROUTER]) == ALL
    before = {name: started_us(hosts[name]) for name in SERVERS}
    folder = override(tmp_path, extra_env={"SANDBOX_SGLANG_PARSER": "fallback", "SANDBOX_LOAD_SECONDS": "1",
                                           "SANDBOX_KV_FRACTION": "0.1", "SGC_GATE_CANARY": uuid.uuid4().hex[:8]})
    since = time.time() - 1
    with Clients(ROUTER_URL) as clients:
        time.sleep(2)
        proc = rollout("--canary", "1", "--batch-size", "2", "-q", "--group-data", folder)
        time.sleep(3)  # traffic after the rollback: the router sends the restored server requests again
    assert proc.returncode == 1, proc.out[-5000:]
    rows = summary(proc.out)
    assert rows["sgc11"]["result"] == "failed" and "rolled back: readiness: launch fingerprint: the KV pool holds" \
        in rows["sgc11"]["error"], rows
    assert [rows[name]["result"] for name in SERVERS[1:]] == ["not run"] * 3, rows
    assert "stopped after batch canary" in proc.out
    assert {name: started_us(hosts[name]) for name in SERVERS[1:]} == {n: before[n] for n in SERVERS[1:]}
    assert clients.failures == [], clients.failures[:5]
    assert healthy_workers(hosts[ROUTER]) == ALL
    runs = invocations_since(hosts["sgc11"], since)
    assert len(runs) >= 3, [(run_id, lines[:3]) for run_id, lines in runs]  # serving, the bad start, the restored
    (_, serving), (_, bad), (_, restored) = runs[-3:]
    # the bad start answered the deploy's own requests (logged like any other: the check can see them)
    assert any("#tokens: " in line for line in bad) and any('INFO:     127.0.0.1:' in line and '"GET /v1/models' in line
                                                            for line in bad), bad[-20:]
    assert chat_requests_from_outside(bad) == [], chat_requests_from_outside(bad)[:3]
    assert chat_requests_from_outside(restored), restored[-20:]  # positive control: the check sees the router's
    assert chat_requests_from_outside(serving)  # and the old configuration served the router until its drain


def test_a_router_lost_mid_rollout_stops_it_and_the_next_rollout_puts_every_server_back(hosts, tmp_path):
    """Issue 22.4: the router's guest killed (power cut, disk kept) while the first server of a rollout in
    batches of 1 is out of the router for its restart. The rollout stops after that batch whatever
    --max-failed, naming the router and what failed, later servers untouched, the summary naming the
    server out of the router; the router booted again, the next rollout registers every server (also
    one it does not restart) and the one after changes nothing."""
    from sandbox import hosts as sandbox_api

    assert healthy_workers(hosts[ROUTER]) == ALL
    before = {name: started_us(hosts[name]) for name in SERVERS}
    # a 5 s load: the router is killed after sgc11's drain, well before its registration
    folder = override(tmp_path, extra_env={"SANDBOX_SGLANG_PARSER": "fallback", "SANDBOX_LOAD_SECONDS": "5",
                                           "SGC_ROUTER_LOST": uuid.uuid4().hex[:8]})
    args = ("--batch-size", "1", "--max-failed", "3", "-q", "--group-data", folder)
    proc, lines = rollout_in_background(*args)
    killed = False
    try:
        wait_for_line(proc, lines, f"drained: {ALL[0]} out of the router", timeout=600)
        sandbox_api.kill(ROUTER)
        killed, killed_at = True, time.monotonic()
        returncode = proc.wait(timeout=300)
        took = time.monotonic() - killed_at
        out = "".join(lines)
        assert returncode == 1, out[-5000:]
        assert took < 120, f"the rollout ended {took:.0f} s after the router was killed"
        assert (f"rollout: stopped after batch 1: router lost: sgc11: the router at {ROUTER_URL}: "
                f"GET {ROUTER_URL}/workers got no answer from sgc11 while registering {ALL[0]}") in out, out[-5000:]
        assert ("a lost router stops the whole rollout, whatever --max-failed (3); "
                "not touched: sgc12, sgc13, sgc14") in out
        rows = summary(out)
        assert rows["sgc11"]["result"] == "failed" and ROUTER_URL in rows["sgc11"]["error"], rows
        # no canary: every server was staged before batch 1 (nothing restarts in a stage), then left alone
        assert [(rows[name]["result"], rows[name]["restarted"]) for name in SERVERS[1:]] == [("staged", "-")] * 3, rows
        assert f"rollout: out of the router: sgc11: drained from the router at {ROUTER_URL} before its restart" \
            in out, out[-3000:]
        assert "rollout: 1 server(s) out of the router (sgc11): once the router answers again" in out
        assert started_us(hosts["sgc11"]) > before["sgc11"]  # restarted: it serves, outside any router
        assert {name: started_us(hosts[name]) for name in SERVERS[1:]} == {n: before[n] for n in SERVERS[1:]}

        router_back(hosts)
        killed = False
        assert hosts[ROUTER].run("test -x /opt/sglang-router/venv/bin/python", check=False).returncode == 0
        again = rollout(*args)
        assert again.returncode == 0, again.out[-5000:]
        rows = summary(again.out)
        assert rows[ROUTER]["result"] == "ok", rows
        assert rows["sgc11"]["restarted"] == "no" and [rows[n]["restarted"] for n in SERVERS[1:]] == ["yes"] * 3
        assert "rollout: out of the router" not in again.out and "router lost" not in again.out
        assert healthy_workers(hosts[ROUTER]) == ALL

        # a server this run does not restart (nothing changed for it), missing from the router: registered
        hosts[ROUTER].run(f"curl -s -X DELETE localhost:30000/workers/{worker_id(hosts[ROUTER], ALL[0])}")
        deadline = time.monotonic() + 30
        while worker_id(hosts[ROUTER], ALL[0]) is not None:
            assert time.monotonic() < deadline, "the router still lists sgc11 30 s after DELETE"
            time.sleep(0.2)
        alone = rollout("--limit", "sgc11", "-q", "--group-data", folder)
        assert alone.returncode == 0, alone.out[-5000:]
        row = summary(alone.out)["sgc11"]
        assert (row["result"], row["changed"], row["restarted"]) == ("ok", "yes", "no"), row
        assert healthy_workers(hosts[ROUTER]) == ALL

        noop = rollout("--batch-size", "2", "-q", "--group-data", folder)
        assert noop.returncode == 0, noop.out[-5000:]
        rows = summary(noop.out)
        for name in [ROUTER, *SERVERS]:
            assert (rows[name]["result"], rows[name]["changed"], rows[name]["restarted"]) == ("ok", "no", "no"), rows
        assert healthy_workers(hosts[ROUTER]) == ALL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if killed:  # the fleet as the other tests expect it: the router up, every server in it
            router_back(hosts)
            rollout(*args)
