"""The last good configuration (core/last_good.py): kept once a configuration serves, put back
when a restart of this run fails readiness. The keep and restore scripts run for real in a
private mount namespace (tmpfs over the host paths they write, a logging stand-in for
systemctl); the rollback decision runs against a scripted host."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from pyinfra_testing.util import FakeState

from core import last_good
from core.runstate import run_state
from core.model_revisions import removal_command
from core.stamps import pending_stamp_path, stamp_path
from core.server import mark_restarted
from facts.model_dir import Revision, Revisions
from facts.router import RouterWorker
from facts.server_envs import EnvsDir, ServerEnv
from tasks import membership, readiness, rollback
from tests.unit.test_step_operations import (ShellHost, failure, run, sandbox_spec, service_facts,
                                             stamp_for)

WAIT = "wait-ready"  # the readiness command, as the scripted host sees it
CAUSE = "cause: RuntimeError: CUDA error: invalid device ordinal"  # the line readiness names (core/ops.py)
NOT_READY = ["waiting for sglang.service", "FAILED: sglang.service is failed after 1.4 s", CAUSE]


KEPT_VENV = "/opt/sglang/venv-envs/0123456789ab"  # the venv the stamps' configuration ran from: gone (no packages)


def stamp(unit="u1", packages="p1", revision="r1", versions=None) -> dict:
    return {"unit": unit, "env": "e1", "options": "o1", "packages": packages, "model_revision": revision,
            "package_versions": versions or {"sglang": "0.5.23"}, "venv": KEPT_VENV}


# --- keeping the last good configuration -----------------------------------------


def keep_facts(spec, kept: str | None, running: str | None = None):
    facts = service_facts(spec, running or stamp_for(spec))
    facts["files.FileText"][f"path={last_good.last_good_stamp_path(spec)}"] = kept
    return facts


def test_a_configuration_kept_already_is_a_no_op():
    spec = sandbox_spec()
    host, commands = run(readiness.last_good_recorded, keep_facts(spec, kept=stamp_for(spec)), spec=spec)
    assert commands == [] and host.noop_description == (
        "the configuration sglang.service serves is kept as the last good one")


@pytest.mark.parametrize("kept", [None, json.dumps(stamp())], ids=["none kept", "another kept"])
def test_the_configuration_that_serves_is_kept_when_it_is_not(kept):
    spec = sandbox_spec()
    _host, commands = run(readiness.last_good_recorded, keep_facts(spec, kept=kept), spec=spec)
    assert [c.get_raw_value() for c in commands] == [c.get_raw_value() for c in last_good.last_good_written(spec)]


SANDBOXED = """
set -e
for d in /etc/systemd/system /etc/sglang /var/lib/sglang-converge; do mkdir -p "$d"; mount -t tmpfs tmpfs "$d"; done
"""


def in_private_mounts(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run script as root with tmpfs over the paths the deploy writes (nothing of this machine's
    changes), `systemctl` a stand-in that logs its arguments to $LOG."""
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed")
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "systemctl").write_text('#!/bin/sh\necho "systemctl $*" >> "$LOG"\n')
    (stub / "systemctl").chmod(0o755)
    env = {"PATH": f"{stub}:/usr/sbin:/usr/bin:/sbin:/bin", "LOG": str(tmp_path / "systemctl.log")}
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", SANDBOXED + script],
                          capture_output=True, text=True, env=env, timeout=60)


def shell(commands) -> str:
    """The `sh -c SCRIPT` commands as one script."""
    return "\n".join(c.get_raw_value() for c in commands)


def test_keep_then_restore_round_trips_files_modes_and_stamp(tmp_path):
    spec = sandbox_spec()
    write = "\n".join(f"echo {shlex.quote(text)} > {path}; chmod {mode} {path}" for path, text, mode in (
        (spec.unit_path, "unit v1", 644), (spec.env_path, "env v1", 600), (spec.options_path, "opt v1", 600),
        (stamp_path(spec), json.dumps(stamp()), 600)))
    change = "\n".join(f"echo v2 > {path}" for path in (spec.unit_path, spec.env_path, spec.options_path,
                                                         stamp_path(spec), pending_stamp_path(spec)))
    d = last_good.last_good_dir(spec)
    show = (f"stat -c '%a %n' {d} {d}/unit {d}/options; cat {spec.unit_path} {spec.env_path} {spec.options_path}; "
            f"stat -c '%a' {spec.options_path}; cat {stamp_path(spec)}; "
            f"[ -e {pending_stamp_path(spec)} ] && echo pending left || echo no pending; ls {d}; ls {d}/..")
    proc = in_private_mounts("\n".join([write, shell(last_good.last_good_written(spec)), change,
                                        "sh -c " + json.dumps(last_good.restore_script(spec)), show]), tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:3] == [f"700 {d}", f"644 {d}/unit", f"600 {d}/options"]  # modes kept, in a root-only dir
    assert lines[3:7] == ["unit v1", "env v1", "opt v1", "600"]
    assert json.loads(lines[7]) == stamp() and lines[8] == "no pending"
    assert lines[9:] == ["env", "options", "recorded_at", "stamp.json", "unit", "sglang"]  # no .new dir left
    assert (tmp_path / "systemctl.log").read_text().splitlines() == [
        "systemctl daemon-reload", "systemctl reset-failed sglang.service", "systemctl restart sglang.service"]


