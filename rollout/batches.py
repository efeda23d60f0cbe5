"""A rollout's batches and its results: the plan (router hosts, canary, batches of N) and each host's row."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Batch:
    label: str  # "router", "canary", "1", "2", ...
    hosts: list[str]


@dataclass
class HostResult:
    host: str
    batch: str
    result: str = "not run"  # "ok", "failed", "not run", "planned", "would fail" (dry), "preflight failed"
    changed: bool | None = None
    restarted: bool | None = None
    ready_s: float | None = None
    error: str = ""
    changes: list[str] = field(default_factory=list)  # dry: the operations that would change
    known_failures: list[str] = field(default_factory=list)  # what the (dry run's) real run fails on
    out_of_router: str = ""  # why the server is out of its router after the run ("": in it, or none)
    router_lost: str = ""  # its router calls that got no answer (rollout/router_loss.py)
    out_of_router_s: float | None = None  # drained to registered again (None: not both in this run)
    staged_s: float | None = None  # its stage's run before its batch (rollout/staging.py; None: not staged)


@dataclass
class RolloutReport:
    results: dict[str, HostResult]
    batches: list[Batch]
    exit_code: int
    preflight_problems: dict[str, list[str]] = field(default_factory=dict)
    batch_seconds: dict[str, float] = field(default_factory=dict)
    total_s: float = 0.0
    preflight_s: float = 0.0
    stopped_after: str | None = None
    dry: bool = False


def plan_batches(routers: list[str], servers: list[str], batch_size: int, canary: int,
                 groups: dict[str, str] | None = None) -> list[Batch]:
    """Router hosts one at a time, then the canary batch, then batches of batch_size, in the given order.

    ``groups`` (host -> multi-node TP group key): the ranks of a group are
    (re)started together, so they count as one and always share a batch.

    >>> [(b.label, b.hosts) for b in plan_batches(["r"], ["a", "b", "c", "d"], 2, 1)]
    [('router', ['r']), ('canary', ['a']), ('1', ['b', 'c']), ('2', ['d'])]
    """
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    if canary < 0:
        raise ValueError(f"canary must be >= 0, got {canary}")
    groups = groups or {}
    batches = [Batch("router" if len(routers) == 1 else f"router {i + 1}", [name])
               for i, name in enumerate(routers)]
    units: list[list[str]] = []
    seen: set[str] = set()
    for name in servers:
        if name in seen:
            continue
        key = groups.get(name)
        unit = [other for other in servers if key is not None and groups.get(other) == key] or [name]
        seen.update(unit)
        units.append(unit)
    if canary and units:
        batches.append(Batch("canary", [n for unit in units[:canary] for n in unit]))
        units = units[canary:]
    for i in range(0, len(units), batch_size):
        batches.append(Batch(str(i // batch_size + 1), [n for unit in units[i : i + batch_size] for n in unit]))
    return batches
