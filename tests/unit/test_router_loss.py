"""A router lost mid-rollout (issue 22.4): what the steps keep on the run state about each server's
place in its router (core/router_membership.py), the fleet-level stop and the summary's lines
(rollout/router_loss.py) - the steps against pyinfra-testing's fake host or a scripted one, the
driver's batches with run_batch faked (no host)."""

from __future__ import annotations

import os
from types import SimpleNamespace

from pyinfra.api import FunctionCommand
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.util import FakeState, create_host
from rich.console import Console

from core.router_membership import RouterMembership, membership, registered
from facts.router import RouterWorker
from rollout import router_loss
from rollout.driver import Driver, HostResult, RolloutReport, plan_batches
from rollout.summary import print_summary
from tasks import membership as steps
from tests.unit.test_last_good import on_demand_facts, stamp
from tests.unit.test_step_operations import ShellHost, failure, sandbox_spec

ROUTER = "http://10.77.10.2:30000"
WORKER = "http://10.77.11.2:30000"
FACT_KEY = f"auth_file=None, router_url={ROUTER}"


def run_op(op, listed, executing=True, facts=None, status=0, **kwargs):
    """The op's commands with the router listing ``listed`` (None: no list), its HTTP status ``status``
    (0: nothing answers), while pyinfra executes (or prepares); the state, to read what the op kept."""
    state = FakeState()
    state.is_executing = executing
    host = create_host(state, facts={**(facts or {}), "router.RouterWorkers": {FACT_KEY: listed},
                                     "http.HttpStatus": {f"url={ROUTER}/workers": status}})
    host.name = "sgc1"  # (create_host's name argument is lost to its loop over the facts)
    with ctx_state.use(state), ctx_host.use(host):
        commands = list(op._inner(**kwargs))
    return state, host, commands


def register(listed, executing=True, status=0):
    return run_op(steps.worker_registered, listed, executing, status=status, router_url=ROUTER, worker_url=WORKER)


def answering(ok: bool):
    """A host whose commands (the router client) all succeed or all fail."""
    return lambda command: (ok, [] if ok else ["FAILED: the router at ... does not answer GET /workers"], [])


# --- the steps: what they keep -------------------------------------------------------------


def test_a_registration_the_router_does_not_answer_fails_and_the_router_is_lost():
    state, _host, commands = register(None)
    message = failure(commands)
    assert message.startswith(f"router: the router at {ROUTER} does not answer GET /workers from sgc1: ")
    assert "run it again once the router answers" in message
    record = membership(state)
    assert [str(loss) for loss in record.losses["sgc1"]] == [
        f"the router at {ROUTER}: GET {ROUTER}/workers got no answer from sgc1 while registering {WORKER}"]
    assert record.out["sgc1"] == f"not registered: the router at {ROUTER} does not answer"


def test_a_router_that_answers_but_gives_no_list_is_not_lost():
    """GET /workers answered 401 (a refused key): the server is not registered, the router is not lost."""
    state, _host, commands = register(None, status=401)
    assert failure(commands).startswith(f"router: the router at {ROUTER} does not answer GET /workers")
    assert membership(state).losses == {} and "sgc1" in membership(state).out


def test_a_dry_run_keeps_nothing():
    """While pyinfra prepares (--dry) the router may not be deployed yet: a plan, nothing kept."""
    state, _host, commands = register(None, executing=False)
    assert [c.function for c in commands] == [registered]
    assert membership(state).out == {} and membership(state).losses == {}


def test_a_server_the_run_does_not_restart_is_registered_when_it_is_missing():
    """The registration step does not ask whether this run restarted the server: one missing from its
    router (a router that restarted, a registration a lost router never got) is put back."""
    state, _host, commands = register([RouterWorker(id="w2", url="http://10.77.12.2:30000", healthy=True)])
    assert len(commands) == 1 and isinstance(commands[0], FunctionCommand)
    assert commands[0].function is registered and commands[0].args == ("/usr/bin/python3", ROUTER, WORKER, None)
    membership(state).taken_out("sgc1", "drained from the router before its restart")
    host = ShellHost(answering(True))
    assert commands[0].function(state, host, *commands[0].args) is True
    assert any(" register --router " + ROUTER in c and "--worker " + WORKER in c for c in host.commands)
    assert membership(state).out == {}  # back in: no longer out


