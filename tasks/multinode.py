"""Multi-node tensor parallelism: the ranks of one TP group act as one.

A node group (tasks/spec/: ``node_group`` once in the group's data, or the
per-host ``nnodes`` / ``node_rank`` / ``dist_init_addr``) is all-or-nothing:

- (re)start: when one rank must restart, every rank does (SGLang's TP group
  cannot take a single rank back): rank 0 is stopped first (its shutdown tells
  the other ranks to exit; they ignore SIGTERM until then), then the others
  (SIGKILL after ``NONZERO_STOP_GRACE_S`` if they still run without rank 0),
  then every rank is started at once; they rendezvous at dist_init_addr.
  A rank that crashed (failed, inactive, or brought back by systemd alone)
  restarts the group as a changed config does. Each rank announces the restart
  (core/stamps.py's pending stamp) before it and records it after: a run cut
  off before the restart reached a rank restarts the group again, one cut off
  after systemd finished it records it instead of restarting a second time.
- readiness: judged at rank 0 (/health 200 and /v1/models lists the served
  name) while every other rank's unit must stay active. The first rank that
  fails fails the whole group, reported with that rank's journal lines (the
  traceback's last line first) within about a second, not at rank 0's timeout.
  Once rank 0 answers, the readiness gates (core/gates.py: the launch fingerprint,
  the decode speed against the profile's floor, ...) run there before the other
  ranks hear the group is ready; a failed gate fails the group (not rolled back).
- a run on a ready group with nothing changed is a no-op on every rank.

pyinfra runs each operation on every host at once, one gevent greenlet per host
in the controller process. The ranks of a group meet on an in-process board
keyed by (run, group, step): each publishes what it found and waits for the
others (``meet``); a rank that failed in an earlier step, a run that is not
parallel (--serial) or a rank that gave up ends the wait with the reason.

    from tasks import multinode
    multinode.group_service(spec)     # instead of tasks/service.py (deploy.py picks)
    multinode.group_readiness(spec)   # instead of tasks/readiness.py
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from typing import Any

import gevent
from pyinfra import host, logger
from pyinfra.api import FunctionCommand, StringCommand, deploy, operation
from pyinfra.context import ctx_host, state

from core.checks import resolved_spec
from core.fingerprint import planned_launch, wait_args
from core.gates import gates_pass
from core.last_good import last_good_dir
from core.ops import fail_command, plan, preparing, record_failure, report
from core.server_envs import switch_marked
from core.render import Rendered, render
from core.runstate import run_state
from core.server import (WAIT_SCRIPT, local_url, mark_restarted, restarted_this_run, server_args_accepted,
                         server_files, start_progress_args)
from core.stamps import (
    pending_stamp_path,
    pending_written,
    read_stamp,
    restart_cut_off,
    restart_reasons,
    restarted_unrecorded,
    stamp_recorded,
    wanted_stamp,
)
from facts.gpu import NvidiaGpus
from facts.http import HttpStatus
from facts.systemd import SystemdUnitState
from tasks.spec import Spec, host_spec, node_groups, validate_inventory

POLL_S = 0.05  # how often a waiting rank looks at the board (in-process, cheap)
SLICE_S = 1.0  # one readiness slice on a host: the group learns of a failure within about this
PROGRESS_S = 5.0
NOT_PARALLEL_S = 10.0  # a rank not in the same step after this long: the run is not parallel
NONZERO_STOP_GRACE_S = 15  # ranks >= 1 exit by themselves once rank 0 stopped; else SIGKILL
DECIDE_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 600.0  # rank 0's stop drains requests (TimeoutStopSec=120 in the unit)


class GroupError(Exception):
    """A rank cannot go on with its group; the message says which rank and why."""


@dataclass
class _Board:
    """What the ranks of one group published for one step."""

    values: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Verdict:
    ready: bool
    rank: int
    host_name: str
    cause: str = ""


@dataclass
class _Run:
    """One pyinfra run's group state, kept on its State (a driver may run many)."""

    boards: dict[tuple[str, str], _Board] = field(default_factory=dict)  # (group, step) ->
    aborted: dict[str, str] = field(default_factory=dict)  # group -> why
    verdicts: dict[str, _Verdict] = field(default_factory=dict)  # group ->
    members: dict[str, list[str]] = field(default_factory=dict)  # group -> host names by rank
    baselines: dict[str, str] = field(default_factory=dict)  # host -> "InvocationID:NRestarts" at our start


def _run() -> _Run:
    return run_state().extension("multinode", _Run)


