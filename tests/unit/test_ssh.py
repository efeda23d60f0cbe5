"""core/ssh.py: pyinfra's ssh connections without Nagle's algorithm (each command of a
deploy waited ~40 ms on the host's delayed ACK)."""

from __future__ import annotations

import socket

from pyinfra.api import Config, Inventory, State

from core.ssh import CONNECT_KWARGS, nodelay, nodelay_on_connect, nodelay_transport


def _tcp_pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    return server, client, accepted


def test_the_transport_factory_gives_paramiko_a_socket_without_nagle():
    server, client, accepted = _tcp_pair()
    try:
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        transport = nodelay_transport(client)
        assert transport.sock is client
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        for sock in (accepted, client, server):
            sock.close()


def test_each_host_connects_with_it_unless_its_data_chooses_its_own_socket_or_transport():
    mine = object()
    inventory = Inventory(([
        "plain",
        ("timeout", {CONNECT_KWARGS: {"timeout": 3}}),
        ("proxied", {CONNECT_KWARGS: {"sock": mine}}),
        ("own", {CONNECT_KWARGS: {"transport_factory": mine}}),
    ], {}))
    state = State()
    nodelay_on_connect(state)
    state.init(inventory, Config())
    kwargs = {host.name: host.connector.data[CONNECT_KWARGS] for host in inventory}  # what SSHClient.connect gets
    assert kwargs["plain"] == {"transport_factory": nodelay_transport}
    assert kwargs["timeout"] == {"timeout": 3, "transport_factory": nodelay_transport}
    assert kwargs["proxied"] == {"sock": mine}
    assert kwargs["own"] == {"transport_factory": mine}


def test_a_connected_host_without_a_tcp_socket_is_left_alone():
    class Local:
        connector = object()  # pyinfra's @local connector: no paramiko client

    assert nodelay(Local()) is False
