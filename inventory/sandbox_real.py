"""pyinfra inventory: sandbox hosts that run the REAL SGLang server (group_data/sandbox_real.py).

    python -c 'from sandbox import hosts; hosts.up(indexes=[290])'
    pyinfra inventory/sandbox_real.py deploy.py

The group `sandbox_real` is the sandbox hosts that are up with an index in
SGC_REAL_INDEXES (default "290-299", sandbox.inventory_data.REAL_INDEXES); they
are not in inventory/sandbox.py's `sandbox` group. With SGC_REAL_ROUTER naming an
up sandbox host (outside those indexes), that host is the group `routers`
(group_data/routers.py) and the real servers register with it. Only connection
keys, the Hub stand-in's URL and the router URLs are set here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

try:
    from pyinfra.api.exceptions import InventoryError
except ImportError:  # read without pyinfra (plain import, tests)
    InventoryError = RuntimeError  # type: ignore[misc,assignment]

from sandbox import hubd  # noqa: E402
from sandbox.inventory_data import connection_data, real_indexes  # noqa: E402

STATE_FILE = Path(os.environ.get("SGC_STATE_DIR", "/run/sglang-converge-sandbox")) / "hosts.json"
PORT = 30000


def _real_hosts() -> tuple[list, list]:
    try:
        state = json.loads(STATE_FILE.read_text())
    except FileNotFoundError:
        state = {"hosts": {}}
    except ValueError as err:
        raise InventoryError(f"sandbox state file {STATE_FILE} is unreadable ({err})") from None
    wanted = real_indexes()
    entries = sorted((e for e in state.get("hosts", {}).values() if int(e["index"]) in wanted),
                     key=lambda e: int(e["index"]))
    if not entries:
        raise InventoryError(
            f"no real-server sandbox host is up ({STATE_FILE} lists none with an index in "
            f"{min(wanted)}-{max(wanted)}): boot one with sandbox.hosts.up(indexes=[290])"
        )
    router_name = os.environ.get("SGC_REAL_ROUTER", "")
    router = next((e for e in state.get("hosts", {}).values() if e["name"] == router_name), None)
    if router_name and router is None:
        raise InventoryError(f"SGC_REAL_ROUTER={router_name!r} is not an up sandbox host")
    routers, servers = [], []
    router_url = f"http://{router['address']}:{PORT}" if router else None
    if router:
        routers.append((router["name"], {**connection_data(router), "router_url": router_url,
                                         "api_key_required": False}))
    for e in entries:
        data = {**connection_data(e), "hf_endpoint": hubd.ENDPOINT}
        if router_url:
            data.update(router_url=router_url, worker_url=f"http://{e['address']}:{PORT}")
        servers.append((e["name"], data))
    return routers, servers


routers, sandbox_real = _real_hosts()
