"""`make bench`: the deploy's costs as ratios against a baseline measured side by side.

(a) no-op re-run of the deploy on a converged sandbox host, against the same
    number of plain `ssh host true` round trips as the deploy ran commands
    (its facts): what pyinfra and our steps add on top of ssh itself;
(b) delay between the server becoming ready (or failing) and the deploy
    reporting it, against the reference incident's hand-written loop
    (every 10 s: `systemctl is-active`, then curl), run on the host at the
    same time as the deploy's readiness step;
(c) bench/rollout.py: the rolling rollout's overhead per host;
(d) bench/transfer.py: the model download against curl, its content
    verification against sha256sum;
(e) bench/seeding.py: a 3-host rollout of a missing revision with peer
    seeding against all from the Hub (Hub bytes and wall time).

Every figure also goes to bench/results/latest.json (bench/results.py).

Absolute seconds depend on the machine; the ratios are the result. Nothing
here is asserted: tests assert behaviour, benchmarks measure.
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

from bench.results import RESULTS, record, start
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


def noop_rerun(host, repeats: int) -> dict:
    runs, counts = [], []
    for _ in range(repeats):
        started = time.monotonic()
        proc = pyinfra("-v", "deploy.py")
        runs.append(time.monotonic() - started)
        out = proc.stdout + proc.stderr
        assert "Grand total" in out, out[-2000:]
        counts.append(len(re.findall(r"Loaded fact", out)))
    commands = max(counts)
    baseline = []
    for _ in range(repeats):
        started = time.monotonic()
        for _ in range(commands):
            subprocess.run([*host.ssh_args(), "true"], check=True)
        baseline.append(time.monotonic() - started)
    return {"deploy_s": statistics.median(runs), "commands": commands, "ssh_s": statistics.median(baseline)}


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    start()  # bench/results/latest.json: this run's figures only
    try:
        host = sandbox_api.up(indexes=[INDEX])[0]
        print(f"bench: converging {HOST} (simulated GPUs) ...", flush=True)
        proc = pyinfra("deploy.py")
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        a = noop_rerun(host, args.repeats)
        print(f"(a) no-op re-run: deploy {a['deploy_s']:.2f} s vs {a['commands']} x `ssh host true` "
              f"{a['ssh_s']:.2f} s  -> ratio {a['deploy_s'] / a['ssh_s']:.2f}")
        record({"noop_s": a["deploy_s"], "noop_fact_commands": a["commands"], "ssh_true_x_commands_s": a["ssh_s"]})
        for outcome in ("ready", "fail"):
            delays = [report_delay(host, outcome) for _ in range(args.repeats)]
            deploy = statistics.median(d["deploy_delay_s"] for d in delays)
            base = statistics.median(d["baseline_delay_s"] for d in delays)
            print(f"(b) report delay after the server {'became ready' if outcome == 'ready' else 'failed'}: "
                  f"deploy {deploy:.2f} s vs 10 s poll loop {base:.2f} s -> ratio {deploy / base:.3f} "
                  f"(median of {args.repeats})")
            record({"ready_report_s" if outcome == "ready" else "crash_report_s": deploy,
                    "poll_loop_ready_report_s" if outcome == "ready" else "poll_loop_crash_report_s": base})
            pyinfra("deploy.py")  # back to a ready server
    finally:
        if not args.keep:
            sandbox_api.remove(HOST)
    return 0


if __name__ == "__main__":
    code = main()
    from bench.rollout import main as rollout_bench  # (c) the rolling rollout's overhead per host
    from bench.transfer import main as transfer_bench  # (d) download and verification against curl, sha256sum
    from bench.seeding import main as seeding_bench  # (e) a 3-host rollout with peer seeding against all from the Hub

    code = code or rollout_bench([])
    transfer_bench([])
    code = code or seeding_bench([])
    print(f"bench: figures in {RESULTS.relative_to(ROOT)}")
    sys.exit(code)
