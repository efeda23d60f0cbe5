"""pyinfra inventory: two SGLang servers on ONE sandbox host (two entries for the same machine), on
disjoint GPUs: <host>-a on GPUs 0-3 (sglang-a.service, port 30000) and <host>-b on GPUs 4-7
(sglang-b.service, port 30001), TP 4 each, the same model (one download, shared).

    python -c 'from sandbox import hosts; hosts.up(indexes=[240])'
    pyinfra inventory/sandbox_two.py deploy.py

SGC_TWO_HOST (default "sgc240") names the sandbox host; its ssh_* keys come from
inventory/sandbox.py. The entries are in group `sandbox` (group_data/sandbox.py applies).
SGC_TWO_B_ENV="KEY=VALUE" adds one variable to b's extra_env only: a change to one server.
"""

from __future__ import annotations

import os
import runpy
from pathlib import Path

try:
    from pyinfra.api.exceptions import InventoryError
except ImportError:  # read without pyinfra (plain import, tests)
    InventoryError = RuntimeError  # type: ignore[misc,assignment]

_HERE = Path(__file__).resolve().parent
_NAME = os.environ.get("SGC_TWO_HOST", "sgc240")
_UP = {name: data for name, data in runpy.run_path(str(_HERE / "sandbox.py"))["sandbox"]}
if _NAME not in _UP:
    raise InventoryError(f"sandbox host {_NAME} is not up: python -c 'from sandbox import hosts; "
                         f"hosts.up(indexes=[{_NAME.removeprefix('sgc')}])' (up: {', '.join(_UP) or 'none'})")


def _b_env() -> dict[str, str]:
    """group_data/sandbox.py's extra_env (host data replaces a group's dict whole) plus SGC_TWO_B_ENV."""
    env = dict(runpy.run_path(str(_HERE.parent / "group_data" / "sandbox.py"))["extra_env"])
    key, sep, value = os.environ.get("SGC_TWO_B_ENV", "").partition("=")
    return {**env, key: value} if sep else env


_SERVER = {"tp_size": 4, "model": "sandbox-tiny"}
sandbox = [
    (f"{_NAME}-a", {**_UP[_NAME], **_SERVER, "gpu_ids": [0, 1, 2, 3], "unit_name": "sglang-a.service",
                    "listen_port": 30000}),
    (f"{_NAME}-b", {**_UP[_NAME], **_SERVER, "gpu_ids": [4, 5, 6, 7], "unit_name": "sglang-b.service",
                    "listen_port": 30001, "extra_env": _b_env()}),
]
