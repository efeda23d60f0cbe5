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

Start progress: the wait follows SGLang's start from its own log lines, per
rank (the phases and where SGLang logs each are in PHASES below), and shows
the phase each rank is in. A start that makes no progress (no new line from
any of its processes, no change of GPU memory) for --stall seconds fails
then, naming the phase, the stuck ranks and each one's last line, rather than
at --timeout. --ranks N: the TP ranks this host runs (rank names TP0..).

Exit status: 0 ready, 1 failed, 3 no verdict yet (--slice).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

POLL_S = 0.25
PROGRESS_S = 5.0
JOURNAL_POLL_S = 2.0  # journal and GPU memory, while the server starts
STATE_DIR = "/run/sglang-converge"  # --slice: the start's progress kept between slices


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


# a traceback's last line: "ValueError: ...", "torch.OutOfMemoryError: ...", and a bare "Exception: ..."
# (sglang 0.5.23 raises one for a failed CUDA graph capture: decode_cuda_graph_runner.py:603)
_ERROR_LINE = re.compile(r"^((?:[A-Za-z_][\w.]*)?(Error|Exception|Exit|Interrupt)\b|error:|.*: error: |No module named )")


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



# ---------------------------------------------------------------------- start progress

# sglang 0.5.23's start, in its own log lines (file:line under python/sglang/srt/), in order.
PHASES = (
    ("starting", None),
    ("initialising parallel groups", "Init parallel begin."),        # distributed/bootstrap.py:115
    ("loading weights", "Load weight begin."),                         # model_executor/model_runner.py:1274
    ("weights loaded", "Load weight end."),                            # model_executor/model_runner.py:1373
    ("KV cache allocated", "KV Cache is allocated."),                  # mem_cache/memory_pool.py:2096
    ("memory pool ready", "Memory pool end."),                         # mem_cache/kv_cache_configurator.py:499
    ("capturing CUDA graphs", " graph begin."),                        # model_runner_components/cuda_graph_setup.py:685,759
    ("CUDA graphs captured", " graph end."),                           # model_runner_components/cuda_graph_setup.py:696,787
    ("scheduler started", "max_total_num_tokens="),                    # managers/scheduler.py:1269 (TP0)
    ("warming up", "Engine startup timings"),                          # entrypoints/engine.py:1118 (main process)
    ("fired up", "The server is fired up and ready to roll!"),         # entrypoints/http_server.py:2600
)
# the weights' tqdm bar (model_loader/weight_utils.py:1166, rank 0): "\r"-separated, a journal blob
_SHARDS = re.compile(r"Loading safetensors checkpoint shards:\s*(\d+)%")
_RANK = re.compile(r"^\[[^\]]*?((?: [A-Z_]+\d+)+)\] ")  # "[2026-12-03 07:18:38 DP0 TP3 EP3] ..."
_MAIN_PHASES = ("warming up", "fired up")  # logged by the main process once every rank is up
_NOT_PROGRESS = ('"GET /health', '"GET /v1/models', '"GET /get_server_info')


def phase_of(text: str) -> int | None:
    """Index in PHASES of the phase a log line starts, or None."""
    for index in range(len(PHASES) - 1, 0, -1):
        marker = PHASES[index][1]
        if marker and marker in text and (not marker.startswith(" graph") or text.split("] ", 1)[-1].startswith("Capture ")):
            return index
    return None


def message_text(message) -> str:
    """A journal MESSAGE: a string, or (a line with "\\r", tqdm's) a list of byte values."""
    if isinstance(message, list):
        message = bytes(message).decode("utf-8", "replace")
    parts = [part for part in str(message or "").split("\r") if part.strip()]
    return parts[-1].strip() if parts else ""


