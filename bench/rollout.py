"""Bench: what the rolling rollout itself costs per host, against plain per-host deploys.

A fleet of its own (sgc15 router, sgc16..sgc19 servers: inventory/sandbox_fleet.py
with SGC_FLEET_INDEXES=15-19), converged once. Then every server is restarted
twice (an extra_env value changes), both times one host at a time, so both
include the same drain / restart / readiness / registration work:

  baseline: `pyinfra -y --limit HOST inventory/sandbox_fleet.py deploy.py`
            for each server in turn (the sum of the per-host deploy times);
  rollout:  `python -m rollout inventory/sandbox_fleet.py --batch-size 1`
            (fleet preflight, per-batch connect + prepare, summary).

Overhead = wall time minus the servers' own time, per host; the result is
the ratio of the rollout's overhead per host to the baseline's. A server's
own time runs from systemd starting to stop it (the unit's
ActiveExitTimestampMonotonic: `systemctl restart` begins with the stop) to
its own "fired up and ready to roll" log line (the journal's monotonic
timestamp of it), read on the host after the run: the stop (SIGTERM, in-flight
requests, the TP ranks exiting) and the load are the server's behaviour, not
the deploy's. Also reported, as ``*_beyond_wait_*``: the older figure, wall
time minus the readiness step's "(X s to ready" lines only, which charges the
stop, and the controller's work while the server loads, to the overhead.
``rollout_marginal_overhead_per_host_s``: the server batches' own overhead
(their "batch N done in X s" lines minus the servers' own time), without what
a rollout pays once (start-up, fleet preflight, router batch, summary): what
each more host adds.

With --before REF the rollout of that git revision (a throw-away worktree) is
rolled too, right before this tree's, so the two are measured side by side on
the same fleet; --rounds N repeats both, interleaved, and reports medians.
The rollout runs with SGC_ROLLOUT_PROFILE (rollout/profile.py):
its seconds per phase, operation and fact, per host, are printed and recorded.

    python -m bench.rollout [--keep] [--before REF] [--rounds N]
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
BATCH_DONE = re.compile(r"^rollout: batch (\S+) done in (\d+(?:\.\d+)?) s", re.M)
READY = re.compile(r"\[(sgc\d+)\].*ready: \S+ serves .* \((\d+(?:\.\d+)?) s to ready")
UNIT = "sglang.service"
# on the host: the unit's last stop began (systemd) and its server's first ready line after that (journal),
# both CLOCK_MONOTONIC microseconds
_OWN_TIME_PY = f"""
import json, subprocess
props = dict(line.split("=", 1) for line in subprocess.run(
    ["systemctl", "show", "{UNIT}", "-p", "ActiveExitTimestampMonotonic,InactiveEnterTimestampMonotonic"],
    capture_output=True, text=True).stdout.split())
stop, stopped = int(props["ActiveExitTimestampMonotonic"]), int(props["InactiveEnterTimestampMonotonic"])
out = subprocess.run(["journalctl", "-u", "{UNIT}", "-o", "json", "--output-fields=MESSAGE", "--no-pager",
                      "-g", "fired up and ready to roll"], capture_output=True, text=True).stdout
