"""tasks/multinode.py and remote/wait_ready.py's slices, without sandbox hosts:
the ranks of a group run as gevent greenlets (as pyinfra runs them) against
scripted hosts (the group's meetings, restart order and readiness verdict) and
pyinfra-testing fake hosts with facts (the operations' decisions). The
node_group settings and their validation are tested in tests/unit/test_spec.py.
"""

from __future__ import annotations

import importlib.util
import json
import re
import runpy
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import gevent
import pytest
from pyinfra.api import FunctionCommand
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.util import FakeState as TestingState
from pyinfra_testing.util import create_host

from facts.model_dir import ModelDir
from facts.systemd import UnitState
from tests.unit.test_step_operations import at_server_venv
from tasks import multinode as M
from core.render import packages_digest, render
from core import stamps
from core.runstate import run_state
from tasks import spec as S

REPO = Path(__file__).resolve().parents[2]
LABEL = "tp16"


# ---------------------------------------------------------------- fakes


@dataclass
class Output:
    stdout_lines: list[str]
    stderr_lines: list[str] = field(default_factory=list)


class FakeHost:
    """A host whose shell commands are answered by ``script(command) -> (ok, stdout lines)``."""

    def __init__(self, name: str, script=None):
        self.name = name
        self.print_prefix = f"[{name}] "
        self.executing_op_hash = "op"
        self.script = script or (lambda command: (True, []))
        self.commands: list[str] = []
        self.logs: list[str] = []
        self.inventory = None

    def run_shell_command(self, command, **kwargs):
        text = command.get_raw_value() if hasattr(command, "get_raw_value") else str(command)
        self.commands.append(text)
        ok, lines = self.script(text)
        return ok, Output(list(lines))

    def log(self, message, log_func=None):
        self.logs.append(message)

    def log_styled(self, message, log_func=None, **kwargs):
        self.logs.append(message)


class FakeState:
    def __init__(self, hosts):
        self.active_hosts = set(hosts)
        self.failed_hosts = set()


def spec_for(rank: int, nnodes: int = 2):
    return SimpleNamespace(
        group_key=LABEL, group_label=LABEL, node_rank=rank, nnodes=nnodes, unit_name="sglang.service",
        venv_python="/usr/bin/python3", listen_host="0.0.0.0", listen_port=30000, served_model_name="tiny",
        readiness_timeout_s=120.0, server_options={}, options_path="/etc/sglang/sglang.yaml",
        tp_size=8 * nnodes, start_stall_s=900.0, unit_stem="sglang",
    )


@pytest.fixture
def group():
    """Two ranks (g0, g1) of group tp16 and a fresh run; run(fn) runs fn(rank) per rank in greenlets."""
    hosts = [FakeHost("g0"), FakeHost("g1")]
    state = FakeState(hosts)
    inventory = SimpleNamespace(get_host=lambda name, default=None: {h.name: h for h in hosts}.get(name, default))
    for h in hosts:
        h.inventory = inventory

    def run(fn, timeout=20):
        def one(rank):
            with ctx_host.use(hosts[rank]):
                return fn(rank)

        with ctx_state.use(state):
            M._run().members[LABEL] = [h.name for h in hosts]
            greenlets = [gevent.spawn(one, rank) for rank in range(len(hosts))]
            gevent.joinall(greenlets, timeout=timeout, raise_error=True)
        assert all(g.ready() for g in greenlets), "a rank is still waiting"
        return [g.value for g in greenlets]

    yield SimpleNamespace(hosts=hosts, state=state, run=run)


# ---------------------------------------------------------------- meet()


def test_meet_returns_every_ranks_value(group):
    values = group.run(lambda rank: M.meet(spec_for(rank), "decide", [f"reason {rank}"] if rank else []))
    assert values == [{"g0": [], "g1": ["reason 1"]}] * 2


def test_meet_fails_when_a_rank_failed_in_an_earlier_step(group):
    group.state.failed_hosts.add(group.hosts[1])
    group.state.active_hosts.discard(group.hosts[1])

    def rank0(rank):
        if rank == 1:
            return None  # pyinfra does not run the step on a failed host
        with pytest.raises(M.GroupError, match=r"rank 1 \(g1\) failed in an earlier step"):
            M.meet(spec_for(0), "decide", [])
        return "raised"

    assert group.run(rank0)[0] == "raised"


def test_meet_gives_up_when_the_ranks_do_not_run_in_parallel(group, monkeypatch):
    monkeypatch.setattr(M, "NOT_PARALLEL_S", 0.2)
    group.hosts[1].executing_op_hash = None  # --serial: rank 1 has not started this step

    def rank0(rank):
        if rank == 1:
            return None
        with pytest.raises(M.GroupError, match=r"rank 1 \(g1\) is not in this step at the same time.*--serial"):
            M.meet(spec_for(0), "decide", [])
        return "raised"

    assert group.run(rank0)[0] == "raised"


