"""A router lost during a rollout: a fleet-level stop, and the servers left out of their router.

After each batch the driver takes from the batch's run state
(core/router_membership.py) which of its servers are out of their router
(drained and not registered again, or never registered) and which router
calls got no answer (``take``: into each host's result). A batch in which a
router stopped answering, or a router host failed, stops the rollout there,
whatever --max-failed (``stopped``): every later server would be drained from
nothing, restarted and fail its registration, so a lost router is not one
more failed host but the whole fleet's. The summary's last lines name the
router, what failed, and each server out of its router (``print_lines``);
once the router answers again, the next rollout registers every ready server
(the router's own batch, tasks/router.py, and each server's registration,
tasks/membership.py, also on a server it does not restart).
"""

from __future__ import annotations

from collections.abc import Callable

from core.router_membership import membership

AGAIN = "once the router answers again, run the rollout again: it registers every ready server"


def take(state, results: dict, names: list[str]) -> None:
    """Each host's place in its router after this batch (``state``: the batch's pyinfra State), into its
    HostResult: ``out_of_router`` (why it is out, "" when it is not), ``out_of_router_s`` (drained to
    registered, when both happened) and ``router_lost`` (what failed)."""
    record = membership(state)
    for name in names:
        results[name].out_of_router = record.out.get(name, "")
        results[name].out_of_router_s = record.out_s.get(name)
        results[name].router_lost = "; ".join(str(loss) for loss in record.losses.get(name, []))


def losses(batch, results: dict) -> list[str]:
    """Why this batch lost a router: each server's unanswered router call, each failed router host."""
    found = [f"{name}: {results[name].router_lost}" for name in batch.hosts if results[name].router_lost]
    if batch.label.startswith("router"):  # plan_batches: "router" / "router N", one router host each
        found += [f"the router host {name} failed: {results[name].error}" for name in batch.hosts
                  if results[name].result == "failed"]
    return found


def stopped(batch, batches: list, report, echo: Callable[[str], None], max_failed: int) -> bool:
    """Stop the rollout after ``batch`` when it lost a router (exit 1, the reason echoed); False: go on."""
    found = losses(batch, report.results)
    if not found:
        return False
    report.stopped_after = batch.label
    report.exit_code = 1
    later = [n for b in batches[batches.index(batch) + 1 :] for n in b.hosts]
    echo(f"rollout: stopped after batch {batch.label}: router lost: {'; '.join(found)}: a lost router stops the "
         f"whole rollout, whatever --max-failed ({max_failed})"
         + (f"; not touched: {', '.join(later)}" if later else ""))
    echo(f"rollout: {AGAIN}")
    return True


def summary_lines(report) -> list[str]:
    """The summary's last lines: each router lost (batch, what failed), each server out of its router."""
    lines = [f"rollout: router lost in batch {result.batch}: {name}: {result.router_lost}"
             for name, result in report.results.items() if result.router_lost]
    out = {name: result.out_of_router for name, result in report.results.items() if result.out_of_router}
    lines += [f"rollout: out of the router: {name}: {why}" for name, why in out.items()]
    if out:
        lines.append(f"rollout: {len(out)} server(s) out of the router ({', '.join(out)}): {AGAIN}")
    return lines


def print_lines(report, console) -> None:
    """``summary_lines``, in red, one line each (never wrapped: tests and operators grep them)."""
    for line in summary_lines(report):
        console.print(line, style="red", markup=False, highlight=False, soft_wrap=True)
