"""SSH connections kept across the rollout's States (fleet preflight, then one State per batch).

The driver makes a fresh pyinfra State + Inventory for each batch, so each
host would be connected twice (preflight, its batch) and the router hosts'
connections made again and again. pyinfra's ssh connector leaves its paramiko
client open on ``disconnect`` (it only drops its file-transfer cache), so a
client whose transport is still active is handed to the same host of the next
State instead of a new handshake (after a probe: a session channel opens
within PROBE_TIMEOUT_S). A host whose kept connection has dropped connects as
usual; anything but pyinfra's ssh connector is left alone.
``close()`` closes them all when the rollout ends.

    pool = Connections()
    pool.adopt(inventory, names)   # before connect_all: kept clients for these hosts
    connect_all(state)
    pool.keep(inventory, names)    # after the State's work: keep the connected clients
    pool.close()
"""

from __future__ import annotations

from types import MethodType
from typing import Any


PROBE_TIMEOUT_S = 5.0


def _live(client: Any) -> bool:
    transport = client.get_transport() if client is not None else None
    return bool(transport is not None and transport.is_active())


def _answers(client: Any) -> bool:
    """The host still answers on this connection: a session channel opens (and closes) in time.

    A host gone without a word (its network removed) leaves the transport
    looking active; a command on it would wait for paramiko's hour-long
    channel timeout, where a new connection fails within CONNECT_TIMEOUT."""
    if not _live(client):
        return False
    try:
        channel = client.get_transport().open_session(timeout=PROBE_TIMEOUT_S)
        channel.close()
        return True
    except Exception:  # noqa: BLE001
        return False


def _key(host) -> tuple:
    """A kept connection serves only a host with the same connection settings."""
    data = getattr(host.connector, "data", None) or {}
    return (host.name, *(repr(data.get(k)) for k in ("ssh_hostname", "ssh_port", "ssh_user", "ssh_key")))


class Connections:
    """Open ssh clients by host, handed from one State's host to the next one's."""

    def __init__(self) -> None:
        self.clients: dict[tuple, Any] = {}
        self.reused = 0

    @staticmethod
    def _ssh(host) -> bool:
        from pyinfra.connectors.ssh import SSHConnector

        return isinstance(host.connector, SSHConnector)

    def adopt(self, inventory, names: list[str]) -> None:
        """The next connect of these hosts takes the kept client when it is still open."""
        for name in names:
            host = inventory.get_host(name)
            if not self._ssh(host):
                continue
            client = self.clients.pop(_key(host), None)
            if client is None:
                continue
            if not _answers(client):
                client.close()
                continue
            connector = host.connector
            original = connector._connect

            def _connect(self, client=client, original=original) -> None:
                if _live(client):
                    self.client = client
                    return
                original()

            connector._connect = MethodType(_connect, connector)
            self.reused += 1

    def keep(self, inventory, names: list[str]) -> None:
        """Keep the open clients of these hosts for the next State."""
        for name in names:
            host = inventory.get_host(name)
            if self._ssh(host) and host.connected and _live(host.connector.client):
                self.clients[_key(host)] = host.connector.client

    def close(self) -> None:
        for client in self.clients.values():
            try:
                client.close()
            except Exception:  # noqa: BLE001
                pass
        self.clients.clear()