def test_keeping_fails_without_a_stamp_and_leaves_the_old_one(tmp_path):
    spec = sandbox_spec()
    d = last_good.last_good_dir(spec)
    script = (f"mkdir -p {d} && echo old > {d}/stamp.json\n"
              f"{shell(last_good.last_good_written(spec))} && echo kept || echo failed\ncat {d}/stamp.json")
    proc = in_private_mounts(script, tmp_path)
    assert proc.stdout.split() == ["failed", "old"], proc.stdout + proc.stderr


# --- the rollback decision ---------------------------------------------------------


NO_REVISIONS, NO_ENVS = Revisions((), ()), EnvsDir((), frozenset())


def rollback_host(spec, kept: dict | None, current: dict, waits=(False, True), restore_ok=True,
                  revisions=NO_REVISIONS, envs=NO_ENVS):
    """A host whose readiness waits answer `waits` in turn; the stamps read as given."""
    answers = list(waits)
    files = {last_good.last_good_stamp_path(spec): kept, stamp_path(spec): current,
             f"{last_good.last_good_dir(spec)}/recorded_at": "2026-12-01T20:00:00Z"}

    def script(command: str):
        if command == WAIT:
            ok = answers.pop(0)
            return ok, (["sglang.service ready after 3.1 s"] if ok else NOT_READY), []
        if command.startswith("cat "):
            path = command.split()[1].strip("'")
            value = files.get(path)
            if value is None:
                return False, [], []
            return True, [value if isinstance(value, str) else json.dumps(value)], []
        if command.startswith("sh -c "):
            return restore_ok, [], ([] if restore_ok else ["cp: cannot stat 'x': No such file or directory"])
        raise AssertionError(f"unexpected command {command!r}")

    # the kept venv is gone (no packages); the revisions and venvs as given
    return ShellHost(script, {"VenvPackages": {}, "ModelRevisions": revisions, "ServerEnvs": envs})


def roll(spec, host, restarted=True):
    state = FakeState()
    if restarted:
        run_state(state).restarted.add(host.name)
    ok = last_good.ready_or_rolled_back(state, host, WAIT, 60, spec)
    return ok, run_state(state).failures.get(host.name, [])


def test_a_failed_restart_is_rolled_back_and_still_fails_the_run():
    spec = sandbox_spec()
    host = rollback_host(spec, kept=stamp(unit="u0"), current=stamp())
    ok, failures = roll(spec, host)
    assert ok is False
    assert [f.cause for f in failures] == [f"rolled back: {CAUSE}"]
    assert failures[0].step == "readiness" and failures[0].detail == tuple(NOT_READY)  # the journal lines kept
    assert [c for c in host.commands if c == WAIT or c.startswith("sh -c")] == [
        WAIT, "sh -c " + shlex.quote(last_good.restore_script(spec)), WAIT]
    assert any("rolling back to the last good configuration (serving as of 2026-12-01T20:00:00Z)" in line
               for line in host.logs)


