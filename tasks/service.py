"""Service: the SGLang server's systemd unit, env and options files, and its
(re)start - only when what it runs changed (core/stamps.py says why).

A multi-node TP group restarts all its ranks together instead (tasks/multinode.py);
deploy.py picks which.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, QuoteString, StringCommand, deploy, operation

from core.ops import plan, record_failure, report
from core.render import Rendered, render
from core.server import mark_restarted, server_args_accepted, server_files
from core.stamps import restart_reasons, stamp_path, stamp_written, wanted_stamp
from facts.systemd import SystemdUnitState, UnitState
from tasks.spec import Spec


def _restart(state, host, unit: str) -> bool:
    ok, output = host.run_shell_command(StringCommand("systemctl restart", QuoteString(unit)),
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
            crashed = (f"service: {spec.unit_name} exited on its own {unit.restarts} time(s) since it was last "
                       "started; systemd restarted it and it runs as wanted: no restart")
            plan(crashed)
            report(crashed)
        host.noop(f"{spec.unit_name} runs as wanted: no restart")
        return
    verb = "restart" if unit.running else "start"
    plan(f"{verb} {spec.unit_name}: " + "; ".join(reasons))
    report(f"service: {verb} {spec.unit_name}: " + "; ".join(reasons))
    stamp = wanted_stamp(spec, rendered)
    yield StringCommand("systemctl reset-failed", QuoteString(spec.unit_name), "2>/dev/null; true")
    yield FunctionCommand(_restart, (spec.unit_name,), {})
    yield from stamp_written(stamp_path(spec), stamp)


@deploy("Service")
def service(spec: Spec) -> None:
    """The unit, env file and options file; restart only when something changed."""
    rendered = render(spec)
    server_args_accepted(spec=spec, rendered=rendered, name="SGLang parser accepts the command line")
    server_files(spec, rendered)
    server_restarted(spec=spec, rendered=rendered, name=f"{spec.unit_name} running the wanted config")
