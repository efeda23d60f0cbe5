"""tasks/multinode.py's group restart after faults, from facts (as tests/unit/test_service_faults.py
does for one server): a rank that crashed, a restart announced by a run that was cut off before
it reached the ranks, and one that systemd finished after the run was cut off. The ranks run as
gevent greenlets against pyinfra-testing fake hosts (tests/unit/test_multinode.py's run_ops)."""

from __future__ import annotations

import json
import logging

import pytest
from pyinfra.api import FunctionCommand, StringCommand

from core import stamps
from tests.unit.test_multinode import M, NAMES, functions, group_spec, rank_facts, restart_kwargs, run_ops, stamp

PENDING_NOTE = "the group restart announced by an earlier run"
RECORDED_NOTE = "was restarted with the wanted config by a run that ended before recording it"


def specs():
    return [group_spec(name) for name in NAMES]


def announced(spec, replaces: str) -> str:
    """The pending stamp a group restart wrote on this rank before it was cut off."""
    return json.dumps({"stamp": json.loads(stamp(spec)), "replaces": replaces})


def older(spec) -> str:
    """The stamp of a start with another model revision: what runs is not what is wanted."""
    return json.dumps({**json.loads(stamp(spec)), "model_revision": "f" * 40})


def order(commands) -> list[str]:
    """Each command as a word: an upload's destination, a function's name, a shell command's text."""
    return [getattr(c, "dest", None) or (c.function.__name__ if isinstance(c, FunctionCommand) else None)
            or c.get_raw_value() for c in commands]


def assert_announced_then_recorded(spec, commands, replaces: str) -> None:
    pending = stamps.pending_stamp_path(spec)
    steps = order(commands)
    assert steps.index(pending + ".tmp") < steps.index("_group_restart") < steps.index(
        stamps.stamp_path(spec) + ".tmp")
    assert steps[-1] == f"rm -f {pending}"
    upload = next(c for c in commands if getattr(c, "dest", "") == pending + ".tmp")
    assert json.loads(upload.src.getvalue()) == {"stamp": json.loads(stamp(spec)), "replaces": replaces}


@pytest.mark.parametrize("active, sub", [("failed", "failed"), ("inactive", "dead")])
def test_a_crashed_rank_restarts_the_group_and_every_rank_says_why(active, sub, caplog):
    caplog.set_level(logging.WARNING)
    s = specs()
    facts = [rank_facts(s[0], stamp(s[0]), invocation="inv0"),
             rank_facts(s[1], stamp(s[1]), active=active, sub_state=sub, invocation="inv1")]
    results = run_ops(M.group_restarted, facts, restart_kwargs)
    assert [functions(commands) for _, commands in results] == [["_group_restart"], ["_group_restart"]]
    assert (f"service: start sglang.service (rank 1 of node group tp16, all ranks together): "
            f"sglang.service is {active}") in caplog.text
    assert (f"service: restart sglang.service (rank 0 of node group tp16, all ranks together): "
            f"rank 1 (sgc21): sglang.service is {active}") in caplog.text
    # each rank announces its restart before it and records it after (a cut-off run leaves the announcement)
    for (_host, commands), spec, invocation in zip(results, s, ["inv0", "inv1"], strict=True):
        assert_announced_then_recorded(spec, commands, invocation)
    # positive control: the same rank active, nothing else changed: no rank restarts
    facts[1] = rank_facts(s[1], stamp(s[1]), invocation="inv1")
    assert [commands for _, commands in run_ops(M.group_restarted, facts, restart_kwargs)] == [[], []]


def test_a_restart_cut_off_before_it_reached_the_ranks_restarts_the_group_with_the_config_unchanged(caplog):
    """The run announced a group restart (a crash, say) and was killed before it stopped anything:
    every rank still runs the invocation it was to replace, the config is what was started."""
    caplog.set_level(logging.WARNING)
    s = specs()
    facts = [rank_facts(spec, stamp(spec), invocation=f"inv{rank}", pending=announced(spec, f"inv{rank}"))
             for rank, spec in enumerate(s)]
    results = run_ops(M.group_restarted, facts, restart_kwargs)
    assert [functions(commands) for _, commands in results] == [["_group_restart"], ["_group_restart"]]
    assert ("service: restart sglang.service (rank 0 of node group tp16, all ranks together): the group restart "
            "announced by an earlier run (/var/lib/sglang-converge/sglang.pending.json) was cut off before it "
            "restarted this rank (sglang.service is still invocation inv0, active)") in caplog.text
    for (_host, commands), spec, rank in zip(results, s, [0, 1], strict=True):
        assert_announced_then_recorded(spec, commands, f"inv{rank}")
    # positive controls: an announcement whose restart happened (another invocation runs: the run was
    # cut off after the stamp, before removing it), or one of other settings than now: no restart
    other = json.dumps({"stamp": {**json.loads(stamp(s[1])), "env": "0" * 64}, "replaces": "inv1"})
    for pending in (announced(s[1], "inv-before"), other):
        facts = [rank_facts(s[0], stamp(s[0]), invocation="inv0"),
                 rank_facts(s[1], stamp(s[1]), invocation="inv1", pending=pending)]
        results = run_ops(M.group_restarted, facts, restart_kwargs)
        assert [commands for _, commands in results] == [[], []]
        assert results[1][0].noop_description == (
            "sglang.service runs as wanted on every rank of node group tp16: no restart")


