"""Pieces every step shares: plan lines, failing with a reason (recorded on
the run state, core/runstate.py), streaming a remote command's output to the
operator, and files written atomically with secrets masked in diffs.
"""

from __future__ import annotations

import difflib
import json
import hashlib
from shlex import quote as _quote
from collections.abc import Iterable
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, FunctionCommand, QuoteString, StringCommand, operation
from pyinfra.context import ctx_host, ctx_state, state

from core.changes import changing
from core.dry_run import record_known_failure
from core.paths import GB, REMOTE_DIR, REMOTE_SRC_DIR, SYSTEMD_DIR
from core.runstate import run_state
from facts.files import FileDigest, FileText

MASK = "********"
# The first line of every file the deploy writes from templates/: it claims the file (managed_file).
MANAGED_MARKER = "# Managed by sglang-converge"
# lines that say why a host failed, best first (remote scripts and steps print them)
_CAUSE_PREFIXES = ("cause:", "FAILED:", "VERIFY FAILED:", "preflight:", "service:", "router:", "model:", "readiness:")


def gb(nbytes: int | float) -> str:
    """Bytes as decimal GB (like disk vendors and the Hub); small sizes also in MB.

    >>> gb(595_000_000_000), gb(41_943_040)
    ('595.00 GB', '0.042 GB (41.9 MB)')
    """
    if abs(nbytes) >= GB:
        return f"{nbytes / GB:.2f} GB"
    return f"{nbytes / GB:.3f} GB ({nbytes / 1e6:.1f} MB)"


def preparing() -> bool:
    """True while pyinfra prepares (plans); False while it executes."""
    return not state.is_executing


def plan(message: str) -> None:
    """A plan line for the operator, printed once, while pyinfra prepares."""
    if preparing():
        for line in message.splitlines():
            logger.warning(f"{host.print_prefix}plan: {line}")


def report(message: str) -> None:
    """A line for the operator while pyinfra executes (plan() covers preparing)."""
    if not preparing():
        logger.warning(f"{host.print_prefix}{message}")


def step_of(message: str) -> str:
    """The step a message is about, from its "step: ..." prefix ("" when it has none)."""
    head = message.split(":", 1)[0]
    return head if head != message and " " not in head.strip() else ""


def explaining_line(lines: list[str]) -> str:
    """The line of a failure's output that says why."""
    lines = [line.strip() for line in lines if line.strip()]
    for prefix in _CAUSE_PREFIXES:
        for line in lines:
            if line.startswith(prefix):
                return line
    return lines[-1] if lines else ""


def record_failure(state, host, cause: str, lines: list[str] | tuple[str, ...] = (), step: str = "") -> None:
    """Remember why ``host`` failed on the run state (the rollout reads it there)."""
    run_state(state).fail(host.name, step or step_of(cause) or "deploy", cause, tuple(lines))


def read_host_text(host, path: str) -> str:
    """A file's text on the host, stripped ("" when it is missing), inside an executing command."""
    ok, output = host.run_shell_command(StringCommand("cat", QuoteString(path), "2>/dev/null"),
                                        print_output=False, print_input=False)
    return "\n".join(output.stdout_lines).strip() if ok else ""


def read_host_json(host, path: str) -> dict:
    """A JSON object file on the host; {} when it is missing or not one."""
    try:
        found = json.loads(read_host_text(host, path) or "{}")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def gate_failed(state, host, lines: list[str], step: str = "readiness") -> bool:
    """A check after a command (a readiness gate) failed: its lines in red, the first as the cause; False."""
    for line in lines:
        host.log_styled(line, fg="red", log_func=logger.error)
    record_failure(state, host, lines[0], tuple(lines), step=step)
    return False


def _fail(state, host, message: str) -> bool:
    for line in message.splitlines():
        host.log_styled(line, fg="red", log_func=logger.error)
    record_failure(state, host, message.splitlines()[0] if message else "failed", message.splitlines())
    return False


def fail_command(message: str) -> FunctionCommand:
    """A command that fails the operation with ``message``, on the controller.

    Yielded (not raised) so the dry run shows the operation as a change that
    will fail, and execution stops the host here with the reason. Made while
    pyinfra prepares, it also records ``message`` as a failure the plan
    already knows (core/dry_run.py): a dry run, which never runs the
    command, exits non-zero naming it.
    """
    if preparing():
        record_known_failure(ctx_state.get(), ctx_host.get(), message)
    return FunctionCommand(_fail, (message,), {})


