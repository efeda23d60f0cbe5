"""Runs ON a host: take an SGLang server out of its router, or put it back.

SGLang's router (sglang-router / smg) keeps its workers in memory and has a
runtime API: POST /workers {"url"} -> 202, GET /workers, DELETE /workers/{id}.
Removal does not wait for a worker's in-flight requests, so `drain` waits
until the server itself is idle (/v1/loads: num_running_reqs +
num_waiting_reqs == 0; older servers' /get_load: num_reqs) before the deploy restarts it.

    python3 router_client.py drain --router URL --worker URL --local URL [--auth-file F] --timeout 600
    python3 router_client.py register --router URL --worker URL [--worker URL ...] [--skip-unready]
                                      [--auth-file F] --timeout 60

Stdlib only. The API key (if any) is read from a root-only file holding it as
an HTTP header line (``Authorization: Bearer KEY``), never from argv. The
router and its servers share it: it authenticates the calls to the router's
/workers API and to the server, and it is registered with each worker
(POST /workers {"url", "api_key"}) so the router gives it to the server with
every request. A keyed server is never registered in a router that answers
without a key: through it, anyone could use the server.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request

POLL_S = 0.1


def call(method: str, url: str, body: dict | None = None, key: str | None = None,
         timeout: float = 5) -> tuple[int, object]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as error:
        return error.code, None
    except (urllib.error.URLError, OSError):
        return 0, None
    try:
        return status, json.loads(raw or b"null")
    except ValueError:
        return status, raw.decode(errors="replace")


PREFIX = "authorization: bearer "
KEY: str | None = None  # set by main() from --auth-file


def api_key(auth_file: str | None) -> str | None:
    """The key of an ``Authorization: Bearer KEY`` line in auth_file."""
    if not auth_file:
        return None
    try:
        with open(auth_file) as handle:
            for line in handle:
                line = line.strip()
                if line.lower().startswith(PREFIX) and line[len(PREFIX):].strip():
                    return line[len(PREFIX):].strip()
    except OSError as error:
        print(f"FAILED: cannot read the API key file {auth_file}: {error}")
        raise SystemExit(1) from error
    return None


def refused(router: str, status: int) -> bool:
    if status in (401, 403):
        print(f"FAILED: the router at {router} refused the API key ({status}): "
              + ("give the router and its servers the same key (api_key_env)" if KEY else
                 "it demands a key and this host has none (api_key_env)"))
        return True
    return False


def workers(router: str) -> list[dict] | None:
    status, body = call("GET", router + "/workers", key=KEY)
    if status != 200 or not isinstance(body, dict):
        if refused(router, status):
            raise SystemExit(1)
        return None
    return list(body.get("workers") or [])


def entries(router: str, url: str) -> list[dict] | None:
    listed = workers(router)
    return None if listed is None else [w for w in listed if str(w.get("url", "")).rstrip("/") == url]


def router_is_open(router: str) -> bool:
    """The router serves its /workers API without a key."""
    status, _ = call("GET", router + "/workers")
    return status == 200


def in_flight(local: str, key: str | None) -> int | None:
    """Requests running or waiting on the server (None: it does not say)."""
    status, body = call("GET", local + "/v1/loads", key=key)
    loads = body.get("loads") if status == 200 and isinstance(body, dict) else None
    if loads is None:
        status, body = call("GET", local + "/get_load", key=key)
        loads = body if status == 200 and isinstance(body, list) else None
    if loads is None:
        return None
    return sum(_requests(load) for load in loads)


def _requests(load: dict) -> int:
    """Running + waiting requests of one DP rank's load. sglang 0.5.23's /v1/loads says
    num_running_reqs (srt/managers/load_snapshot.py, LoadSnapshot); older /get_load num_reqs."""
    running = load.get("num_running_reqs", load.get("num_reqs", 0))
    return int(running or 0) + int(load.get("num_waiting_reqs", 0) or 0)


def drain(args) -> int:
    start = time.monotonic()
    found = entries(args.router, args.worker)
    if found is None:
        print(f"FAILED: the router at {args.router} does not answer GET /workers")
        return 1
    for worker in found:
        status, _ = call("DELETE", f"{args.router}/workers/{worker['id']}", key=KEY)
        if status not in (200, 202, 204, 404):
            print(f"FAILED: DELETE {args.router}/workers/{worker['id']} answered {status or 'nothing'}")
            return 1
    while found:
        found = entries(args.router, args.worker)
        if found and time.monotonic() - start > 30:
            print(f"FAILED: the router still lists {args.worker} 30 s after DELETE")
            return 1
        if found:
            time.sleep(POLL_S)
    removed = time.monotonic() - start
    peak = 0
    while True:
        busy = in_flight(args.local, KEY)
        if busy is None:
            print(f"drained: {args.worker} out of the router in {removed:.1f} s; "
                  f"{args.local} reports no load (not running?)")
            return 0
        peak = max(peak, busy)
        if busy == 0:
            print(f"drained: {args.worker} out of the router in {removed:.1f} s, idle after "
                  f"{time.monotonic() - start:.1f} s ({peak} request(s) were still running)")
            return 0
        if time.monotonic() - start > args.timeout:
            print(f"FAILED: {args.worker} still has {busy} request(s) after {args.timeout:.0f} s "
                  "(drain_timeout_s); it is out of the router and was not restarted")
            return 1
        time.sleep(POLL_S)


def register(args) -> int:
    start = time.monotonic()
    if KEY and router_is_open(args.router):
        print(f"FAILED: the router at {args.router} answers without an API key, and this server demands one: "
              "registered there, anyone reaching the router could use it; give the router the same key "
              "(its api_key_env)")
        return 1
    pending = []
    for url in args.worker:
        found = entries(args.router, url)
        if found is None:
            print(f"FAILED: the router at {args.router} does not answer GET /workers")
            return 1
        if any(w.get("is_healthy") for w in found):
            print(f"registered: {url} is already in the router at {args.router}, healthy")
            continue
        if args.skip_unready:
            status, _ = call("GET", url + "/health", key=KEY)
            if status != 200:
                print(f"skipped: {url} is not ready (/health {status or 'no answer'}): "
                      "it registers itself when its own deploy makes it ready")
                continue
        if not found:
            request = {"url": url, **({"api_key": KEY} if KEY else {})}
            status, body = call("POST", args.router + "/workers", request, key=KEY)
            if status not in (200, 201, 202):
                print(f"FAILED: POST {args.router}/workers {{url: {url}}} answered {status or 'nothing'}: {body}")
                return 1
        pending.append(url)
    failed = 0
    for url in pending:
        while True:
            found = entries(args.router, url) or []
            if any(w.get("is_healthy") for w in found):
                print(f"registered: {url} is in the router at {args.router}, healthy after "
                      f"{time.monotonic() - start:.1f} s")
                break
            if time.monotonic() - start > args.timeout:
                print(f"FAILED: the router at {args.router} does not report {url} healthy after "
                      f"{args.timeout:.0f} s (listed: {bool(found)})")
                failed += 1
                break
            time.sleep(POLL_S)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("drain")
    d.add_argument("--router", required=True)
    d.add_argument("--worker", required=True)
    d.add_argument("--local", required=True)
    d.add_argument("--auth-file")
    d.add_argument("--timeout", type=float, default=600)
    r = sub.add_parser("register")
    r.add_argument("--router", required=True)
    r.add_argument("--worker", action="append", required=True)
    r.add_argument("--skip-unready", action="store_true")
    r.add_argument("--auth-file")
    r.add_argument("--timeout", type=float, default=60)
    args = parser.parse_args(argv)
    global KEY
    KEY = api_key(args.auth_file)
    args.router = args.router.rstrip("/")
    if args.command == "drain":
        args.worker = args.worker.rstrip("/")
        return drain(args)
    args.worker = [url.rstrip("/") for url in args.worker]
    return register(args)


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # a TextIOWrapper here
    sys.exit(main())
