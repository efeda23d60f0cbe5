"""Router: SGLang's router in front of the servers, and the servers in it.

A router host (role = "router", group_data/routers.py) runs SGLang's router
from PyPI (``sglang-router``, ``python -m sglang_router.launch_router``) in its
own venv under a systemd unit, restarted only when its unit or package
changed. Its workers live in the router's memory: they are added and removed
through its runtime API (POST /workers {url}, GET /workers, DELETE
/workers/{id}), never on its command line.

A server with ``router_url`` leaves the router before its deploy restarts it
(DELETE, then wait until the server itself is idle: /v1/loads), and comes
back once ready (POST, then wait until the router reports it healthy). The
router's own deploy puts back every ready server of the inventory that names
it (after a router restart the list is empty).

Facts: ``RouterWorkers`` (facts/router.py: GET /workers, asked from the host).
"""

from __future__ import annotations

import json
import shlex
from io import StringIO
from pathlib import Path

from pyinfra import host, inventory
from pyinfra.api import FileUploadCommand, FunctionCommand, QuoteString, StringCommand, deploy, operation
from pyinfra.operations import files

from facts.files import FileText
from facts.http import HttpStatus
from facts.router import RouterWorker, RouterWorkers
from facts.systemd import SystemdUnitState
from facts.venv import VenvPackages
from tasks._common import _stream, fail_command, managed_file, plan, preparing, report
from tasks.python_env import packages, pip_bootstrapped, venv
from tasks.readiness import local_url
from tasks.service import (
    RESTARTED_THIS_RUN,
    STATE_DIR,
    _jinja,
    render,
    restart_reasons,
    server_args_accepted,
    sha256,
    systemd_quote,
    unit_installed,
)
from tasks.spec import ROUTER_LAUNCHER, SpecError, host_spec

CLIENT_SCRIPT = Path(__file__).resolve().parent.parent / "remote" / "router_client.py"
REGISTER_TIMEOUT_S = 60


# --- the router host --------------------------------------------------------------

LAUNCHER_SCRIPT = Path(__file__).resolve().parent.parent / "remote" / "router_launch.py"


def render_router_unit(spec) -> str:
    """The router's systemd unit for a RouterSpec."""
    return _jinja.get_template("sglang-router.service.j2").render(
        spec_source="tasks/router.py",
        policy=spec.router_policy,
        port=spec.router_listen_port,
        exec_start=" ".join(systemd_quote(arg) for arg in spec.router_argv),
        # a new launcher changes the unit, so the router restarts with it
        launcher=ROUTER_LAUNCHER if spec.api_key else None,
        launcher_sha256=sha256(LAUNCHER_SCRIPT.read_text()) if spec.api_key else None,
    )


def router_stamp_path(unit: str) -> str:
    return f"{STATE_DIR}/{unit.removesuffix('.service')}.json"


def _package_name(requirement: str) -> str:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    return canonicalize_name(Requirement(requirement).name)


def _auth_digest(auth_text: str) -> str | None:
    return sha256(auth_text) if auth_text else None


def router_restart_reasons(unit: str, unit_text: str, venv_path: str, package: str, auth_text: str = "",
                           unit_state=None) -> list[str]:
    """Why the router must be (re)started now; empty when it runs as wanted.
    ``unit_state``: the unit's SystemdUnitState when the caller has it already."""
    state = unit_state or host.get_fact(SystemdUnitState, unit=unit)
    if not _running(state):
        return [f"{unit} is {state.active_state if state.load_state == 'loaded' else 'not installed'}"]
    text = host.get_fact(FileText, path=router_stamp_path(unit))
    try:
        started_with = json.loads(text) if text else {}
    except ValueError:
        started_with = {}
    name = _package_name(package)
    version = host.get_fact(VenvPackages, path=venv_path).get(name)
    reasons = []
    if started_with.get("unit") != sha256(unit_text):
        reasons.append("unit file changed")
    if started_with.get("package") != version:
        reasons.append(f"{name} {started_with.get('package', '-')} -> {version}")
    if started_with.get("auth") != _auth_digest(auth_text):
        reasons.append("API key changed")
    return reasons


