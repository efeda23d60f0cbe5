"""Bench: a 3-host rollout of a revision the hosts lack, with peer seeding against all from the Hub.

A fleet of its own (sgc25..sgc27, servers only: inventory/sandbox_fleet.py with
SGC_FLEET_INDEXES=25-27 and no router), converged once. Then, twice per mode,
every host's model dir is removed and the rollout runs with a canary and one
batch of two, the Hub stand-in throttled to a fixed rate (all its clients
share it, like one uplink):

  hub:     `python -m rollout ... --canary 1 --batch-size 2 --no-seed`
           (every host downloads from the Hub);
  seeded:  the same without --no-seed (the canary downloads, the other two
           copy from it, rsync over ssh, and verify against the Hub's digests).

Figures: the Hub's file bytes served and the rollout's wall time, per mode,
and their ratios (seeded over hub; Hub bytes over the model's size).

    python -m bench.seeding [--rate-mbps 16] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.results import record
from sandbox import hosts as sandbox_api
from sandbox import hubd

ROOT = Path(__file__).resolve().parent.parent
INDEXES = [25, 26, 27]
NAMES = [f"sgc{i}" for i in INDEXES]
ENV = {"SGC_FLEET_INDEXES": "25-27", "SGC_FLEET_ROUTER": "", "PYINFRA_PROGRESS": "off"}
ROLLOUT = [sys.executable, "-m", "rollout", "inventory/sandbox_fleet.py", "-q"]


def _rollout(*args: str) -> tuple[float, str]:
    started = time.monotonic()
    proc = subprocess.run([*ROLLOUT, *args], cwd=ROOT, env={**os.environ, **ENV}, capture_output=True, text=True,
                          timeout=1800)
    took = time.monotonic() - started
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return took, proc.stdout + proc.stderr


def _set_rate(mbps: float | None) -> None:
    if mbps is None:
        hubd.THROTTLE_FILE.unlink(missing_ok=True)
    else:
        hubd.THROTTLE_FILE.write_text(f"{mbps}\n")
    time.sleep(1.0)  # the hub reads the file every 0.25 s


def model_path(host) -> str:
    """The pinned revision's dir the deploy converges on ``host`` (Spec.model_path: group_data/sandbox.py's model)."""
    from bench.noop import host_spec

    return host_spec(host.name, sandbox_api._read_state()["hosts"][host.name]).model_path


def one_round(hosts, seeded: bool) -> dict:
    for host in hosts:
        host.run(f"rm -rf {model_path(host)}")
    hubd.stats(reset=True)
    took, out = _rollout("--canary", "1", "--batch-size", "2", *([] if seeded else ["--no-seed"]))
    stats = hubd.stats()
    assert ("copy what they lack from sgc25" in out) is seeded, out[-3000:]
    return {"s": took, "hub_bytes": stats["file_bytes"]}


def measure(hosts, repeats: int) -> dict:
    marker = json.loads(hosts[0].run(f"cat {model_path(hosts[0])}/.sglang-converge.json").stdout)
    model_bytes = sum(marker["files"].values())
    runs: dict[str, list[dict]] = {"hub": [], "seeded": []}
    for _ in range(repeats):  # interleaved, so both modes see the same machine
        runs["hub"].append(one_round(hosts, seeded=False))
        runs["seeded"].append(one_round(hosts, seeded=True))
    out = {"model_bytes": model_bytes}
    for mode, rounds in runs.items():
        out[f"{mode}_s"] = statistics.median(r["s"] for r in rounds)
        out[f"{mode}_hub_bytes"] = statistics.median(r["hub_bytes"] for r in rounds)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.seeding", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate-mbps", type=float, default=16.0, help="the Hub stand-in's rate, all clients")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="leave the bench hosts running")
    args = parser.parse_args(argv)
    try:
        hosts = sandbox_api.up(indexes=INDEXES)
        print(f"bench: seeding: converging {', '.join(NAMES)} ...", flush=True)
        _rollout("--batch-size", "3")
        _set_rate(args.rate_mbps)
        r = measure(hosts, args.repeats)
    finally:
        _set_rate(None)
        if not args.keep:
            for name in NAMES:
                sandbox_api.remove(name)
    model = r["model_bytes"]
    print(f"(e) 3-host rollout of a missing revision, Hub at {args.rate_mbps:g} MB/s: peer seeding "
          f"{r['seeded_s']:.1f} s, Hub {r['seeded_hub_bytes'] / model:.2f}x the model; all from the Hub "
          f"{r['hub_s']:.1f} s, {r['hub_hub_bytes'] / model:.2f}x -> time ratio {r['seeded_s'] / r['hub_s']:.2f}, "
          f"Hub bytes ratio {r['seeded_hub_bytes'] / max(r['hub_hub_bytes'], 1):.2f} (median of {args.repeats})",
          flush=True)
    record({"seed_rollout_s": r["seeded_s"], "hub_only_rollout_s": r["hub_s"],
            "seed_hub_bytes_over_model": r["seeded_hub_bytes"] / model,
            "hub_only_hub_bytes_over_model": r["hub_hub_bytes"] / model,
            "seed_over_hub_only_s": r["seeded_s"] / r["hub_s"], "seed_model_bytes": model})
    return 0


if __name__ == "__main__":
    sys.exit(main())