def test_the_rollback_trims_what_lies_beyond_keep_by_what_serves_again_the_failed_revision_kept():
    """A second failed revision change, rolled back: the good revision serves, the one that just failed is
    the newest switched to (kept for a retry), the first failed one goes, as the next run of the good
    configuration would remove it (keep_revisions 2); likewise a venv beyond keep_envs."""
    spec = sandbox_spec(keep_revisions=2, keep_envs=2)
    root = spec.revisions_dir
    good, first, second = f"{root}/530153015301", f"{root}/bad0bad0bad0", f"{root}/bad1bad1bad1"
    revisions = Revisions((Revision(good, {}, 100), Revision(first, {}, 200), Revision(second, {}, 300)), ())
    envs = EnvsDir((ServerEnv(KEPT_VENV, 100, None), ServerEnv("/opt/sglang/venv-envs/old", 50, None),
                    ServerEnv("/opt/sglang/venv-envs/new", 300, None)), frozenset())
    kept = {**stamp(unit="u0"), "model_path": good}
    host = rollback_host(spec, kept=kept, current=stamp(), revisions=revisions, envs=envs)
    ok, failures = roll(spec, host)
    assert ok is False and [f.cause for f in failures] == [f"rolled back: {CAUSE}"]
    removed = [c for c in host.commands if c.startswith("sh -c ") and ".removing" in c]
    assert removed == [removal_command(first).get_raw_value(),
                       removal_command("/opt/sglang/venv-envs/old").get_raw_value()], host.commands
    assert any(f"after the rollback, remove what lies beyond keep_revisions = 2 / keep_envs = 2: {first}" in line
               for line in host.logs), host.logs
    # the positive control's converse: nothing beyond keep, nothing removed
    host = rollback_host(spec, kept=kept, current=stamp(),
                         revisions=Revisions(revisions.revisions[:2], ()), envs=NO_ENVS)
    roll(spec, host)
    assert not [c for c in host.commands if ".removing" in c], host.commands


def test_a_ready_server_is_never_rolled_back():
    spec = sandbox_spec()
    host = rollback_host(spec, kept=stamp(unit="u0"), current=stamp(), waits=(True,))
    assert roll(spec, host) == (True, [])
    assert host.commands == [WAIT]


def test_the_time_to_ready_is_kept_when_readiness_sees_the_restarted_server_ready():
    """From the restart (mark_restarted) to ready: the time-to-ready step then runs nothing on the host."""
    spec = sandbox_spec()
    host = rollback_host(spec, kept=None, current=stamp(), waits=(True,))
    state = FakeState()
    mark_restarted(state, host)
    assert last_good.ready_or_rolled_back(state, host, WAIT, 60, spec) is True
    ready_s = run_state(state).ready_s[host.name]
    assert ready_s >= 0
    assert readiness._record(state, host, spec.venv_python, spec.unit_name) is True
    assert host.commands == [WAIT] and run_state(state).ready_s[host.name] == ready_s


@pytest.mark.parametrize("why, spec_overrides, kept, current, restarted, said", [
    ("turned off", {"rollback_on_failure": False}, stamp(unit="u0"), stamp(), True, None),
    ("not restarted by this run", {}, stamp(unit="u0"), stamp(), False, None),
    ("nothing kept", {}, None, stamp(), True, "no last good configuration is recorded"),
    ("the same files", {}, stamp(), stamp(packages="p2"), True, "the configuration that failed is the last good one"),
    ("packages changed", {}, stamp(unit="u0"), stamp(packages="p2", versions={"sglang": "0.5.24"}), True,
     "the venv's packages changed since it served (sglang 0.5.23 -> 0.5.24)"),
    ("model changed", {}, stamp(unit="u0"), stamp(revision="r2"), True, "the model revision changed since it served"),
])
def test_what_cannot_be_rolled_back_is_not_and_the_failure_stands(why, spec_overrides, kept, current, restarted,
                                                                  said):
    spec = sandbox_spec(**spec_overrides)
    host = rollback_host(spec, kept=kept, current=current, waits=(False,))
    ok, failures = roll(spec, host, restarted=restarted)
    assert ok is False and [f.cause for f in failures] == [CAUSE]
    assert not any(c.startswith("sh -c") for c in host.commands)  # nothing restored, nothing restarted
    if said is None:
        assert host.commands == [WAIT] and not host.logs
    else:
        assert any(line.startswith("readiness: not rolled back: " + said) for line in host.logs), host.logs


def test_a_last_good_configuration_that_does_not_serve_either_says_both():
    spec = sandbox_spec()
    host = rollback_host(spec, kept=stamp(unit="u0"), current=stamp(), waits=(False, False))
    ok, failures = roll(spec, host)
    assert ok is False and len(failures) == 1
    assert failures[0].cause == (
        f"rollback failed: the last good configuration does not serve either ({CAUSE}); first: {CAUSE}")


def test_a_restore_that_fails_says_so():
    spec = sandbox_spec()
    host = rollback_host(spec, kept=stamp(unit="u0"), current=stamp(), waits=(False,), restore_ok=False)
    ok, failures = roll(spec, host)
    assert ok is False and failures[0].cause.startswith(
        f"rollback failed: cp: cannot stat 'x': No such file or directory (after {CAUSE})")
    assert host.commands.count(WAIT) == 1


