"""Where a rollout's time goes: wall seconds per phase, per operation and per fact.

Off unless ``SGC_ROLLOUT_PROFILE`` is set (a path: the profile is written
there as JSON when the rollout ends; ``-`` or ``1``: printed only). The driver
marks its phases (``with profile.phase("connect"): ...``); operations are timed
by a pyinfra state callback (host start to success/error), facts and every
remote command by wrapping pyinfra's ``get_fact`` and ``run_shell_command``.
Phases may overlap (facts are gathered inside "prepare" or an operation);
bench/rollout.py reads the JSON and prints it.

    from rollout import profile
    with profile.phase("connect"):
        connect_all(state)
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

ENV = "SGC_ROLLOUT_PROFILE"


class Profile:
    """Seconds and counts per key ("phase:connect", "op:...", "fact:...")."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self._op_started: dict[tuple[str, str], float] = {}

    def add(self, key: str, seconds: float) -> None:
        self.seconds[key] += seconds
        self.counts[key] += 1

    def as_dict(self) -> dict[str, Any]:
        keys = sorted(self.seconds, key=lambda k: (k.split(":", 1)[0], -self.seconds[k]))
        return {key: {"s": round(self.seconds[key], 3), "n": self.counts[key]} for key in keys}

    def callback(self):
        """A pyinfra state callback handler timing each operation per host."""
        from pyinfra.api.state import BaseStateCallback

        profile = self

        def done(state, host, op_hash) -> None:
            started = profile._op_started.pop((host.name, op_hash), None)
            if started is not None:
                names = ", ".join(sorted(state.get_op_meta(op_hash).names))
                profile.add(f"op:{names}", time.monotonic() - started)

        class OpTimes(BaseStateCallback):
            @staticmethod
            def operation_host_start(state, host, op_hash) -> None:
                profile._op_started[(host.name, op_hash)] = time.monotonic()

            @staticmethod
            def operation_host_success(state, host, op_hash, retry_count: int = 0) -> None:
                done(state, host, op_hash)

            @staticmethod
            def operation_host_error(state, host, op_hash, *args, **kwargs) -> None:
                done(state, host, op_hash)

        return OpTimes()


_current: Profile | None = None


def enabled() -> bool:
    return _current is not None


def start() -> Profile | None:
    """A fresh profile when ``SGC_ROLLOUT_PROFILE`` is set (pyinfra's facts and commands timed too)."""
    global _current
    if not os.environ.get(ENV):
        _current = None
        return None
    _current = Profile()
    _wrap_pyinfra()
    return _current


_scope: list[str] = []


@contextmanager
def phase(name: str, scope: bool = False) -> Iterator[None]:
    """Time the block as ``phase:NAME`` (nothing when profiling is off); with
    ``scope`` the phases inside it are named ``NAME: inner``."""
    if _current is None:
        yield
        return
    full = ": ".join([*_scope, name])
    if scope:
        _scope.append(name)
    started = time.monotonic()
    try:
        yield
    finally:
        if scope:
            _scope.pop()
        _current.add(f"phase:{full}", time.monotonic() - started)


def watch(state) -> None:
    """Time this State's operations (nothing when profiling is off)."""
    if _current is not None:
        state.add_callback_handler(_current.callback())


def finish(echo=print) -> dict[str, Any] | None:
    """Write (``SGC_ROLLOUT_PROFILE`` a path) and print the profile; None when off."""
    if _current is None:
        return None
    data = _current.as_dict()
    target = os.environ.get(ENV, "")
    if target not in ("", "-", "1"):
        with open(target, "w") as f:
            json.dump(data, f, indent=1)
    for key, value in data.items():
        echo(f"rollout: profile: {value['s']:8.2f} s  x{value['n']:<4} {key}")
    return data


_wrapped = False


def _wrap_pyinfra() -> None:
    """Time every fact (by class, prepare or execute) and every remote command."""
    global _wrapped
    if _wrapped:
        return
    _wrapped = True
    from pyinfra.api import host as host_module
    from pyinfra.api.host import Host

    original_get_fact = host_module.get_fact
    original_run = Host.run_shell_command

    def timed_get_fact(state, host, cls, *args, **kwargs):
        started = time.monotonic()
        try:
            return original_get_fact(state, host, cls, *args, **kwargs)
        finally:
            if _current is not None:
                stage = "execute" if state.is_executing else "prepare"
                _current.add(f"fact:{stage}:{getattr(cls, '__name__', cls)}", time.monotonic() - started)

    def timed_run(self, *args, **kwargs):
        started = time.monotonic()
        try:
            return original_run(self, *args, **kwargs)
        finally:
            if _current is not None:
                _current.add("ssh:run_shell_command", time.monotonic() - started)

    host_module.get_fact = timed_get_fact
    Host.run_shell_command = timed_run  # type: ignore[method-assign]