ready = [int(json.loads(line)["__MONOTONIC_TIMESTAMP"]) for line in out.splitlines() if line.strip()]
ready = min((t for t in ready if t > stopped), default=0)
print(json.dumps({{"stop_s": (stopped - stop) / 1e6, "own_s": (ready - stop) / 1e6 if ready else None}}))
"""


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


def own_time(name: str) -> dict[str, float]:
    """The server's own time in its last restart, read on the host: {"stop_s", "own_s"} (stop began to ready)."""
    import json

    proc = sandbox_api.get_host(name).run(["python3", "-c", _OWN_TIME_PY], timeout=60)
    times = json.loads(proc.stdout)
    assert times["own_s"] is not None and times["stop_s"] >= 0, (name, times)
    return times


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
    own = {name: own_time(name) for name in SERVERS}
    n = len(SERVERS)
    profile = json.loads(profile_file.read_text()) if profile_file.exists() else {}
    per_host = {key: round(value["s"] / n, 3) for key, value in profile.items()}
    if "phase:run" in profile:
        per_host["phase:startup and exit (outside run)"] = round((took - profile["phase:run"]["s"]) / n, 3)
    own_s, stop_s = sum(t["own_s"] for t in own.values()), sum(t["stop_s"] for t in own.values())
    server_batches_s = sum(float(s) for label, s in BATCH_DONE.findall(out) if not label.startswith("router"))
    return {"s": took, "ready_s": sum(ready.values()), "own_s": own_s, "stop_s": stop_s,
            "overhead_per_host_s": (took - own_s) / n, "marginal_overhead_per_host_s": (server_batches_s - own_s) / n,
            "overhead_beyond_wait_per_host_s": (took - sum(ready.values())) / n, "profile_per_host_s": per_host}


def print_profile(label: str, per_host: dict[str, float], top: int = 25) -> None:
    print(f"bench: rollout {label}: profile, seconds per host (phases overlap: facts and ops run inside them)")
    ranked = sorted(per_host.items(), key=lambda kv: -kv[1])
    for key, seconds in [kv for kv in ranked if kv[0].startswith("phase:")] + \
            [kv for kv in ranked if not kv[0].startswith("phase:")][:top]:
        print(f"  {seconds:7.2f}  {key}")


def per_host_deploys(tmp: Path, label: str, cwd: Path = ROOT) -> dict:
    """The same restart as `pyinfra --limit HOST deploy.py` per server, in turn: its overhead (as rolling_restart)."""
    total, ready, own = 0.0, {}, {}
    folder = _override(tmp / f"{label}-per-host", uuid.uuid4().hex[:8])
    for name in SERVERS:
        took, out, rc = _run([sys.executable, "-m", "pyinfra", "-y", "--limit", name, "inventory/sandbox_fleet.py",
                              "--group-data", folder, "deploy.py"], cwd=cwd)
        assert rc == 0, out[-4000:]
        total += took
        ready.update(_ready_seconds(out))
        own[name] = own_time(name)
    assert set(ready) == set(SERVERS), ready
    own_s, stop_s = sum(t["own_s"] for t in own.values()), sum(t["stop_s"] for t in own.values())
    return {"s": total, "ready_s": sum(ready.values()), "own_s": own_s, "stop_s": stop_s,
            "overhead_per_host_s": (total - own_s) / len(SERVERS),
            "overhead_beyond_wait_per_host_s": (total - sum(ready.values())) / len(SERVERS)}


def pair(tmp: Path, label: str, cwd: Path = ROOT) -> dict:
    """Per-host deploys, then the rollout, both by the code in ``cwd``; their overheads and the rollout's ratio."""
    base = per_host_deploys(tmp, label, cwd)
    roll = rolling_restart(tmp, label, cwd)
    return {"baseline": base, "rollout": roll,
            "ratio": roll["overhead_per_host_s"] / base["overhead_per_host_s"],
            "ratio_beyond_wait": roll["overhead_beyond_wait_per_host_s"] / base["overhead_beyond_wait_per_host_s"]}


def measure(tmp: Path, before: Path | None = None, rounds: int = 1) -> dict:
    """Converge, then ``rounds`` rounds: ``before``'s pair (its own deploy code) and this tree's, interleaved."""
    took, out, rc = _run([*ROLLOUT_CMD, "--batch-size", "4"])
    assert rc == 0, out[-4000:]
    result: dict = {"converge_s": took, "now": [], "before": []}
    for i in range(rounds):
        if before is not None:
            result["before"].append(pair(tmp, f"before-{i}", before))
        result["now"].append(pair(tmp, f"now-{i}", ROOT))
    return result


