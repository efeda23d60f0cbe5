"""What a rollout reports per host that pyinfra does not: time to ready.

``ready_recorded`` runs in deploy.py after readiness. On a host whose server
this run (re)started it reads, on the host, how long ago systemd started the
server's main process (CLOCK_MONOTONIC, the clock systemd stamps with) and
keeps it in ``READY_S`` (host name -> seconds), read by the rollout's summary.
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import FunctionCommand, StringCommand, operation

from tasks.service import RESTARTED_THIS_RUN

# host name -> seconds from the server's (re)start to ready, this process
READY_S: dict[str, float] = {}

_ELAPSED_PY = (
    "import subprocess, sys, time\n"
    "out = subprocess.run(['systemctl', 'show', '-p', 'ExecMainStartTimestampMonotonic', '--value', sys.argv[1]],"
    " capture_output=True, text=True).stdout.strip()\n"
    "print('%.3f' % (time.monotonic() - int(out or 0) / 1e6) if out and out != '0' else '')\n"
)


def elapsed_command(python: str, unit: str) -> str:
    return " ".join(shlex.quote(part) for part in (python, "-c", _ELAPSED_PY, unit))


def _record(state, host, python: str, unit: str) -> bool:
    if host.name not in RESTARTED_THIS_RUN:
        return True
    ok, output = host.run_shell_command(StringCommand(elapsed_command(python, unit)), print_output=False,
                                        print_input=False)
    text = "".join(output.stdout_lines).strip() if ok else ""
    try:
        READY_S[host.name] = float(text)
    except ValueError:
        pass
    return True


@operation()
def ready_recorded(spec):
    """
    Record how long the server took from its (re)start to ready (only when
    this run restarted it; the readiness step ran just before).

    .. code:: python

        ready_recorded(spec=spec)
    """
    if host.name not in RESTARTED_THIS_RUN:  # filled while executing: while preparing, nothing is shown
        host.noop("no restart this run: nothing to record")
        return
    yield FunctionCommand(_record, (spec.venv_python, spec.unit_name), {})