class StartProgress:
    """What each rank of a starting server last did, and when anything last moved."""

    def __init__(self, ranks: int, main_pid: str, now: float, first_rank: int = 0):
        # rank -> {"phase": index in PHASES, "line": its last line, "at": when, "pct": weights loaded %}
        self.ranks: dict[str, dict[str, Any]] = {
            f"TP{first_rank + i}": {"phase": 0, "line": "", "at": now, "pct": None} for i in range(max(ranks, 1))}
        self.main_pid = main_pid
        self.moved_at = now
        self.cursor = ""
        self.memory = ""

    def rank_of(self, text: str, pid: str) -> str | None:
        match = _RANK.match(text)
        if match:
            tp = [part for part in match.group(1).split() if part.startswith("TP")]
            return tp[0] if tp else match.group(1).strip()
        if pid and pid != self.main_pid and len(self.ranks) == 1:
            return next(iter(self.ranks))  # TP 1: SGLang's scheduler logs without a rank prefix
        return None

    def line(self, text: str, pid: str, at: float) -> None:
        if not text or any(word in text for word in _NOT_PROGRESS):
            return
        self.moved_at = max(self.moved_at, at)
        rank = self.rank_of(text, pid)
        phase = phase_of(text)
        shards = _SHARDS.search(text)
        if rank is None:  # the main process: its phases move every rank that is behind them
            if phase is not None and PHASES[phase][0] in _MAIN_PHASES:
                for state in self.ranks.values():
                    state["phase"] = max(state["phase"], phase)
            return
        state = self.ranks.setdefault(rank, {"phase": 0, "line": "", "at": at, "pct": None})
        state.update(line=text[-300:], at=at)
        if shards:
            state.update(phase=max(state["phase"], 2), pct=int(shards.group(1)))
        elif phase is not None:
            state["phase"] = max(state["phase"], phase)

    def memory_seen(self, memory: str, now: float) -> None:
        if memory and memory != self.memory:
            if self.memory:
                self.moved_at = now
            self.memory = memory

    def summary(self) -> str:
        """'loading weights 45% (TP0-TP7)' or 'weights loaded (TP0, TP2); loading weights (TP1)'."""
        groups: dict[str, list[str]] = {}
        for rank, state in sorted(self.ranks.items(), key=lambda item: _rank_key(item[0])):
            name = PHASES[state["phase"]][0]
            if state["phase"] == 2 and state["pct"] is not None:
                name += f" {state['pct']}%"
            groups.setdefault(name, []).append(rank)
        return "; ".join(f"{name} ({_ranks_text(ranks)})" for name, ranks in groups.items())

    def stalled(self, now: float, stall_s: float | None) -> list[str] | None:
        """None while the start moves; else the failure's lines: the phase, the stuck ranks, their last lines."""
        if not stall_s or now - self.moved_at < stall_s:
            return None
        lowest = min(state["phase"] for state in self.ranks.values())
        stuck = sorted((r for r, s in self.ranks.items() if s["phase"] == lowest), key=_rank_key)
        lines = [f"FAILED: the start made no progress for {now - self.moved_at:.0f} s (start_stall_s {stall_s:.0f}): "
                 f"stuck in {PHASES[lowest][0]!r}: {_ranks_text(stuck)}; {self.summary()}"]
        for rank in stuck:
            state = self.ranks[rank]
            last = f"{now - state['at']:.0f} s ago: {state['line']}" if state["line"] else "no line yet"
            lines.append(f"  {rank} last line: {last}")
        return lines

    def to_json(self) -> dict:
        return {"ranks": self.ranks, "main_pid": self.main_pid, "moved_at": self.moved_at,
                "cursor": self.cursor, "memory": self.memory}

    @classmethod
    def from_json(cls, data: dict) -> StartProgress:
        progress = cls(0, data.get("main_pid", ""), data.get("moved_at", time.time()))
        progress.ranks = data["ranks"]
        progress.cursor, progress.memory = data.get("cursor", ""), data.get("memory", "")
        return progress


def _rank_key(rank: str) -> tuple[int, str]:
    digits = "".join(ch for ch in rank if ch.isdigit())
    return (int(digits) if digits else -1, rank)


def _ranks_text(ranks: list[str]) -> str:
    """TP0-TP4, TP6, TP7: runs of three or more consecutive TP ranks as a range."""
    parts: list[str] = []
    run: list[int] = []
    for rank in ranks + [""]:
        number = _rank_key(rank)[0] if rank.startswith("TP") else None
        if number is not None and run and number == run[-1] + 1:
            run.append(number)
            continue
        if run:
            parts += [f"TP{run[0]}-TP{run[-1]}"] if len(run) > 2 else [f"TP{n}" for n in run]
        run = [number] if number is not None else []
        if rank and number is None:
            parts.append(rank)
    return ", ".join(parts)


def read_journal(progress: StartProgress, unit: str, invocation: str) -> None:
    """Feed the unit's new journal entries (this invocation's) to ``progress``."""
    cmd = ["journalctl", "--no-pager", "-o", "json", "--output-fields=MESSAGE,_PID"]
    cmd += [f"_SYSTEMD_INVOCATION_ID={invocation}"] if invocation else ["-u", unit]
    cmd += [f"--after-cursor={progress.cursor}"] if progress.cursor else []
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return
    for raw in out.splitlines():
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        progress.cursor = entry.get("__CURSOR", progress.cursor)
        at = int(entry.get("__REALTIME_TIMESTAMP", 0)) / 1e6 or time.time()
        progress.line(message_text(entry.get("MESSAGE")), str(entry.get("_PID", "")), at)


