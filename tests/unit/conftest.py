"""What every unit test gets."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def no_hub_tensor_headers(monkeypatch):
    """The memory plan's Hub header reads (core/checkpoint_tensors.py) answer "offline" in unit tests, so
    none reaches a sandbox Hub that happens to be up on this machine; a test that wants headers
    patches hub_tensor_groups itself."""
    from core import checkpoint_tensors

    def offline(*_args, **_kwargs):
        raise OSError("unit tests do not ask the Hub")

    monkeypatch.setattr(checkpoint_tensors, "hub_tensor_groups", offline)