def stream(state, host, command: str, timeout: int | None, step: str = "",
           changes: tuple[str, ...] | None = None) -> bool:
    """FunctionCommand body: run ``command``, printing its output lines as they come.

    pyinfra shows a command's output only with -v; progress and the journal
    lines of a failure must reach the operator at any verbosity. A failure is
    recorded with the line that explains it. ``changes``: the only files the
    command may change (core/factcache.changing; None: anything).
    """
    ok, output = host.run_shell_command(
        StringCommand(command) if changes is None else changing(StringCommand(command), *changes),
        print_output=True,
        print_input=False,
        _timeout=timeout,
    )
    if not ok:
        lines = list(output.stdout_lines) + list(output.stderr_lines)
        record_failure(state, host, explaining_line(lines) or f"command failed: {command[:80]}", lines, step)
    return ok


def mask(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, MASK)
    return text


def print_diff(path: str, old: str | None, new: str, secrets: Iterable[str] = ()) -> None:
    """Unified diff of a managed file, secrets masked, during prepare with --diff."""
    if not preparing() or not state.config.DIFF:
        return
    secrets = list(secrets)
    old_lines = mask(old or "", secrets).splitlines(keepends=True)
    new_lines = mask(new, secrets).splitlines(keepends=True)
    logger.info(f"{host.print_prefix}{'Will modify' if old is not None else 'Will create'} {path}")
    for line in difflib.unified_diff(old_lines, new_lines, fromfile=path, tofile=path + " (new)"):
        logger.info("    %s", line.rstrip("\n"))


def claims(content: str) -> bool:
    """The text carries our marker line: a file the deploy owns."""
    return any(line.strip().startswith(MANAGED_MARKER) for line in content.splitlines())


def foreign_file_message(dest: str, setting: str) -> str:
    kind = "unit file" if dest.startswith(SYSTEMD_DIR + "/") else "file"
    return (
        f"{kind} {dest} exists and is not managed by sglang-converge (no {MANAGED_MARKER!r} line): "
        f"refusing to overwrite it; choose another {setting}"
    )


@operation()
def managed_file(dest: str, content: str, mode: str = "644", secrets: list[str] | None = None,
                 setting: str = "unit_name (router_unit_name on a router host)", writer: str = ""):
    """
    Write a file atomically (temp file of the final mode, then rename), so a
    dropped connection never leaves a half-written unit and a secret file is
    never readable by others, not even for a moment.

    Content that carries our marker line (``# Managed by sglang-converge``,
    the templates' first line) claims ``dest``: a file already there without
    that line is someone else's (``ssh.service``, say) and is never
    overwritten: the operation fails naming it and ``setting``.

    + dest: absolute path on the host
    + content: the file's text
    + mode: octal mode, e.g. "600" for files holding secrets
    + secrets: values masked as ******** in the --diff output
    + setting: the setting that chose ``dest``, named when a foreign file is refused
    + writer: names the temp file, for a file several servers of one host write (at the same moment:
      one temp file each, or one's rename would find the other's gone)

    .. code:: python

        managed_file(dest="/etc/sglang/sglang.yaml", content=text, mode="600", secrets=[key])
    """
    digest = host.get_fact(FileDigest, path=dest)
    wanted = hashlib.sha256(content.encode()).hexdigest()
    if digest and digest["sha256"] == wanted and digest["mode"] == mode and digest["owner"] == "root":
        host.noop(f"{dest} is up to date")
        return
    if digest is None or digest["sha256"] != wanted:
        old = (host.get_fact(FileText, path=dest) or "") if digest else None  # "": an empty file
        if old is not None and claims(content) and not claims(old):
            message = foreign_file_message(dest, setting)
            plan(message)
            yield fail_command(message)
            return
        print_diff(dest, old, content, secrets or [])
        tmp = f"{dest}.{writer}.sgc-new" if writer else dest + ".sgc-new"
        parent = dest.rsplit("/", 1)[0] or "/"
        # the facts kept of other files stay (core/factcache.py)
        yield changing(StringCommand("install -d -m 755", QuoteString(parent)), dest, tmp)
        yield changing(StringCommand("install -m", mode, "-o root -g root /dev/null", QuoteString(tmp)), tmp)
        yield FileUploadCommand(StringIO(content), tmp)
        yield changing(StringCommand("mv -f", QuoteString(tmp), QuoteString(dest)), dest, tmp)
    else:
        yield changing(StringCommand("chown root:root", QuoteString(dest), "&& chmod", mode, QuoteString(dest)), dest)


def scripts_uploaded(owner: str, names: Iterable[str]):
    """Commands: the helper scripts ``names`` (files of remote/) uploaded beside their place in REMOTE_DIR
    and renamed into it: a sibling server's step may be starting python on them at this moment (a rename
    swaps the whole file)."""
    uploads = [(str(REMOTE_SRC_DIR / name), f"{REMOTE_DIR}/{name}") for name in names]
    for local, remote in uploads:
        yield FileUploadCommand(local, f"{remote}.{owner}.sgc-new")
    yield StringCommand(" && ".join(f"mv -f {_quote(f'{remote}.{owner}.sgc-new')} {_quote(remote)}"
                                    for _local, remote in uploads))