def test_a_healthy_server_is_a_no_op_and_counts_as_in():
    state = FakeState()
    membership(state).taken_out("sgc1", "out")
    _state, host, commands = register([RouterWorker(id="w1", url=WORKER, healthy=True)])
    assert commands == [] and host.noop_description == f"{WORKER} is in the router at {ROUTER}, healthy"
    assert membership(_state).out == {}


def test_a_failed_registration_is_out_and_the_router_lost_only_when_it_does_not_answer():
    state = FakeState()
    refused = ShellHost(answering(False), {"HttpStatus": 200})  # it answers (and refused)
    assert registered(state, refused, "python3", ROUTER, WORKER) is False
    assert "sgc1" in membership(state).out and membership(state).losses == {}
    gone = ShellHost(answering(False), {"HttpStatus": 0})  # asked again: no answer
    assert registered(state, gone, "python3", ROUTER, WORKER) is False
    assert [loss.router_url for loss in membership(state).losses["sgc1"]] == [ROUTER]
    assert membership(state).out["sgc1"].endswith(f"not registered again: the router at {ROUTER} does not answer")


def test_a_drain_that_succeeded_takes_the_server_out_until_it_is_registered():
    state = FakeState()
    assert steps._drain(state, ShellHost(answering(True)), "python3", ROUTER, WORKER, "http://127.0.0.1:30000",
                        10.0, None) is True
    assert membership(state).out == {"sgc1": f"drained from the router at {ROUTER} before its restart"}
    assert membership(state).losses == {}
    assert registered(state, ShellHost(answering(True)), "python3", ROUTER, WORKER) is True
    assert membership(state).out == {}


def test_a_drain_the_router_stops_answering_loses_the_router():
    state = FakeState()
    host = ShellHost(answering(False), {"HttpStatus": 0})
    assert steps._drain(state, host, "python3", ROUTER, WORKER, "http://127.0.0.1:30000", 10.0, None) is False
    assert "stopped answering during its drain" in membership(state).out["sgc1"]
    assert "while draining " + WORKER in membership(state).losses["sgc1"][0].what


def test_a_drain_that_finds_the_router_gone_restarts_but_the_router_is_lost():
    spec = sandbox_spec(router_url=ROUTER, worker_url=WORKER)
    facts = on_demand_facts(spec, stamp(), stamp(), stamp(unit="u0"))  # something to roll back to: a restart
    state, host, commands = run_op(steps.worker_drained, None, facts=facts, spec=spec, rolling_back=True)
    assert commands == [] and host.noop_description == f"the router at {ROUTER} does not answer: nothing to drain"
    assert membership(state).losses["sgc1"][0].what.endswith("while draining it before its restart")
    assert "did not answer before the restart" in membership(state).out["sgc1"]
    state, _host, _commands = run_op(steps.worker_drained, None, executing=False, facts=facts, spec=spec,
                                     rolling_back=True)
    assert membership(state).losses == {}  # planning (a dry run): nothing kept


def test_out_reasons_add_up_once():
    record = RouterMembership()
    record.taken_out("a", "drained")
    record.taken_out("a", "not registered")
    record.taken_out("a", "not registered")
    assert record.out == {"a": "drained; not registered"}
    record.put_back("a")
    record.put_back("b")  # never out: nothing to do
    assert record.out == {}


# --- the driver: a fleet-level stop, the summary ----------------------------------------------


