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

Facts: ``RouterWorkers`` (GET /workers, asked from the host).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from io import StringIO
from pathlib import Path

from pyinfra import host, inventory
from pyinfra.api import FactBase, FileUploadCommand, FunctionCommand, QuoteString, StringCommand, deploy, operation

from tasks._common import FileText, _stream, fail_command, managed_file, plan, preparing, report
from tasks._facts import FactValue
from tasks.python_env import VenvPackages, packages, pip_bootstrapped, venv
from tasks.readiness import HttpStatus, local_url
from tasks.service import (
    RESTARTED_THIS_RUN,
    STATE_DIR,
    SystemdUnitState,
    _jinja,
    render,
    restart_reasons,
    server_args_accepted,
    sha256,
    systemd_quote,
    unit_installed,
)
from tasks.spec import SpecError, host_spec

CLIENT_SCRIPT = Path(__file__).resolve().parent.parent / "remote" / "router_client.py"
REGISTER_TIMEOUT_S = 60


# --- facts ----------------------------------------------------------------------


@dataclass(frozen=True)
class RouterWorker(FactValue):
    id: str
    url: str
    healthy: bool
    load: int = 0


class RouterWorkers(FactBase[list[RouterWorker] | None]):
    """
    The workers a router lists (GET /workers), asked from the host (None when
    the router does not answer).

    .. code:: python

        workers = host.get_fact(RouterWorkers, router_url="http://10.77.10.2:30000")
        [w.url for w in workers or [] if w.healthy]
    """

    def command(self, router_url: str) -> StringCommand:
        return StringCommand(
            "curl -s -f -m 5", QuoteString(router_url.rstrip("/") + "/workers"), "|| echo unreachable"
        )

    def process(self, output) -> list[RouterWorker] | None:
        text = "\n".join(output).strip()
        if not text.startswith("{"):
            return None
        try:
            body = json.loads(text)
        except ValueError:
            return None
        return [
            RouterWorker(
                id=str(w.get("id", "")),
                url=str(w.get("url", "")).rstrip("/"),
                healthy=bool(w.get("is_healthy")),
                load=int(w.get("load") or 0),
            )
            for w in body.get("workers") or []
        ]


# --- the router host --------------------------------------------------------------


def render_router_unit(spec) -> str:
    """The router's systemd unit for a RouterSpec."""
    return _jinja.get_template("sglang-router.service.j2").render(
        spec_source="tasks/router.py",
        policy=spec.router_policy,
        port=spec.router_listen_port,
        exec_start=" ".join(systemd_quote(arg) for arg in spec.router_argv),
    )


def router_stamp_path(spec) -> str:
    return f"{STATE_DIR}/{spec.unit_stem}.json"


def _package_name(requirement: str) -> str:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    return canonicalize_name(Requirement(requirement).name)


def router_restart_reasons(spec, unit_text: str) -> list[str]:
    """Why the router must be (re)started now; empty when it runs as wanted."""
    unit = host.get_fact(SystemdUnitState, unit=spec.router_unit_name)
    text = host.get_fact(FileText, path=router_stamp_path(spec))
    try:
        started_with = json.loads(text) if text else {}
    except ValueError:
        started_with = {}
    name = _package_name(spec.router_package)
    version = host.get_fact(VenvPackages, path=spec.router_venv_path).get(name)
    if not unit.running:
        return [f"{spec.router_unit_name} is {unit.active_state if unit.exists else 'not installed'}"]
    reasons = []
    if started_with.get("unit") != sha256(unit_text):
        reasons.append("unit file changed")
    if started_with.get("package") != version:
        reasons.append(f"{name} {started_with.get('package', '-')} -> {version}")
    return reasons


@operation()
def router_restarted(spec, unit_text: str):
    """
    (Re)start the router only when its unit or its package changed since it
    was started, or it is not running; record what it was started with.

    .. code:: python

        router_restarted(spec=router_spec, unit_text=render_router_unit(router_spec))
    """
    reasons = router_restart_reasons(spec, unit_text)
    if not reasons:
        host.noop(f"{spec.router_unit_name} runs as wanted: no restart")
        return
    unit = host.get_fact(SystemdUnitState, unit=spec.router_unit_name)
    verb = "restart" if unit.running else "start"
    plan(f"{verb} {spec.router_unit_name}: " + "; ".join(reasons)
         + ("; its workers are registered again" if unit.running else ""))
    report(f"router: {verb} {spec.router_unit_name}: " + "; ".join(reasons))
    name = _package_name(spec.router_package)
    stamp = json.dumps(
        {"unit": sha256(unit_text), "package": host.get_fact(VenvPackages, path=spec.router_venv_path).get(name)},
        sort_keys=True,
    )
    yield StringCommand("systemctl reset-failed", QuoteString(spec.router_unit_name), "2>/dev/null; true")
    yield StringCommand("systemctl restart", QuoteString(spec.router_unit_name))
    yield FunctionCommand(_mark_restarted, (), {})
    yield StringCommand("install -d -m 755", STATE_DIR)
    yield FileUploadCommand(StringIO(stamp + "\n"), router_stamp_path(spec) + ".tmp")
    yield StringCommand("mv -f", QuoteString(router_stamp_path(spec) + ".tmp"), QuoteString(router_stamp_path(spec)))