def state_path(unit: str, invocation: str) -> str:
    return f"{STATE_DIR}/start-{unit}-{invocation or 'unknown'}.json"


def load_progress(unit: str, invocation: str, ranks: int, first_rank: int) -> StartProgress:
    """The progress an earlier slice of this wait kept, or a new one."""
    try:
        with open(state_path(unit, invocation)) as handle:
            return StartProgress.from_json(json.load(handle))
    except (OSError, ValueError, KeyError):
        return StartProgress(ranks, "", time.time(), first_rank)


def save_progress(progress: StartProgress, unit: str, invocation: str) -> None:
    try:
        os.makedirs(STATE_DIR, mode=0o700, exist_ok=True)
        with open(state_path(unit, invocation), "w") as handle:
            json.dump(progress.to_json(), handle)
    except OSError:
        pass


def start_stalled(progress: StartProgress, unit: str, invocation: str, stall_s: float | None) -> bool:
    """Feed the new journal lines and GPU memory to ``progress``; on a stall print why (the stall
    line is the cause, then the journal) and return True."""
    read_journal(progress, unit, invocation)
    progress.memory_seen(gpu_memory(), time.time())
    stalled = progress.stalled(time.time(), stall_s)
    if not stalled:
        return False
    print("\n".join(stalled))
    for line in explain(journal_lines(unit, invocation)):
        if not line.startswith("cause:"):
            print(line)
    return True


def keep_fingerprint(url: str, key: str | None, path: str, keys: list[str]) -> None:
    """What SGLang chose (``keys`` of its /server_info) into ``path`` (root-only), and printed; the
    deploy holds it against its plan (core/fingerprint.py)."""
    status, body = 0, b""
    for route in ("/server_info", "/get_server_info"):  # 0.5.23 has both; older servers only the second
        status, body = get(url + route, key)
        if status == 200:
            break
    try:
        info = json.loads(body) if status == 200 else None
    except ValueError:
        info = None
    if not isinstance(info, dict):
        print(f"fingerprint: /server_info answered {status or 'nothing'}: not kept")
        return
    kept = {name: info[name] for name in keys if name in info}
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path + ".new", "w", opener=lambda p, flags: os.open(p, flags, 0o600)) as handle:
        json.dump(kept, handle, sort_keys=True)
    os.replace(path + ".new", path)
    print("fingerprint: " + json.dumps(kept, sort_keys=True))


PENDING = 3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
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
    parser.add_argument("--stall", type=float, default=None)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--first-rank", type=int, default=0)
    parser.add_argument("--fingerprint-file", default=None)
    parser.add_argument("--fingerprint-keys", default="")
    args = parser.parse_args(argv)
    if not args.watch and not (args.url and args.served_name):
        parser.error("--url and --served-name are required unless --watch")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    key = api_key(args.options_file)
    start = time.monotonic()
    if args.baseline:
        invocation, _, restarts = args.baseline.partition(":")
    else:
        first = unit_state(args.unit)
        invocation, restarts = first.get("InvocationID", ""), first.get("NRestarts", "0")
        if args.slice is not None:
            print(f"baseline: {invocation}:{restarts}")
    progress = (load_progress(args.unit, invocation, args.ranks, args.first_rank) if args.slice is not None
                else StartProgress(args.ranks, "", time.time(), args.first_rank))
    last_progress = start
    last_journal = 0.0
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
        progress.main_pid = progress.main_pid or state.get("MainPID", "")
        if now - last_journal >= JOURNAL_POLL_S and health != 200:
            last_journal = now
            if start_stalled(progress, args.unit, invocation, args.stall):
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
                    if args.fingerprint_file:
                        keep_fingerprint(args.url, key, args.fingerprint_file, args.fingerprint_keys.split(","))
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
                print(f"waiting: {waited:.0f} s, {status_text}; {gpu_memory()}; start: {progress.summary()}")
            print(f"pending: {status_text}")
            save_progress(progress, args.unit, invocation)
            return PENDING
        if args.slice is None and now - last_progress >= PROGRESS_S:
            last_progress = now
            print(f"waiting: {waited:.0f} s, {status_text}; {gpu_memory()}; start: {progress.summary()}")
            sys.stdout.flush()
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(main())
