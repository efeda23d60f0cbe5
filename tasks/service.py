"""Service: the SGLang server's systemd unit, env and options files, and its
(re)start - only when what it runs changed (core/stamps.py says why).

A multi-node TP group restarts all its ranks together instead (tasks/multinode.py);
deploy.py picks which.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, QuoteString, StringCommand, deploy, operation

from core.changes import changing
from core.ops import plan, record_failure, report
from core.server_envs import switch_marked
from core.render import Rendered, render
from core.server import mark_restarted, server_args_accepted, server_files
from core.stamps import (
    pending_stamp_path,
    pending_written,
    read_stamp,
    restart_reasons,
    restarted_unrecorded,
    stamp_recorded,
    wanted_stamp,
)
from facts.systemd import SystemdUnitState, UnitState
from tasks.spec import Spec


def _restart(state, host, unit: str) -> bool:
    # changes no file: the facts kept of them stay (core/factcache.py)
    ok, output = host.run_shell_command(changing(StringCommand("systemctl restart", QuoteString(unit))),
                                        print_output=False, print_input=False)
    if ok:
        mark_restarted(state, host)
    else:
        for line in output.stderr_lines:
            host.log_styled(f"service: {line}", fg="red", log_func=logger.error)
        record_failure(state, host, f"service: systemctl restart {unit} failed", output.stderr_lines)
    return ok


def crash_reasons(unit_name: str, unit: UnitState) -> list[str]:
    """A server that crashed and waits out RestartSec= before systemd starts it again
    (ActiveState activating, SubState auto-restart) counts as running for the stamps,
    but readiness would judge a dead process: start it now instead."""
    if unit.active_state == "activating" and unit.sub_state == "auto-restart":
        return [f"{unit_name} crashed (exited on its own) and waits for systemd's automatic restart "
                f"(restarts so far: {unit.restarts})"]
    return []


@operation()
def server_restarted(spec: Spec, rendered: Rendered):
    """
    (Re)start the server only when what it runs changed since it was started
    (unit, env, options, venv packages, model revision) or it is not running;
    record what it was started with.

    .. code:: python

        server_restarted(spec=spec, rendered=render(spec))
    """
    unit = host.get_fact(SystemdUnitState, unit=spec.unit_name)
    reasons = crash_reasons(spec.unit_name, unit) + restart_reasons(spec, rendered, unit)
    if not reasons:
        if unit.restarts:  # NRestarts: automatic restarts since the unit was last started by hand
            crashed = (f"{spec.unit_name} exited on its own {unit.restarts} time(s) since it was last "
                       "started; systemd restarted it and it runs as wanted: no restart")
            plan(crashed)
            report(f"service: {crashed}")
        host.noop(f"{spec.unit_name} runs as wanted: no restart")
        return
    stamp = wanted_stamp(spec, rendered)
    pending = read_stamp(pending_stamp_path(spec))
    if restarted_unrecorded(unit, pending, stamp) and not crash_reasons(spec.unit_name, unit):
        message = (f"{spec.unit_name} was restarted with the wanted config by a run that ended before "
                   f"recording it ({'; '.join(reasons)} since the last record): recorded, no restart")
        plan(message)
        report(f"service: {message}")
        yield from stamp_recorded(spec, stamp)
        return
    verb = "restart" if unit.running else "start"
    plan(f"{verb} {spec.unit_name}: " + "; ".join(reasons))
    report(f"service: {verb} {spec.unit_name}: " + "; ".join(reasons))
    yield changing(StringCommand("systemctl reset-failed", QuoteString(spec.unit_name), "2>/dev/null; true"))
    # what the restart starts, and the invocation it replaces: a run cut off during the restart
    # (the restart goes on in systemd) leaves it for the next run, which then need not restart again
    yield from pending_written(spec, stamp, unit)
    yield switch_marked(spec)  # the venv it switches to (core/server_envs.py: what pruning orders by)
    yield FunctionCommand(_restart, (spec.unit_name,), {})
    yield from stamp_recorded(spec, stamp)


@deploy("Service")
def service(spec: Spec) -> None:
    """The unit, env file and options file; restart only when something changed."""
    rendered = render(spec)
    server_args_accepted(spec=spec, rendered=rendered, name="SGLang parser accepts the command line")
    server_files(spec, rendered)
    server_restarted(spec=spec, rendered=rendered, name=f"{spec.unit_name} running the wanted config")
