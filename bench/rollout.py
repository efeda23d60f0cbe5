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

With --before REF the rollout of that git revision (a throw-away worktree) is
rolled too, right before this tree's, so the two are measured side by side on
the same fleet. The rollout runs with SGC_ROLLOUT_PROFILE (rollout/profile.py):
its seconds per phase, operation and fact, per host, are printed and recorded.

    python -m bench.rollout [--keep] [--before REF]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from bench.results import record
from sandbox import hosts as sandbox_api

ROOT = Path(__file__).resolve().parent.parent
INDEXES = [15, 16, 17, 18, 19]
SERVERS = [f"sgc{i}" for i in INDEXES[1:]]
ENV = {"SGC_FLEET_INDEXES": "15-19", "SGC_FLEET_ROUTER": "sgc15", "PYINFRA_PROGRESS": "off"}
READY = re.compile(r"\[(sgc\d+)\].*ready: \S+ serves .* \((\d+(?:\.\d+)?) s to ready")


def _run(argv: list[str], timeout: float = 1200, cwd: Path = ROOT, env: dict | None = None) -> tuple[float, str, int]:
    started = time.monotonic()
    env = {**os.environ, **ENV, **(env or {})}
    if cwd != ROOT:  # another checkout's modules first (not this tree's editable install)
        env["PYTHONPATH"] = str(cwd)
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
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


ROLLOUT_CMD = [sys.executable, "-m", "rollout", "inventory/sandbox_fleet.py", "-q"]


def rolling_restart(tmp: Path, label: str, cwd: Path = ROOT) -> dict:
    """One rolling restart of every server (batch size 1) by the rollout in ``cwd``: its overhead and profile."""
    import json

    folder = _override(tmp / label, uuid.uuid4().hex[:8])
    profile_file = tmp / f"{label}.profile.json"
    took, out, rc = _run([*ROLLOUT_CMD, "--batch-size", "1", "--group-data", folder], cwd=cwd,
                         env={"SGC_ROLLOUT_PROFILE": str(profile_file)})
    assert rc == 0, out[-4000:]
    ready = _ready_seconds(out)
    assert set(ready) == set(SERVERS), (ready, out[-4000:])
    n = len(SERVERS)
    profile = json.loads(profile_file.read_text()) if profile_file.exists() else {}
    per_host = {key: round(value["s"] / n, 3) for key, value in profile.items()}
    if "phase:run" in profile:
        per_host["phase:startup and exit (outside run)"] = round((took - profile["phase:run"]["s"]) / n, 3)
    return {"s": took, "ready_s": sum(ready.values()), "overhead_per_host_s": (took - sum(ready.values())) / n,
            "profile_per_host_s": per_host}


def print_profile(label: str, per_host: dict[str, float], top: int = 25) -> None:
    print(f"bench: rollout {label}: profile, seconds per host (phases overlap: facts and ops run inside them)")
    ranked = sorted(per_host.items(), key=lambda kv: -kv[1])
    for key, seconds in [kv for kv in ranked if kv[0].startswith("phase:")] + \
            [kv for kv in ranked if not kv[0].startswith("phase:")][:top]:
        print(f"  {seconds:7.2f}  {key}")


def per_host_deploys(tmp: Path, label: str, cwd: Path = ROOT) -> tuple[float, float]:
    """The same restart as `pyinfra --limit HOST deploy.py` per server, in turn: (seconds, servers' ready s)."""
    total, ready = 0.0, {}
    folder = _override(tmp / f"{label}-per-host", uuid.uuid4().hex[:8])
    for name in SERVERS:
        took, out, rc = _run([sys.executable, "-m", "pyinfra", "-y", "--limit", name, "inventory/sandbox_fleet.py",
                              "--group-data", folder, "deploy.py"], cwd=cwd)
        assert rc == 0, out[-4000:]
        total += took
        ready.update(_ready_seconds(out))
    assert set(ready) == set(SERVERS), ready
    return total, sum(ready.values())


