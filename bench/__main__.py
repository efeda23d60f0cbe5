"""`make bench`: the deploy's costs as ratios against a baseline measured side by side.

(a) bench/noop.py: no-op re-run of the deploy on a converged sandbox host,
    beside the same checks as an Ansible playbook and the floor (every
    command the deploy sends, in one ssh round trip);
(b) delay between the server becoming ready (or failing) and the deploy
    reporting it, against the reference incident's hand-written loop
    (every 10 s: `systemctl is-active`, then curl), run on the host at the
    same time as the deploy's readiness step;
(c) bench/rollout.py: the rolling rollout's overhead per host;
(d) bench/transfer.py: the model download against curl, its content
    verification against sha256sum;
(e) bench/seeding.py: a 3-host rollout of a missing revision with peer
    seeding against all from the Hub (Hub bytes and wall time);
(f) bench/scale.py: the dry run and the no-op re-run over 1, 10, 20, 50
    hosts at once (clones of one converged host; N capped by the RAM left),
    against one host;
(g) bench/gates.py: what the readiness gates (fingerprint, speed, ...)
    add to a restart, against the same restart with them turned off;
(h) bench/staged.py: a 4-server rollout of new packages plus a new revision,
    staged (stage then switch) against unstaged, and each host's time out of
    its router beside its restart and load.

Every figure also goes to bench/results/latest.json (bench/results.py); the
run ends with a table of every figure there, its goal and whether it is met
(bench/table.py). `--part noop` (report, rollout, transfer, seeding) runs one part:
its figures replace theirs in latest.json, the others' stay (scale: --part scale).

Absolute seconds depend on the machine; the ratios are the result. Nothing
here is asserted: tests assert behaviour, benchmarks measure.

`--quick` (`make bench QUICK=1`) runs every part once at its smallest size (one
round, a 40 MB transfer, scale over 1 and 2 hosts), its figures in
.sandbox/bench-quick.json: not a measurement, a check that every part still
runs (`make test` runs it: tests/integration/test_bench.py).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench import results
from bench.results import record, start
from bench.table import main as table
from sandbox import hosts as sandbox_api

ROOT = Path(__file__).resolve().parent.parent
INDEX = 9  # a host of its own: benchmarks can run beside other sandbox hosts
HOST = f"sgc{INDEX}"
PYINFRA = [sys.executable, "-m", "pyinfra"]

REFERENCE_LOOP = r"""
start=$(date +%s.%N)
while true; do
  sleep 10
  if [ "$(systemctl is-active sglang.service)" = failed ] || [ "$(systemctl show sglang.service -p NRestarts --value)" != "$R0" ]; then
    echo "failed $(date +%s.%N)"; exit 0
  fi
  if curl -sf -o /dev/null http://127.0.0.1:30000/health; then echo "ready $(date +%s.%N)"; exit 0; fi
