"""Which servers this run left out of their router, and which routers stopped answering.

Kept on the run state (core/runstate.py), per host, for the rollout's summary
and its fleet-level stop (rollout/router_loss.py):

- ``out``: a server is out of its router from a drain that succeeded (DELETE
  /workers/{id}) until a registration that succeeded (POST /workers, then
  healthy), or when it could not be registered at all;
- ``losses``: a router call that found the router not answering (asked again
  from the host after the call failed, GET /workers gets no HTTP answer at
  all - a refused key is an answer): the router is lost - every later drain
  would take a server out of nothing and every registration would fail.

    from core.router_membership import membership, registered
    membership(state).taken_out(host.name, f"drained from the router at {url} before its restart")
    registered(state, host, python, router_url, worker_url, auth_file)   # a FunctionCommand body's call
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from core.router_api import register_workers
from core.runstate import run_state
from facts.http import HttpStatus

KEY = "router_membership"


@dataclass(frozen=True)
class RouterLoss:
    """A router that did not answer a host, and what failed because of it."""

    router_url: str
    what: str

    def __str__(self) -> str:
        return f"the router at {self.router_url}: {self.what}"


@dataclass
class RouterMembership:
    out: dict[str, str] = field(default_factory=dict)  # host -> why its server is out of its router
    losses: dict[str, list[RouterLoss]] = field(default_factory=dict)  # host -> the router calls it found unanswered
    out_since: dict[str, float] = field(default_factory=dict)  # host -> when it went out (monotonic)
    out_s: dict[str, float] = field(default_factory=dict)  # host -> seconds from out to in again, this run

    def taken_out(self, host_name: str, why: str) -> None:
        """The server is out of its router (``why`` is added to what took it out before)."""
        self.out_since.setdefault(host_name, time.monotonic())
        before = self.out.get(host_name)
        self.out[host_name] = f"{before}; {why}" if before and why not in before else (before or why)

    def put_back(self, host_name: str) -> None:
        """The server is in its router again, healthy."""
        self.out.pop(host_name, None)
        if host_name in self.out_since:
            self.out_s[host_name] = time.monotonic() - self.out_since.pop(host_name)

    def lost(self, host_name: str, router_url: str, what: str) -> None:
        self.losses.setdefault(host_name, []).append(RouterLoss(router_url, what))


def membership(state=None) -> RouterMembership:
    """This run's record (``state``: a pyinfra State; default: the current one)."""
    return run_state(state).extension(KEY, RouterMembership)


def router_answers(host, router_url: str) -> bool:
    """The router gives any HTTP answer to GET /workers (401 included), asked from ``host`` now (read
    afresh each time); False: nothing answers there (connection refused, no route, a timeout)."""
    return host.get_fact(HttpStatus, url=f"{router_url.rstrip('/')}/workers") != 0


def no_answer(router_url: str, host_name: str, doing: str) -> str:
    """What failed, in one line.

    >>> no_answer("http://10.77.10.2:30000", "sgc11", "registering http://10.77.11.2:30000")
    'GET http://10.77.10.2:30000/workers got no answer from sgc11 while registering http://10.77.11.2:30000'
    """
    return f"GET {router_url}/workers got no answer from {host_name} while {doing}"


def registered(state, host, python: str, router_url: str, worker_url: str, auth_file: str | None = None) -> bool:
    """Register ``worker_url`` in its router (core/router_api.register_workers) and keep what came of it:
    in the router again, or out of it (and the router lost when it no longer answers)."""
    record = membership(state)
    if register_workers(state, host, python, router_url, [worker_url], False, auth_file=auth_file):
        record.put_back(host.name)
        return True
    if router_answers(host, router_url):
        record.taken_out(host.name, f"not registered again in the router at {router_url} (it refused or "
                                    "did not report it healthy)")
    else:
        record.lost(host.name, router_url, no_answer(router_url, host.name, f"registering {worker_url}"))
        record.taken_out(host.name, f"not registered again: the router at {router_url} does not answer")
    return False