def fleet_driver(outcomes: dict, max_failed: int = 3):
    """A Driver whose run_batch plays ``outcomes`` (host -> fn(result, record)) instead of pyinfra."""
    lines: list[str] = []
    driver = Driver("inventory/sandbox_fleet.py", batch_size=1, max_failed=max_failed, echo=lines.append)

    def run_batch(batch, results, offers=None):
        state = SimpleNamespace()  # the batch's State: its run state is all the driver reads here
        for name in batch.hosts:
            results[name].result = "ok"
            outcomes.get(name, lambda result, record: None)(results[name], membership(state))
        router_loss.take(state, results, batch.hosts)

    driver.run_batch = run_batch  # type: ignore[method-assign]
    batches = plan_batches(["sgc10"], ["sgc11", "sgc12", "sgc13", "sgc14"], 1, 0)
    report = RolloutReport({n: HostResult(n, b.label) for b in batches for n in b.hosts}, batches, exit_code=0)
    seeding = SimpleNamespace(offers=lambda names: {}, converged=lambda names: None)
    driver._run_batches(batches, report, seeding)
    return report, lines


def lost_router(result, record):
    result.result, result.error = "failed", f"in the router: router: the router at {ROUTER} does not answer"
    record.taken_out(result.host, f"drained from the router at {ROUTER} before its restart")
    record.lost(result.host, ROUTER, f"GET {ROUTER}/workers got no answer from sgc11 while registering {WORKER}")


def test_a_lost_router_stops_the_rollout_whatever_max_failed():
    report, lines = fleet_driver({"sgc11": lost_router}, max_failed=3)
    assert (report.exit_code, report.stopped_after) == (1, "1")
    assert [report.results[n].result for n in ("sgc12", "sgc13", "sgc14")] == ["not run"] * 3
    stop = next(line for line in lines if line.startswith("rollout: stopped after batch 1: router lost: "))
    assert f"sgc11: the router at {ROUTER}: GET {ROUTER}/workers got no answer from sgc11" in stop
    assert "a lost router stops the whole rollout, whatever --max-failed (3); not touched: sgc12, sgc13, sgc14" in stop
    assert report.results["sgc11"].out_of_router == f"drained from the router at {ROUTER} before its restart"


def test_a_failed_host_within_max_failed_lets_the_rollout_go_on():
    """Positive control: the same failure without a lost router is one failed host of --max-failed 3."""
    def failed(result, record):
        result.result, result.error = "failed", "readiness: boom"

    report, lines = fleet_driver({"sgc11": failed}, max_failed=3)
    assert report.exit_code == 1 and report.stopped_after is None
    assert [report.results[n].result for n in ("sgc12", "sgc13", "sgc14")] == ["ok"] * 3
    assert not any("router lost" in line for line in lines)


def test_a_failed_router_host_stops_the_rollout_before_any_server():
    def unreachable(result, record):
        result.result, result.error = "failed", "cannot connect over ssh to 10.77.10.2: Connection refused"

    report, lines = fleet_driver({"sgc10": unreachable}, max_failed=3)
    assert report.stopped_after == "router"
    assert all(report.results[n].result == "not run" for n in ("sgc11", "sgc12", "sgc13", "sgc14"))
    assert any("router lost: the router host sgc10 failed: cannot connect over ssh to 10.77.10.2" in line
               for line in lines), lines


def test_the_summary_names_the_lost_router_and_each_server_out_of_it():
    report, _lines = fleet_driver({"sgc11": lost_router})
    console = Console(width=120, record=True, file=open(os.devnull, "w"))
    print_summary(report, console)
    text = console.export_text()
    lines = text.splitlines()
    assert f"rollout: router lost in batch 1: sgc11: the router at {ROUTER}: GET {ROUTER}/workers got no answer " \
           f"from sgc11 while registering {WORKER}" in lines
    assert f"rollout: out of the router: sgc11: drained from the router at {ROUTER} before its restart" in lines
    assert any(line.startswith("rollout: 1 server(s) out of the router (sgc11): once the router answers again, "
                               "run the rollout again") for line in lines), text
    assert "stopped after batch 1" in text
    # a rollout where every server is back in its router: no such line (negative control)
    clean, _ = fleet_driver({})
    console = Console(width=120, record=True, file=open(os.devnull, "w"))
    print_summary(clean, console)
    assert "out of the router" not in console.export_text() and "router lost" not in console.export_text()