def test_abort_ends_every_wait(group):
    def ranks(rank):
        if rank == 1:
            gevent.sleep(0.1)
            M.abort(spec_for(1), "rank 1 (g1) could not stop sglang.service")
            return None
        with pytest.raises(M.GroupError, match="could not stop"):
            M.meet(spec_for(0), "stopped", True)
        return "raised"

    assert group.run(ranks)[0] == "raised"


# ---------------------------------------------------------------- the group restart


def test_restart_stops_rank0_first_then_the_others_then_starts_all(group):
    events = []

    def script_for(name):
        def script(command):
            kind = "start" if "systemctl start" in command else "stop"
            events.append((kind, name))
            gevent.sleep(0.05)
            return True, ([f"baseline: inv-{name}:0"] if kind == "start" else [])
        return script

    for h in group.hosts:
        h.script = script_for(h.name)
    results = group.run(lambda rank: M._group_restart(group.state, group.hosts[rank], spec_for(rank)))
    assert results == [True, True]
    assert events[0] == ("stop", "g0") and events[1] == ("stop", "g1")
    assert {e for e in events[2:]} == {("start", "g0"), ("start", "g1")}
    assert run_state(group.state).restarted >= {"g0", "g1"}
    with ctx_state.use(group.state):
        assert M._run().baselines == {"g0": "inv-g0:0", "g1": "inv-g1:0"}
    # rank 1 gets SIGKILL only if it still runs NONZERO_STOP_GRACE_S after rank 0 stopped
    assert "systemctl kill -s SIGKILL" in group.hosts[1].commands[0]
    assert 'systemctl stop "$u"' in group.hosts[0].commands[0]  # rank 0's stop (positive control)...
    assert "SIGKILL" not in group.hosts[0].commands[0]  # ...has no SIGKILL


def test_restart_rank0_cannot_stop_nobody_starts(group):
    group.hosts[0].script = lambda command: (False, ["Failed to stop sglang.service: Access denied"])
    results = group.run(lambda rank: M._group_restart(group.state, group.hosts[rank], spec_for(rank)))
    assert results == [False, False]
    assert any('systemctl stop "$u"' in c for c in group.hosts[0].commands)  # rank 0 tried to stop...
    assert not any("systemctl start" in c for h in group.hosts for c in h.commands)  # ...and nobody started
    assert any("rank 0 (g0) could not stop sglang.service" in line for line in group.hosts[1].logs)


# ---------------------------------------------------------------- the group's readiness


def slices(*answers):
    """A script answering each readiness slice with the next (ok, lines); the last repeats."""
    answers = list(answers)

    def script(command):
        gevent.sleep(0.02)
        return answers.pop(0) if len(answers) > 1 else answers[0]

    return script


PENDING = (False, ["baseline: inv:0", "pending: /health 503 (loading), active/running"])


def test_ready_at_rank0_while_rank1_stays_active(group):
    group.hosts[0].script = slices(PENDING, PENDING, (True, ["ready: sglang.service serves tiny at http://x (2.0 s to ready, pid 7)"]))
    group.hosts[1].script = slices((False, ["pending: active/running"]))
    results = group.run(lambda rank: M._group_wait(group.state, group.hosts[rank], spec_for(rank)))
    assert results == [True, True]
    assert any("ready: sglang.service serves tiny" in line for line in group.hosts[0].logs)
    assert any("node group tp16 is ready at rank 0 (g0)" in line for line in group.hosts[1].logs)
    # rank 0 checks HTTP; rank 1 only watches its unit (the arguments after the script's text)
    args0, args1 = (h.commands[0].rsplit("--unit", 1)[1] for h in group.hosts)
    assert "--served-name tiny" in args0 and "--watch" not in args0
    assert "--watch" in args1 and "--served-name" not in args1
    assert "--baseline inv:0" in group.hosts[0].commands[1]  # the first slice's baseline carries over


