"""Readiness: the server answers, or the deploy says why it does not.

On the host (no firewall between the deploy and the port): the unit must stay
active, /health must answer 200 and /v1/models must list the served name. A
failing unit is reported within a second with the journal lines that explain
it; a restart of this run that fails is rolled back to the last good
configuration (core/last_good.py), which is kept once a configuration serves.
A server already ready, with nothing changed, is a no-op. A multi-node TP
group is judged as one, at rank 0 (tasks/multinode.py). Once ready, the time
from the (re)start to ready is kept on the run state for the rollout's summary.
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import FunctionCommand, StringCommand, deploy, operation

from core.fingerprint import planned_launch
from core.last_good import last_good_dir, last_good_stamp_path, last_good_written, ready_or_rolled_back
from core.ops import plan, preparing
from core.render import render
from core.runstate import run_state
from core.model_revisions import old_revisions_removed
from core.server_envs import old_envs_removed
from core.server import local_url, restarted_this_run, wait_command
from core.stamps import read_stamp, restart_reasons, stamp_path
from facts.gpu import NvidiaGpus
from facts.http import HttpStatus
from facts.systemd import SystemdUnitState
from tasks.spec import Spec


@operation()
def server_ready(spec: Spec):
    """
    Wait on the host until the server is ready (bounded by the spec's
    readiness timeout), failing fast with the journal when the unit fails.

    .. code:: python

        server_ready(spec=spec)
    """
    url = local_url(spec)
    if not restarted_this_run(host.name):
        unit = host.get_fact(SystemdUnitState, unit=spec.unit_name)
        pending = restart_reasons(spec, render(spec), unit)  # the same read: one round trip
        if not pending and unit.running and host.get_fact(HttpStatus, url=url + "/health") == 200:
            host.noop(f"{spec.unit_name} is ready at {url}")
            return
    stall = f", failing after {spec.start_stall_s:.0f} s without start progress" if spec.start_stall_s else ""
    plan(f"wait until {url}/health is 200 and /v1/models lists {spec.served_model_name!r} "
         f"(at most {spec.readiness_timeout_s:.0f} s{stall})")
    command = wait_command(spec, spec.readiness_timeout_s)
    # what SGLang must choose (core/fingerprint.py): the command line's values, the memory fit's KV tokens
    plan_ = planned_launch(spec, host.get_fact(NvidiaGpus))
    if plan_.kv_tokens:
        plan(f"then: SGLang's KV pool holds at least {plan_.kv_tolerance:g} x {plan_.kv_tokens} tokens "
             f"({plan_.kv_from}), and it runs {', '.join(f'{k}={v}' for k, v in plan_.equal.items())}")
    floor = spec.profile.expect.min_decode_tok_s
    if spec.perf_tolerance or floor:
        plan("then: decode speed (concurrency 1 and 4, 128 tokens) at least "
             + " and ".join(([f"{spec.perf_tolerance:g} x this host's last good tok/s"] if spec.perf_tolerance else [])
                            + ([f"the profile's floor of {floor:g} tok/s"] if floor else [])))
    if spec.profile.min_accept_length is not None:  # core/draft_gate.py: measured with the decode speed
        plan(f"then: the draft's accept length at least {spec.profile.min_accept_length:g} (min_accept_length)")
    # a restart of this run that fails is rolled back to the last good configuration (core/last_good.py)
    yield FunctionCommand(ready_or_rolled_back, (command, int(spec.readiness_timeout_s) + 60, spec, plan_), {})


@operation()
def last_good_recorded(spec: Spec):
    """
    Keep the configuration that serves (the readiness step just passed) as the
    last good one: its unit, env and options files and restart stamp, copied
    into a root-only dir of the state dir. A restart that fails readiness
    rolls back to it (core/last_good.py). A no-op when it is kept already.

    .. code:: python

        last_good_recorded(spec=spec)
    """
    kept = read_stamp(last_good_stamp_path(spec))
    if preparing() and restart_reasons(spec, render(spec)):
        plan(f"keep the new configuration as the last good one ({last_good_dir(spec)}) once it serves")
    elif kept and kept == read_stamp(stamp_path(spec)):
        host.noop(f"the configuration {spec.unit_name} serves is kept as the last good one")
        return
    yield from last_good_written(spec)


_ELAPSED_PY = (
    "import subprocess, sys, time\n"
    "out = subprocess.run(['systemctl', 'show', '-p', 'ExecMainStartTimestampMonotonic', '--value', sys.argv[1]],"
    " capture_output=True, text=True).stdout.strip()\n"
    "print('%.3f' % (time.monotonic() - int(out or 0) / 1e6) if out and out != '0' else '')\n"
)


def elapsed_command(python: str, unit: str) -> str:
    return " ".join(shlex.quote(part) for part in (python, "-c", _ELAPSED_PY, unit))


def _record(state, host, python: str, unit: str) -> bool:
    run = run_state(state)
    if host.name not in run.restarted or host.name in run.ready_s:  # kept when the readiness step saw it ready
        return True
    ok, output = host.run_shell_command(StringCommand(elapsed_command(python, unit)), print_output=False,
                                        print_input=False)
    text = "".join(output.stdout_lines).strip() if ok else ""
    try:
        run_state(state).ready_s[host.name] = float(text)
    except ValueError:
        pass
    return True


@operation()
def ready_recorded(spec: Spec):
    """
    Record how long the server took from its (re)start to ready (only when
    this run restarted it; the readiness step ran just before). The readiness
    step keeps it when it sees the server ready (core/last_good.py); otherwise
    (a multi-node group's rank) it is read on the host: since the unit started.

    .. code:: python

        ready_recorded(spec=spec)
    """
    if not restarted_this_run(host.name):  # filled while executing: while preparing, nothing is shown
        host.noop("no restart this run: nothing to record")
        return
    yield FunctionCommand(_record, (spec.venv_python, spec.unit_name), {})


@deploy("Readiness")
def readiness(spec: Spec) -> None:
    """The server is ready, or the deploy fails with the reason."""
    server_ready(spec=spec, name=f"{spec.unit_name} ready")
    last_good_recorded(spec=spec, name="last good configuration kept")
    old_envs_removed(spec=spec, name="old venvs removed")
    old_revisions_removed(spec=spec, name="old model revisions removed")


@deploy("Time to ready")
def time_to_ready(spec: Spec) -> None:
    """How long the server took from its (re)start to ready, kept for the rollout's summary."""
    ready_recorded(spec=spec, name="time to ready recorded")
