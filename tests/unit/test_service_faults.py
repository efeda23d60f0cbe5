"""The service step after faults, from facts: a crash waiting for systemd's restart,
crashes systemd already mended, and a restart whose run was cut off before it
recorded it (tests/integration/test_faults_controller.py does the same on a host)."""

from __future__ import annotations

import json
import logging

from pyinfra.api import FunctionCommand, StringCommand

from core.render import render
from core.stamps import stamp_path
from facts.systemd import UnitState
from tasks import service
from tests.unit.test_step_operations import run, sandbox_spec, service_facts, stamp_for


def unit(active="active", sub="running", restarts=0, invocation="x") -> UnitState:
    return UnitState("loaded", active, sub, 812, "enabled", "/etc/systemd/system/sglang.service", restarts,
                     invocation, 1)


def facts_with(spec, stamp, state: UnitState, pending: str | None = None) -> dict:
    facts = service_facts(spec, stamp)
    facts["systemd.SystemdUnitState"] = {f"unit={spec.unit_name}": state}
    facts["files.FileText"][f"path={service.pending_stamp_path(spec)}"] = pending
    return facts


def functions(commands) -> list[str]:
    return [c.function.__name__ for c in commands if isinstance(c, FunctionCommand)]


def raw(commands) -> list[str]:
    return [c.get_raw_value() for c in commands if isinstance(c, StringCommand)]


def test_a_crash_waiting_for_its_automatic_restart_is_started_now_and_said_why(caplog):
    spec = sandbox_spec()
    caplog.set_level(logging.WARNING)
    facts = facts_with(spec, stamp_for(spec), unit("activating", "auto-restart", restarts=1))
    _host, commands = run(service.server_restarted, facts, spec=spec, rendered=render(spec))
    assert functions(commands) == ["_restart"]
    assert ("plan: restart sglang.service: sglang.service crashed (exited on its own) and waits for systemd's "
            "automatic restart (restarts so far: 1)") in caplog.text
    # positive control: the same unit running, no restart
    _host, commands = run(service.server_restarted, facts_with(spec, stamp_for(spec), unit()), spec=spec,
                          rendered=render(spec))
    assert commands == []


def test_crashes_systemd_mended_are_said_and_restart_nothing(caplog):
    spec = sandbox_spec()
    caplog.set_level(logging.WARNING)
    host, commands = run(service.server_restarted, facts_with(spec, stamp_for(spec), unit(restarts=2)), spec=spec,
                         rendered=render(spec))
    assert commands == [] and host.noop_description == "sglang.service runs as wanted: no restart"
    assert "sglang.service exited on its own 2 time(s) since it was last started; systemd restarted it" in caplog.text


def test_a_restart_is_announced_before_it_runs_and_the_announcement_removed_after():
    spec = sandbox_spec()
    changed = sandbox_spec(extra_env={"PYTHONPATH": "/usr/local/lib/sandbox-gpu", "NCCL_DEBUG": "INFO"})
    _host, commands = run(service.server_restarted, facts_with(changed, stamp_for(spec), unit(invocation="old")),
                          spec=changed, rendered=render(changed))
    pending = service.pending_stamp_path(changed)
    uploads = [c for c in commands if not isinstance(c, (StringCommand, FunctionCommand))]
    assert [u.dest for u in uploads] == [pending + ".tmp", stamp_path(changed) + ".tmp"]
    announced = json.loads(uploads[0].src.getvalue())
    assert announced["replaces"] == "old"
    order = [getattr(c, "dest", None) or getattr(getattr(c, "function", None), "__name__", None)
             or c.get_raw_value() for c in commands]
    assert order.index(pending + ".tmp") < order.index("_restart") < order.index(stamp_path(changed) + ".tmp")
    assert order[-1] == f"rm -f {pending}"


def test_a_restart_cut_off_before_it_was_recorded_is_recorded_not_repeated(caplog):
    spec = sandbox_spec()
    changed = sandbox_spec(extra_env={"PYTHONPATH": "/usr/local/lib/sandbox-gpu", "NCCL_DEBUG": "INFO"})
    caplog.set_level(logging.WARNING)
    facts = facts_with(changed, stamp_for(spec), unit(invocation="old"))
    _host, commands = run(service.server_restarted, facts, spec=changed, rendered=render(changed))
    wanted = json.loads(next(c for c in commands if getattr(c, "dest", "").endswith(".pending.json.tmp"))
                        .src.getvalue())["stamp"]
    # the run was cut off during the restart; systemd finished it: another invocation runs
    pending = json.dumps({"stamp": wanted, "replaces": "old"})
    caplog.clear()
    _host, commands = run(service.server_restarted, facts_with(changed, stamp_for(spec), unit(invocation="new"),
                                                               pending), spec=changed, rendered=render(changed))
    assert "_restart" not in functions(commands)
    assert [c.dest for c in commands if hasattr(c, "dest")] == [stamp_path(changed) + ".tmp"]
    assert raw(commands)[-1] == f"rm -f {service.pending_stamp_path(changed)}"
    assert "was restarted with the wanted config by a run that ended before recording it" in caplog.text
    # positive controls: the same announcement and the old invocation still running (cut off
    # before the restart), or another config wanted since: the restart happens
    for state, stamp_text in ((unit(invocation="old"), pending), (unit(invocation="new"), pending.replace(
            wanted["env"], "0" * len(wanted["env"])))):
        _host, commands = run(service.server_restarted, facts_with(changed, stamp_for(spec), state, stamp_text),
                              spec=changed, rendered=render(changed))
        assert functions(commands) == ["_restart"]
