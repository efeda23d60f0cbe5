"""A server behind SGLang's router: out of it before a restart, back in once ready.

A server with ``router_url`` leaves the router before its deploy restarts it
(DELETE, then wait until the server itself is idle: /v1/loads), and comes
back once ready (POST, then wait until the router reports it healthy). The
new command line is checked with SGLang's parser first, so a typo never
drains a server. What came of it is kept on the run state
(core/router_membership.py): out of the router from a drain that succeeded
until a registration that succeeded; a router that stopped answering is lost
(the rollout stops there: rollout/router_loss.py).
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import FunctionCommand, deploy, operation

from core.last_good import rollback_source
from core.ops import fail_command, plan, preparing, stream
from core.render import render
from core.router_api import auth_file_written, client_command, workers_of
from core.router_membership import membership, no_answer, registered, router_answers
from core.server import local_url, server_args_accepted
from core.stamps import restart_reasons
from facts.router import RouterWorkers
from tasks.spec import Spec


def _drain(state, host, python: str, router_url: str, worker_url: str, local: str, timeout_s: float,
           auth_file: str | None) -> bool:
    args = ["drain", "--router", router_url, "--worker", worker_url, "--local", local, "--timeout", str(timeout_s)]
    if auth_file:
        args += ["--auth-file", auth_file]
    drained = stream(state, host, client_command(python, *args), int(timeout_s) + 60, step="router", changes=())
    record = membership(state)
    if drained:
        record.taken_out(host.name, f"drained from the router at {router_url} before its restart")
    elif not router_answers(host, router_url):  # it may have gone with the DELETE already sent
        record.lost(host.name, router_url, no_answer(router_url, host.name, f"draining {worker_url}"))
        record.taken_out(host.name, f"the router at {router_url} stopped answering during its drain")
    return drained


@operation()
def worker_drained(spec: Spec, rolling_back: bool = False):
    """
    Before the deploy restarts a server that is in its router: remove it from
    the router (DELETE /workers/{id}) and wait until the server itself has no
    request running or waiting (/v1/loads), at most ``drain_timeout_s``.
    Nothing when no restart is planned (the service step's own reasons, or
    with ``rolling_back`` a kept configuration to put back: rollback.py).

    .. code:: python

        worker_drained(spec=spec)
    """
    if spec.router_url is None or spec.worker_url is None:
        host.noop("not behind a router (router_url is None)")
        return
    if not (rollback_source(spec)[0] if rolling_back else restart_reasons(spec, render(spec))):
        host.noop("no restart planned: stays in the router")
        return
    listed = host.get_fact(RouterWorkers, router_url=spec.router_url, auth_file=spec.auth_file)
    if listed is None:
        # executing: the router went away (a rollout deploys it first); the restart goes on
        if not preparing() and not router_answers(host, spec.router_url):
            membership().lost(host.name, spec.router_url,
                              no_answer(spec.router_url, host.name, "draining it before its restart"))
            membership().taken_out(host.name, f"not in the router at {spec.router_url}: it did not answer "
                                              "before the restart")
        host.noop(f"the router at {spec.router_url} does not answer: nothing to drain")
        return
    if not workers_of(spec.worker_url, listed):
        host.noop(f"{spec.worker_url} is not in the router: nothing to drain")
        return
    plan(f"take {spec.worker_url} out of the router at {spec.router_url} and wait until it is idle "
         f"(at most {spec.drain_timeout_s:.0f} s) before the restart")
    yield FunctionCommand(_drain, (spec.venv_python, spec.router_url, spec.worker_url, local_url(spec),
                                   spec.drain_timeout_s, spec.auth_file), {})


@operation()
def worker_registered(router_url: str, worker_url: str, python: str = "/usr/bin/python3",
                      auth_file: str | None = None):
    """
    Once the server is ready: it is in its router (POST /workers {url,
    api_key}) and the router reports it healthy. Nothing when it already is.

    + auth_file: the root-only file with the server's API key (a keyed server)

    .. code:: python

        worker_registered(router_url="http://10.77.10.2:30000", worker_url="http://10.77.11.2:30000")
    """
    listed = host.get_fact(RouterWorkers, router_url=router_url, auth_file=auth_file)
    if any(w.healthy for w in workers_of(worker_url, listed)):
        if not preparing():
            membership().put_back(host.name)
        host.noop(f"{worker_url} is in the router at {router_url}, healthy")
        return
    if listed is None and not preparing():
        if not router_answers(host, router_url):  # nothing answers there (not a refused key)
            membership().lost(host.name, router_url, no_answer(router_url, host.name, f"registering {worker_url}"))
        membership().taken_out(host.name, f"not registered: the router at {router_url} does not answer")
        yield fail_command(f"router: the router at {router_url} does not answer GET /workers from "
                           f"{host.name}: {worker_url} cannot be registered (deploy the router hosts first; "
                           "a router lost during a rollout stops it: run it again once the router answers)")
        return
    # also when this run restarts nothing: a server missing from its router (a router restarted,
    # a registration a lost router never got) is registered again
    plan(f"register {worker_url} in the router at {router_url}")
    yield FunctionCommand(registered, (python, router_url, worker_url, auth_file), {})


@deploy("Router: drain")
def drain(spec: Spec) -> None:
    """Out of the router before a restart (the new command line checked first, so a typo never drains a server)."""
    if spec.router_url is None:
        return
    server_args_accepted(spec=spec, rendered=render(spec), name="SGLang parser accepts the command line (before drain)")
    auth_file_written(spec)  # the key for the router's /workers API, as curl and router_client.py read it
    worker_drained(spec=spec, name=f"{spec.worker_url} out of the router before a restart")


@deploy("Router: drain before the rollback")
def drain_for_rollback(spec: Spec) -> None:
    """Out of the router before rollback.py restarts the server with its previous good configuration."""
    if spec.router_url is None:
        return
    auth_file_written(spec)
    worker_drained(spec=spec, rolling_back=True, name=f"{spec.worker_url} out of the router before the rollback")


@deploy("Router: register")
def register(spec: Spec) -> None:
    """Back in the router once ready."""
    if spec.router_url is None or spec.worker_url is None:
        return
    worker_registered(router_url=spec.router_url, worker_url=spec.worker_url, python=spec.venv_python,
                      auth_file=spec.auth_file, name=f"{spec.worker_url} in the router")
