"""HTTP: what a GET on the host itself answers (no firewall between us and the port)."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase


class HttpStatus(FactBase[int]):
    """
    HTTP status of a GET on the host itself (0 when nothing answers).

    .. code:: python

        host.get_fact(HttpStatus, url="http://127.0.0.1:30000/health")  # 200, 503 while loading
    """

    def command(self, url: str) -> str:
        return f"curl -s -m 3 -o /dev/null -w '%{{http_code}}' {shlex.quote(url)} || true"

    def process(self, output: list[str]) -> int:
        text = "".join(output).strip()
        return int(text) if text.isdigit() else 0