def group_of(spec: Spec) -> str:
    """The key of the spec's node group (only ranks of a group reach this module)."""
    if spec.group_key is None:
        raise GroupError(f"{spec.host_name} is not in a node group")
    return spec.group_key


def members(spec: Spec) -> list[str]:
    """The group's host names in rank order (from the validated inventory)."""
    known = _run().members
    if group_of(spec) not in known:
        groups = node_groups(validate_inventory(host.inventory))
        known[group_of(spec)] = [s.host_name for s in groups[group_of(spec)]]
    return known[group_of(spec)]


def _rank_of(spec: Spec, name: str) -> int:
    return members(spec).index(name)


def _who(spec: Spec, name: str) -> str:
    return f"rank {_rank_of(spec, name)} ({name})"


def abort(spec: Spec, reason: str) -> None:
    """Tell every rank waiting on the group to give up, with ``reason`` (first one wins)."""
    _run().aborted.setdefault(group_of(spec), reason)


def meet(spec: Spec, step: str, value: Any, wait_for: list[str] | None = None,
         timeout: float = DECIDE_TIMEOUT_S) -> dict[str, Any]:
    """Publish this rank's ``value`` for ``step`` and wait until the ranks in
    ``wait_for`` (default: all) published theirs; returns {host name: value}.

    Raises GroupError when a rank failed in an earlier step (pyinfra dropped
    it), another rank aborted, the ranks do not run this step at the same time
    (--serial), or ``timeout`` passed.

    .. code:: python

        reasons = meet(spec, "restart-decision", restart_reasons(spec, rendered))
    """
    group = group_of(spec)
    run = _run()
    board = run.boards.setdefault((group, step), _Board())
    board.values[host.name] = value
    names = wait_for or members(spec)
    started = time.monotonic()
    while True:
        aborted = run.aborted.get(group)
        if aborted:
            raise GroupError(aborted)
        missing = [name for name in names if name not in board.values]
        if not missing:
            return {name: board.values[name] for name in names}
        waited = time.monotonic() - started
        for name in missing:
            peer = host.inventory.get_host(name)
            if peer in state.failed_hosts or peer not in state.active_hosts:
                raise GroupError(f"{_who(spec, name)} failed in an earlier step")
            if waited > NOT_PARALLEL_S and peer.executing_op_hash != host.executing_op_hash:
                raise GroupError(
                    f"{_who(spec, name)} is not in this step at the same time: the ranks of a TP group "
                    "must converge in parallel (no --serial, no _serial)"
                )
        if waited > timeout:
            raise GroupError(f"{_who(spec, missing[0])} did not reach step {step!r} within {timeout:.0f} s")
        gevent.sleep(POLL_S)


# --- restart ---------------------------------------------------------------------


def _planned_reasons(spec: Spec, own: list[str]) -> dict[str, list[str]]:
    """While preparing (--dry): every rank's restart reasons, the other ranks'
    read from their own facts once per group (hosts are prepared one by one)."""
    board = _run().boards.setdefault((group_of(spec), "plan"), _Board())
    board.values[host.name] = own
    for name in members(spec):
        if name in board.values:
            continue
        peer = host.inventory.get_host(name)
        try:
            with ctx_host.use(peer):
                built = host_spec(peer)
                assert isinstance(built, Spec), f"{name} is a router host, not a rank"
                peer_spec = resolved_spec(built)
                board.values[name] = rank_restart_reasons(peer_spec, render(peer_spec))
        except Exception as e:  # noqa: BLE001 - a plan line, not a decision
            board.values[name] = [f"its state could not be read ({e})"]
    return dict(board.values)


def _unit_cmd(script: str, unit: str) -> StringCommand:
    return StringCommand("u=" + shlex.quote(unit) + ";", script)


_STOP_RANK0 = 'systemctl stop "$u"'
# ranks >= 1: without rank 0 they cannot finish a graceful shutdown (SGLang waits
# for rank 0's broadcast); a running one gets NONZERO_STOP_GRACE_S, then SIGKILL
_STOP_NONZERO = (
    f'i=0; while [ "$(systemctl show -p SubState --value "$u")" = running ] && [ $i -lt {NONZERO_STOP_GRACE_S * 5} ]; do '
    "sleep 0.2; i=$((i+1)); done; "
    'if [ "$(systemctl show -p SubState --value "$u")" = running ]; then '
    f'echo "still running {NONZERO_STOP_GRACE_S} s after rank 0 stopped: SIGKILL"; systemctl kill -s SIGKILL "$u"; fi; '
    'systemctl stop "$u"'
)
_START = (
    'systemctl reset-failed "$u" 2>/dev/null; systemctl start "$u" && '
    'echo "baseline: $(systemctl show -p InvocationID --value "$u"):$(systemctl show -p NRestarts --value "$u")"'
)


