"""SGLang's router: the workers it lists, asked from the host."""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyinfra.api import FactBase, QuoteString, StringCommand

from facts._value import FactValue


@dataclass(frozen=True)
class RouterWorker(FactValue):
    id: str
    url: str
    healthy: bool
    load: int = 0


class RouterWorkers(FactBase[list[RouterWorker] | None]):
    """
    The workers a router lists (GET /workers), asked from the host (None when
    the router does not answer).

    .. code:: python

        workers = host.get_fact(RouterWorkers, router_url="http://10.77.10.2:30000",
                                auth_file="/etc/sglang/sglang.auth")  # auth_file: a keyed router
        [w.url for w in workers or [] if w.healthy]
    """

    def command(self, router_url: str, auth_file: str | None = None) -> StringCommand:
        # A keyed router wants the key: curl reads the header line from the root-only file.
        auth = ["-H", QuoteString("@" + auth_file)] if auth_file else []
        return StringCommand(
            "curl -s -f -m 5", *auth, QuoteString(router_url.rstrip("/") + "/workers"), "|| echo unreachable"
        )

    def process(self, output: list[str]) -> list[RouterWorker] | None:
        text = "\n".join(output).strip()
        if not text.startswith("{"):
            return None
        try:
            body = json.loads(text)
        except ValueError:
            return None
        return [
            RouterWorker(
                id=str(w.get("id", "")),
                url=str(w.get("url", "")).rstrip("/"),
                healthy=bool(w.get("is_healthy")),
                load=int(w.get("load") or 0),
            )
            for w in body.get("workers") or []
        ]
