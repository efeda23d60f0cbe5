"""host.data the sandbox inventories give every sandbox host (inventory/sandbox.py,
inventory/sandbox_fleet.py): how pyinfra reaches it, and the offline pip wheel."""

from __future__ import annotations

import os
from pathlib import Path

WHEELS = Path("/var/cache/sglang-converge/wheels")


def connection_data(entry: dict) -> dict:
    """ssh_* keys for one host of the sandbox state file, plus the pip wheel when there is one."""
    data = {
        "ssh_hostname": entry["address"],
        "ssh_user": "root",
        "ssh_key": entry["ssh_key"],
        # every guest of one rootfs shares its host keys: no known_hosts
        "ssh_known_hosts_file": "/dev/null",
        "ssh_strict_host_key_checking": "no",
        "ssh_allow_agent": False,
        "ssh_look_for_keys": False,
        # a 2-core machine busy with 8 stand-in ranks (and CI's unit tests) can be slow to answer a
        # handshake: a few tries, seconds apart, rather than pyinfra's 0.1-0.5 s
        "ssh_connect_retries": 3,
        "ssh_connect_retry_min_delay": 1.0,
        "ssh_connect_retry_max_delay": 3.0,
    }
    wheels = sorted(WHEELS.glob("pip-*.whl"))  # the offline pip bootstrap the scenario keeps
    if wheels:
        data["pip_wheel"] = str(wheels[-1])
    return data


def parse_indexes(text: str) -> set[int]:
    """ "290-299,301" -> {290, ..., 299, 301}"""
    out: set[int] = set()
    for part in text.replace(",", " ").split():
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return out


def real_indexes() -> set[int]:
    """Host indexes that run the real SGLang server (inventory/sandbox_real.py), not the stand-in."""
    return parse_indexes(os.environ.get("SGC_REAL_INDEXES", "290-299"))
