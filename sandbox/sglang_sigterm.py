"""SIMULATED: how SGLang 0.5.23 (single tokenizer, uvicorn 0.54) stops on SIGTERM,
for the sandbox stand-in (sandbox/sglang_standin.py). Stdlib only.

Which handler SIGTERM meets depends on how far the server got (sglang/srt):

A. loading (Engine._launch_subprocesses waits for the schedulers; no HTTP server
   yet): nothing installed a SIGTERM handler, the default action kills the
   process; the schedulers follow (kill_itself_when_parent_died, PDEATHSIG).
B. uvicorn serving, before the first generation request (the server's own
   warmup): uvicorn's Server.capture_signals handler (signal.signal) sets
   should_exit. uvicorn shuts down (stops listening), then its lifespan
   shutdown joins the warmup thread (entrypoints/http_server.py lifespan),
   whose _execute_server_warmup still polls /model_info - now refused - 120
   times a second apart, then logs "Initialization failed. warmup error" and
   kill_process_tree(os.getpid()) SIGKILLs the tree and itself.
C. from the first generation request on: TokenizerManager.auto_create_handle_loop
   (managers/tokenizer_manager.py) ran loop.add_signal_handler(SIGTERM, ...),
   which goes through signal.signal too and, installed later, replaces
   uvicorn's handler. SignalHandler.sigterm_handler only logs and sets
   gracefully_exit; sigterm_watchdog, started by that same first request,
   looks at the flag every 5 s (phase from its start), then drains
   (every 5 s while requests remain; its force exits, on a failed health check
   or SGL_FORCE_SHUTDOWN, are not modelled), sends ShutdownReq to the schedulers,
   waits up to 15 s for them, kills what is left, and asks uvicorn to exit
   (set_server_stop_hook: server.should_exit). Meanwhile /health,
   /health_generate and /ready answer 503 and new generation requests are
   still accepted (and drained).

That is SIGTERM to the main process alone (kill PID; KillMode=mixed, the deploy's
unit since the real server showed it: tests/integration/test_real_server.py).
Under KillMode=control-group systemd sends SIGTERM to every process of the
unit at once, and the schedulers, which install no handler, die at once; the
main process's SubprocessWatchdog (utils/watchdog.py, 1 s poll) then SIGQUITs
it, running_phase_sigquit_handler kills the tree and itself (SIGKILL): no drain,
and the 5 s tick never comes (the stand-in's ranks do the same, run_rank).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

# managers/tokenizer_manager.py sigterm_watchdog: `await asyncio.sleep(5)`, both loops
WATCHDOG_PERIOD_S = 5.0
# managers/tokenizer_manager.py _SCHEDULER_EXIT_TIMEOUT_SECS
SCHEDULER_EXIT_TIMEOUT_S = 15.0
# entrypoints/http_server.py _execute_server_warmup: `for _ in range(120): time.sleep(1); GET /model_info`
WARMUP_MODEL_INFO_TRIES = 120

_tm_logger = logging.getLogger("sglang.srt.managers.tokenizer_manager")
_http_logger = logging.getLogger("sglang.srt.entrypoints.http_server")


def uvicorn_line(msg: str) -> None:
    """uvicorn's logger as SGLang configures it (utils/common.py set_uvicorn_logging_configs):
    "[%(asctime)s] %(levelprefix)s %(message)s", on stderr."""
    import sys

    print(f'[{time.strftime("%Y-%m-%d %H:%M:%S")}] INFO:     {msg}', file=sys.stderr, flush=True)


class Lifecycle:
    """The SIGTERM path of one server process (node rank 0)."""

    def __init__(self, stop: threading.Event):
        self.stop = stop  # the main thread's wake-up: uvicorn should_exit
        self.serving = False  # uvicorn's capture_signals is active (phase B)
        self.loop_started = False  # auto_create_handle_loop ran (phase C)
        self.gracefully_exit = False  # TokenizerManager.gracefully_exit
        self.drained = threading.Event()  # sigterm_watchdog finished draining
        self.captured: int | None = None  # the signal uvicorn's handler took (it re-raises it at its exit)
        self.rids: dict[str, None] = {}  # TokenizerManager.rid_to_state, in order
        self._lock = threading.Lock()

    # -- the handlers --------------------------------------------------------

    def uvicorn_started(self) -> None:
        """Phase B: uvicorn/server.py Server.capture_signals -> handle_exit. One
        Python-level handler dispatches on the phase: SGLang swaps the handler from
        the event loop in the main thread, the stand-in's first request may come
        on any HTTP thread, and only the main thread may call signal.signal."""
        self.serving = True
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame) -> None:
        if self.loop_started:
            # add_signal_handler calls its callback without arguments
            self.sigterm_handler()
        else:  # uvicorn handle_exit: should_exit = True
            self.captured = signal.SIGTERM
            self.stop.set()

    def sigterm_handler(self, signum=None, frame=None) -> None:
        """managers/tokenizer_manager.py SignalHandler.sigterm_handler."""
        _tm_logger.warning(f"SIGTERM received. {signum=} {frame=}. Draining requests and shutting down...")
        self.gracefully_exit = True

    # -- the tokenizer manager's loop -----------------------------------------

    def auto_create_handle_loop(self) -> None:
        """managers/tokenizer_manager.py auto_create_handle_loop: the first generation
        request (the warmup's, or /health's own generation) replaces the SIGTERM
        handler and starts sigterm_watchdog."""
        with self._lock:
            if self.loop_started:
                return
            self.loop_started = True
        threading.Thread(target=self._sigterm_watchdog, name="sigterm_watchdog", daemon=True).start()

    def _sigterm_watchdog(self) -> None:
        """managers/tokenizer_manager.py sigterm_watchdog, up to the ShutdownReq
        (the main thread does the rest: stop_ranks / stop hook)."""
        while not self.gracefully_exit:
            time.sleep(WATCHDOG_PERIOD_S)
        while True:
            with self._lock:
                remaining_rids = list(self.rids)
            remain_num_req = len(remaining_rids)
            _tm_logger.info(
                f"Gracefully exiting... Remaining number of requests {remain_num_req}. "
                f"Remaining requests {remaining_rids=}."
            )
            if remain_num_req > 0:
                time.sleep(WATCHDOG_PERIOD_S)
            else:
                break
        self.drained.set()
        self.stop.set()

    def enter(self, rid: str) -> None:
        with self._lock:
            self.rids[rid] = None

    def leave(self, rid: str) -> None:
        with self._lock:
            self.rids.pop(rid, None)

    # -- the main thread, once stop is set ------------------------------------

    def stop_schedulers(self, ranks, broadcast=None) -> None:
        """sigterm_watchdog after the drain: ShutdownReq (to every node's schedulers
        through rank 0's: broadcast), up to SCHEDULER_EXIT_TIMEOUT_S for them to exit,
        then kill_process_tree(os.getpid(), include_parent=False)."""
        if broadcast is not None:
            broadcast()
        stragglers = ranks.shutdown(timeout=SCHEDULER_EXIT_TIMEOUT_S) if ranks is not None else []
        if stragglers:
            _tm_logger.warning(
                f"Schedulers still alive {int(SCHEDULER_EXIT_TIMEOUT_S)}s after ShutdownReq, "
                f"killing them before they released: {stragglers}"
            )
        pid = os.getpid()
        logging.getLogger("sglang.srt.utils.common").info(
            f"kill_process_tree called: parent_pid={pid}, include_parent=False, pid={pid}"
        )

    @staticmethod
    def uvicorn_shutdown_begin() -> None:
        """uvicorn/server.py Server.shutdown, up to the lifespan shutdown."""
        uvicorn_line("Shutting down")
        uvicorn_line("Waiting for application shutdown.")

    @staticmethod
    def uvicorn_shutdown_end() -> None:
        uvicorn_line("Application shutdown complete.")
        uvicorn_line(f"Finished server process [{os.getpid()}]")

    @staticmethod
    def warmup_gives_up(url: str, kill_tree) -> None:
        """Phase B's end: the warmup thread polls the closed port, then kills the tree
        and itself (http_server.py _execute_server_warmup, kill_process_tree)."""
        import socket
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        last = ""
        for _ in range(WARMUP_MODEL_INFO_TRIES):
            time.sleep(1)
            try:
                with socket.create_connection((parts.hostname, parts.port), timeout=5):
                    pass
            except OSError as e:
                last = (f"requests.exceptions.ConnectionError: HTTPConnectionPool(host={parts.hostname!r}, "
                        f"port={parts.port}): Max retries exceeded with url: /model_info ({e})")
        _http_logger.error(f"Initialization failed. warmup error: Traceback (most recent call last):\n{last}\n")
        kill_tree()
