"""Bench: what the rolling rollout itself costs per host, against plain per-host deploys.

A fleet of its own (sgc15 router, sgc16..sgc19 servers: inventory/sandbox_fleet.py
with SGC_FLEET_INDEXES=15-19), converged once. Then every server is restarted
twice (an extra_env value changes), both times one host at a time, so both
include the same drain / restart / readiness / registration work:

  baseline: `pyinfra -y --limit HOST inventory/sandbox_fleet.py deploy.py`
            for each server in turn (the sum of the per-host deploy times);
  rollout:  `python -m rollout inventory/sandbox_fleet.py --batch-size 1`
            (fleet preflight, per-batch connect + prepare, summary).

Overhead = wall time minus the servers' own time to ready (the readiness
step's "(X s to ready" lines), per host; the result is the ratio of the
rollout's overhead per host to the baseline's.

    python -m bench.rollout [--keep]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

from bench.results import record
from sandbox import hosts as sandbox_api

ROOT = Path(__file__).resolve().parent.parent
INDEXES = [15, 16, 17, 18, 19]
SERVERS = [f"sgc{i}" for i in INDEXES[1:]]
ENV = {"SGC_FLEET_INDEXES": "15-19", "SGC_FLEET_ROUTER": "sgc15", "PYINFRA_PROGRESS": "off"}
READY = re.compile(r"\[(sgc\d+)\].*ready: \S+ serves .* \((\d+(?:\.\d+)?) s to ready")


def _run(argv: list[str], timeout: float = 1200) -> tuple[float, str, int]:
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=timeout)
    return time.monotonic() - started, proc.stdout + proc.stderr, proc.returncode


def _override(folder: Path, tag: str) -> str:
    """A --group-data dir that changes the servers' environment (a restart everywhere)."""
    import ast

    tree = ast.parse((ROOT / "group_data" / "sandbox.py").read_text())
    env: dict[str, str] = next((ast.literal_eval(n.value) for n in tree.body
                if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "extra_env"), {})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sandbox.py").write_text(f"extra_env = {dict(env, SGC_BENCH=tag)!r}\n")
    return str(folder)


def _ready_seconds(output: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2)) for m in READY.finditer(output)}


def measure(tmp: Path) -> dict:
    rollout_cmd = [sys.executable, "-m", "rollout", "inventory/sandbox_fleet.py", "-q"]
    took, out, rc = _run([*rollout_cmd, "--batch-size", "4"])
    assert rc == 0, out[-4000:]
    converge_s = took

    base_total, base_ready = 0.0, {}
    folder = _override(tmp / "baseline", uuid.uuid4().hex[:8])
    for name in SERVERS:
        took, out, rc = _run([sys.executable, "-m", "pyinfra", "-y", "--limit", name, "inventory/sandbox_fleet.py",
                              "--group-data", folder, "deploy.py"])
        assert rc == 0, out[-4000:]
        base_total += took
        base_ready.update(_ready_seconds(out))
    assert set(base_ready) == set(SERVERS), base_ready

    folder = _override(tmp / "rollout", uuid.uuid4().hex[:8])
    took, out, rc = _run([*rollout_cmd, "--batch-size", "1", "--group-data", folder])
    assert rc == 0, out[-4000:]
    roll_ready = _ready_seconds(out)
    assert set(roll_ready) == set(SERVERS), roll_ready
    n = len(SERVERS)
    base_overhead = (base_total - sum(base_ready.values())) / n
    roll_overhead = (took - sum(roll_ready.values())) / n
    return {
        "converge_s": converge_s, "baseline_s": base_total, "rollout_s": took,
        "baseline_ready_s": sum(base_ready.values()), "rollout_ready_s": sum(roll_ready.values()),
        "baseline_overhead_per_host_s": base_overhead, "rollout_overhead_per_host_s": roll_overhead,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rollout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave the bench fleet running")
    args = parser.parse_args(argv)
    import tempfile

    try:
        sandbox_api.up(indexes=INDEXES)
        print(f"bench: rollout: converging a fleet of {len(SERVERS)} servers + 1 router (sgc15..sgc19) ...",
              flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            r = measure(Path(tmp))
        print(f"(c) rolling restart of {len(SERVERS)} servers, one at a time: rollout {r['rollout_s']:.1f} s vs "
              f"{len(SERVERS)} per-host deploys {r['baseline_s']:.1f} s (servers' own time to ready "
              f"{r['rollout_ready_s']:.1f} s / {r['baseline_ready_s']:.1f} s); overhead per host: rollout "
              f"{r['rollout_overhead_per_host_s']:.2f} s vs per-host deploy {r['baseline_overhead_per_host_s']:.2f} s "
              f"-> ratio {r['rollout_overhead_per_host_s'] / r['baseline_overhead_per_host_s']:.2f} "
              f"(first converge of the fleet: {r['converge_s']:.0f} s)", flush=True)
        record({key: r[key] for key in ("rollout_overhead_per_host_s", "baseline_overhead_per_host_s")}
               | {"rollout_overhead_over_per_host_deploys":
                  r["rollout_overhead_per_host_s"] / r["baseline_overhead_per_host_s"]})
    finally:
        if not args.keep:
            for index in INDEXES:
                sandbox_api.remove(f"sgc{index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
