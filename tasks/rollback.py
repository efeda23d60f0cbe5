"""Rollback on demand: put back the good configuration that served before the current one.

`pyinfra INVENTORY rollback.py` (or `python -m rollout INVENTORY --rollback`,
batch by batch behind the router) runs, per server: out of its router,
this step, readiness, back in the router. The step restores the kept
configuration (core/last_good.py) whose files differ from the ones the
server was started with: the previous good one when the current one serves
(an undo: the next --rollback goes forward again), the last good one when
the current one never served. Like the automatic rollback it restores files
only, and refuses when the venv's packages or the model revision changed.
"""

from __future__ import annotations

from pyinfra.api import FunctionCommand, QuoteString, StringCommand, deploy, operation

from core.last_good import restore_script, rollback_source
from core.ops import fail_command, plan, report
from core.server import mark_restarted
from tasks.spec import Spec


@operation()
def config_rolled_back(spec: Spec):
    """
    Restore the good configuration that served before the current one (its
    unit, env and options files and restart stamp) and restart the server.
    Fails, changing nothing, when none is kept or it cannot be restored by
    its files alone.

    .. code:: python

        config_rolled_back(spec=spec)
    """
    if spec.is_multinode:
        yield fail_command(f"rollback: {spec.unit_name} is a rank of a multi-node TP group: groups are not rolled "
                           "back (restore the settings and run deploy.py)")
        return
    source, what = rollback_source(spec)
    if source is None:
        yield fail_command(f"rollback: {what}")
        return
    message = f"put back {what} and restart {spec.unit_name}"
    plan(message)
    report(f"rollback: {message}")
    yield StringCommand("sh", "-c", QuoteString(restore_script(spec, source)))
    yield FunctionCommand(mark_restarted, (), {})


@deploy("Rollback")
def rollback(spec: Spec) -> None:
    """The previous good configuration back, restarted (readiness follows)."""
    config_rolled_back(spec=spec, name=f"{spec.unit_name} back to its previous good configuration")
