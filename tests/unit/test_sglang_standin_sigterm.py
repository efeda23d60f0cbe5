"""SIGTERM on the SGLang stand-in, as SGLang 0.5.23 meets it (sandbox/sglang_sigterm.py):
the default action while loading, uvicorn's handler before the first generation
request, then the tokenizer manager's: a log line at once, /health 503 while its
watchdog (a 5 s poll from the warmup request) drains the requests, then the exit.

The assertions are on what is seen and in which order, never on durations."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from tests.unit.test_sglang_standin import READY, Bed, bed, free_port, holders, http  # noqa: F401 - bed: fixture

SIGTERM_LINE = "SIGTERM received. signum=None frame=None. Draining requests and shutting down..."
EXITING = "Gracefully exiting... Remaining number of requests"
FINISHED = "INFO:     Finished server process"


def _ready(bed: Bed, *extra: str, **env):
    port = free_port()
    proc = bed.start(["--model-path", str(bed.model), "--tp-size", "2", "--port", str(port), *extra], **env)
    proc.wait_for(READY)
    return proc, f"http://127.0.0.1:{port}"


def _statuses(base: str) -> dict[str, int]:
    return {path: http("GET", base + path)[0] for path in ("/health", "/health_generate", "/ready")}


def test_sigterm_after_ready_drains_at_the_watchdogs_tick(bed):
    # a generation that outlasts one watchdog period: in flight at its first tick after the signal
    proc, base = _ready(bed, SANDBOX_GEN_DELAY_S="5.5")
    assert _statuses(base) == {"/health": 200, "/health_generate": 200, "/ready": 200}  # control
    results: list = []
    slow = threading.Thread(target=lambda: results.append(http("POST", base + "/generate", timeout=60,
                                                               body={"text": "slow", "sampling_params": {}})))
    slow.start()
    while http("GET", base + "/v1/loads")[1]["loads"][0]["num_running_reqs"] < 1:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait_for(SIGTERM_LINE)
    # the window: the process lives on, health says 503, and new generation requests are still served
    assert _statuses(base) == {"/health": 503, "/health_generate": 503, "/ready": 503}
    assert proc.p.poll() is None
    assert "Health check request received during shutdown. Returning 503." in proc.out()
    status, body = http("POST", base + "/generate", body={"text": "late", "sampling_params": {"max_new_tokens": 1}})
    assert status == 200 and body["text"]
    slow.join(60)
    assert results and results[0][0] == 200
    rid = results[0][1]["meta_info"]["id"]

    assert proc.wait(60) == 0
    out = proc.out()
    # the slow request was listed by id at a tick (with the late one, if still running), then a
    # tick found none, then the schedulers and uvicorn stopped
    ticks = [line.split("] ", 1)[1] for line in out.splitlines() if EXITING in line]
    idle = f"{EXITING} 0. Remaining requests remaining_rids=[]."
    assert len(ticks) >= 2 and ticks[-1] == idle, ticks
    assert f"'{rid}'" in ticks[0] and ticks[0].startswith((f"{EXITING} 1. ", f"{EXITING} 2. ")), ticks
    assert out.index(SIGTERM_LINE) < out.index(ticks[0]) < out.index(idle)
    assert out.index(idle) < out.index("kill_process_tree called:") < out.index("INFO:     Shutting down") \
        < out.index(FINISHED)
    assert out.count(idle) == 1
    assert bed.used() == {0: 0, 1: 0} and not holders(bed)


def test_sigterm_with_nothing_in_flight_still_waits_for_the_tick(bed):
    proc, base = _ready(bed)
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait_for(SIGTERM_LINE)
    seen = _statuses(base)
    alive = proc.p.poll() is None
    out = proc.out()
    # the exit follows the watchdog's line; before it, the process answered 503
    if EXITING not in out:
        assert alive and seen == {"/health": 503, "/health_generate": 503, "/ready": 503}
    assert proc.wait(30) == 0
    out = proc.out()
    assert out.index(SIGTERM_LINE) < out.index(f"{EXITING} 0. Remaining requests remaining_rids=[].") \
        < out.index(FINISHED)


def test_sigterm_while_loading_is_the_default_action(bed):
    port = free_port()
    proc = bed.start(["--model-path", str(bed.model), "--tp-size", "2", "--port", str(port)],
                     SANDBOX_LOAD_SECONDS="30")
    proc.wait_for("Load weight begin")
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(30) == -signal.SIGTERM  # no handler yet: killed by the signal, nothing logged
    assert "SIGTERM received" not in proc.out() and READY not in proc.out()
    _ranks_follow(bed)


def _ranks_follow(bed: Bed) -> None:
    """The ranks die with the main process (PR_SET_PDEATHSIG, like SGLang's schedulers)."""
    deadline = time.monotonic() + 30
    while holders(bed) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not holders(bed)


def test_sigterm_before_any_generation_request_meets_uvicorns_handler(bed):
    """--skip-server-warmup: no warmup request, so uvicorn's handler is still SIGTERM's:
    uvicorn exits and re-raises it (killed by SIGTERM), without SGLang's drain."""
    proc, base = _ready(bed, "--skip-server-warmup", SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION="0")
    assert http("GET", base + "/health")[0] == 200  # no generation behind /health with this setting
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(30) == -signal.SIGTERM
    out = proc.out()
    assert SIGTERM_LINE not in out and EXITING not in out
    assert out.index("INFO:     Shutting down") < out.index(FINISHED)
    _ranks_follow(bed)

    # control: the first generation request hands SIGTERM to SGLang's handler
    proc, base = _ready(bed, "--skip-server-warmup", SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION="0")
    assert http("POST", base + "/generate", body={"text": "x", "sampling_params": {"max_new_tokens": 1}})[0] == 200
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(30) == 0
    assert proc.out().index(SIGTERM_LINE) < proc.out().index(EXITING)


def test_sigterm_to_every_process_like_systemd_kills_the_ranks_and_no_drain(bed):
    """systemd's KillMode=control-group (the unit's) sends SIGTERM to the main process and
    the ranks at once. SGLang's schedulers have no SIGTERM handler: they die, the main
    process's SubprocessWatchdog SIGQUITs it, it kills the tree and itself; nothing drains.
    (Control: SIGTERM to the main process alone drains, the tests above.)"""
    proc, base = _ready(bed, SANDBOX_GEN_DELAY_S="5.5")
    results: list = []

    def slow():
        try:
            results.append(http("POST", base + "/generate", timeout=60, body={"text": "slow", "sampling_params": {}}))
        except Exception as e:  # noqa: BLE001 - the connection goes down with the server
            results.append(e)

    t = threading.Thread(target=slow)
    t.start()
    while http("GET", base + "/v1/loads")[1]["loads"][0]["num_running_reqs"] < 1:
        time.sleep(0.02)
    ranks = [int(c) for task in Path(f"/proc/{proc.pid}/task").iterdir()
             for c in (task / "children").read_text().split()
             if b"resource_tracker" not in Path(f"/proc/{c}/cmdline").read_bytes()]
    assert len(ranks) == 2, ranks
    for pid in [proc.pid, *ranks]:
        os.kill(pid, signal.SIGTERM)
    assert proc.wait(30) == -signal.SIGKILL
    t.join(60)
    assert results and not (isinstance(results[0], tuple) and results[0][0] == 200)  # not drained
    out = proc.out()
    assert out.index(SIGTERM_LINE) < out.index("crashed with exit code -15. Triggering SIGQUIT for cleanup...") \
        < out.index("SIGQUIT received.")
    assert EXITING not in out
    _ranks_follow(bed)
