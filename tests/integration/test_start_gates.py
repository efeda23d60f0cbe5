"""Start progress on a converged sandbox host (the shared sgc280): the readiness wait follows SGLang's
start lines per rank and shows them; a rank that hangs in loading without a line (the stand-in's
SANDBOX_HANG_RANK) fails the start once nothing moved for start_stall_s, naming the phase, the rank
and its last line, instead of at readiness_timeout_s; the last good configuration serves again."""

from __future__ import annotations

import re
import runpy

import pytest

from tests.integration.helpers import ROOT, grand_total, pyinfra, shared_converged_host, unit_props

pytestmark = pytest.mark.sandbox

TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def host(request):
    return shared_converged_host(request, TIMINGS)


def test_a_rank_hung_in_loading_fails_within_start_stall_s_names_it_and_is_rolled_back(host, tmp_path):
    before = unit_props(host, "sglang.service")
    env = {**runpy.run_path(str(ROOT / "group_data" / "sandbox.py"))["extra_env"], "SANDBOX_HANG_RANK": "5"}
    (tmp_path / "sandbox.py").write_text(f"extra_env = {env!r}\nstart_stall_s = 15\n")
    proc = pyinfra("deploy.py", "--group-data", str(tmp_path), limit=host.name)
    assert proc.returncode != 0, proc.out[-4000:]
    stall = re.search(r"FAILED: the start made no progress for (\d+) s \(start_stall_s 15\): "
                      r"stuck in 'loading weights': TP5; (.*)", proc.out)
    assert stall, proc.out[-5000:]
    assert 15 <= int(stall.group(1)) <= 20  # within the bound plus a journal poll, not readiness_timeout_s (120)
    assert "loading weights (TP5)" in stall.group(2) and "scheduler started (TP0-TP4, TP6, TP7)" in stall.group(2)
    last = re.search(r"TP5 last line: \d+ s ago: (.*)", proc.out)
    assert last and "TP5] Load weight begin." in last.group(1), proc.out[-4000:]
    # the run showed the phases as it went
    assert re.search(r"waiting: \d+ s, .*; start: .*loading weights \(TP5\)", proc.out), proc.out[-4000:]
    assert "readiness: rolled back: sglang.service serves the last good configuration again" in proc.out
    after = unit_props(host, "sglang.service")
    assert after["ActiveState"] == "active" and after["MainPID"] != before["MainPID"]
    assert host.run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health").stdout == "200"
    again = pyinfra("deploy.py", limit=host.name)
    assert again.returncode == 0 and grand_total(again.out)[:2] == (0, 0), again.out[-4000:]
