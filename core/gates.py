"""The gates a restarted server passes after it answers (README: What ready means), in order:
the launch fingerprint (what SGLang chose against the plan), then the decode speed (with a draft,
its accept length first, from the same measurement: core/draft_gate.py), then the profile's smoke
checks (core/smoke_gate.py: the answers are right). Each records
its own failure on the run state (core/ops.gate_failed) and returns False; the first failure
stops the chain (a server that chose the wrong KV pool is not worth timing). What they took is
logged ("readiness: gates passed in 3.1 s (fingerprint 0.0 s, speed 3.1 s)": make bench reads it).

    ok = gates_pass(state, host, spec, plan, last_good_dir(spec))   # core/last_good.py, readiness
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from pyinfra import logger

from core.fingerprint import LaunchPlan, launch_matches_plan
from core.smoke_gate import smoke_answers_right
from core.speed_gate import decode_speed_as_expected

if TYPE_CHECKING:
    from tasks.spec import Spec


def gates_pass(state, host, spec: Spec, plan: LaunchPlan, last_good_dir: str) -> bool:
    """Every gate after /health, in order; False at the first that fails (its lines are logged)."""
    gates = (("fingerprint", lambda: launch_matches_plan(state, host, spec, plan)),
             ("speed", lambda: decode_speed_as_expected(state, host, spec, last_good_dir)),
             ("smoke", lambda: smoke_answers_right(state, host, spec)))
    took: list[tuple[str, float]] = []
    for name, gate in gates:
        started = time.monotonic()
        passed = gate()
        took.append((name, time.monotonic() - started))
        if not passed:
            return False
    host.log(f"readiness: gates passed in {sum(s for _, s in took):.1f} s ("
             + ", ".join(f"{name} {s:.1f} s" for name, s in took) + ")", logger.warning)
    return True
