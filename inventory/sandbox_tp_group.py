"""pyinfra inventory: a 2-node tensor-parallel group on sandbox hosts sgc20 + sgc21
(TP 16 over 2 x 8 simulated GPUs), the node group described once.

    python -c 'from sandbox import hosts; hosts.up(indexes=[20, 21])'
    pyinfra inventory/sandbox_tp_group.py deploy.py

The hosts and their ssh_* keys come from inventory/sandbox.py (the sandbox
state file); they are in group `sandbox`, so group_data/sandbox.py applies.
SGC_TP_GROUP_HOSTS (default "sgc20,sgc21") names the group's hosts in rank
order. The group below is defined after `sandbox`, so its data wins where both
set a key (pyinfra merges group data in definition order).
"""

from __future__ import annotations

import os
import runpy
from pathlib import Path

try:
    from pyinfra.api.exceptions import InventoryError
except ImportError:  # read without pyinfra (plain import, tests)
    InventoryError = RuntimeError  # type: ignore[misc,assignment]

_RANKS = [name.strip() for name in os.environ.get("SGC_TP_GROUP_HOSTS", "sgc20,sgc21").split(",") if name.strip()]
_UP = {name: data for name, data in runpy.run_path(str(Path(__file__).with_name("sandbox.py")))["sandbox"]}
_MISSING = [name for name in _RANKS if name not in _UP]
if _MISSING:
    raise InventoryError(
        f"sandbox host(s) {', '.join(_MISSING)} of the TP group are not up: "
        f"python -c 'from sandbox import hosts; hosts.up(indexes=[...])' (up: {', '.join(_UP) or 'none'})"
    )

sandbox = [(name, _UP[name]) for name in _RANKS]

# The node group, once: each host's --nnodes, --node-rank and --dist-init-addr
# (rank 0's ssh_hostname and the port) are derived from it by tasks/spec/.
sandbox_tp16 = (
    list(_RANKS),
    {
        "node_group": {"name": "sandbox-tp16", "hosts": list(_RANKS), "dist_init_port": 20000},
        "tp_size": 8 * len(_RANKS),  # 8 simulated GPUs per host (group_data/sandbox.py's gpu_ids)
    },
)
