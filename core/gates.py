"""The gates a restarted server passes after it answers (README: What ready means), in order:
the launch fingerprint (what SGLang chose against the plan), then the decode speed (with a draft,
its accept length first, from the same measurement: core/draft_gate.py), then the profile's smoke
checks (core/smoke_gate.py: the answers are right). Each records its own failure on the run state
(core/ops.gate_failed) and returns False. After a restart the first failure stops the chain (a
server that chose the wrong KV pool is not worth timing); `rollout --verify` (tasks/verify.py) runs
every gate. What they took is logged ("readiness: gates passed in 3.1 s (fingerprint 0.0 s, speed
3.1 s, smoke 0.1 s)": make bench reads it).

    ok = gates_pass(state, host, spec, plan, last_good_dir(spec))   # core/last_good.py, readiness
    verdicts = run_gates(state, host, spec, plan, last_good_dir(spec), every=True)   # verify
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pyinfra import logger

from core.fingerprint import LaunchPlan, launch_matches_plan
from core.smoke_gate import smoke_answers_right
from core.speed_gate import decode_speed_as_expected

if TYPE_CHECKING:
    from tasks.spec import Spec

Verdict = tuple[str, bool, float]  # (gate, passed, seconds)


def _gates(state, host, spec: Spec, plan: LaunchPlan, last_good_dir: str) -> list[tuple[str, Callable[[], bool]]]:
    return [("fingerprint", lambda: launch_matches_plan(state, host, spec, plan)),
            ("speed", lambda: decode_speed_as_expected(state, host, spec, last_good_dir)),
            ("smoke", lambda: smoke_answers_right(state, host, spec))]


def run_gates(state, host, spec: Spec, plan: LaunchPlan, last_good_dir: str, every: bool = False) -> list[Verdict]:
    """Each gate's verdict, in order; without ``every``, none after the first that fails."""
    verdicts: list[Verdict] = []
    for name, gate in _gates(state, host, spec, plan, last_good_dir):
        started = time.monotonic()
        passed = gate()
        verdicts.append((name, passed, time.monotonic() - started))
        if not passed and not every:
            break
    return verdicts


def took(verdicts: list[Verdict]) -> str:
    """'0.3 s (fingerprint 0.0 s, speed 0.2 s, smoke 0.1 s)'."""
    return (f"{sum(s for _, _, s in verdicts):.1f} s ("
            + ", ".join(f"{name} {s:.1f} s" + ("" if ok else " FAILED") for name, ok, s in verdicts) + ")")


def gates_pass(state, host, spec: Spec, plan: LaunchPlan, last_good_dir: str) -> bool:
    """Every gate after /health, in order; False at the first that fails (its lines are logged)."""
    verdicts = run_gates(state, host, spec, plan, last_good_dir)
    if not all(ok for _, ok, _ in verdicts):
        return False
    host.log(f"readiness: gates passed in {took(verdicts)}", logger.warning)
    return True
