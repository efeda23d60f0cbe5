"""Runs ON the target host: wait until an SGLang unit is ready, or say why not.

Ready = the unit stays active, GET /health answers 200 (503 while loading), and
/v1/models lists the served name (with the API key, read from the root-only
options file, never from argv). Fails within ~0.25 s of the unit failing or
restarting, printing the unit's journal lines, the traceback's last line first.

    python3 wait_ready.py --unit sglang.service --url http://127.0.0.1:30000 \
        --served-name kimi-k2.6 --options-file /etc/sglang/sglang.yaml --timeout 3600

Multi-node groups (tasks/multinode.py) call it in slices, so the controller
can stop every rank's wait as soon as one rank fails:

    --slice 1      give up after 1 s without a verdict: print "pending: ..." and
                   exit 3 (the first slice also prints "baseline: INVOCATION:NRESTARTS")
    --baseline B   the unit's InvocationID:NRestarts when the wait began
    --elapsed E    seconds already waited in earlier slices (messages, --timeout)
    --progress     end a pending slice with a "waiting: ..." line (GPU memory too)
    --watch        ranks >= 1: no HTTP check, only "the unit stays active"

Exit status: 0 ready, 1 failed, 3 no verdict yet (--slice).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

POLL_S = 0.25
PROGRESS_S = 5.0


def unit_state(unit: str) -> dict[str, str]:
    out = subprocess.run(
        ["systemctl", "show", unit, "--property=ActiveState,SubState,NRestarts,InvocationID,Result,MainPID"],
        capture_output=True,
        text=True,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def journal_lines(unit: str, invocation: str, count: int = 25) -> list[str]:
    cmd = ["journalctl", "--no-pager", "-o", "cat", "-n", str(count)]
    cmd += [f"_SYSTEMD_INVOCATION_ID={invocation}"] if invocation else ["-u", unit]
    lines = subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()
    if not lines and invocation:
        return journal_lines(unit, "", count)
    return lines


_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b|error:|.*: error: |No module named )")


def explain(lines: list[str]) -> list[str]:
    """The line that explains a failure first (a traceback's last line), then context."""
    culprit = None
    for line in reversed(lines):
        stripped = line.strip()
        if stripped and _ERROR_LINE.match(stripped.split("] ", 1)[-1]):
            culprit = stripped
            break
    if culprit is None:
        noise = ("Main process exited", "Failed with result", "Scheduled restart", "Stopped ", "Started ")
        culprit = next((line.strip() for line in reversed(lines)
                        if line.strip() and not any(word in line for word in noise)), None)
    return ([f"cause: {culprit}"] if culprit else []) + ["journal:"] + [f"  {line}" for line in lines]


def api_key(options_file: str | None) -> str | None:
    if not options_file:
        return None
    try:
        with open(options_file) as handle:
            for line in handle:
                key, sep, value = line.partition(":")
                if sep and key.strip() == "api-key":
                    value = value.strip()
                    return json.loads(value) if value.startswith('"') else value
    except OSError:
        return None
    return None


def get(url: str, key: str | None) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, b""
    except (urllib.error.URLError, OSError):
        return 0, b""


def gpu_memory() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=5,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    used = [line.split(",")[1].strip() for line in out.splitlines() if "," in line]
    return "GPU MiB used: " + " ".join(used) if used else ""


PENDING = 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--unit", required=True)
    parser.add_argument("--url")
    parser.add_argument("--served-name")
    parser.add_argument("--options-file")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--slice", type=float, default=None)
    parser.add_argument("--baseline", default=None)
    parser.add_argument("--elapsed", type=float, default=0.0)
    parser.add_argument("--progress", action="store_true")
    parser.add_argument("--watch", action="store_true")
    args = parser.parse_args(argv)
    if not args.watch and not (args.url and args.served_name):
        parser.error("--url and --served-name are required unless --watch")

    key = api_key(args.options_file)
    start = time.monotonic()
    if args.baseline:
        invocation, _, restarts = args.baseline.partition(":")
    else:
        first = unit_state(args.unit)
        invocation, restarts = first.get("InvocationID", ""), first.get("NRestarts", "0")
        if args.slice is not None:
            print(f"baseline: {invocation}:{restarts}")
    last_progress = start
    health = 0
    while True:
        now = time.monotonic()
        waited = args.elapsed + now - start
        state = unit_state(args.unit)
        active = state.get("ActiveState")
        if active in ("failed", "inactive", "deactivating") or state.get("SubState") == "auto-restart" \
                or state.get("NRestarts", "0") != restarts or (
            invocation and state.get("InvocationID") not in ("", invocation)
        ):
            print(f"FAILED: {args.unit} is {active}/{state.get('SubState')} "
                  f"(result {state.get('Result')}, restarts {state.get('NRestarts')}) "
                  f"after {waited:.1f} s")
            for line in explain(journal_lines(args.unit, invocation)):
                print(line)
            return 1
        if not args.watch:
            health, _ = get(args.url + "/health", None)
            if health == 200:
                status, body = get(args.url + "/v1/models", key)
                try:
                    served = [model.get("id") for model in json.loads(body or b"{}").get("data", [])]
                except ValueError:
                    served = []
                if status == 200 and args.served_name in served:
                    print(f"ready: {args.unit} serves {args.served_name} at {args.url} "
                          f"({waited:.1f} s to ready, pid {state.get('MainPID')})")
                    return 0
                if status in (401, 403):
                    print(f"FAILED: /v1/models answered {status}: the API key in {args.options_file} is refused")
                    return 1
        if waited > args.timeout:
            print(f"FAILED: not ready after {args.timeout:.0f} s (/health {health or 'no answer'})")
            for line in explain(journal_lines(args.unit, invocation)):
                print(line)
            return 1
        status_text = (f"{active}/{state.get('SubState')}" if args.watch else
                       f"/health {health or 'no answer'}{' (loading)' if health == 503 else ''}, "
                       f"{active}/{state.get('SubState')}")
        if args.slice is not None and now - start >= args.slice:
            if args.progress:
                print(f"waiting: {waited:.0f} s, {status_text}; {gpu_memory()}")
            print(f"pending: {status_text}")
            return PENDING
        if args.slice is None and now - last_progress >= PROGRESS_S:
            last_progress = now
            print(f"waiting: {waited:.0f} s, {status_text}; {gpu_memory()}")
            sys.stdout.flush()
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(main())
