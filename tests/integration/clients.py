"""Client threads that send chat requests through a router while a test restarts what is behind it."""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.error
import urllib.request

CLIENTS = 2
# A request that takes longer fails. Long enough for a slow answer on 2 CPU cores shared with a restart
# and another test's converge (a CI run saw two chat requests through the router past 30 s while the
# real server restarted beside them; p99 10 s); a request lost on a stopped worker still fails, since
# sglang-router holds it up to its request_timeout_secs (1800 s by default: sglang_router RouterArgs).
REQUEST_TIMEOUT_S = 120


class Clients:
    """``count`` threads sending chat requests to ``url`` until stopped; each failure kept with its reason."""

    def __init__(self, url: str, count: int = CLIENTS, model: str = "tiny", api_key: str | None = None):
        self.url = url
        self.model = model
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.stop = threading.Event()
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.loop, daemon=True) for _ in range(count)]

    def loop(self):
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": "hello"}],
                           "max_tokens": 16}).encode()
        while not self.stop.is_set():
            request = urllib.request.Request(self.url + "/v1/chat/completions", data=body, headers=self.headers)
            started = time.monotonic()
            try:
                with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                    answer = json.loads(response.read())
                    ok = response.status == 200 and answer["choices"][0]["message"]["content"]
                    error = None if ok else f"{response.status}: {answer}"
            except urllib.error.HTTPError as err:
                error = f"HTTP {err.code}: {err.read()[:200]!r}"
            except Exception as err:  # noqa: BLE001
                error = f"{type(err).__name__}: {err}"
            with self.lock:
                if error:
                    self.failures.append(error)
                else:
                    self.latencies.append(time.monotonic() - started)

    @property
    def sent(self) -> int:
        with self.lock:
            return len(self.latencies) + len(self.failures)

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)

    def percentiles(self) -> dict[str, float]:
        q = statistics.quantiles(sorted(self.latencies), n=100, method="inclusive")
        return {"p50": q[49], "p95": q[94], "p99": q[98]}