def _shell(host, command: StringCommand) -> tuple[bool, list[str]]:
    ok, output = host.run_shell_command(command, print_output=False, print_input=False)
    return ok, [line for line in output.stdout_lines + output.stderr_lines if line.strip()]


def _group_restart(state, host, spec: Spec) -> bool:
    """Stop rank 0, then the others, then start every rank; each step waits for the whole group."""
    names = members(spec)
    label = spec.group_label
    try:
        if spec.node_rank != 0:
            meet(spec, "rank-0-stopped", True, wait_for=[names[0]], timeout=STOP_TIMEOUT_S)
        ok, lines = _shell(host, _unit_cmd(_STOP_RANK0 if spec.node_rank == 0 else _STOP_NONZERO, spec.unit_name))
        for line in lines:
            host.log(f"service: {line}", logger.warning)
        if not ok:
            raise GroupError(f"{_who(spec, host.name)} could not stop {spec.unit_name}: {' '.join(lines[-2:])}")
        if spec.node_rank == 0:
            meet(spec, "rank-0-stopped", True, wait_for=[names[0]])
        meet(spec, "stopped", True, timeout=STOP_TIMEOUT_S)
        ok, lines = _shell(host, _unit_cmd(_START, spec.unit_name))
        if not ok:
            raise GroupError(f"{_who(spec, host.name)} could not start {spec.unit_name}: {' '.join(lines[-2:])}")
        for line in lines:
            if line.startswith("baseline: "):
                _run().baselines[host.name] = line.split(" ", 1)[1]
        mark_restarted(state, host)
        return True
    except GroupError as e:
        abort(spec, str(e))
        host.log_styled(f"service: node group {label}: {e}", fg="red", log_func=logger.error)
        record_failure(state, host, f"service: node group {label}: {e}")
        return False


def rank_restart_reasons(spec: Spec, rendered: Rendered) -> list[str]:
    """Why this rank must restart (with its group); empty when it runs as wanted."""
    return _rank_decision(spec, rendered)[0]


def _rank_decision(spec: Spec, rendered: Rendered) -> tuple[list[str], list[str]]:
    """(why this rank must restart, the reasons a restart made by a cut-off run already answered).

    restart_reasons() (a rank that is failed or inactive is one), plus a rank that crashed
    since it was started: SGLang's TP group cannot take a single rank back, so systemd's
    restart of one rank (Restart=on-failure) does not bring the group back. Then the pending
    stamp (core/stamps.py): a restart announced by a run that was cut off either never
    reached this rank (it has the invocation that restart was to replace: restart) or was
    finished by systemd (another invocation runs the wanted config: record it, no restart).
    """
    unit = host.get_fact(SystemdUnitState, unit=spec.unit_name)
    reasons = restart_reasons(spec, rendered, unit)
    pending = read_stamp(pending_stamp_path(spec))
    wanted = wanted_stamp(spec, rendered)
    if unit.running and (unit.sub_state == "auto-restart" or unit.restarts > 0):
        reasons.insert(0, f"{spec.unit_name} crashed since it was started "
                          f"(systemd restarted it {unit.restarts} time(s), now {unit.sub_state})")
    elif reasons and restarted_unrecorded(unit, pending, wanted):
        return [], reasons
    if restart_cut_off(unit, pending, wanted):
        reasons.append(f"the group restart announced by an earlier run ({pending_stamp_path(spec)}) was cut off "
                       f"before it restarted this rank ({spec.unit_name} is still invocation "
                       f"{unit.invocation_id[:12]}, {unit.active_state})")
    return reasons, []