@operation()
def router_restarted(unit: str, unit_text: str, venv_path: str, package: str, auth_text: str = ""):
    """
    (Re)start the router only when its unit, its package or its API key
    changed since it was started, or it is not running; record what it was
    started with (the key only as a digest).

    .. code:: python

        router_restarted(unit="sglang-router.service", unit_text=text,
                         venv_path="/opt/sglang-router/venv", package="sglang-router==0.3.2")
    """
    reasons = router_restart_reasons(unit, unit_text, venv_path, package, auth_text)
    if not reasons:
        host.noop(f"{unit} runs as wanted: no restart")
        return
    running = _running(host.get_fact(SystemdUnitState, unit=unit))
    verb = "restart" if running else "start"
    plan(f"{verb} {unit}: " + "; ".join(reasons) + ("; its workers are registered again" if running else ""))
    report(f"router: {verb} {unit}: " + "; ".join(reasons))
    name = _package_name(package)
    started = {"unit": sha256(unit_text), "package": host.get_fact(VenvPackages, path=venv_path).get(name)}
    if auth_text:
        started["auth"] = _auth_digest(auth_text)
    stamp = json.dumps(started, sort_keys=True)
    yield StringCommand("systemctl reset-failed", QuoteString(unit), "2>/dev/null; true")
    yield StringCommand("systemctl restart", QuoteString(unit))
    yield FunctionCommand(_mark_restarted, (), {})
    yield StringCommand("install -d -m 700", STATE_DIR)  # stamps hold digests of secret files: root only
    yield FileUploadCommand(StringIO(stamp + "\n"), router_stamp_path(unit) + ".tmp")
    yield StringCommand("mv -f", QuoteString(router_stamp_path(unit) + ".tmp"), QuoteString(router_stamp_path(unit)))


def _running(unit_state) -> bool:
    """UnitState.running, from the fields (fixtures give the fields only)."""
    return unit_state.active_state in ("active", "activating", "reloading")


def _mark_restarted(state, host) -> bool:
    RESTARTED_THIS_RUN.add(host.name)
    return True


def wait_router_command(unit: str, url: str, timeout_s: float) -> str:
    """Shell loop: until GET url/liveness answers; fails at once (with the journal) when the unit fails."""
    q_unit = shlex.quote(unit)
    live = shlex.quote(url + "/liveness")
    timeout_ms = int(timeout_s * 1000)
    journal = f"journalctl --no-pager -o cat -n 20 -u {q_unit}"
    return (
        f"start=$(date +%s%N); while :; do "
        f"ms=$(( ($(date +%s%N) - start) / 1000000 )); "
        f"st=$(systemctl show -p ActiveState --value {q_unit}); "
        f'case "$st" in failed|inactive|deactivating) echo "FAILED: {unit} is $st"; {journal}; exit 1;; esac; '
        f"if curl -s -f -m 2 -o /dev/null {live}; then "
        f'echo "ready: {unit} answers at {url} ($ms ms to ready)"; exit 0; fi; '
        f'if [ "$ms" -gt {timeout_ms} ]; then echo "FAILED: {unit} does not answer '
        f'{url}/liveness after {timeout_s:.0f} s"; {journal}; exit 1; fi; '
        "sleep 0.2; done"
    )


def _wait_router(state, host, unit: str, url: str, timeout_s: float) -> bool:
    return _stream(state, host, wait_router_command(unit, url, timeout_s), int(timeout_s) + 30)


@operation()
def router_ready(unit: str, url: str, timeout_s: float = 120):
    """
    Wait on the router host until the router answers /liveness (its unit
    failing stops the wait at once, with the journal).

    .. code:: python

        router_ready(unit="sglang-router.service", url="http://127.0.0.1:30000", timeout_s=120)
    """
    if host.name not in RESTARTED_THIS_RUN:
        state = host.get_fact(SystemdUnitState, unit=unit)
        if _running(state) and host.get_fact(HttpStatus, url=url + "/liveness") == 200:
            host.noop(f"{unit} answers at {url}")
            return
    plan(f"wait until {url}/liveness answers (at most {timeout_s:.0f} s)")
    yield FunctionCommand(_wait_router, (unit, url, timeout_s), {})