def test_a_group_stopped_and_not_started_again_says_the_restart_was_cut_off(caplog):
    """Killed between the stop and the start: the ranks are inactive; the group restarts, and says
    that an earlier run's restart left them so."""
    caplog.set_level(logging.WARNING)
    s = specs()
    facts = [rank_facts(spec, stamp(spec), active="inactive", sub_state="dead", invocation=f"inv{rank}",
                        pending=announced(spec, f"inv{rank}")) for rank, spec in enumerate(s)]
    results = run_ops(M.group_restarted, facts, restart_kwargs)
    assert [functions(commands) for _, commands in results] == [["_group_restart"], ["_group_restart"]]
    assert ("service: start sglang.service (rank 1 of node group tp16, all ranks together): sglang.service is "
            "inactive; the group restart announced by an earlier run (/var/lib/sglang-converge/sglang.pending.json) "
            "was cut off before it restarted this rank (sglang.service is still invocation inv1, inactive)"
            ) in caplog.text


def test_a_restart_systemd_finished_after_the_run_was_cut_off_is_recorded_not_repeated(caplog):
    """The run restarted the group for a new model revision and was cut off before recording it:
    every rank runs another invocation with the wanted config. Recorded, no second restart."""
    caplog.set_level(logging.WARNING)
    s = specs()
    facts = [rank_facts(spec, older(spec), invocation=f"new{rank}", pending=announced(spec, f"old{rank}"))
             for rank, spec in enumerate(s)]
    results = run_ops(M.group_restarted, facts, restart_kwargs)
    for (_host, commands), spec in zip(results, s, strict=True):
        assert "_group_restart" not in functions(commands)
        assert [c.dest for c in commands if hasattr(c, "dest")] == [stamps.stamp_path(spec) + ".tmp"]
        assert [c.get_raw_value() for c in commands if isinstance(c, StringCommand)][-1] == (
            f"rm -f {stamps.pending_stamp_path(spec)}")
    assert (f"service: sglang.service (rank 1 of node group tp16) {RECORDED_NOTE} (model revision ffffffffffff -> "
            "0123456789ab since the last record); every rank runs as wanted: recorded, no restart") in caplog.text
    # positive controls: rank 1 still runs the invocation the restart was to replace (the run was cut
    # off before it got there), or it crashed since systemd started it: the whole group restarts
    for late in (rank_facts(s[1], older(s[1]), invocation="old1", pending=announced(s[1], "old1")),
                 rank_facts(s[1], older(s[1]), invocation="new1", restarts=1, pending=announced(s[1], "old1"))):
        results = run_ops(M.group_restarted, [facts[0], late], restart_kwargs)
        assert [functions(commands) for _, commands in results] == [["_group_restart"], ["_group_restart"]]


def test_a_rank_left_failed_after_a_cut_off_restart_is_restarted_not_recorded():
    s = specs()
    facts = [rank_facts(s[0], older(s[0]), invocation="new0", pending=announced(s[0], "old0")),
             rank_facts(s[1], older(s[1]), active="failed", sub_state="failed", invocation="new1",
                        pending=announced(s[1], "old1"))]
    results = run_ops(M.group_restarted, facts, restart_kwargs)
    assert [functions(commands) for _, commands in results] == [["_group_restart"], ["_group_restart"]]


@pytest.mark.parametrize("leftover", [False, True], ids=["no-announcement", "recorded-announcement-left"])
def test_healthy_and_unchanged_is_a_no_op_on_every_rank(leftover):
    """Also with the announcement of a restart that happened and was recorded (the run was cut off
    between writing the stamp and removing the announcement): nothing to do."""
    s = specs()
    facts = [rank_facts(spec, stamp(spec), invocation=f"new{rank}",
                        pending=announced(spec, f"old{rank}") if leftover else None) for rank, spec in enumerate(s)]
    results = run_ops(M.group_restarted, facts, restart_kwargs)
    for host, commands in results:
        assert commands == []
        assert host.noop_description == "sglang.service runs as wanted on every rank of node group tp16: no restart"
    # and the readiness step agrees: nothing is pending on either rank
    ready = run_ops(M.group_ready, facts, lambda rank: {"spec": s[rank]})
    assert [commands for _, commands in ready] == [[], []]