def test_a_failing_rank_fails_the_group_at_once_with_its_journal(group):
    failed = (False, [
        "FAILED: sglang.service is activating/auto-restart (result exit-code, restarts 0) after 0.4 s",
        "cause: ModuleNotFoundError: No module named 'msgspec'",
        "journal:",
        "  Traceback (most recent call last):",
        "  ModuleNotFoundError: No module named 'msgspec'",
    ])
    group.hosts[0].script = slices(PENDING)  # rank 0 would wait until its timeout
    group.hosts[1].script = slices((False, ["baseline: inv:0", "pending: active/running"]), failed)
    results = group.run(lambda rank: M._group_wait(group.state, group.hosts[rank], spec_for(rank)))
    assert results == [False, False]
    # rank 0 stopped with rank 1's failure: a few slices, not its 120 s timeout's worth
    assert len(group.hosts[0].commands) < 10, group.hosts[0].commands
    logs1 = group.hosts[1].logs
    assert logs1[0] == "readiness: node group tp16 failed at rank 1 (g1):"
    assert logs1[1].startswith("FAILED: sglang.service is activating/auto-restart")
    assert logs1[2] == "cause: ModuleNotFoundError: No module named 'msgspec'"
    assert "  Traceback (most recent call last):" in logs1
    assert group.hosts[0].logs[-1] == (
        "readiness: node group tp16 failed at rank 1 (g1): cause: ModuleNotFoundError: No module named 'msgspec'"
    )


def test_a_check_that_cannot_run_is_that_ranks_failure(group):
    group.hosts[0].script = slices(PENDING)
    group.hosts[1].script = slices((False, []))
    results = group.run(lambda rank: M._group_wait(group.state, group.hosts[rank], spec_for(rank)))
    assert results == [False, False]
    assert "FAILED: the readiness check could not run" in group.hosts[1].logs
    assert "failed at rank 1 (g1)" in group.hosts[0].logs[-1]


def test_restarted_rank_waits_from_the_baseline_of_its_start(group, monkeypatch):
    gated = []
    monkeypatch.setattr(M, "_gates_pass_at_rank_0", lambda state, host, spec: gated.append(host.name) or True)
    run_state(group.state).restarted.update({"g0", "g1"})
    group.hosts[0].script = slices((True, ["ready: sglang.service serves tiny at http://x (1.0 s to ready, pid 7)"]))
    group.hosts[1].script = slices((False, ["pending: active/running"]))
    with ctx_state.use(group.state):
        M._run().baselines.update({"g0": "inv0:0", "g1": "inv1:0"})
    results = group.run(lambda rank: M._group_wait(group.state, group.hosts[rank], spec_for(rank)))
    assert results == [True, True]
    assert "--baseline inv0:0" in group.hosts[0].commands[0]
    assert "--baseline inv1:0" in group.hosts[1].commands[0]
    assert gated == ["g0"]  # the gates ran at rank 0 only, after its restart
    args0, args1 = (h.commands[0].rsplit("--unit", 1)[1] for h in group.hosts)  # after the script's text
    assert "--fingerprint-file" in args0 and "--fingerprint-file" not in args1  # rank 0 keeps what SGLang chose


def test_a_gate_failing_at_rank_0_fails_the_group_with_its_cause(group, monkeypatch):
    def failing_gate(state, host, spec):
        run_state(state).fail(host.name, "readiness", "readiness: speed gate: decode at concurrency 1 is 3 tok/s")
        return False

    monkeypatch.setattr(M, "_gates_pass_at_rank_0", failing_gate)
    run_state(group.state).restarted.update({"g0", "g1"})
    group.hosts[0].script = slices((True, ["ready: sglang.service serves tiny at http://x (1.0 s to ready, pid 7)"]))
    group.hosts[1].script = slices((False, ["pending: active/running"]))
    results = group.run(lambda rank: M._group_wait(group.state, group.hosts[rank], spec_for(rank)))
    assert results == [False, False]
    assert group.hosts[1].logs[-1] == ("readiness: node group tp16 failed at rank 0 (g0): readiness: speed gate: "
                                       "decode at concurrency 1 is 3 tok/s")
    assert run_state(group.state).first_failure("g1").cause.endswith("decode at concurrency 1 is 3 tok/s")


# ---------------------------------------------------------------- remote/wait_ready.py in slices


