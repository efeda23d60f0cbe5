"""What one run learns as it goes, kept on pyinfra's State (never in module globals).

A State is one run: the CLI makes one, the rollout driver one per batch, a
test one per case. Steps write here while executing, later steps and the
rollout driver read it:

- ``restarted``: hosts whose server (or router) this run (re)started, so
  readiness waits for the new process instead of trusting a stale 200;
- ``restarted_at``: when (the controller's monotonic clock) that (re)start returned;
- ``ready_s``: seconds from that (re)start to ready, per host;
- ``failures``: why a host failed, recorded where it failed (step, cause,
  the lines that explain it), so nobody has to parse log text.

    from core.runstate import run_state
    run_state().restarted.add(host.name)
    run_state().fail(host.name, "readiness", "sglang.service failed", journal_lines)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from pyinfra.context import ctx_state

_ATTR = "sglang_converge_run"
T = TypeVar("T")


@dataclass(frozen=True)
class Failure:
    """Why a host failed: the step, the cause in one line, and the lines that explain it."""

    step: str
    cause: str
    detail: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.step}: {self.cause}"


@dataclass
class RunState:
    restarted: set[str] = field(default_factory=set)
    restarted_at: dict[str, float] = field(default_factory=dict)
    ready_s: dict[str, float] = field(default_factory=dict)
    failures: dict[str, list[Failure]] = field(default_factory=dict)
    extensions: dict[str, Any] = field(default_factory=dict)  # per-concern state (e.g. node-group boards)

    def fail(self, host_name: str, step: str, cause: str, detail: list[str] | tuple[str, ...] = ()) -> Failure:
        failure = Failure(step, cause.strip(), tuple(detail))
        self.failures.setdefault(host_name, []).append(failure)
        return failure

    def first_failure(self, host_name: str) -> Failure | None:
        found = self.failures.get(host_name)
        return found[0] if found else None

    def extension(self, key: str, factory: type[T]) -> T:
        """A concern's own per-run object (made on first use)."""
        if key not in self.extensions:
            self.extensions[key] = factory()
        value: T = self.extensions[key]
        return value


def run_state(state: Any = None) -> RunState:
    """This run's RunState (``state``: a pyinfra State; default: the current one)."""
    current = state if state is not None else ctx_state.get()
    run = getattr(current, _ATTR, None)
    if run is None:
        run = RunState()
        setattr(current, _ATTR, run)
    return run
