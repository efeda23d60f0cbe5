"""A keyed fleet: SGLang's real router (sglang-router from PyPI, sgc22) and one
server (sgc23) share the API key exported on the controller. The router
demands it from clients and from its /workers API, gives it to the server with
each request, and holds it only in a root-only file (never argv, the unit or
the journal); a second rollout changes nothing; a new key restarts both and
leaves them working together with it. The server boots staged (tests/integration/templates.py)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.integration import fleet_helpers
from tests.integration.fleet_helpers import summary, wait_for_ssh
from tests.integration.templates import staged_hosts

pytestmark = pytest.mark.sandbox

INDEXES = [22, 23]
ROUTER, SERVER = "sgc22", "sgc23"
ROUTER_URL = "http://10.77.22.2:30000"
KEY = "sk-fleet-key-5e1f0c"
ENV = {"SGC_FLEET_INDEXES": "22-23", "SGC_FLEET_ROUTER": ROUTER}


def rollout(*args: str, key: str = KEY):
    return fleet_helpers.rollout(*args, timeout=900, env={**ENV, "SGLANG_API_KEY": key})


@pytest.fixture(scope="module")
def keyed_fleet(request):
    from sandbox import hosts as sandbox_api

    def cleanup():
        for index in INDEXES:
            sandbox_api.remove(f"sgc{index}")

    request.addfinalizer(cleanup)
    # the server boots staged (its venv and revision: tests/integration/templates.py); the router fresh
    booted = {h.name: h for h in [*sandbox_api.up(indexes=INDEXES[:1]), *staged_hosts(INDEXES[1:])]}
    wait_for_ssh(booted.values())
    first = rollout("--batch-size", "1")
    return booted, first


def call(url: str, key: str | None, body: dict | None = None) -> tuple[int, dict | None]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, None


def test_keyed_rollout_converges(keyed_fleet):
    _, first = keyed_fleet
    assert first.returncode == 0, first.out[-6000:]
    rows = summary(first.out)
    assert rows[ROUTER]["result"] == rows[SERVER]["result"] == "ok"  # positive control: the output is the rollout's
    assert KEY not in first.out


def test_router_demands_the_key_and_gives_it_to_the_server(keyed_fleet):
    status, _ = call(ROUTER_URL + "/workers", None)
    assert status == 401  # the control plane is closed to callers without the key
    status, body = call(ROUTER_URL + "/workers", KEY)
    assert status == 200
    [worker] = body["workers"]
    assert worker["url"] == "http://10.77.23.2:30000" and worker["is_healthy"]
    # registered with the key: the router could read the server's /model_info and /server_info
    assert worker["model_id"] != "unknown", worker
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    assert call(ROUTER_URL + "/v1/chat/completions", None, chat)[0] == 401
    assert call(ROUTER_URL + "/v1/chat/completions", "sk-wrong", chat)[0] == 401
    status, answer = call(ROUTER_URL + "/v1/chat/completions", KEY, chat)
    assert status == 200 and answer["choices"][0]["message"]["content"]


def test_router_key_only_in_a_root_only_file(keyed_fleet):
    hosts, _ = keyed_fleet
    router = hosts[ROUTER]
    assert router.run("stat -c '%a %U' /etc/sglang/sglang-router.auth").stdout.split() == ["600", "root"]
    # the restart stamps hold digests of the key files: root only
    assert router.run("stat -c '%a' /var/lib/sglang-converge").stdout.strip() == "700"
    cmdlines = router.run("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '", check=False).stdout
    assert "router_launch.py" in cmdlines or "sglang::router" in cmdlines
    assert KEY not in cmdlines
    unit = router.run("cat /etc/systemd/system/sglang-router.service").stdout
    assert "ExecStart=" in unit and "--auth-file /etc/sglang/sglang-router.auth" in unit, unit
    assert KEY not in unit
    journal = router.run("journalctl --no-pager -u sglang-router.service", check=False).stdout
    assert "sglang-router.service" in journal, journal[-2000:]  # systemd's own lines about the unit are there
    assert KEY not in journal
    # positive control for the checks above: the same reads find the key where it must be
    assert KEY in router.run("cat /etc/sglang/sglang-router.auth").stdout
    server = hosts[SERVER]
    assert server.run("stat -c '%a %U' /etc/sglang/sglang.auth").stdout.split() == ["600", "root"]
    server_cmdlines = server.run("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '", check=False).stdout
    assert "sglang_standin --model-path" in server_cmdlines, server_cmdlines[-2000:]  # the server runs
    assert KEY not in server_cmdlines


def test_second_keyed_rollout_changes_nothing(keyed_fleet):
    hosts, first = keyed_fleet
    assert first.returncode == 0
    before = {name: h.run("systemctl show -p MainPID --value sglang-router.service sglang.service").stdout
              for name, h in hosts.items()}
    # each host runs its service (router: sglang-router, server: sglang): a PID that a restart would change
    assert [int(before[name].split()[i]) > 0 for name, i in ((ROUTER, 0), (SERVER, 1))] == [True, True], before
    again = rollout("--batch-size", "1")
    assert again.returncode == 0, again.out[-6000:]
    rows = summary(again.out)
    for name in (ROUTER, SERVER):
        assert (rows[name]["changed"], rows[name]["restarted"]) == ("no", "no"), rows[name]
    after = {name: h.run("systemctl show -p MainPID --value sglang-router.service sglang.service").stdout
             for name, h in hosts.items()}
    assert after == before


def test_key_rotation_restarts_both_and_they_work_with_the_new_key(keyed_fleet):
    hosts, _ = keyed_fleet
    new_key = "sk-rotated-77aa03"
    proc = rollout("--batch-size", "1", key=new_key)
    assert proc.returncode == 0, proc.out[-6000:]
    rows = summary(proc.out)
    assert rows[ROUTER]["restarted"] == rows[SERVER]["restarted"] == "yes", rows
    assert "API key changed" in proc.out and "options file changed" in proc.out
    assert KEY not in proc.out and new_key not in proc.out
    assert call(ROUTER_URL + "/workers", KEY)[0] == 401
    status, body = call(ROUTER_URL + "/workers", new_key)
    assert status == 200 and [w["is_healthy"] for w in body["workers"]] == [True]
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    assert call(ROUTER_URL + "/v1/chat/completions", new_key, chat)[0] == 200
    assert call("http://10.77.23.2:30000/v1/models", KEY)[0] == 401  # the server itself took the new key
    cmdlines = hosts[ROUTER].run("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '", check=False).stdout
    assert "router_launch.py" in cmdlines or "sglang::router" in cmdlines  # positive control: the router runs
    assert new_key not in cmdlines
