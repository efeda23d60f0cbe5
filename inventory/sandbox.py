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
    entries = sorted(state.get("hosts", {}).values(), key=lambda e: int(e["index"]))
    if not entries:
        raise InventoryError(
            f"no sandbox hosts are up ({STATE_FILE} lists none): run `python -m sandbox up --hosts N` first"
        )
    hosts = []
    for e in entries:
        hosts.append(
            (
                e["name"],
                {
                    "ssh_hostname": e["address"],
                    "ssh_user": "root",
                    "ssh_key": e["ssh_key"],
                    "ssh_known_hosts_file": "/dev/null",
                    "ssh_strict_host_key_checking": "no",
                    "ssh_allow_agent": False,
                    "ssh_look_for_keys": False,
                    "ssh_connect_retries": 2,
                    # the sandbox's Hub stand-in (sandbox/hubd.py), reached through the guest's gateway
                    "hf_endpoint": f"http://10.77.0.1:{_hub_port()}",
                    **_pip_wheel(),
                },
            )
        )
    return hosts


def _hub_port() -> int:
    try:
        return int(json.loads((STATE_FILE.parent / "hub.json").read_text())["port"])
    except (OSError, ValueError, KeyError):
        return 18080


def _pip_wheel() -> dict:
    """The offline pip bootstrap: the pip wheel the scenario keeps on the machine."""
    wheels = sorted(Path("/var/cache/sglang-converge/wheels").glob("pip-*.whl"))
    return {"pip_wheel": str(wheels[-1])} if wheels else {}


sandbox = _sandbox_hosts()
