"""The rollout's summary: a table per host, then the totals and each fleet-level stop or dry-run verdict."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from rollout import router_loss

if TYPE_CHECKING:
    from rollout.batches import RolloutReport


def summary_table(report: RolloutReport):
    """The rollout's summary as a rich Table."""
    from rich.table import Table

    title = "rollout" + (" (dry run: nothing changed)" if report.dry or any(r.result == "planned" for r in
                                                                            report.results.values()) else "")
    table = Table(title=title)
    for column in ("host", "batch", "result", "changed", "restarted", "staged", "time to ready", "out of router",
                   "error"):
        table.add_column(column, overflow="fold")

    def seconds(value: float | None) -> str:
        return f"{value:.1f} s" if value is not None else "-"

    def yes_no(value: bool | None) -> str:
        return "-" if value is None else ("yes" if value else "no")

    for result in report.results.values():
        table.add_row(
            result.host,
            result.batch,
            result.result,
            yes_no(result.changed),
            yes_no(result.restarted),
            seconds(result.staged_s),  # its stage's run (rollout/staging.py), ahead of its batch
            seconds(result.ready_s),
            seconds(result.out_of_router_s),  # drained to registered again
            result.error,
        )
    return table


def print_summary(report: RolloutReport, console=None) -> None:
    from rich.console import Console

    from core.dry_run import verdict_lines

    console = console or Console(stderr=False, width=max(120, int(os.environ.get("COLUMNS", "0") or 0)))
    console.print(summary_table(report))
    ok = sum(r.result in ("ok", "staged") for r in report.results.values())
    restarted = sum(bool(r.restarted) for r in report.results.values())
    console.print(
        f"rollout: {ok}/{len(report.results)} host(s) ok, {restarted} restarted, "
        f"{report.total_s:.1f} s in all (preflight {report.preflight_s:.1f} s)"
        + (f"; stopped after batch {report.stopped_after}" if report.stopped_after else "")
    )
    router_loss.print_lines(report, console)  # a router lost, the servers out of their router
    if report.dry:  # its last lines: each host the real run would fail on, each failure (core/dry_run.py)
        for line in verdict_lines({name: r.known_failures for name, r in report.results.items()}):
            console.print(line, style="red", markup=False, highlight=False, soft_wrap=True)  # one line each
