"""The draft gate: with a draft model (speculative decoding, the profile's ``draft:``), the speed
gate's measurement (remote/decode_speed.py) also sums the draft's verify steps that each /generate
answer reports (meta_info spec_verify_ct, sglang 0.5.23 managers/tokenizer_manager.py:3149-3172)
into the draft's accept length: completion tokens per verify step, the bonus token included, so
1.0 means every draft token was rejected. Below the profile's ``expect: {min_accept_length}``
(default 1.5, tasks/spec/profile.py) readiness fails like a crash (rolled back): a draft that
accepts nothing (a mismatched checkpoint, a broken hidden-state capture) serves correct text, only
slower than without it. A server that reports no verify steps at all runs without the draft.

    problems = compare(measured, 1.5)                   # the speed JSON, the minimum
    ok = draft_accepted(state, host, spec, measured)    # core/speed_gate.py, right after measuring
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyinfra import logger

from core.ops import gate_failed

if TYPE_CHECKING:
    from tasks.spec import Spec

NOTHING_ACCEPTED = 1.0  # one token per verify step: the bonus token alone


def compare(measured: dict[str, Any], minimum: float) -> list[str]:
    """Problems: no verify steps reported, or an accept length below ``minimum``."""
    verify_ct, length = measured.get("verify_ct"), measured.get("accept_length")
    if not verify_ct or not isinstance(length, (int, float)):
        return ["a draft is configured but the server reports no speculative decoding (no spec_verify_ct in "
                "/generate's meta_info)"]
    if length >= minimum:
        return []
    how_much = "accepts nothing" if length <= NOTHING_ACCEPTED else "accepts too little"
    return [f"the draft {how_much}: accept length {length:.2f} over {verify_ct} verify steps, below "
            f"min_accept_length {minimum:g}"]


def draft_accepted(state, host, spec: Spec, measured: dict[str, Any]) -> bool:
    """Judge the measured accept length (True without a draft); a problem is recorded as the readiness failure."""
    minimum = spec.profile.min_accept_length
    if minimum is None:
        return True
    problems = compare(measured, minimum)
    if problems:
        return gate_failed(state, host, [f"readiness: draft gate: {line}" for line in problems])
    host.log(f"readiness: draft accepted: accept length {measured['accept_length']:.2f} "
             f"(min_accept_length {minimum:g})", logger.warning)
    return True
