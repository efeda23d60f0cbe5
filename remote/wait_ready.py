"""Runs ON the target host: wait until an SGLang unit is ready, or say why not.

Ready = the unit stays active, GET /health answers 200 (503 while loading), and
/v1/models lists the served name (with the API key, read from the root-only
options file, never from argv). Fails within ~0.25 s of the unit failing or
restarting, printing the unit's journal lines, the traceback's last line first.

    python3 wait_ready.py --unit sglang.service --url http://127.0.0.1:30000 \
        --served-name kimi-k2.6 --options-file /etc/sglang/sglang.yaml --timeout 3600
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--unit", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--served-name", required=True)
    parser.add_argument("--options-file")
    parser.add_argument("--timeout", type=float, default=3600)
    args = parser.parse_args(argv)

    key = api_key(args.options_file)
    start = time.monotonic()
    first = unit_state(args.unit)
    invocation, restarts = first.get("InvocationID", ""), first.get("NRestarts", "0")
    last_progress = start
    health = 0
    while True:
        now = time.monotonic()
        state = unit_state(args.unit)
        active = state.get("ActiveState")
        if active in ("failed", "inactive", "deactivating") or state.get("SubState") == "auto-restart" \
                or state.get("NRestarts", "0") != restarts or (
            invocation and state.get("InvocationID") not in ("", invocation)
        ):
            print(f"FAILED: {args.unit} is {active}/{state.get('SubState')} "
                  f"(result {state.get('Result')}, restarts {state.get('NRestarts')}) "
                  f"after {now - start:.1f} s")
            for line in explain(journal_lines(args.unit, invocation)):
                print(line)
            return 1
        health, _ = get(args.url + "/health", None)
        if health == 200:
            status, body = get(args.url + "/v1/models", key)
            try:
                served = [model.get("id") for model in json.loads(body or b"{}").get("data", [])]
            except ValueError:
                served = []
            if status == 200 and args.served_name in served:
                print(f"ready: {args.unit} serves {args.served_name} at {args.url} "
                      f"({now - start:.1f} s to ready, pid {state.get('MainPID')})")
                return 0
            if status in (401, 403):
                print(f"FAILED: /v1/models answered {status}: the API key in {args.options_file} is refused")
                return 1
        if now - start > args.timeout:
            print(f"FAILED: not ready after {args.timeout:.0f} s (/health {health or 'no answer'})")
            for line in explain(journal_lines(args.unit, invocation)):
                print(line)
            return 1
        if now - last_progress >= PROGRESS_S:
            last_progress = now
            print(f"waiting: {now - start:.0f} s, /health {health or 'no answer'}"
                  f"{' (loading)' if health == 503 else ''}, {active}/{state.get('SubState')}; {gpu_memory()}")
            sys.stdout.flush()
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(main())
