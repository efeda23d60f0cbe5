"""pyinfra inventory: the local sandbox hosts (`python -m sandbox up --hosts N` first).

    pyinfra inventory/sandbox.py deploy.py

Reads the sandbox state file (/run/sglang-converge-sandbox/hosts.json) and
defines the group `sandbox`, hosts in index order (sgc1, sgc2, ...).
Only pyinfra ssh_* connection keys are set here: the deploy settings of
the sandbox hosts live in group_data/sandbox.py.
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


def _sandbox_hosts() -> list[tuple[str, dict]]:
    try:
        state = json.loads(STATE_FILE.read_text())
    except FileNotFoundError:
        state = {"hosts": {}}
    except ValueError as err:
        raise InventoryError(
            f"sandbox state file {STATE_FILE} is unreadable ({err}): "
            "run `python -m sandbox down`, then `python -m sandbox up --hosts N`"
        ) from None
    # the real-server hosts are inventory/sandbox_real.py's (they must not get the stand-in's settings)
    entries = sorted((e for e in state.get("hosts", {}).values() if int(e["index"]) not in real_indexes()),
                     key=lambda e: int(e["index"]))
    if not entries:
        raise InventoryError(
            f"no sandbox hosts are up ({STATE_FILE} lists none): run `python -m sandbox up --hosts N` first"
        )
    # the sandbox's Hub stand-in (sandbox/hubd.py), reached through the guest's gateway
    return [(e["name"], {**connection_data(e), "hf_endpoint": hubd.ENDPOINT}) for e in entries]


sandbox = _sandbox_hosts()