def _mark_restarted(state, host) -> bool:
    RESTARTED_THIS_RUN.add(host.name)
    return True


def _wait_router_command(spec) -> str:
    unit = shlex.quote(spec.router_unit_name)
    url = shlex.quote(spec.local_url + "/liveness")
    timeout_ms = int(spec.router_readiness_timeout_s * 1000)
    journal = f"journalctl --no-pager -o cat -n 20 -u {unit}"
    return (
        f"start=$(date +%s%N); while :; do "
        f"ms=$(( ($(date +%s%N) - start) / 1000000 )); "
        f"st=$(systemctl show -p ActiveState --value {unit}); "
        f'case "$st" in failed|inactive|deactivating) echo "FAILED: {spec.router_unit_name} is $st"; {journal}; exit 1;; esac; '
        f"if curl -s -f -m 2 -o /dev/null {url}; then "
        f'echo "ready: {spec.router_unit_name} answers at {spec.local_url} ($ms ms to ready)"; exit 0; fi; '
        f'if [ "$ms" -gt {timeout_ms} ]; then echo "FAILED: {spec.router_unit_name} does not answer '
        f'{spec.local_url}/liveness after {spec.router_readiness_timeout_s:.0f} s"; {journal}; exit 1; fi; '
        "sleep 0.2; done"
    )


@operation()
def router_ready(spec):
    """
    Wait on the router host until the router answers /liveness (its unit
    failing stops the wait at once, with the journal).

    .. code:: python

        router_ready(spec=router_spec)
    """
    if host.name not in RESTARTED_THIS_RUN:
        unit = host.get_fact(SystemdUnitState, unit=spec.router_unit_name)
        if unit.running and host.get_fact(HttpStatus, url=spec.local_url + "/liveness") == 200:
            host.noop(f"{spec.router_unit_name} answers at {spec.local_url}")
            return
    plan(f"wait until {spec.local_url}/liveness answers (at most {spec.router_readiness_timeout_s:.0f} s)")
    yield FunctionCommand(_stream, (_wait_router_command(spec), int(spec.router_readiness_timeout_s) + 30), {})


def fleet_worker_urls(spec) -> list[str]:
    """worker_url of every server of the inventory whose router_url is this router's."""
    if spec.router_url is None:
        return []
    urls = []
    for other in inventory:
        try:
            other_spec = host_spec(other)
        except SpecError:
            continue  # its own deploy reports it
        if getattr(other_spec, "role", "server") == "server" and other_spec.router_url == spec.router_url:
            if other_spec.worker_url and other_spec.worker_url not in urls:
                urls.append(other_spec.worker_url)
    return urls


def _register_command(python: str, router_url: str, worker_urls: list[str], skip_unready: bool) -> str:
    args = [python, "-u", "-c", CLIENT_SCRIPT.read_text(), "register", "--router", router_url,
            "--timeout", str(REGISTER_TIMEOUT_S)]
    for url in worker_urls:
        args += ["--worker", url]
    if skip_unready:
        args.append("--skip-unready")
    return " ".join(shlex.quote(arg) for arg in args)


@operation()
def fleet_workers_registered(spec, worker_urls: list[str]):
    """
    Every ready server that names this router is registered in it (after a
    router restart its list is empty); servers that are not ready are left to
    their own deploy.

    .. code:: python

        fleet_workers_registered(spec=router_spec, worker_urls=["http://10.77.11.2:30000"])
    """
    if not worker_urls:
        host.noop("no server of the inventory names this router (router_url)")
        return
    listed = None if host.name in RESTARTED_THIS_RUN else host.get_fact(RouterWorkers, router_url=spec.local_url)
    healthy = {w.url for w in listed or [] if w.healthy}
    missing = [url for url in worker_urls if url not in healthy]
    if not missing:
        host.noop(f"all {len(worker_urls)} server(s) are registered and healthy")
        return
    plan(f"register the ready ones of {len(missing)} server(s): {', '.join(missing)}")
    yield FunctionCommand(_stream, (_register_command(spec.venv_python, spec.local_url, missing, True),
                                    REGISTER_TIMEOUT_S * len(missing) + 30), {})


