"""Shared base for the typed values facts return."""

from __future__ import annotations

import dataclasses
from typing import Any


class FactValue:
    """Mixin for fact dataclasses: JSON for `pyinfra INVENTORY fact facts.x.Fact`."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]