done
"""


def pyinfra(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*PYINFRA, "-y", "--limit", HOST, "inventory/sandbox.py", *args], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, **(env or {})})


def _stream_until(proc: subprocess.Popen, pattern: str) -> float | None:
    for line in proc.stdout:  # type: ignore[union-attr]
        if re.search(pattern, line):
            return time.time()
    return None


def report_delay(host, outcome: str) -> dict:
    """Restart the server; when it becomes ready (or is killed), how late does each loop say so?"""
    r0 = host.run("systemctl show sglang.service -p NRestarts --value").stdout.strip()
    host.run("systemctl restart sglang.service")
    baseline = subprocess.Popen([*host.ssh_args(), f"R0={r0} bash -c '{REFERENCE_LOOP}'"], stdout=subprocess.PIPE,
                                text=True)
    deploy = subprocess.Popen([*PYINFRA, "-y", "--limit", HOST, "inventory/sandbox.py",
                               "tests/integration/steps_deploy.py"], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env={**os.environ, "SGC_STEPS": "readiness"})
    event = None
    if outcome == "fail":
        # kill the server while it loads, once the deploy's readiness wait runs:
        # the delay measured is the reaction, not the deploy's start-up
        for line in deploy.stdout:  # type: ignore[union-attr]
            if "Starting operation: Readiness" in line:
                break
        time.sleep(1.0)
        host.run("systemctl kill -s KILL sglang.service")
        event = time.time()
    said: dict[str, float | None] = {}
    thread = threading.Thread(target=lambda: said.__setitem__("deploy", _stream_until(deploy, r"ready: |FAILED:")))
    thread.start()
    baseline_out = baseline.communicate(timeout=120)[0].split()
    thread.join(timeout=120)
    deploy.wait(timeout=60)
    if outcome == "ready":
        line = host.run("journalctl -u sglang.service -o short-unix --no-pager | grep 'fired up and ready' | tail -n 1"
                        ).stdout.split()
        event = float(line[0])
    reported = said.get("deploy")
    if reported is None or event is None:
        raise RuntimeError(f"the deploy never reported the server {outcome}")
    return {"deploy_delay_s": reported - event, "baseline_delay_s": float(baseline_out[1]) - event}


PARTS = ("noop", "report", "gates", "rollout", "transfer", "seeding", "scale", "staged")


# each part's arguments in --quick mode: one round, the smallest sizes
QUICK_ARGS = {
    "rollout": ["--rounds", "1"],
    "transfer": ["--size-mb", "40", "--shards", "2", "--repeats", "1"],
    "seeding": ["--repeats", "1"],
    "scale": ["--hosts", "1,2", "--repeats", "1"],
    "staged": ["--repeats", "1"],
}
QUICK_RESULTS = ROOT / ".sandbox" / "bench-quick.json"


def host_parts(parts: list[str], repeats: int, keep: bool, quick: bool = False) -> None:
    """(a), (b) and (g), on sgc9: converged once, then measured."""
    from bench.noop import measure

    try:
        host = sandbox_api.up(indexes=[INDEX])[0]
        print(f"bench: converging {HOST} (simulated GPUs) ...", flush=True)
        proc = pyinfra("deploy.py")
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        if "noop" in parts:
            # each of its runs takes about a second, the floor's half of one, and the ssh handshake alone
            # moves by a tenth: at least five interleaved rounds for a median that holds from run to run
            rounds = 1 if quick else max(repeats, 5)
            a = measure(host, ["-y", "-v", "--limit", HOST, "inventory/sandbox.py", "deploy.py"], rounds)
            print(f"(a) no-op re-run: deploy {a['noop_s']:.2f} s ({a['noop_host_commands']} commands on the host) vs "
                  f"Ansible {a['ansible_noop_s']:.2f} s ({a['ansible_tasks']} tasks) -> ansible_over_noop "
                  f"{a['ansible_over_noop']:.2f} (goal >= 6); floor ({a['floor_distinct_commands']} commands, one "
                  f"ssh round trip) {a['floor_noop_s']:.2f} s -> noop_over_floor {a['noop_over_floor']:.2f} "
                  f"(goal <= 2; median of {rounds})", flush=True)
            record(a)
        if "report" in parts:
            for outcome in ("ready", "fail"):
                delays = [report_delay(host, outcome) for _ in range(repeats)]
                deploy = statistics.median(d["deploy_delay_s"] for d in delays)
                base = statistics.median(d["baseline_delay_s"] for d in delays)
                print(f"(b) report delay after the server {'became ready' if outcome == 'ready' else 'failed'}: "
                      f"deploy {deploy:.2f} s vs 10 s poll loop {base:.2f} s -> ratio {deploy / base:.3f} "
                      f"(median of {repeats})")
                record({"ready_report_s" if outcome == "ready" else "crash_report_s": deploy,
                        "poll_loop_ready_report_s" if outcome == "ready" else "poll_loop_crash_report_s": base})
                if keep or outcome == "ready" or "gates" in parts:  # not for a host removed next
                    pyinfra("deploy.py")  # back to a ready server
        if "gates" in parts:
            from bench.gates import describe, measure as measure_gates

            g = measure_gates(pyinfra, 1 if quick else max(repeats, 3))
            print(describe(g), flush=True)
            record({k: v for k, v in g.items() if k != "gates_parts"})
            if keep:  # a removed host needs no restart back
                pyinfra("deploy.py")  # back to the settings' own environment
    finally:
        if not keep:
            sandbox_api.remove(HOST)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help=f"leave {HOST} running")
    parser.add_argument("--part", action="append", choices=PARTS,
                        help="run only this part (repeatable; default: all, and latest.json starts afresh)")
    parser.add_argument("--quick", action="store_true",
                        help=f"every part once at its smallest size, figures in {QUICK_RESULTS.relative_to(ROOT)} "
                             "(a check that the benches run, not a measurement)")
    args = parser.parse_args(argv)
    parts = args.part or list(PARTS)
    quick = args.quick
    if quick:
        args.repeats = 1
        results.RESULTS = QUICK_RESULTS  # what record() and start() write

    def part_args(name: str) -> list[str]:
        return QUICK_ARGS.get(name, []) if quick else []

    if not args.part:
        start()  # bench/results/latest.json: this run's figures only
    code = 0
    try:
        if "noop" in parts or "report" in parts or "gates" in parts:
            host_parts(parts, args.repeats, args.keep, quick)
        if "rollout" in parts:
            from bench.rollout import main as rollout_bench  # (c) the rolling rollout's overhead per host

            code = rollout_bench(part_args("rollout"))
        if "transfer" in parts:
            from bench.transfer import main as transfer_bench  # (d) download and verification vs curl, sha256sum

            transfer_bench(part_args("transfer"))
        if "seeding" in parts:
            from bench.seeding import main as seeding_bench  # (e) a 3-host rollout with peer seeding vs all from the Hub

            code = code or seeding_bench(part_args("seeding"))
        if "scale" in parts:
            from bench.scale import main as scale_bench  # (f) 1 -> 50 hosts: dry run, no-op re-run

            code = code or scale_bench(part_args("scale"))
        if "staged" in parts:
            from bench.staged import main as staged_bench  # (h) a 4-server rollout of a change, staged vs unstaged

            code = code or staged_bench(part_args("staged"))
    finally:
        print(f"bench: figures in {results.RESULTS}")
        table(results.RESULTS)
    return code


if __name__ == "__main__":
    sys.exit(main())