@deploy("Router")
def router(spec):
    """SGLang's router: venv, pinned package, unit; restart only on change; ready; its servers registered."""
    venv(path=spec.router_venv_path, python=spec.venv_python, name=f"venv {spec.router_venv_path}")
    pip_bootstrapped(path=spec.router_venv_path, get_pip_url=spec.get_pip_url, pip_wheel=spec.pip_wheel,
                     name="pip works in the router's venv")
    packages(path=spec.router_venv_path, requirements=[spec.router_package], name=f"{spec.router_package}")
    unit_text = render_router_unit(spec)
    managed_file(dest=spec.unit_path, content=unit_text, mode="644", name=f"unit file {spec.unit_path}")
    unit_installed(unit=spec.router_unit_name, name=f"{spec.router_unit_name} loaded and enabled")
    router_restarted(spec=spec, unit_text=unit_text, name=f"{spec.router_unit_name} running the wanted config")
    router_ready(spec=spec, name=f"{spec.router_unit_name} ready")
    fleet_workers_registered(spec=spec, worker_urls=fleet_worker_urls(spec), name="servers registered in the router")


# --- a server behind a router ------------------------------------------------------


def _mine(spec, listed: list[RouterWorker] | None) -> list[RouterWorker]:
    return [w for w in listed or [] if w.url == spec.worker_url]


@operation()
def worker_drained(spec):
    """
    Before the deploy restarts a server that is in its router: remove it from
    the router (DELETE /workers/{id}) and wait until the server itself has no
    request running or waiting (/v1/loads), at most ``drain_timeout_s``.
    Nothing when no restart is planned.

    .. code:: python

        worker_drained(spec=spec)
    """
    if spec.router_url is None:
        host.noop("not behind a router (router_url is None)")
        return
    reasons = restart_reasons(spec, render(spec))
    if not reasons:
        host.noop("no restart planned: stays in the router")
        return
    listed = host.get_fact(RouterWorkers, router_url=spec.router_url)
    if listed is None:
        host.noop(f"the router at {spec.router_url} does not answer: nothing to drain")
        return
    if not _mine(spec, listed):
        host.noop(f"{spec.worker_url} is not in the router: nothing to drain")
        return
    plan(f"take {spec.worker_url} out of the router at {spec.router_url} and wait until it is idle "
         f"(at most {spec.drain_timeout_s:.0f} s) before the restart")
    args = [spec.venv_python, "-u", "-c", CLIENT_SCRIPT.read_text(), "drain", "--router", spec.router_url,
            "--worker", spec.worker_url, "--local", local_url(spec), "--timeout", str(spec.drain_timeout_s)]
    if spec.server_options:
        args += ["--options-file", spec.options_path]
    yield FunctionCommand(_stream, (" ".join(shlex.quote(a) for a in args), int(spec.drain_timeout_s) + 60), {})


@operation()
def worker_registered(spec):
    """
    Once the server is ready: it is in its router (POST /workers {url}) and
    the router reports it healthy. Nothing when it already is.

    .. code:: python

        worker_registered(spec=spec)
    """
    if spec.router_url is None:
        host.noop("not behind a router (router_url is None)")
        return
    listed = host.get_fact(RouterWorkers, router_url=spec.router_url)
    if any(w.healthy for w in _mine(spec, listed)):
        host.noop(f"{spec.worker_url} is in the router at {spec.router_url}, healthy")
        return
    if listed is None and not preparing():
        yield fail_command(f"router: the router at {spec.router_url} does not answer GET /workers from "
                           f"{host.name}: {spec.worker_url} cannot be registered (deploy the router hosts first)")
        return
    plan(f"register {spec.worker_url} in the router at {spec.router_url}")
    yield FunctionCommand(_stream, (_register_command(spec.venv_python, spec.router_url, [spec.worker_url], False),
                                    REGISTER_TIMEOUT_S + 30), {})


@deploy("Router: drain")
def drain(spec):
    """Out of the router before a restart (the new command line checked first, so a typo never drains a server)."""
    if spec.router_url is None:
        return
    server_args_accepted(spec=spec, rendered=render(spec), name="SGLang parser accepts the command line (before drain)")
    worker_drained(spec=spec, name=f"{spec.worker_url} out of the router before a restart")


@deploy("Router: register")
def register(spec):
    """Back in the router once ready."""
    if spec.router_url is None:
        return
    worker_registered(spec=spec, name=f"{spec.worker_url} in the router")