def test_keeping_a_new_configuration_makes_the_kept_one_the_previous(tmp_path):
    spec = sandbox_spec()
    d, p = last_good.last_good_dir(spec), last_good.previous_good_dir(spec)
    keep = shell(last_good.last_good_written(spec))
    script = "\n".join([f"echo '{{\"unit\": \"u1\"}}' > {stamp_path(spec)}", f"echo unit1 > {spec.unit_path}", keep,
                        f"echo '{{\"unit\": \"u2\"}}' > {stamp_path(spec)}", f"echo unit2 > {spec.unit_path}", keep,
                        f"cat {d}/stamp.json {d}/unit {p}/stamp.json {p}/unit; ls {d}/.."])
    proc = in_private_mounts(script, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n") == ['{"unit": "u2"}', "unit2", '{"unit": "u1"}', "unit1", "sglang",
                                      "sglang.previous", ""]


# --- rollback on demand (rollback.py) ------------------------------------------------


def on_demand_facts(spec, current: dict, last: dict | None, previous: dict | None):
    facts = service_facts(spec, json.dumps(current))
    for kept_dir, kept in ((last_good.last_good_dir(spec), last), (last_good.previous_good_dir(spec), previous)):
        facts["files.FileText"][f"path={kept_dir}/stamp.json"] = json.dumps(kept) if kept else None
        facts["files.FileText"][f"path={kept_dir}/recorded_at"] = "2026-11-30T10:00:00Z\n" if kept else None
    facts["venv.VenvPackages"][f"path={KEPT_VENV}"] = {}
    return facts


def test_rollback_puts_the_previous_good_configuration_back_when_the_current_one_serves(caplog):
    spec = sandbox_spec()
    _host, commands = run(rollback.config_rolled_back, on_demand_facts(spec, stamp(), stamp(), stamp(unit="u0")),
                          spec=spec)
    assert [c.get_raw_value() for c in commands[:1]] == [
        "sh -c " + shlex.quote(last_good.restore_script(spec, last_good.previous_good_dir(spec)))]
    assert [c.function for c in commands[1:]] == [mark_restarted]  # so readiness waits for the new process
    assert ("plan: put back the configuration that served as of 2026-11-30T10:00:00Z "
            f"({last_good.previous_good_dir(spec)}) and restart sglang.service") in caplog.text


def test_rollback_puts_the_last_good_one_back_when_the_current_one_never_served():
    spec = sandbox_spec()
    _host, commands = run(rollback.config_rolled_back,
                          on_demand_facts(spec, stamp(unit="u2"), stamp(), stamp(unit="u0")), spec=spec)
    assert commands[0].get_raw_value() == "sh -c " + shlex.quote(last_good.restore_script(spec))


@pytest.mark.parametrize("last, previous, says", [
    (None, None, "rollback: no earlier good configuration is kept for sglang.service"),
    (stamp(), None, "rollback: no earlier good configuration is kept for sglang.service"),
    (stamp(), stamp(unit="u0", packages="p0", versions={"sglang": "0.5.22"}),
     "rollback: the kept configuration in /var/lib/sglang-converge/last-good/sglang.previous cannot be put back: "
     "the venv's packages changed since it served (sglang 0.5.22 -> 0.5.23)"),
])
def test_rollback_with_nothing_to_put_back_fails_changing_nothing(last, previous, says):
    spec = sandbox_spec()
    _host, commands = run(rollback.config_rolled_back, on_demand_facts(spec, stamp(), last, previous), spec=spec)
    assert failure(commands).startswith(says)


def test_the_rollback_drains_the_server_only_when_there_is_something_to_put_back():
    spec = sandbox_spec(router_url="http://10.77.10.2:30000", worker_url="http://10.77.1.2:30000")
    nothing = on_demand_facts(spec, stamp(), stamp(), None)
    host, commands = run(membership.worker_drained, nothing, spec=spec, rolling_back=True)
    assert commands == [] and host.noop_description == "no restart planned: stays in the router"
    facts = on_demand_facts(spec, stamp(), stamp(), stamp(unit="u0"))
    facts["router.RouterWorkers"] = {f"auth_file=None, router_url={spec.router_url}": [
        RouterWorker(id="w1", url=spec.worker_url, healthy=True)]}
    _host, commands = run(membership.worker_drained, facts, spec=spec, rolling_back=True)
    assert [c.function.__name__ for c in commands] == ["_drain"]