def fleet_worker_urls(spec) -> list[str]:
    """worker_url of every server of the inventory whose router_url is this router's."""
    if spec.router_url is None:
        return []
    urls, invalid = [], []
    for other in inventory:
        try:
            other_spec = host_spec(other)
        except SpecError:
            if other.data.get("router_url") == spec.router_url:
                invalid.append(other.name)
            continue  # its own deploy reports why
        if getattr(other_spec, "role", "server") == "server" and other_spec.router_url == spec.router_url:
            if other_spec.worker_url and other_spec.worker_url not in urls:
                urls.append(other_spec.worker_url)
    if invalid:
        plan(f"not registered by the router's deploy (invalid settings): {', '.join(invalid)}")
    return urls


def client_command(python: str, *args: str) -> str:
    """remote/router_client.py run on the host with ``python`` (stdlib only), sent inline."""
    return " ".join(shlex.quote(arg) for arg in (python, "-u", "-c", CLIENT_SCRIPT.read_text(), *args))


def _register(state, host, python: str, router_url: str, worker_urls: list[str], skip_unready: bool,
              auth_file: str | None = None) -> bool:
    args = ["register", "--router", router_url, "--timeout", str(REGISTER_TIMEOUT_S)]
    for url in worker_urls:
        args += ["--worker", url]
    if skip_unready:
        args.append("--skip-unready")
    if auth_file:
        args += ["--auth-file", auth_file]
    return _stream(state, host, client_command(python, *args), REGISTER_TIMEOUT_S * len(worker_urls) + 30)


@operation()
def fleet_workers_registered(router_url: str, worker_urls: list[str], python: str = "/usr/bin/python3",
                             auth_file: str | None = None):
    """
    Every ready server that names this router is registered in it (after a
    router restart its list is empty); servers that are not ready are left to
    their own deploy.

    + router_url: the router as its own host reaches it
    + worker_urls: the servers' worker_url
    + python: an interpreter on the host (runs remote/router_client.py)
    + auth_file: the root-only file with the router's key (a keyed router)

    .. code:: python

        fleet_workers_registered(router_url="http://127.0.0.1:30000", worker_urls=["http://10.77.11.2:30000"])
    """
    if not worker_urls:
        host.noop("no server of the inventory names this router (router_url)")
        return
    listed = None if host.name in RESTARTED_THIS_RUN else host.get_fact(RouterWorkers, router_url=router_url, auth_file=auth_file)
    healthy = {w.url for w in listed or [] if w.healthy}
    missing = [url for url in worker_urls if url not in healthy]
    if not missing:
        host.noop(f"all {len(worker_urls)} server(s) are registered and healthy")
        return
    plan(f"register the ready ones of {len(missing)} server(s): {', '.join(missing)}")
    yield FunctionCommand(_register, (python, router_url, missing, True), {"auth_file": auth_file} if auth_file else {})


def auth_file_written(spec) -> None:
    """The root-only file with the spec's API key as a header line; none without a key."""
    if spec.api_key is not None:
        managed_file(dest=spec.auth_path, content=spec.auth_header(), mode="600",
                     secrets=[spec.api_key.get_secret_value()], name=f"API key file {spec.auth_path} (0600)")
    else:
        files.file(path=spec.auth_path, present=False, name=f"no API key file {spec.auth_path}")


