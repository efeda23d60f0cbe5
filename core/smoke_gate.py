"""The correctness gate: once a restarted server passed the fingerprint and the speed gate, the
profile's ``smoke:`` checks (tasks/spec/smoke.py) run on the host (remote/smoke_check.py: each a
request at temperature 0, bounded) and every answer must match its regular expression. A server
that is up but broken (gibberish with /health 200: a bad kernel, a wrong quantization) fails
readiness like a crash (rolled back), with the prompt, what was wanted and what came back.

    ok = smoke_answers_right(state, host, spec)    # core/gates.py, after the speed gate
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from pyinfra import logger

from core.ops import gate_failed, read_host_json, stream
from core.paths import REMOTE_SRC_DIR, STATE_DIR
from core.server import local_url, script_command

if TYPE_CHECKING:
    from tasks.spec import Spec

SMOKE_SCRIPT = REMOTE_SRC_DIR / "smoke_check.py"
MAX_S = 60  # each check's request


def smoke_path(spec: Spec) -> str:
    return f"{STATE_DIR}/launch/{spec.unit_stem}.smoke.json"


def smoke_command(spec: Spec) -> str:
    checks = [check.model_dump(exclude_none=True) for check in spec.profile.smoke]
    return script_command(spec, SMOKE_SCRIPT, ["--url", local_url(spec), "--served-name", spec.served_model_name,
                                               "--checks", json.dumps(checks), "--max-s", str(MAX_S),
                                               "--out", smoke_path(spec)])


def wrong_answers(results: dict) -> list[str]:
    """One line per check whose answer did not match: the prompt, the regex, what came back."""
    lines = []
    for check in results.get("checks", []):
        if check.get("ok"):
            continue
        wanted = (f"a call of {check['tool']} with its required arguments" if check.get("tool") else "")
        regex = f"/{check['expect']}/" if check.get("expect") else ""
        wanted = f"{wanted} matching {regex}" if wanted and regex else wanted or regex
        lines.append(f"{check['prompt']!r} wanted {wanted}, got {str(check.get('got'))[:200]!r}")
    return lines


def right_answers(results: dict) -> list[str]:
    """One line per check that passed: the prompt and the answer (its first 120 characters)."""
    return [f"{check['prompt']!r} answered {str(check.get('got'))[:120]!r}"
            for check in results.get("checks", []) if check.get("ok")]


def smoke_answers_right(state, host, spec: Spec) -> bool:
    """Run the profile's smoke checks on the host and judge them (True when it has none)."""
    checks = spec.profile.smoke
    if not checks:
        return True
    if not stream(state, host, smoke_command(spec), MAX_S * len(checks) + 30, step="readiness",
                  changes=(smoke_path(spec),)):
        return False
    results = read_host_json(host, smoke_path(spec)) or {}
    wrong = wrong_answers(results)
    if wrong or len(results.get("checks", [])) != len(checks):
        return gate_failed(state, host, [f"readiness: smoke: {line}" for line in wrong]
                           or [f"readiness: smoke: {smoke_path(spec)} holds no answer for every check"])
    tools = sum(1 for check in checks if check.tool is not None)
    host.log(f"readiness: smoke checks passed: {len(checks)} of {len(checks)} (temperature 0"
             + (f"; {tools} tool call(s) parsed)" if tools else ")"), logger.warning)
    for line in right_answers(results):  # what the model said: the operator sees it is a real answer
        host.log(f"readiness: smoke: {line}", logger.warning)
    return True