def measure(tmp: Path, before: Path | None = None) -> dict:
    """Per-host deploys, then the rollout; with ``before`` that revision's pair first (its own deploy code)."""
    took, out, rc = _run([*ROLLOUT_CMD, "--batch-size", "4"])
    assert rc == 0, out[-4000:]
    result: dict = {"converge_s": took}
    if before is not None:
        base_total, base_ready = per_host_deploys(tmp, "before", before)
        old = rolling_restart(tmp, "before", before)
        result |= {"baseline_before_s": base_total, "baseline_before_ready_s": base_ready,
                   "baseline_before_overhead_per_host_s": (base_total - base_ready) / len(SERVERS),
                   "rollout_before_s": old["s"], "rollout_before_ready_s": old["ready_s"],
                   "rollout_before_overhead_per_host_s": old["overhead_per_host_s"],
                   "rollout_before_profile_per_host_s": old["profile_per_host_s"]}
    base_total, base_ready = per_host_deploys(tmp, "baseline")
    new = rolling_restart(tmp, "rollout")
    return result | {
        "baseline_s": base_total, "rollout_s": new["s"], "baseline_ready_s": base_ready, "rollout_ready_s": new["ready_s"],
        "baseline_overhead_per_host_s": (base_total - base_ready) / len(SERVERS),
        "rollout_overhead_per_host_s": new["overhead_per_host_s"], "rollout_profile_per_host_s": new["profile_per_host_s"],
    }


@contextmanager
def checkout(ref: str | None, tmp: Path):
    """A throw-away worktree of ``ref`` (None: none)."""
    if ref is None:
        yield None
        return
    path = tmp / "before-tree"
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(path), ref], cwd=ROOT, check=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rollout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave the bench fleet running")
    parser.add_argument("--before", metavar="REF", help="also roll this git revision's rollout, side by side")
    args = parser.parse_args(argv)
    import tempfile

    try:
        sandbox_api.up(indexes=INDEXES)
        print(f"bench: rollout: converging a fleet of {len(SERVERS)} servers + 1 router (sgc15..sgc19) ...",
              flush=True)
        with tempfile.TemporaryDirectory() as tmp, checkout(args.before, Path(tmp)) as before:
            r = measure(Path(tmp), before)
        print(f"(c) rolling restart of {len(SERVERS)} servers, one at a time: rollout {r['rollout_s']:.1f} s vs "
              f"{len(SERVERS)} per-host deploys {r['baseline_s']:.1f} s (servers' own time to ready "
              f"{r['rollout_ready_s']:.1f} s / {r['baseline_ready_s']:.1f} s); overhead per host: rollout "
              f"{r['rollout_overhead_per_host_s']:.2f} s vs per-host deploy {r['baseline_overhead_per_host_s']:.2f} s "
              f"-> ratio {r['rollout_overhead_per_host_s'] / r['baseline_overhead_per_host_s']:.2f} "
              f"(first converge of the fleet: {r['converge_s']:.0f} s)", flush=True)
        figures = {key: r[key] for key in ("rollout_overhead_per_host_s", "baseline_overhead_per_host_s",
                                          "rollout_profile_per_host_s")}
        figures["rollout_overhead_over_per_host_deploys"] = (r["rollout_overhead_per_host_s"]
                                                             / r["baseline_overhead_per_host_s"])
        if "rollout_before_s" in r:
            before_ratio = r["rollout_before_overhead_per_host_s"] / r["baseline_before_overhead_per_host_s"]
            print_profile(f"before ({args.before})", r["rollout_before_profile_per_host_s"])
            print(f"(c) before ({args.before}): rollout {r['rollout_before_s']:.1f} s vs per-host deploys "
                  f"{r['baseline_before_s']:.1f} s (ready {r['rollout_before_ready_s']:.1f} s / "
                  f"{r['baseline_before_ready_s']:.1f} s); overhead per host: rollout "
                  f"{r['rollout_before_overhead_per_host_s']:.2f} s vs per-host deploy "
                  f"{r['baseline_before_overhead_per_host_s']:.2f} s -> ratio {before_ratio:.2f}; "
                  f"now {r['rollout_overhead_per_host_s']:.2f} s", flush=True)
            figures |= {key: r[key] for key in ("rollout_before_overhead_per_host_s",
                                                "baseline_before_overhead_per_host_s",
                                                "rollout_before_profile_per_host_s")}
            figures["rollout_before_overhead_over_per_host_deploys"] = before_ratio
        print_profile("now", r["rollout_profile_per_host_s"])
        record(figures)
    finally:
        if not args.keep:
            for index in INDEXES:
                sandbox_api.remove(f"sgc{index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
