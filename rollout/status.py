"""The fleet at a glance, read-only: `python -m rollout INVENTORY --status`.

For every targeted host, in inventory order, from the same facts the deploy
reads (nothing is changed, no operation runs):

- servers: the unit's state and restart count, /health, the model revision
  on disk, drift - why the next deploy would restart the server (the unit,
  env or options file, the venv packages or the model revision differ from
  what it was started with) - the launch fingerprint kept with the last
  good configuration (what SGLang chose: KV tokens, attention backend, ...,
  core/fingerprint.py) and, behind a router, whether the router lists it healthy;
- routers: the unit, /liveness, and how many workers it lists healthy.

Exit status 0 when every host is as the settings want it and serving, 1
otherwise (a monitor can run it), 2 for invalid settings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.spec import RouterSpec, Spec


@dataclass
class HostStatus:
    host: str
    role: str  # "server", "rank N" (multi-node, N >= 1), "router"
    unit: str = "-"  # "active", "failed (3 restarts)", "not installed", ...
    serving: bool | None = None  # /health (servers) or /liveness (routers) answers 200
    revision: str = "-"  # the model revision on disk (short)
    drift: list[str] = field(default_factory=list)  # why the next deploy would restart it
    router: str = "-"  # "healthy", "not listed", "unhealthy", or a router's "2/3 healthy"
    launch: str = "-"  # the last good configuration's launch fingerprint (core/fingerprint.summary)
    error: str = ""

    @property
    def ok(self) -> bool:
        return (not self.error and not self.drift and self.serving is not False
                and self.router not in ("not listed", "unhealthy", "router down"))


def _not_the_unit(reasons: list[str], unit_name: str) -> list[str]:
    """Restart reasons without "UNIT is inactive": the unit column says it."""
    return [r for r in reasons if not r.startswith(unit_name)]


def _unit_text(unit) -> str:
    if not unit.exists:
        return "not installed"
    text = unit.active_state if unit.active_state != "active" else "active"
    return text + (f" ({unit.restarts} restarts)" if unit.restarts else "")


def server_status(spec: Spec) -> HostStatus:
    """A server's status from its facts (inside pyinfra's host context)."""
    from pyinfra import host

    from facts.files import FileText
    from facts.http import HttpStatus
    from facts.model_dir import ModelDirState
    from facts.router import RouterWorkers
    from facts.systemd import SystemdUnitState
    from core.checks import resolved_spec
    from core.fingerprint import summary
    from core.last_good import last_good_dir
    from core.render import render
    from core.server import local_url
    from core.stamps import restart_reasons

    spec = resolved_spec(spec)
    rank = getattr(spec, "node_rank", 0)
    row = HostStatus(spec.host_name, "server" if rank == 0 else f"rank {rank}")
    unit = host.get_fact(SystemdUnitState, unit=spec.unit_name)
    row.unit = _unit_text(unit)
    if rank == 0:
        row.serving = host.get_fact(HttpStatus, url=local_url(spec) + "/health") == 200
    else:  # ranks >= 1 serve no HTTP: they serve while their unit runs
        row.serving = unit.running
    marker = host.get_fact(ModelDirState, path=spec.model_path).marker or {}
    revision = marker.get("revision")
    row.revision = str(revision)[:12] if revision else "not downloaded"
    row.drift = _not_the_unit(restart_reasons(spec, render(spec), unit_state=unit), spec.unit_name)
    kept = host.get_fact(FileText, path=f"{last_good_dir(spec)}/fingerprint.json")
    try:
        row.launch = summary(json.loads(kept)) if kept else "-"
    except ValueError:
        row.launch = "unreadable"
    if spec.router_url:
        listed = host.get_fact(RouterWorkers, router_url=spec.router_url, auth_file=spec.auth_file)
        mine = [w for w in listed or [] if w.url == spec.worker_url]
        row.router = ("router down" if listed is None else
                      "not listed" if not mine else "healthy" if any(w.healthy for w in mine) else "unhealthy")
    return row


def router_status(spec: RouterSpec) -> HostStatus:
    from pyinfra import host

    from facts.http import HttpStatus
    from facts.router import RouterWorkers
    from facts.systemd import SystemdUnitState
    from core.render import render_router_unit
    from core.stamps import router_restart_reasons

    row = HostStatus(spec.host_name, "router")
    unit = host.get_fact(SystemdUnitState, unit=spec.router_unit_name)
    row.unit = _unit_text(unit)
    row.serving = host.get_fact(HttpStatus, url=spec.local_url + "/liveness") == 200
    row.drift = _not_the_unit(router_restart_reasons(spec.router_unit_name, render_router_unit(spec),
                                                     spec.router_venv_path, spec.router_package,
                                                     spec.auth_header(), unit_state=unit), spec.router_unit_name)
    listed = host.get_fact(RouterWorkers, router_url=spec.local_url, auth_file=spec.auth_file)
    if listed is not None:
        row.router = f"{sum(w.healthy for w in listed)}/{len(listed)} healthy"
    elif row.serving:
        row.router = "router down"
    return row


def gather(driver) -> list[HostStatus]:
    """Every targeted host's status, gathered in parallel over one connection each."""
    import gevent
    from pyinfra.context import ctx_host, ctx_inventory, ctx_state

    from tasks.spec import RouterSpec, host_spec

    routers, servers = driver.load()
    names = routers + servers
    state, config, inventory = driver._state(check_for_changes=True)
    active = {h.name for h in driver._start(state, config, inventory, names)}
    rows: dict[str, HostStatus] = {}
    try:
        def one(name: str) -> HostStatus:
            host = inventory.get_host(name)
            with ctx_state.use(state), ctx_inventory.use(inventory), ctx_host.use(host):
                spec = host_spec(host)
                return router_status(spec) if isinstance(spec, RouterSpec) else server_status(spec)

        greenlets = {name: gevent.spawn(one, name) for name in names if name in active}
        gevent.joinall(list(greenlets.values()))
        for name in names:
            if name not in active:
                rows[name] = HostStatus(name, "router" if name in routers else "server",
                                        error="; ".join(driver.errors.pop(name, ["cannot connect over ssh"])))
            elif greenlets[name].exception is not None:
                rows[name] = HostStatus(name, "router" if name in routers else "server",
                                        error=f"status error: {greenlets[name].exception}")
            else:
                rows[name] = greenlets[name].value
    finally:
        driver._stop(state)
        driver.close()
    # inventory order: routers and servers interleaved as the inventory lists them
    order = [h.name for h in inventory if h.name in rows]
    return [rows[name] for name in order]


def status_table(rows: list[HostStatus]):
    from rich.table import Table

    table = Table(title="fleet status (read-only)")
    for column in ("host", "role", "unit", "serving", "model revision", "drift (next deploy restarts)",
                   "router", "launch (last good)", "error"):
        table.add_column(column, overflow="fold")
    for row in rows:
        serving = "-" if row.serving is None else ("yes" if row.serving else "NO")
        table.add_row(row.host, row.role, row.unit, serving, row.revision,
                      "; ".join(row.drift) or "none", row.router, row.launch, row.error)
    return table


def print_status(rows: list[HostStatus], console=None) -> int:
    """Print the table and a one-line verdict; return the exit status."""
    import os

    from rich.console import Console

    console = console or Console(width=max(120, int(os.environ.get("COLUMNS", "0") or 0)))
    console.print(status_table(rows))
    bad = [row.host for row in rows if not row.ok]
    console.print(f"status: {len(rows) - len(bad)}/{len(rows)} host(s) as wanted and serving"
                  + (f"; not: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0
