"""The speed gate: once a restarted server serves as planned, a short, bounded decode measurement
on the host (remote/decode_speed.py: concurrency 1 and 4, fixed prompt and output length) is held
against the host's last good figure (kept with the last good configuration, speed.json) and the
profile's floor (``expect: {min_decode_tok_s}``). Below ``perf_tolerance`` x the last good figure,
or below the floor, readiness fails like a crash (rolled back). With a draft model the same
measurement gives the draft's accept length, judged first (core/draft_gate.py: a draft that accepts
nothing is why such a server is slow), so it runs even with perf_tolerance 0 and no floor.

    ok = decode_speed_as_expected(state, host, spec)    # in the readiness step, after the fingerprint
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyinfra import logger

from core.draft_gate import draft_accepted
from core.ops import gate_failed, read_host_json, stream
from core.paths import REMOTE_SRC_DIR, STATE_DIR
from core.server import local_url, script_command

if TYPE_CHECKING:
    from tasks.spec import Spec

SPEED_SCRIPT = REMOTE_SRC_DIR / "decode_speed.py"
CONCURRENCY = (1, 4)


def speed_path(spec: Spec) -> str:
    """What the last measurement gave (copied with the last good configuration as speed.json)."""
    return f"{STATE_DIR}/launch/{spec.unit_stem}.speed.json"


def speed_command(spec: Spec, url: str) -> str:
    return script_command(spec, SPEED_SCRIPT, ["--url", url, "--tokens", str(spec.speed_check_tokens), "--concurrency",
                                               ",".join(map(str, CONCURRENCY)), "--max-s", f"{spec.speed_check_max_s:g}",
                                               "--out", speed_path(spec)])


def compare(measured: dict[str, Any], last_good: dict[str, Any] | None, tolerance: float,
            floor: float | None) -> list[str]:
    """Problems: a concurrency's tok/s below tolerance x the last good one, or c1 below the floor."""
    problems = []
    if floor and measured.get("c1", {}).get("tok_s", 0) < floor:
        problems.append(f"decode at concurrency 1 is {measured['c1']['tok_s']:g} tok/s, below the profile's floor "
                        f"of {floor:g} tok/s")
    if tolerance and last_good and last_good.get("tokens") == measured.get("tokens"):
        for key in sorted(k for k in measured if k.startswith("c") and k in last_good):
            now, before = measured[key]["tok_s"], last_good[key]["tok_s"]
            if before and now < tolerance * before:
                problems.append(f"decode at concurrency {key[1:]} is {now:g} tok/s, {now / before:.0%} of this "
                                f"host's last good {before:g} tok/s (perf_tolerance {tolerance:g})")
    return problems


def decode_speed_as_expected(state, host, spec: Spec, last_good_dir: str) -> bool:
    """Measure on the host and judge; a problem is recorded as the readiness failure."""
    gated = bool(spec.perf_tolerance or spec.profile.expect.min_decode_tok_s)
    if not gated and spec.draft is None:
        return True
    bound = int(spec.speed_check_max_s * (len(CONCURRENCY) + 1)) + 30
    if not stream(state, host, speed_command(spec, local_url(spec)), bound, step="readiness",
                  changes=(speed_path(spec),)):
        return False
    measured = read_host_json(host, speed_path(spec))
    if not draft_accepted(state, host, spec, measured):
        return False
    if not gated:
        return True
    last_good = read_host_json(host, f"{last_good_dir}/speed.json")
    problems = compare(measured, last_good, spec.perf_tolerance, spec.profile.expect.min_decode_tok_s)
    if not problems:
        against = (f"last good c1 {last_good['c1']['tok_s']:g} tok/s" if last_good and "c1" in last_good
                   else "no last good figure yet on this host")
        host.log("readiness: decode speed as expected: " + ", ".join(
            f"concurrency {k[1:]} {v['tok_s']:g} tok/s" for k, v in sorted(measured.items()) if k.startswith("c"))
            + f" ({against})", logger.warning)
        return True
    return gate_failed(state, host, [f"readiness: speed gate: {line}" for line in problems])
