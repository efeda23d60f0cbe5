"""Bench: a 4-server rollout of new packages plus a new model revision, staged against unstaged.

A fleet of its own (sgc35 router, sgc36..sgc39 servers: inventory/sandbox_fleet.py with
SGC_FLEET_INDEXES=35-39), converged once on the default profile. Then, per round and mode, the
change - one more package (a new venv by content) and the next model revision (sandbox-tiny-next) -
rolled with a canary and batches of one:

  unstaged: `python -m rollout ... --canary 1 --batch-size 1 --no-stage` (each batch builds its
            venv and downloads its revision in its own run, then restarts);
  staged:   the same without --no-stage (after the canary, the other three stage at once, then
            each batch only drains, restarts, passes readiness and registers).

Between runs the fleet goes back to the default profile with keep_envs = keep_revisions = 1, so
every measured run builds and downloads again. Figures: each mode's wall time, their ratio
(``staged_rollout_over_unstaged``), and per host, from the rollout's own report
(SGC_ROLLOUT_REPORT): its time out of its router (drain to registered) beside its server's restart
and load (the unit's stop to its "fired up" line, bench/rollout.py own_time). The sandbox's hosts
share this machine's two cores: three stages at once share them too, where on real hosts each has
its own, so the ratio here is an upper bound of the real one.

    python -m bench.staged [--repeats 1] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.results import record
from sandbox import hosts as sandbox_api

ROOT = Path(__file__).resolve().parent.parent
INDEXES = [35, 36, 37, 38, 39]
SERVERS = [f"sgc{i}" for i in INDEXES[1:]]
ENV = {"SGC_FLEET_INDEXES": "35-39", "SGC_FLEET_ROUTER": "sgc35", "PYINFRA_PROGRESS": "off"}
ROLLOUT = [sys.executable, "-m", "rollout", "inventory/sandbox_fleet.py", "-q"]
EXTRA = "six==1.17.0"  # the package change: a small pure-Python wheel (a whole new venv all the same)


def _rollout(*args: str) -> tuple[float, str, dict]:
    with tempfile.NamedTemporaryFile(suffix=".json") as report:
        started = time.monotonic()
        proc = subprocess.run([*ROLLOUT, *args], cwd=ROOT, env={**os.environ, **ENV, "SGC_ROLLOUT_REPORT": report.name},
                              capture_output=True, text=True, timeout=3600)
        took = time.monotonic() - started
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        return took, proc.stdout + proc.stderr, json.loads(Path(report.name).read_text() or "{}")


def change() -> list[str]:
    packages = runpy.run_path(str(ROOT / "group_data" / "sandbox.py"))["packages"]
    return ["--data", f"packages={json.dumps([*packages, EXTRA])}", "--data", "model=sandbox-tiny-next"]


def one_round(staged: bool) -> dict:
    from bench.rollout import own_time

    _rollout("--batch-size", "4", "--data", "keep_envs=1", "--data", "keep_revisions=1")  # back, nothing kept
    took, out, results = _rollout("--canary", "1", "--batch-size", "1", *change(), *([] if staged else ["--no-stage"]))
    assert ("rollout: stage 1:" in out) is staged, out[-3000:]
    own = {name: own_time(name) for name in SERVERS}
    return {"s": took, "hosts": {name: {"out_of_router_s": results[name]["out_of_router_s"],
                                         "staged_s": results[name]["staged_s"],
                                         "restart_and_load_s": own[name]["own_s"]} for name in SERVERS}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.staged", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="leave the bench hosts running")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict]] = {"unstaged": [], "staged": []}
    try:
        sandbox_api.up(indexes=INDEXES)
        print(f"bench: staged: converging sgc35 (router), {', '.join(SERVERS)} ...", flush=True)
        _rollout("--batch-size", "4")
        for _ in range(args.repeats):  # interleaved, so both modes see the same machine
            runs["unstaged"].append(one_round(staged=False))
            runs["staged"].append(one_round(staged=True))
    finally:
        if not args.keep:
            for index in INDEXES:
                sandbox_api.remove(f"sgc{index}")
    s = {mode: statistics.median(r["s"] for r in rounds) for mode, rounds in runs.items()}
    print(f"(h) 4-server rollout of new packages + a new revision: staged {s['staged']:.1f} s, unstaged "
          f"{s['unstaged']:.1f} s -> {s['staged'] / s['unstaged']:.2f} (median of {args.repeats})", flush=True)
    for mode, rounds in runs.items():
        for name, host in rounds[-1]["hosts"].items():
            print(f"    {mode:8} {name}: out of its router {host['out_of_router_s'] or 0:.1f} s (restart and load "
                  f"{host['restart_and_load_s']:.1f} s)" + (f", staged in {host['staged_s']:.1f} s" if host["staged_s"]
                                                             else ""), flush=True)
    out_of_router = {mode: statistics.median(h["out_of_router_s"] or 0 for h in rounds[-1]["hosts"].values())
                     for mode, rounds in runs.items()}
    record({"staged_rollout_s": s["staged"], "unstaged_rollout_s": s["unstaged"],
            "staged_rollout_over_unstaged": s["staged"] / s["unstaged"],
            "staged_out_of_router_s": out_of_router["staged"], "unstaged_out_of_router_s": out_of_router["unstaged"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
