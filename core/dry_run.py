"""A dry run that already knows the real run would fail says so, last, and exits non-zero.

While pyinfra prepares (plans), a step that reads in its facts that it
cannot succeed (the pinned repo or revision missing on the Hub, a refused
token, disk short, a preflight problem, a foreign unit file) yields
``core.ops.fail_command(message)``: a command that fails the host when it
runs. A dry run never runs it, so ``fail_command`` also records the message
here while preparing, on the run's State (core/runstate.py), per host, in
plan order. A real run's prepare records the same and nothing reads it: the
command fails the host when it runs, as it always did.

- ``pyinfra INVENTORY deploy.py --dry``: config.py calls
  ``exit_nonzero_on_known_failures(state)``; each host with a known failure
  then joins pyinfra's ``state.failed_hosts`` (which pyinfra's CLI reads only
  to choose its exit status: 1) and ``verdict_lines`` are printed last, as
  the CLI exits;
- ``python -m rollout --dry``: the driver reads ``known_failures(state)``
  per host of each batch, and ends its summary with ``verdict_lines``
  (exit 1).

Only what a step finds before its first command is known while preparing
(pyinfra plans each operation up to its first command), and ``--dry -y``
plans nothing (pyinfra skips change detection).

    from core.dry_run import known_failures, verdict_lines
    for line in verdict_lines(known_failures(state)):
        print(line)
"""

from __future__ import annotations

import atexit
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.runstate import run_state

PREFIX = "dry run: the real run would fail on"


@dataclass
class KnownFailures:
    """What planning already knows will fail, per host (messages, in plan order)."""

    by_host: dict[str, list[str]] = field(default_factory=dict)
    fail_hosts: bool = False  # pyinfra's CLI --dry: each such host joins state.failed_hosts (exit status 1)


def _board(state: Any) -> KnownFailures:
    return run_state(state).extension("dry_run", KnownFailures)


def record_known_failure(state: Any, host: Any, message: str) -> None:
    """Remember, while preparing, that ``host`` would fail with ``message`` (core.ops.fail_command calls it).

    ``state``/``host``: pyinfra's State and Host objects (not the context proxies).

    .. code:: python

        record_known_failure(ctx_state.get(), ctx_host.get(), "model: repo sandbox/x not found on the Hub")
    """
    board = _board(state)
    listed = board.by_host.setdefault(host.name, [])
    if message not in listed:
        listed.append(message)
    if board.fail_hosts:
        state.failed_hosts.add(host)  # read by pyinfra's CLI only for its exit status; the plan goes on


def known_failures(state: Any) -> dict[str, list[str]]:
    """{host name: the failure messages planning found}, hosts with none left out.

    >>> from types import SimpleNamespace
    >>> state = SimpleNamespace()
    >>> record_known_failure(state, SimpleNamespace(name="sgc1"), "model: repo sandbox/x not found")
    >>> known_failures(state)
    {'sgc1': ['model: repo sandbox/x not found']}
    """
    return {name: list(found) for name, found in _board(state).by_host.items() if found}


def verdict_lines(known: Mapping[str, Sequence[str]]) -> list[str]:
    """The last lines of a dry run: a header, then one line per host and failure (a message's
    indented lines stay under it, indented); [] when nothing is known to fail.

    >>> for line in verdict_lines({"sgc1": ["model: repo sandbox/x not found on the Hub (HTTP 404)"]}):
    ...     print(line)
    dry run: nothing was changed; planning already knows the real run would fail on 1 host(s):
    dry run: the real run would fail on sgc1: model: repo sandbox/x not found on the Hub (HTTP 404)
    """
    hosts = [name for name, found in known.items() if found]
    if not hosts:
        return []
    lines = [f"dry run: nothing was changed; planning already knows the real run would fail on {len(hosts)} host(s):"]
    for name in hosts:
        for message in known[name]:
            for line in message.splitlines() or ["failed"]:
                if not line.strip():
                    continue
                lines.append(f"    {line.strip()}" if line[:1].isspace() else f"{PREFIX} {name}: {line}")
    return lines


def dry_run_requested(argv: Sequence[str]) -> bool:
    """The pyinfra command line asks for a dry run.

    >>> dry_run_requested(["pyinfra", "inventory/sandbox.py", "deploy.py", "--dry"])
    True
    """
    return "--dry" in argv[1:]


def exit_nonzero_on_known_failures(state: Any, echo: Callable[[str], None] | None = None,
                                   at_exit: Callable[[Callable[[], None]], Any] = atexit.register) -> None:
    """pyinfra's CLI, --dry (config.py): a host whose plan knows a failure fails the run (exit 1),
    and the verdict lines (hosts pyinfra itself failed, unreachable ones say, included) are its last
    output, on stderr. ``echo``/``at_exit``: for tests.

    .. code:: python

        if dry_run_requested(sys.argv):
            exit_nonzero_on_known_failures(ctx_state.get())
    """
    _board(state).fail_hosts = True

    def print_verdict() -> None:
        known = known_failures(state)
        for host in getattr(state, "failed_hosts", ()):
            known.setdefault(host.name, ["pyinfra failed it while connecting or planning (its error is above)"])
        say = echo or _stderr
        for line in verdict_lines(dict(sorted(known.items()))):
            say(line)

    at_exit(print_verdict)


def _stderr(line: str) -> None:
    import click

    click.echo(click.style(line, fg="red"), err=True)
