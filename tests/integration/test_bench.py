"""`make bench`, the README's benchmark command, in its quick mode (`make bench QUICK=1`: every part once,
at its smallest size): each part still runs to its figures, through the same entry point as a real
measurement, its figures in .sandbox/bench-quick.json (bench/results/latest.json, a real run's, is left
as it was). Nothing here times anything: benchmarks measure, this test only checks they run.

One `make bench QUICK=1 PART=...` per test, by the hosts each part boots (sgc9: noop, report, gates;
none: transfer). The fleet parts (rollout: sgc15-19, seeding: sgc25-27, staged: sgc35-39, scale:
sgc100-101) each converge a fleet of their own first, 5 to 8 minutes of the CI machine's 2 cores apiece:
past the CI budget (45 minutes cold), so `make test` leaves them to `make bench QUICK=1` (FLEET_PARTS,
run by hand; tests/unit/test_readme_commands.py lists them as not run by a test).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.integration.helpers import newcomer_env, ROOT

pytestmark = pytest.mark.sandbox

QUICK_RESULTS = ROOT / ".sandbox" / "bench-quick.json"
LATEST = ROOT / "bench" / "results" / "latest.json"

# PART=... -> (the lines each part prints, the figures it records)
PARTS = {
    "noop report gates": (["(a) no-op re-run: deploy ", "(b) report delay after the server became ready",
                           "(b) report delay after the server failed", "(g) readiness gates: "],
                          ["noop_s", "ansible_noop_s", "ansible_over_noop", "noop_over_floor", "ready_report_s",
                           "crash_report_s", "gates_s", "gates_over_restart"]),
    "transfer": (["MB: fetch_model ", "MB: hash_files "],  # (d) download 39 MB: ..., (d) verify 39 MB: ...
                 ["download_over_curl", "verify_over_sha256sum"]),
}
FLEET_PARTS = {  # `make bench QUICK=1 PART=...` by hand: see the docstring
    "seeding": (["(e) 3-host rollout of a missing revision"], ["seed_rollout_s", "seed_hub_bytes_over_model"]),
    "scale": (["bench: scale: (f) 2 hosts vs 1: dry run x"], ["scale_dry_2_over_1", "scale_noop_2_over_1"]),
    "staged": (["(h) 4-server rollout of new packages + a new revision: staged "],
               ["staged_rollout_over_unstaged"]),
    "rollout": (["(c) "], ["rollout_overhead_per_host_s"]),
}


def latest_figures() -> str | None:
    return LATEST.read_text() if LATEST.exists() else None


@pytest.mark.parametrize("part", PARTS, ids=[p.replace(" ", "+") for p in PARTS])
def test_make_bench_quick_runs_each_part_to_its_figures(part):
    lines, figures = PARTS[part]
    latest_before = latest_figures()
    env = newcomer_env()
    proc = subprocess.run(["make", "bench", "QUICK=1", f"PART={part}"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=2400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    missing = [line for line in lines if line not in out]
    assert not missing, (missing, out[-6000:])
    recorded = json.loads(QUICK_RESULTS.read_text())
    assert not [f for f in figures if not isinstance(recorded.get(f), int | float)], (figures, recorded)
    assert f"bench: figures in {QUICK_RESULTS}" in out
    assert latest_figures() == latest_before  # a real run's figures are not replaced by a quick one's