@operation()
def group_restarted(spec: Spec, rendered: Rendered):
    """
    (Re)start every rank of the node group when any rank must restart (what
    it runs changed, it crashed or is not running, or a cut-off run's restart
    never reached it): rank 0 stopped first, then the others, then all started
    together; announce the restart before it and record what each was started
    with after. A no-op on every rank when no rank must restart (a rank that a
    cut-off run's restart left running the wanted config records it).

    .. code:: python

        group_restarted(spec=spec, rendered=render(spec))
    """
    label = spec.group_label
    own, answered = _rank_decision(spec, rendered)
    if preparing():
        reasons = _planned_reasons(spec, own)
    else:
        try:
            reasons = meet(spec, "restart-decision", own)
        except GroupError as e:
            abort(spec, str(e))
            yield fail_command(f"service: node group {label}: {e}: no rank is (re)started")
            return
    why = {name: r for name, r in reasons.items() if r}
    stamp = wanted_stamp(spec, rendered)
    if not why and answered:
        message = (f"{spec.unit_name} (rank {spec.node_rank} of node group {label}) was restarted with the wanted "
                   f"config by a run that ended before recording it ({'; '.join(answered)} since the last record); "
                   "every rank runs as wanted: recorded, no restart")
        plan(message)
        report(f"service: {message}")
        yield from stamp_recorded(spec, stamp)
        return
    if not why:
        host.noop(f"{spec.unit_name} runs as wanted on every rank of node group {label}: no restart")
        return
    unit = host.get_fact(SystemdUnitState, unit=spec.unit_name)
    verb = "restart" if unit.running else "start"
    parts = ["; ".join(own)] if own else []
    parts += [f"{_who(spec, name)}: {'; '.join(r)}" for name, r in why.items() if name != host.name]
    message = (f"{verb} {spec.unit_name} (rank {spec.node_rank} of node group {label}, all ranks together): "
               + "; ".join(parts))
    plan(message)
    report(f"service: {message}")
    # announced before, recorded after (core/stamps.py): a run cut off in between leaves the
    # announcement, and the next run restarts the group again or records what systemd finished
    yield from pending_written(spec, stamp, unit)
    yield switch_marked(spec)  # the venv it switches to (core/server_envs.py: what pruning orders by)
    yield FunctionCommand(_group_restart, (spec,), {})
    yield from stamp_recorded(spec, stamp)


# --- readiness -------------------------------------------------------------------


def _wait_args(spec: Spec, elapsed: float, baseline: str | None, progress: bool) -> str:
    args = [spec.venv_python, "-u", "-c", WAIT_SCRIPT.read_text(), "--unit", spec.unit_name,
            "--slice", str(SLICE_S), "--elapsed", f"{elapsed:.2f}", *start_progress_args(spec)]
    if spec.node_rank == 0:
        args += ["--url", local_url(spec), "--served-name", spec.served_model_name,
                 "--timeout", str(spec.readiness_timeout_s)]
        args += ["--options-file", spec.options_path]  # always: see core/server.py script_command
        args += wait_args(spec)  # what SGLang chose, kept once ready: the gates' fingerprint
    else:
        # rank 0 owns the group's timeout; the others only watch their unit
        args += ["--watch", "--timeout", str(spec.readiness_timeout_s + 60)]
    if baseline:
        args += ["--baseline", baseline]
    if progress:
        args.append("--progress")
    return " ".join(shlex.quote(arg) for arg in args)


def _group_wait(state, host, spec: Spec) -> bool:
    """One rank's share of the group's readiness wait, in slices of SLICE_S
    on the host, until rank 0 is ready or any rank failed (the verdict)."""
    run = _run()
    key = group_of(spec)
    label = spec.group_label
    names = members(spec)
    baseline = run.baselines.get(host.name) if restarted_this_run(host.name) else None
    started = time.monotonic()
    last_progress = started
    failed_here = False
    while key not in run.verdicts and key not in run.aborted:
        now = time.monotonic()
        progress = spec.node_rank == 0 and now - last_progress >= PROGRESS_S
        if progress:
            last_progress = now
        ok, output = host.run_shell_command(
            StringCommand(_wait_args(spec, now - started, baseline, progress)),
            print_output=False, print_input=False, _timeout=int(SLICE_S + 60),
        )
        lines = [line for line in output.stdout_lines if line.strip()]
        verdict = next((line for line in lines if line.startswith(("ready:", "FAILED:"))), None)
        for line in lines:
            if line.startswith("baseline: "):
                baseline = line.split(" ", 1)[1]
            elif line.startswith("waiting: "):
                host.log(f"readiness: {line} (node group {label}, at rank 0)", logger.warning)
        if verdict is None and not any(line.startswith("pending: ") for line in lines):
            # the check itself could not run (ssh, python): that is this rank's failure
            lines = ["FAILED: the readiness check could not run"] + [
                f"  {line}" for line in (output.stderr_lines or output.stdout_lines)[-10:]]
            verdict = lines[0]
        if verdict is None:
            continue
        if verdict.startswith("ready:"):
            host.log(f"readiness: {verdict} (node group {label}: all {len(names)} ranks joined)", logger.warning)
            if spec.node_rank == 0 and restarted_this_run(host.name) and not _gates_pass_at_rank_0(state, host, spec):
                failed = run_state(state).first_failure(host.name)
                run.verdicts.setdefault(key, _Verdict(False, 0, host.name, failed.cause if failed else "a gate failed"))
                return False  # the gate recorded this rank's failure; the others read the verdict
            run.verdicts.setdefault(key, _Verdict(True, spec.node_rank, host.name))
            break
        failed_here = True
        cause = next((line for line in lines if line.startswith("cause: ")), verdict)
        if run.verdicts.setdefault(key, _Verdict(False, spec.node_rank, host.name, cause)).host_name == host.name:
            host.log_styled(f"readiness: node group {label} failed at rank {spec.node_rank} ({host.name}):",
                            fg="red", log_func=logger.error)
        for line in lines:
            if not line.startswith(("baseline: ", "pending: ")):
                host.log_styled(line, fg="red", log_func=logger.error)
        break
    verdict = run.verdicts.get(key)
    if verdict is None:
        host.log_styled(f"readiness: node group {label}: {run.aborted[key]}", fg="red", log_func=logger.error)
        record_failure(state, host, f"readiness: node group {label}: {run.aborted[key]}")
        return False
    if verdict.ready and not failed_here:
        if host.name != verdict.host_name:
            host.log(f"readiness: node group {label} is ready at rank 0 ({verdict.host_name}); "
                     f"{spec.unit_name} stays active here (rank {spec.node_rank})", logger.warning)
        return True
    if host.name != verdict.host_name and not verdict.ready:
        host.log_styled(f"readiness: node group {label} failed at rank {verdict.rank} ({verdict.host_name}): "
                        f"{verdict.cause}", fg="red", log_func=logger.error)
    record_failure(state, host, f"readiness: node group {label} failed at rank {verdict.rank} "
                                f"({verdict.host_name}): {verdict.cause}")
    return False


