"""SGLang's real router (sglang-router from PyPI on sgc10) in front of the
sandbox servers (sgc11..sgc14): a rolling restart of every server while
clients send chat requests through the router loses no request; a router
restart gets its workers registered again."""

import json
import time
import uuid

import pytest

from tests.integration.clients import CLIENTS, Clients
from tests.integration.fleet_helpers import ROUTER, ROUTER_URL, SERVERS, fleet, override, rollout, started_us, summary

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def hosts(request):
    return fleet(request)


def healthy_workers(router_host) -> list[str]:
    body = json.loads(router_host.run("curl -s localhost:30000/workers").stdout)
    return sorted(w["url"] for w in body["workers"] if w["is_healthy"])


def test_rolling_restart_through_the_router_fails_no_request(hosts, tmp_path):
    assert healthy_workers(hosts[ROUTER]) == [f"http://10.77.{i}.2:30000" for i in (11, 12, 13, 14)]
    before = {name: started_us(hosts[name]) for name in SERVERS}
    folder = override(tmp_path, extra_env={"SANDBOX_SGLANG_PARSER": "fallback", "SANDBOX_LOAD_SECONDS": "1",
                                           "SANDBOX_GEN_DELAY_S": "0.2", "SGC_ROUTER_TEST": uuid.uuid4().hex[:8]})
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
