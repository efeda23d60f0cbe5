"""Readiness: the server answers, or the deploy says why it does not.

On the host (no firewall between the deploy and the port): the unit must stay
active, /health must answer 200 and /v1/models must list the served name. A
failing unit is reported within a second with the journal lines that explain
it. A server already ready, with nothing changed, is a no-op. A multi-node TP
group is judged as one, at rank 0 (tasks/multinode.py: group_ready).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import FunctionCommand, deploy, operation

from facts.http import HttpStatus
from facts.systemd import SystemdUnitState
from tasks._common import _stream, plan
from tasks.service import RESTARTED_THIS_RUN, render, restart_reasons
from tasks.spec import local_http_url

WAIT_SCRIPT = Path(__file__).resolve().parent.parent / "remote" / "wait_ready.py"


def local_url(spec) -> str:
    return local_http_url(spec.listen_host, spec.listen_port)


@operation()
def server_ready(spec):
    """
    Wait on the host until the server is ready (bounded by the spec's
    readiness timeout), failing fast with the journal when the unit fails.

    .. code:: python

        server_ready(spec=spec)
    """
    url = local_url(spec)
    if host.name not in RESTARTED_THIS_RUN:
        pending = restart_reasons(spec, render(spec))
        unit = host.get_fact(SystemdUnitState, unit=spec.unit_name)
        if not pending and unit.running and host.get_fact(HttpStatus, url=url + "/health") == 200:
            host.noop(f"{spec.unit_name} is ready at {url}")
            return
    plan(f"wait until {url}/health is 200 and /v1/models lists {spec.served_model_name!r} "
         f"(at most {spec.readiness_timeout_s:.0f} s)")
    args = [
        spec.venv_python, "-u", "-c", WAIT_SCRIPT.read_text(),
        "--unit", spec.unit_name, "--url", url, "--served-name", spec.served_model_name,
        "--timeout", str(spec.readiness_timeout_s),
    ]
    if spec.server_options:
        args += ["--options-file", spec.options_path]
    command = " ".join(shlex.quote(arg) for arg in args)
    yield FunctionCommand(_stream, (command, int(spec.readiness_timeout_s) + 60), {})


@deploy("Readiness")
def readiness(spec):
    """The server is ready, or the deploy fails with the reason."""
    if spec.is_multinode:  # judged at rank 0 for the whole TP group (tasks/multinode.py)
        from tasks.multinode import group_ready

        group_ready(spec=spec, name=f"node group {spec.group_label} ready at rank 0")
        return
    server_ready(spec=spec, name=f"{spec.unit_name} ready")
