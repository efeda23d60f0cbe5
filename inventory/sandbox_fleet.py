"""pyinfra inventory: a fleet of local sandbox hosts, SGLang's router in front.

    python -c 'from sandbox import hosts; hosts.up(indexes=[10, 11, 12, 13, 14])'
    python -m rollout inventory/sandbox_fleet.py --batch-size 2 --canary 1
    pyinfra inventory/sandbox_fleet.py deploy.py          # all at once

The fleet is the sandbox hosts that are up with an index in SGC_FLEET_INDEXES
(default "10-19"), in index order. The first of them (or SGC_FLEET_ROUTER, a
host name; "" for none) is the router host (group `routers`,
group_data/routers.py); the others are SGLang servers (group `sandbox`,
group_data/sandbox.py) that register with it. Only connection keys, the
Hub stand-in's URL, the offline pip wheel and the URLs are set here.
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
from sandbox.inventory_data import connection_data  # noqa: E402

STATE_FILE = Path(os.environ.get("SGC_STATE_DIR", "/run/sglang-converge-sandbox")) / "hosts.json"
SERVER_PORT = 30000
ROUTER_PORT = 30000


def _indexes(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.replace(",", " ").split():
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return out


def _fleet() -> tuple[list, list]:
    try:
        state = json.loads(STATE_FILE.read_text())
    except FileNotFoundError:
        state = {"hosts": {}}
    except ValueError as err:
        raise InventoryError(f"sandbox state file {STATE_FILE} is unreadable ({err})") from None
    wanted = _indexes(os.environ.get("SGC_FLEET_INDEXES", "10-19"))
    entries = sorted((e for e in state.get("hosts", {}).values() if int(e["index"]) in wanted),
                     key=lambda e: int(e["index"]))
    if not entries:
        raise InventoryError(
            f"no sandbox fleet host is up ({STATE_FILE} lists none with an index in {sorted(wanted)}): "
            "boot them with sandbox.hosts.up(indexes=[10, 11, ...])"
        )
    router_name = os.environ.get("SGC_FLEET_ROUTER", entries[0]["name"] if len(entries) > 1 else "")
    router_entry = next((e for e in entries if e["name"] == router_name), None)
    if router_name and router_entry is None:
        raise InventoryError(f"SGC_FLEET_ROUTER={router_name!r} is not an up fleet host: "
                             f"{', '.join(e['name'] for e in entries)}")
    router_url = f"http://{router_entry['address']}:{ROUTER_PORT}" if router_entry else None
    routers, servers = [], []
    for e in entries:
        data = connection_data(e)
        if e is router_entry:
            # like the sandbox servers (group_data/sandbox.py): keyed when SGLANG_API_KEY is exported
            routers.append((e["name"], {**data, "router_url": router_url, "api_key_required": False}))
        else:
            data["hf_endpoint"] = hubd.ENDPOINT
            if router_url:
                data.update(router_url=router_url, worker_url=f"http://{e['address']}:{SERVER_PORT}")
            servers.append((e["name"], data))
    return routers, servers


routers, sandbox = _fleet()