def load_wait_ready():
    spec = importlib.util.spec_from_file_location("wait_ready_under_test", REPO / "remote" / "wait_ready.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def wait_ready(monkeypatch):
    module = load_wait_ready()
    monkeypatch.setattr(module, "POLL_S", 0.01)
    monkeypatch.setattr(module, "gpu_memory", lambda: "GPU MiB used: 1 1")
    monkeypatch.setattr(module, "journal_lines", lambda unit, invocation, count=25: [
        "Traceback (most recent call last):", "ModuleNotFoundError: No module named 'msgspec'",
        "sglang.service: Main process exited, code=exited, status=1/FAILURE",
    ])
    return module


def unit(active="active", sub="running", restarts="0", invocation="inv"):
    return {"ActiveState": active, "SubState": sub, "NRestarts": restarts, "InvocationID": invocation,
            "Result": "success", "MainPID": "42"}


def test_slice_without_verdict_prints_baseline_and_pending(wait_ready, monkeypatch, capsys):
    monkeypatch.setattr(wait_ready, "unit_state", lambda u: unit())
    monkeypatch.setattr(wait_ready, "get", lambda url, key: (503, b""))
    rc = wait_ready.main(["--unit", "sglang.service", "--url", "http://x", "--served-name", "tiny",
                          "--slice", "0.05", "--elapsed", "10", "--progress"])
    out = capsys.readouterr().out.splitlines()
    assert rc == wait_ready.PENDING == 3
    assert out[0] == "baseline: inv:0"
    waiting = re.match(r"waiting: (\d+) s, /health 503 \(loading\), active/running; GPU MiB used", out[1])
    assert waiting, out[1]
    assert 10 <= int(waiting[1]) <= 10 + 60  # --elapsed counted in; the slice's own time depends on load
    assert out[2] == "pending: /health 503 (loading), active/running"


def test_watch_slice_fails_on_auto_restart_with_the_cause_first(wait_ready, monkeypatch, capsys):
    monkeypatch.setattr(wait_ready, "unit_state", lambda u: unit("activating", "auto-restart"))
    monkeypatch.setattr(wait_ready, "get", lambda url, key: pytest.fail("--watch makes no HTTP request"))
    rc = wait_ready.main(["--unit", "sglang.service", "--watch", "--slice", "1", "--baseline", "inv:0"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 1
    assert out[0].startswith("FAILED: sglang.service is activating/auto-restart")
    assert out[1] == "cause: ModuleNotFoundError: No module named 'msgspec'"


def test_baseline_from_an_earlier_slice_catches_a_restart_in_between(wait_ready, monkeypatch, capsys):
    monkeypatch.setattr(wait_ready, "unit_state", lambda u: unit(restarts="1", invocation="inv2"))
    monkeypatch.setattr(wait_ready, "get", lambda url, key: (503, b""))
    rc = wait_ready.main(["--unit", "sglang.service", "--watch", "--slice", "1", "--baseline", "inv:0"])
    assert rc == 1
    assert "restarts 1" in capsys.readouterr().out


def test_slice_ready_at_rank0(wait_ready, monkeypatch, capsys):
    monkeypatch.setattr(wait_ready, "unit_state", lambda u: unit())
    monkeypatch.setattr(wait_ready, "get", lambda url, key: (200, b'{"data": [{"id": "tiny"}]}'))
    rc = wait_ready.main(["--unit", "sglang.service", "--url", "http://x", "--served-name", "tiny",
                          "--slice", "1", "--elapsed", "3"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert out[-1].startswith("ready: sglang.service serves tiny at http://x (3.0 s to ready")


def test_without_slice_it_behaves_as_before(wait_ready, monkeypatch, capsys):
    states = iter([unit(), unit("failed", "failed")])
    monkeypatch.setattr(wait_ready, "unit_state", lambda u: next(states))
    monkeypatch.setattr(wait_ready, "get", lambda url, key: (503, b""))
    rc = wait_ready.main(["--unit", "sglang.service", "--url", "http://x", "--served-name", "tiny"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 1 and not any(line.startswith(("baseline:", "pending:")) for line in out)
    assert out[0].startswith("FAILED: sglang.service is failed/failed")


# ---------------------------------------------------------------- the operations, facts in, commands out

REVISION = "0123456789abcdef0123456789abcdef01234567"
NAMES = ["sgc20", "sgc21"]


def group_spec(name: str):
    data = {}
    for part in ("all", "sandbox"):
        data.update({k: v for k, v in runpy.run_path(str(REPO / "group_data" / f"{part}.py")).items()
                     if not k.startswith("_")})
    data.update(tp_size=16, node_group={"hosts": NAMES, "dist_init_port": 20000, "name": "tp16"})
    addresses = {"sgc20": "10.77.20.2", "sgc21": "10.77.21.2"}
    return S.build_spec(name, data, environ={}, addresses=addresses).resolve(compute_cap="12.0", p2p_ok=True)


def rank_facts(spec, stamp: str | None, sub_state="running", restarts=0, health=200, active="active",
               invocation="x", pending: str | None = None):
    unit = UnitState(load_state="loaded", active_state=active, sub_state=sub_state, main_pid=812,
                     unit_file_state="enabled", fragment_path=spec.unit_path, restarts=restarts,
                     invocation_id=invocation, started_monotonic_us=1)
    return {"systemd.SystemdUnitState": {f"unit={spec.unit_name}": unit},
            "files.FileText": {f"path={stamps.stamp_path(spec)}": stamp,
                               f"path={stamps.pending_stamp_path(spec)}": pending},
            "venv.VenvPackages": {"path=/opt/sglang/venv": {"sglang": "0.5.23"}},
            "model_dir.ModelDirState": {"path=/srv/models/tiny": ModelDir({"revision": REVISION}, {}, 0)},
            "http.HttpStatus": {"url=http://127.0.0.1:30000/health": health}}


def stamp(spec) -> str:
    return json.dumps({**render(spec).digests(), "packages": packages_digest({"sglang": "0.5.23"}),
                       "package_versions": {"sglang": "0.5.23"}, "model_revision": REVISION,
                       "venv": spec.server_venv, "model_path": spec.model_path})


def run_ops(op, facts_by_rank, make_kwargs):
    """Run ``op`` for both ranks at once (executing, as pyinfra does): [(host, commands)]."""
    state = TestingState()
    state.is_executing = True
    hosts = [create_host(state, name=name, facts=at_server_venv(facts, group_spec(name)))
             for name, facts in zip(NAMES, facts_by_rank, strict=True)]
    inventory = SimpleNamespace(get_host=lambda name, default=None: {h.name: h for h in hosts}.get(name, default))
    for name, h in zip(NAMES, hosts, strict=True):
        h.name = name  # create_host() reuses its `name` argument as a loop variable
        h.inventory, h.executing_op_hash = inventory, "op"
    state.active_hosts, state.failed_hosts = set(hosts), set()

    def one(rank):
        with ctx_host.use(hosts[rank]):
            return list(op._inner(**make_kwargs(rank)))

    with ctx_state.use(state):
        M._run().members["tp16"] = list(NAMES)
        greenlets = [gevent.spawn(one, rank) for rank in range(2)]
        gevent.joinall(greenlets, timeout=10, raise_error=True)
    return [(h, g.value) for h, g in zip(hosts, greenlets, strict=True)]


def functions(commands) -> list[str]:
    return [c.function.__name__ for c in commands if isinstance(c, FunctionCommand)]


def restart_kwargs(rank):
    spec = group_spec(NAMES[rank])
    return {"spec": spec, "rendered": render(spec)}


def test_group_running_as_wanted_restarts_nothing():
    specs = [group_spec(n) for n in NAMES]
    results = run_ops(M.group_restarted, [rank_facts(s, stamp(s)) for s in specs], restart_kwargs)
    assert [host.name for host, _ in results] == NAMES
    for host, commands in results:
        assert commands == []
        assert host.noop_description == "sglang.service runs as wanted on every rank of node group tp16: no restart"


def test_one_rank_due_for_a_restart_restarts_the_whole_group():
    specs = [group_spec(n) for n in NAMES]
    results = run_ops(M.group_restarted, [rank_facts(specs[0], stamp(specs[0])), rank_facts(specs[1], None)],
                      restart_kwargs)
    assert [functions(commands) for _, commands in results] == [["_group_restart"], ["_group_restart"]]


def test_a_rank_that_crashed_since_it_was_started_restarts_the_group():
    specs = [group_spec(n) for n in NAMES]
    facts = [rank_facts(specs[0], stamp(specs[0])), rank_facts(specs[1], stamp(specs[1]), restarts=2)]
    state = TestingState()
    with ctx_state.use(state), ctx_host.use(create_host(state, facts=at_server_venv(facts[1], specs[1]))):
        reasons = M.rank_restart_reasons(specs[1], render(specs[1]))
    assert reasons == ["sglang.service crashed since it was started (systemd restarted it 2 time(s), now running)"]
    results = run_ops(M.group_restarted, facts, restart_kwargs)
    assert [functions(commands) for _, commands in results] == [["_group_restart"], ["_group_restart"]]


def test_ready_group_is_a_no_op_and_a_loading_rank0_makes_every_rank_wait():
    specs = [group_spec(n) for n in NAMES]
    results = run_ops(M.group_ready, [rank_facts(s, stamp(s)) for s in specs], lambda rank: {"spec": specs[rank]})
    assert [commands for _, commands in results] == [[], []]
    assert results[0][0].noop_description == (
        "node group tp16 is ready at rank 0 (sgc20); sglang.service active on all 2 ranks")
    facts = [rank_facts(specs[0], stamp(specs[0]), health=503), rank_facts(specs[1], stamp(specs[1]))]
    results = run_ops(M.group_ready, facts, lambda rank: {"spec": specs[rank]})
    assert [functions(commands) for _, commands in results] == [["_group_wait"], ["_group_wait"]]
