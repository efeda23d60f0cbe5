"""Router: SGLang's router in front of the servers.

A router host (role = "router", group_data/routers.py) runs SGLang's router
from PyPI (``sglang-router``, ``python -m sglang_router.launch_router``) in its
own venv under a systemd unit, restarted only when its unit, its package or
its key changed (core/stamps.py). Its workers live in the router's memory:
they are added and removed through its runtime API (POST /workers {url}, GET
/workers, DELETE /workers/{id}), never on its command line. The router's own
deploy puts back every ready server of the inventory that names it (after a
router restart the list is empty). A server's own way in and out of its
router is tasks/membership.py.

Facts: ``RouterWorkers`` (facts/router.py: GET /workers, asked from the host).
"""

from __future__ import annotations

import shlex

from pyinfra import host, inventory
from pyinfra.api import FunctionCommand, QuoteString, StringCommand, deploy, operation

from core.ops import managed_file, plan, report, stream
from core.render import LAUNCHER_SCRIPT, render_router_unit
from core.router_api import auth_file_written, register_workers
from core.server import mark_restarted, restarted_this_run, unit_installed
from core.stamps import router_restart_reasons, router_stamp_path, stamp_written, unit_running, wanted_router_stamp
from core.venv_ops import packages, pip_bootstrapped, venv
from facts.http import HttpStatus
from facts.router import RouterWorkers
from facts.systemd import SystemdUnitState
from tasks.spec import ROUTER_LAUNCHER, RouterSpec, Spec, SpecError, host_spec


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
    running = unit_running(host.get_fact(SystemdUnitState, unit=unit))
    verb = "restart" if running else "start"
    plan(f"{verb} {unit}: " + "; ".join(reasons) + ("; its workers are registered again" if running else ""))
    report(f"router: {verb} {unit}: " + "; ".join(reasons))
    stamp = wanted_router_stamp(unit_text, venv_path, package, auth_text)
    yield StringCommand("systemctl reset-failed", QuoteString(unit), "2>/dev/null; true")
    yield StringCommand("systemctl restart", QuoteString(unit))
    yield FunctionCommand(mark_restarted, (), {})
    yield from stamp_written(router_stamp_path(unit), stamp)


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
    return stream(state, host, wait_router_command(unit, url, timeout_s), int(timeout_s) + 30, step="router")


@operation()
def router_ready(unit: str, url: str, timeout_s: float = 120):
    """
    Wait on the router host until the router answers /liveness (its unit
    failing stops the wait at once, with the journal).

    .. code:: python

        router_ready(unit="sglang-router.service", url="http://127.0.0.1:30000", timeout_s=120)
    """
    if not restarted_this_run(host.name):
        state = host.get_fact(SystemdUnitState, unit=unit)
        if unit_running(state) and host.get_fact(HttpStatus, url=url + "/liveness") == 200:
            host.noop(f"{unit} answers at {url}")
            return
    plan(f"wait until {url}/liveness answers (at most {timeout_s:.0f} s)")
    yield FunctionCommand(_wait_router, (unit, url, timeout_s), {})


def fleet_worker_urls(spec: RouterSpec) -> list[str]:
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
        if isinstance(other_spec, Spec) and other_spec.router_url == spec.router_url:
            if other_spec.worker_url and other_spec.worker_url not in urls:
                urls.append(other_spec.worker_url)
    if invalid:
        plan(f"not registered by the router's deploy (invalid settings): {', '.join(invalid)}")
    return urls


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
    listed = (None if restarted_this_run(host.name)
              else host.get_fact(RouterWorkers, router_url=router_url, auth_file=auth_file))
    healthy = {w.url for w in listed or [] if w.healthy}
    missing = [url for url in worker_urls if url not in healthy]
    if not missing:
        host.noop(f"all {len(worker_urls)} server(s) are registered and healthy")
        return
    plan(f"register the ready ones of {len(missing)} server(s): {', '.join(missing)}")
    yield FunctionCommand(register_workers, (python, router_url, missing, True),
                          {"auth_file": auth_file} if auth_file else {})


@deploy("Router")
def router(spec: RouterSpec) -> None:
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