@deploy("Router")
def router(spec):
    """SGLang's router: venv, pinned package, unit; restart only on change; ready; its servers registered."""
    venv(path=spec.router_venv_path, python=spec.venv_python, name=f"venv {spec.router_venv_path}")
    pip_bootstrapped(path=spec.router_venv_path, get_pip_url=spec.get_pip_url, pip_wheel=spec.pip_wheel,
                     name="pip works in the router's venv")
    packages(path=spec.router_venv_path, requirements=[spec.router_package], name=f"{spec.router_package}")
    auth_file_written(spec)
    if spec.api_key is not None:
        managed_file(dest=ROUTER_LAUNCHER, content=LAUNCHER_SCRIPT.read_text(), mode="644",
                     name=f"launcher {ROUTER_LAUNCHER} (gives the router its key)")
    unit_text = render_router_unit(spec)
    managed_file(dest=spec.unit_path, content=unit_text, mode="644", name=f"unit file {spec.unit_path}")
    unit_installed(unit=spec.router_unit_name, name=f"{spec.router_unit_name} loaded and enabled")
    router_restarted(unit=spec.router_unit_name, unit_text=unit_text, venv_path=spec.router_venv_path,
                     package=spec.router_package, auth_text=spec.auth_header(),
                     name=f"{spec.router_unit_name} running the wanted config")
    router_ready(unit=spec.router_unit_name, url=spec.local_url, timeout_s=spec.router_readiness_timeout_s,
                 name=f"{spec.router_unit_name} ready")
    fleet_workers_registered(router_url=spec.local_url, worker_urls=fleet_worker_urls(spec), python=spec.venv_python,
                             auth_file=spec.auth_file, name="servers registered in the router")


# --- a server behind a router ------------------------------------------------------


def _mine(worker_url: str, listed: list[RouterWorker] | None) -> list[RouterWorker]:
    return [w for w in listed or [] if w.url == worker_url]


def _drain(state, host, python: str, router_url: str, worker_url: str, local: str, timeout_s: float,
           auth_file: str | None) -> bool:
    args = ["drain", "--router", router_url, "--worker", worker_url, "--local", local, "--timeout", str(timeout_s)]
    if auth_file:
        args += ["--auth-file", auth_file]
    return _stream(state, host, client_command(python, *args), int(timeout_s) + 60)


@operation()
def worker_drained(spec):
    """
    Before the deploy restarts a server that is in its router: remove it from
    the router (DELETE /workers/{id}) and wait until the server itself has no
    request running or waiting (/v1/loads), at most ``drain_timeout_s``.
    Nothing when no restart is planned (the service step's own reasons).

    .. code:: python

        worker_drained(spec=spec)
    """
    if spec.router_url is None:
        host.noop("not behind a router (router_url is None)")
        return
    if not restart_reasons(spec, render(spec)):
        host.noop("no restart planned: stays in the router")
        return
    listed = host.get_fact(RouterWorkers, router_url=spec.router_url, auth_file=spec.auth_file)
    if listed is None:
        host.noop(f"the router at {spec.router_url} does not answer: nothing to drain")
        return
    if not _mine(spec.worker_url, listed):
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
    if any(w.healthy for w in _mine(worker_url, listed)):
        host.noop(f"{worker_url} is in the router at {router_url}, healthy")
        return
    if listed is None and not preparing():
        yield fail_command(f"router: the router at {router_url} does not answer GET /workers from "
                           f"{host.name}: {worker_url} cannot be registered (deploy the router hosts first)")
        return
    plan(f"register {worker_url} in the router at {router_url}")
    yield FunctionCommand(_register, (python, router_url, [worker_url], False),
                          {"auth_file": auth_file} if auth_file else {})


@deploy("Router: drain")
def drain(spec):
    """Out of the router before a restart (the new command line checked first, so a typo never drains a server)."""
    if spec.router_url is None:
        return
    server_args_accepted(spec=spec, rendered=render(spec), name="SGLang parser accepts the command line (before drain)")
    auth_file_written(spec)  # the key for the router's /workers API, as curl and router_client.py read it
    worker_drained(spec=spec, name=f"{spec.worker_url} out of the router before a restart")


@deploy("Router: register")
def register(spec):
    """Back in the router once ready."""
    if spec.router_url is None:
        return
    worker_registered(router_url=spec.router_url, worker_url=spec.worker_url, python=spec.venv_python,
                      auth_file=spec.auth_file, name=f"{spec.worker_url} in the router")