def summarize(pairs: list[dict]) -> dict:
    """Medians over rounds: each figure, and the profile of the round whose rollout overhead is the median."""
    from statistics import median

    def med(side: str, key: str) -> float:
        return median(p[side][key] for p in pairs)

    by_overhead = sorted(pairs, key=lambda p: p["rollout"]["overhead_per_host_s"])
    n = len(SERVERS)
    return {
        "rollout_overhead_per_host_s": med("rollout", "overhead_per_host_s"),
        "baseline_overhead_per_host_s": med("baseline", "overhead_per_host_s"),
        "rollout_overhead_over_per_host_deploys": median(p["ratio"] for p in pairs),
        "rollout_overhead_beyond_wait_per_host_s": med("rollout", "overhead_beyond_wait_per_host_s"),
        "baseline_overhead_beyond_wait_per_host_s": med("baseline", "overhead_beyond_wait_per_host_s"),
        "rollout_overhead_beyond_wait_over_per_host_deploys": median(p["ratio_beyond_wait"] for p in pairs),
        "rollout_marginal_overhead_per_host_s": med("rollout", "marginal_overhead_per_host_s"),
        "rollout_server_stop_per_host_s": median(p["rollout"]["stop_s"] / n for p in pairs),
        "rollout_server_own_per_host_s": median(p["rollout"]["own_s"] / n for p in pairs),
        "rollout_s": med("rollout", "s"), "baseline_s": med("baseline", "s"),
        "rollout_profile_per_host_s": by_overhead[len(by_overhead) // 2]["rollout"]["profile_per_host_s"],
        "rounds": len(pairs),
    }


def describe(f: dict) -> str:
    return (f"rolling restart of {len(SERVERS)} servers, one at a time ({f['rounds']} round(s), medians): "
            f"rollout {f['rollout_s']:.1f} s vs {len(SERVERS)} per-host deploys {f['baseline_s']:.1f} s; the servers' "
            f"own time per host {f['rollout_server_own_per_host_s']:.1f} s (of it stopping "
            f"{f['rollout_server_stop_per_host_s']:.1f} s); overhead per host: rollout "
            f"{f['rollout_overhead_per_host_s']:.2f} s vs per-host deploy {f['baseline_overhead_per_host_s']:.2f} s "
            f"-> ratio {f['rollout_overhead_over_per_host_deploys']:.2f}; beyond the readiness wait only (the older "
            f"figure: stop counted as overhead): {f['rollout_overhead_beyond_wait_per_host_s']:.2f} s vs "
            f"{f['baseline_overhead_beyond_wait_per_host_s']:.2f} s; what each more host adds (the server batches "
            f"only, without start-up, preflight, router batch, summary): {f['rollout_marginal_overhead_per_host_s']:.2f} s")


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
    parser.add_argument("--rounds", type=int, default=1, help="rounds (interleaved with --before's): medians")
    args = parser.parse_args(argv)
    import tempfile

    try:
        sandbox_api.up(indexes=INDEXES)
        print(f"bench: rollout: converging a fleet of {len(SERVERS)} servers + 1 router (sgc15..sgc19) ...",
              flush=True)
        with tempfile.TemporaryDirectory() as tmp, checkout(args.before, Path(tmp)) as before:
            r = measure(Path(tmp), before, max(1, args.rounds))
        now = summarize(r["now"])
        figures = {key: value for key, value in now.items() if key not in ("rollout_s", "baseline_s", "rounds")}
        if r["before"]:
            old = summarize(r["before"])
            print_profile(f"before ({args.before})", old["rollout_profile_per_host_s"])
            print(f"(c) before ({args.before}) {describe(old)}", flush=True)
            figures |= {key.replace("rollout_", "rollout_before_", 1).replace("baseline_", "baseline_before_", 1): value
                        for key, value in old.items() if key not in ("rollout_s", "baseline_s", "rounds")}
        print_profile("now", now["rollout_profile_per_host_s"])
        print(f"(c) {describe(now)} (first converge of the fleet: {r['converge_s']:.0f} s)", flush=True)
        record(figures)
    finally:
        if not args.keep:
            for index in INDEXES:
                sandbox_api.remove(f"sgc{index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
