"""The host's ssh connection sends each message without waiting on Nagle.

paramiko writes an SSH message with several small socket writes (channel
open, exec request, EOF, close); with Nagle's algorithm on, a write after an
unacknowledged one waits for the peer's delayed ACK, ~40 ms on Linux. That
made every command of a deploy take 55-70 ms where the host spends 10-15 ms
(measured on the sandbox: `systemctl show` 67 ms median over paramiko, 12 ms
with TCP_NODELAY; the handshake 85-120 ms, 60 ms with it). OpenSSH sets
TCP_NODELAY for interactive sessions; paramiko never does, and pyinfra has
no setting of its own for it, only ``ssh_paramiko_connect_kwargs``.

- ``nodelay_on_connect(state)`` (config.py): each host's paramiko transport is
  made by ``transport_factory`` (paramiko's SSHClient.connect argument), which
  sets it on the socket before the handshake, unless the host's data passes
  its own ``sock`` or ``transport_factory``;
- ``nodelay(host)`` (deploy.py, rollback.py): sets it on a host's connected
  socket, for connections made otherwise (pyinfra's API, the rollout driver).
"""

from __future__ import annotations

import inspect
import socket
from typing import Any

CONNECT_KWARGS = "ssh_paramiko_connect_kwargs"  # pyinfra's ssh connector: extra SSHClient.connect arguments


def _set_nodelay(sock: Any) -> bool:
    """TCP_NODELAY on ``sock`` when it is a TCP socket (not a ProxyCommand's pipe); True when set."""
    if getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6):
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        return False
    return True


def nodelay_transport(sock: Any, **kwargs: Any) -> Any:
    """paramiko's ``transport_factory``: its Transport, on a socket without Nagle."""
    from paramiko import Transport

    _set_nodelay(sock)
    return Transport(sock, **kwargs)


def _factory_supported() -> bool:
    """paramiko >= 3.2 takes ``transport_factory`` (pyinfra allows older ones)."""
    try:
        from paramiko import SSHClient

        return "transport_factory" in inspect.signature(SSHClient.connect).parameters
    except (ImportError, TypeError, ValueError):
        return False


def nodelay_on_connect(state: Any) -> None:
    """Make ``state``'s init (which makes each host's connector from its data) give every host
    whose data does not choose its own socket or transport the TCP_NODELAY transport."""
    if not _factory_supported():
        return
    init = state.init

    def init_with_nodelay(inventory: Any, *args: Any, **kwargs: Any) -> None:
        for host in inventory:
            given = host.data.get(CONNECT_KWARGS) or {}
            if isinstance(given, dict) and not {"sock", "transport_factory"} & set(given):
                # host.data.<key> = ...: pyinfra's way of setting a host's data in code
                setattr(host.data, CONNECT_KWARGS, {**given, "transport_factory": nodelay_transport})
        init(inventory, *args, **kwargs)

    state.init = init_with_nodelay


def nodelay(host: Any) -> bool:
    """Set TCP_NODELAY on ``host``'s connected ssh socket (pyinfra's ssh connector); True when set.
    Any other connector (local, docker, a proxy command's pipe) is left as it is."""
    if hasattr(host, "_get_module"):  # pyinfra's context proxy (`from pyinfra import host`)
        host = host._get_module()
    client = getattr(getattr(host, "connector", None), "client", None)
    transport = client.get_transport() if client is not None and hasattr(client, "get_transport") else None
    return _set_nodelay(getattr(transport, "sock", None))
