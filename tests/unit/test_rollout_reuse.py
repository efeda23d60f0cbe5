"""The rollout's reuse across its States: ssh connections kept from one State
to the next (rollout/connections.py), and the per-phase profile (rollout/profile.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from pyinfra.connectors.ssh import SSHConnector

from rollout import profile
from rollout.connections import Connections


class FakeTransport:
    def __init__(self, active=True, answers=True):
        self.active, self.answers, self.probes = active, answers, 0

    def is_active(self):
        return self.active

    def open_session(self, timeout=None):
        self.probes += 1
        if not self.answers:
            raise EOFError("gone")
        return SimpleNamespace(close=lambda: None)


class FakeClient:
    def __init__(self, **kwargs):
        self.transport, self.closed = FakeTransport(**kwargs), False

    def get_transport(self):
        return self.transport

    def close(self):
        self.closed = True


def ssh_host(name, client=None, hostname="10.0.0.1"):
    connector = object.__new__(SSHConnector)
    connector.data = {"ssh_hostname": hostname, "ssh_port": 22, "ssh_user": "root", "ssh_key": None}
    connector.client = client
    connector.fresh = 0

    def _connect():
        connector.fresh += 1
        connector.client = FakeClient()

    connector._connect = _connect
    return SimpleNamespace(name=name, connector=connector, connected=client is not None)


class Inventory(dict):
    def get_host(self, name):
        return self[name]


def test_an_open_connection_goes_to_the_same_host_of_the_next_state():
    pool = Connections()
    client = FakeClient()
    pool.keep(Inventory(a=ssh_host("a", client)), ["a"])
    nxt = ssh_host("a")
    pool.adopt(Inventory(a=nxt), ["a"])
    nxt.connector._connect()
    assert nxt.connector.client is client and nxt.connector.fresh == 0
    assert pool.reused == 1 and client.transport.probes == 1


def test_a_dropped_or_silent_connection_is_closed_and_the_host_connects_afresh():
    for client in (FakeClient(active=False), FakeClient(answers=False)):
        pool = Connections()
        pool.clients[("a", "'10.0.0.1'", "22", "'root'", "None")] = client
        nxt = ssh_host("a")
        pool.adopt(Inventory(a=nxt), ["a"])
        nxt.connector._connect()
        assert nxt.connector.fresh == 1 and nxt.connector.client is not client
        assert client.closed and pool.reused == 0


def test_a_connection_serves_only_the_same_host_and_address():
    pool = Connections()
    client = FakeClient()
    pool.keep(Inventory(a=ssh_host("a", client)), ["a"])
    moved = ssh_host("a", hostname="10.0.0.2")
    pool.adopt(Inventory(a=moved), ["a"])
    moved.connector._connect()
    assert moved.connector.fresh == 1
    pool.close()
    assert client.closed and not pool.clients


def test_unconnected_hosts_are_not_kept():
    pool = Connections()
    pool.keep(Inventory(a=SimpleNamespace(name="a", connector=ssh_host("a").connector, connected=False)), ["a"])
    assert not pool.clients


def test_profile_is_off_unless_asked(monkeypatch):
    monkeypatch.delenv(profile.ENV, raising=False)
    assert profile.start() is None
    with profile.phase("connect"):
        pass
    assert profile.finish() is None


def test_profile_phases_nest_and_are_written(monkeypatch, tmp_path):
    target = tmp_path / "profile.json"
    monkeypatch.setenv(profile.ENV, str(target))
    profile.start()
    with profile.phase("batch", scope=True):
        with profile.phase("connect"):
            pass
    lines: list[str] = []
    data = profile.finish(echo=lines.append)
    monkeypatch.delenv(profile.ENV)
    profile.start()
    assert set(data) == {"phase:batch", "phase:batch: connect"}
    assert json.loads(target.read_text()) == data
    assert any("phase:batch: connect" in line for line in lines)


def test_gpu_facts_are_read_once_per_rollout_and_others_every_time():
    from facts.gpu import GpuP2P, NvidiaGpus
    from facts.venv import VenvPackages
    from rollout.static_facts import StaticFacts

    asked: list[tuple] = []
    answers = {NvidiaGpus: [], GpuP2P: None, VenvPackages: {"sglang": "0.5.23"}}

    class Host:  # pyinfra's Host: get_fact on the class (core/factcache.py may wrap it after attach)
        def __init__(self, state_no: int) -> None:
            self.name, self.state_no = "a", state_no

        def get_fact(self, cls, *args, **kwargs):
            return asked.append((self.state_no, cls, kwargs)) or answers[cls]

    def host_in(state_no: int):
        return Host(state_no)

    facts = StaticFacts()
    first = host_in(1)
    facts.attach(first)
    assert first.get_fact(NvidiaGpus) == []  # empty: asked again next time
    answers[NvidiaGpus] = ["gpu0"]
    assert first.get_fact(NvidiaGpus) == ["gpu0"]
    second = host_in(2)  # the next State's host
    facts.attach(second)
    assert second.get_fact(NvidiaGpus) == ["gpu0"]
    assert second.get_fact(VenvPackages, path="/v") == second.get_fact(VenvPackages, path="/v")
    assert [(n, cls) for n, cls, _ in asked] == [(1, NvidiaGpus), (1, NvidiaGpus), (2, VenvPackages),
                                                 (2, VenvPackages)]
    assert facts.hits == 1
    wrapped = Host.get_fact
    Host.get_fact = lambda self, cls, *args, **kwargs: "wrapped later"  # type: ignore[method-assign]
    try:
        assert second.get_fact(VenvPackages, path="/v") == "wrapped later"  # the class's, as it is now
    finally:
        Host.get_fact = wrapped  # type: ignore[method-assign]