def _gates_pass_at_rank_0(state, host, spec: Spec) -> bool:
    """The readiness gates (core/gates.py) at rank 0, where the group serves, before the other ranks
    hear it is ready. A group keeps no last good configuration (it is not rolled back): the speed
    gate holds it to the profile's floor only."""
    return gates_pass(state, host, spec, planned_launch(spec, host.get_fact(NvidiaGpus)), last_good_dir(spec))


def _rank_ready(spec: Spec) -> bool:
    """This rank needs no wait: not restarted by this run, nothing pending,
    unit running, and at rank 0 /health answers 200."""
    if restarted_this_run(host.name):
        return False
    if rank_restart_reasons(spec, render(spec)):
        return False
    return spec.node_rank != 0 or host.get_fact(HttpStatus, url=local_url(spec) + "/health") == 200


@operation()
def group_ready(spec: Spec):
    """
    Wait until the node group is ready at rank 0 while every other rank's
    unit stays active; fail the whole group as soon as one rank fails, with
    that rank's journal. A no-op when every rank is already ready.

    .. code:: python

        group_ready(spec=spec)
    """
    label = spec.group_label
    ready = _rank_ready(spec)
    if preparing():
        planned = _run().boards.get((group_of(spec), "plan"))  # group_restarted's plan
        if ready and not (planned and any(planned.values.values())):
            host.noop(f"{spec.unit_name} is active (rank {spec.node_rank} of node group {label})")
            return
    else:
        try:
            found = meet(spec, "ready-check", ready)
        except GroupError as e:
            abort(spec, str(e))
            yield fail_command(f"readiness: node group {label}: {e}")
            return
        if all(found.values()):
            host.noop(f"node group {label} is ready at rank 0 ({members(spec)[0]}); "
                      f"{spec.unit_name} active on all {len(found)} ranks")
            return
    if spec.node_rank == 0:
        plan(f"wait until node group {label} is ready here at rank 0: {local_url(spec)}/health is 200 and "
             f"/v1/models lists {spec.served_model_name!r} (at most {spec.readiness_timeout_s:.0f} s), "
             "while every rank's unit stays active")
    else:
        plan(f"watch {spec.unit_name} (rank {spec.node_rank} of node group {label}) until rank 0 is ready")
    yield FunctionCommand(_group_wait, (spec,), {})


@deploy("Service (node group)")
def group_service(spec: Spec) -> None:
    """The rank's unit, env and options files; every rank restarts together when any must."""
    rendered = render(spec)
    server_args_accepted(spec=spec, rendered=rendered, name="SGLang parser accepts the command line")
    server_files(spec, rendered)
    group_restarted(spec=spec, rendered=rendered,
                    name=f"{spec.unit_name} running the wanted config (node group {spec.group_label})")


@deploy("Readiness (node group)")
def group_readiness(spec: Spec) -> None:
    """The group is ready at rank 0 while every rank stays active, or it fails as a whole."""
    group_ready(spec=spec, name=f"node group {spec.group_label} ready at rank 0")
