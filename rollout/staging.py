"""Stage then switch: what each server's restart switches to, prepared before its batch.

A rollout stages (stage.py: tasks/pipeline.py STAGE_PIPELINE - the package
set's own venv, the model revision's own dir, both verified, peers seeding)
on the servers of the later batches once the canary passed (no canary: before
the first batch), ``parallel`` hosts at a time in one pyinfra run each, while
every one of them keeps serving. A batch's deploy then finds its venv and its
revision in place, so it only drains, restarts, passes readiness and
registers. ``--stage-only`` stages every server and restarts nothing.

A host whose stage fails is failed in the summary ("stage: ..."), counts
against --max-failed like a failed batch host, and its batch skips it: what
serves there was not touched.

    stage_chunks(["a", "b", "c"], 2)   # [Batch("stage 1", ["a", "b"]), Batch("stage 2", ["c"])]
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollout.batches import Batch, HostResult, RolloutReport

STAGE_FILE = "stage.py"
# ``driver``: the rollout's rollout.driver.Driver (which imports this module): its run_batch, echo, specs,
# groups, dry, stage_parallel


def stage_chunks(names: list[str], parallel: int, groups: dict[str, str] | None = None) -> list[Batch]:
    """``names`` in runs of at most ``parallel`` hosts (a multi-node group's ranks together, as one).

    >>> [(b.label, b.hosts) for b in stage_chunks(["a", "b", "c"], 2)]
    [('stage 1', ['a', 'b']), ('stage 2', ['c'])]
    """
    from rollout.batches import plan_batches

    return [type(b)(f"stage {b.label}", b.hosts) for b in plan_batches([], names, parallel, 0, groups)]


def stage(driver: Any, names: list[str], report: RolloutReport, seeding) -> list[str]:
    """Stage ``names``; each host's ``staged_s`` (and, failed, its result) in ``report``: the hosts that failed."""
    from rollout.batches import HostResult

    failed: list[str] = []
    for chunk in stage_chunks(names, driver.stage_parallel, driver.groups):
        driver.echo(f"rollout: {chunk.label}: {', '.join(chunk.hosts)} (nothing restarts)"
                    + (" (dry: plan only)" if driver.dry else ""))
        staged: dict[str, HostResult] = {name: HostResult(name, chunk.label) for name in chunk.hosts}
        t0 = time.monotonic()
        driver.run_batch(chunk, staged, seeding.offers(chunk.hosts), deploy_file=STAGE_FILE)
        took = time.monotonic() - t0
        report.batch_seconds[chunk.label] = took
        for name, result in staged.items():
            merged(report.results[name], result, took)
            if result.result == "failed":
                failed.append(name)
        seeding.converged([name for name in chunk.hosts if staged[name].result == "ok"])
        driver.echo(f"rollout: {chunk.label} done in {took:.1f} s"
                    + (f", failed: {', '.join(n for n in chunk.hosts if n in failed)}" if
                       any(n in failed for n in chunk.hosts) else ", staged"))
    return failed


def merged(into: HostResult, stage_result: HostResult, took: float) -> None:
    """The stage's result in the host's own: failed ("stage: why"), or staged (its time, whether it changed)."""
    into.staged_s = took
    into.changed = bool(into.changed) or bool(stage_result.changed)
    into.changes = [*into.changes, *stage_result.changes]
    into.known_failures = [*into.known_failures, *stage_result.known_failures]
    if stage_result.result in ("failed", "would fail"):
        into.result = stage_result.result
        into.error = f"stage: {stage_result.error}"
        into.restarted = False if stage_result.result == "failed" else into.restarted
    elif stage_result.result in ("ok", "planned"):
        into.result = "staged" if stage_result.result == "ok" else "planned"


def later_servers(batches: list[Batch], after: int, specs: dict, results: dict[str, HostResult]) -> list[str]:
    """The servers of the batches after index ``after`` that have not failed, in batch order."""
    return [name for batch in batches[after + 1 :] for name in batch.hosts
            if name in specs and results[name].result != "failed"]


def without_failed(batch: Batch, results: dict[str, HostResult], groups: dict[str, str]) -> Batch:
    """``batch`` without the hosts whose stage failed (and the other ranks of their multi-node group)."""
    failed = {name for name in batch.hosts if results[name].result == "failed"}
    failed |= {name for name in batch.hosts if groups.get(name) and
               any(groups.get(name) == groups.get(other) for other in failed)}
    return batch if not failed else type(batch)(batch.label, [n for n in batch.hosts if n not in failed])


def only(driver: Any, report: RolloutReport, seeding) -> None:
    """--stage-only: stage every targeted server, restart nothing; exit 1 when any failed (or, dry, would)."""
    servers = [name for batch in report.batches for name in batch.hosts if name in driver.specs]
    failed = stage(driver, servers, report, seeding)
    if failed or any(report.results[name].known_failures for name in servers):
        report.exit_code = 1
    for name in report.results:
        if name not in driver.specs:
            report.results[name].result = "not run"  # router hosts: nothing to stage
