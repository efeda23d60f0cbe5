"""Shared base for the typed values facts return."""

from __future__ import annotations

import dataclasses


class FactValue:
    """Mixin for fact dataclasses: JSON for `pyinfra INVENTORY fact tasks.x.Fact`."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)  # type: ignore[call-overload]
