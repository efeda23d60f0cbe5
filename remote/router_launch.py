"""Runs ON a router host, as the router unit's ExecStart: start SGLang's router
(sglang-router) with its API key read from a root-only file, never argv.

    VENV/bin/python router_launch.py --auth-file /etc/sglang/sglang-router.auth -- --host 0.0.0.0 --port 30000 ...

The file (mode 0600) holds the key as an HTTP header line,
``Authorization: Bearer KEY``. The key goes to the router's Python API
(RouterArgs.api_key, what --api-key sets), so it is absent from
/proc/*/cmdline, the unit file and the journal. With it the router demands
``Authorization: Bearer KEY`` from clients and from callers of its /workers
API (/liveness, /readiness and /health stay open).
"""

from __future__ import annotations

import sys

PREFIX = "authorization: bearer "


def read_key(path: str) -> str:
    with open(path) as handle:
        for line in handle:
            line = line.strip()
            if line.lower().startswith(PREFIX) and line[len(PREFIX):].strip():
                return line[len(PREFIX):].strip()
    raise SystemExit(f"router_launch: no 'Authorization: Bearer KEY' line in {path}")


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[0] != "--auth-file" or argv[2] != "--":
        raise SystemExit("usage: router_launch.py --auth-file FILE -- ROUTER-ARGS...")
    key = read_key(argv[1])
    from sglang_router.launch_router import launch_router, parse_router_args

    args = parse_router_args(argv[3:])
    args.api_key = key
    launch_router(args)


if __name__ == "__main__":
    main(sys.argv[1:])
