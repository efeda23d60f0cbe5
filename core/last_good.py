"""The last good configuration of a server, and the automatic rollback to it.

Once a configuration has been seen serving (the readiness step passed), its
unit, env and options files and its restart stamp (core/stamps.py: the files'
digests, the venv's packages, the model revision) are copied into a root-only
directory of the state dir, ``last-good/<unit stem>/``:

    yield from last_good_written(spec)            # after readiness passed

When a restart of this run fails readiness (crash at start, load failure,
timeout) and ``rollback_on_failure`` is on, the readiness step puts those
files back, restarts the unit, waits until it serves again, and still fails
the run, with ``rolled back: <cause>``: the operator's change did not go in.
Packages come back with the files: each package set has its own venv
(core/server_envs.py) and the unit file names it, so the kept unit runs the
kept packages as long as that venv is kept (``keep_envs``). The model revision
comes back the same way: each revision has its own dir (core/model_revisions.py),
named by the kept unit, kept for ``keep_revisions``. When the venv or the
revision dir is gone, the files alone would not bring that configuration back,
so nothing is rolled back and the run says why.

    FunctionCommand(ready_or_rolled_back, (wait_command, timeout, spec), {})

A multi-node TP group is not rolled back (its ranks restart together; a
rollback of one rank alone would not serve).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyinfra import host as current_host, logger
from pyinfra.api import QuoteString, StringCommand

from core.changes import changing
from core.disk import model_complete
from core.fingerprint import LaunchPlan, fingerprint_path
from core.gates import gates_pass
from core.model_revisions import removal_command, revisions_beyond_keep
from core.ops import read_host_json, read_host_text, stream
from core.speed_gate import speed_path
from core.paths import STATE_DIR
from core.router_membership import registered
from core.server_envs import envs_to_remove
from core.runstate import Failure, run_state
from core.stamps import package_changes, pending_stamp_path, read_stamp, stamp_path
from core.render import packages_digest
from facts.files import FileText
from facts.model_dir import ModelDirState
from facts.server_envs import ServerEnvs
from facts.venv import VenvPackages

if TYPE_CHECKING:
    from tasks.spec import Spec

STEP = "readiness"
FILES = ("unit", "env", "options")  # what a configuration is, besides its stamp
ALONE = "its files alone would not bring it back"


def last_good_dir(spec: Spec) -> str:
    """The newest configuration seen serving (what a failed restart rolls back to)."""
    return f"{STATE_DIR}/last-good/{spec.unit_stem}"


def previous_good_dir(spec: Spec) -> str:
    """The one that served before it (what `rollback.py` / `python -m rollout --rollback` puts back)."""
    return f"{STATE_DIR}/last-good/{spec.unit_stem}.previous"


def last_good_stamp_path(spec: Spec) -> str:
    return f"{last_good_dir(spec)}/stamp.json"


def _paths(spec: Spec) -> dict[str, str]:
    return {"unit": spec.unit_path, "env": spec.env_path, "options": spec.options_path}


def last_good_written(spec: Spec) -> list[StringCommand]:
    """Copy the running configuration (files + stamp) into the last-good dir, root-only; the one
    kept there before becomes the previous good one (each dir is complete or absent: a new dir
    renamed into place)."""
    target = last_good_dir(spec)
    copies = "; ".join(f'if [ -f {shlex.quote(path)} ]; then cp -p {shlex.quote(path)} "$t/{name}"; fi'
                       for name, path in _paths(spec).items())
    script = (f"set -e; umask 077; d={shlex.quote(target)}; t=\"$d.new\"; rm -rf \"$t\"; "
              f"install -d -m 700 {shlex.quote(STATE_DIR)} {shlex.quote(STATE_DIR + '/last-good')} \"$t\"; "
              f"{copies}; cp -p {shlex.quote(stamp_path(spec))} \"$t/stamp.json\"; "
              # what SGLang chose when it started with this configuration (core/fingerprint.py)
              f"if [ -f {shlex.quote(fingerprint_path(spec))} ]; then "
              f"cp -p {shlex.quote(fingerprint_path(spec))} \"$t/fingerprint.json\"; fi; "
              # and the decode speed it measured then (core/speed_gate.py)
              f"if [ -f {shlex.quote(speed_path(spec))} ]; then cp -p {shlex.quote(speed_path(spec))} \"$t/speed.json\"; fi; "
              "date -u +%Y-%m-%dT%H:%M:%SZ > \"$t/recorded_at\"; "
              f"p={shlex.quote(previous_good_dir(spec))}; "
              "if [ -d \"$d\" ]; then rm -rf \"$p\"; mv \"$d\" \"$p\"; fi; mv \"$t\" \"$d\"")
    return [changing(StringCommand("sh", "-c", QuoteString(script)), f"{STATE_DIR}/last-good")]


def restore_script(spec: Spec, kept_dir: str | None = None) -> str:
    """Put a kept configuration's files and stamp back (default: the last good one), then restart
    the unit (a fresh start: reset-failed first)."""
    source = shlex.quote(kept_dir or last_good_dir(spec))
    unit = shlex.quote(spec.unit_name)
    copies = "; ".join(f"if [ -f {source}/{name} ]; then cp -p {source}/{name} {shlex.quote(path)}; fi"
                       for name, path in _paths(spec).items())
    return (f"set -e; {copies}; cp -p {source}/stamp.json {shlex.quote(stamp_path(spec))}; "
            f"rm -f {shlex.quote(pending_stamp_path(spec))}; systemctl daemon-reload; "
            f"systemctl reset-failed {unit} 2>/dev/null || true; systemctl restart {unit}")


def same_files(kept: dict[str, Any], current: dict[str, Any]) -> bool:
    """Two stamps of the same unit, env and options files."""
    return all(kept.get(name) == current.get(name) for name in FILES)


def why_not_rolled_back(spec: Spec, last_good: dict[str, Any], current: dict[str, Any],
                        packages_of: Callable[[str], dict[str, str]] | None = None) -> str | None:
    """Why the last good configuration cannot be put back by its files alone (None: it can)."""
    if not last_good:
        return (f"no last good configuration is recorded ({last_good_dir(spec)}: one is recorded once a "
                "configuration serves)")
    if same_files(last_good, current):
        return "the configuration that failed is the last good one (its files did not change)"
    return not_by_files_alone(last_good, current, packages_of or venv_packages, spec.venv_path, revision_held)


def not_by_files_alone(last_good: dict[str, Any], current: dict[str, Any],
                       venv_packages: Callable[[str], dict[str, str]] | None = None,
                       legacy_venv: str | None = None,
                       revision_held: Callable[[str, str], bool] | None = None) -> str | None:
    """Why a kept configuration's files alone would not bring it back (None: they would).

    Its packages come back with its unit file when the venv that unit runs from is still there
    as it served (core/server_envs.py keeps it): ``venv_packages(path)`` reads a venv's packages
    ({} when there is none). A stamp from before venvs by content names no venv: it ran from
    ``legacy_venv`` (the venv_path setting). Its model revision comes back with it when the revision
    dir its unit names still holds that revision: ``revision_held(path, revision)`` reads it."""
    if last_good.get("packages") != current.get("packages"):
        venv = last_good.get("venv") or legacy_venv
        found = venv_packages(venv) if venv and venv_packages else None
        if found is None or packages_digest(found) != last_good.get("packages"):
            changes = package_changes(last_good.get("package_versions", {}), current.get("package_versions", {}))
            where = ("" if found is None else f" and its venv {venv} is gone" if not found
                     else f" and its venv {venv} no longer holds them")
            return f"the venv's packages changed since it served{changes or ' (the package list)'}{where}: " + ALONE
    for key, path_key, what in (("model_revision", "model_path", "the model revision"),
                                ("draft_revision", "draft_path", "the draft model's revision")):
        if last_good.get(key) == current.get(key):
            continue
        # revisions side by side (core/model_revisions.py): the kept unit names its revision's own dir
        path = str(last_good.get(path_key) or "")
        checkable = bool(path and revision_held and last_good.get(key))
        if checkable and revision_held and revision_held(path, last_good[key]):
            continue
        where = f" and {path} no longer holds it (keep_revisions)" if checkable else ""
        return (f"{what} changed since it served ({str(last_good.get(key))[:12]} -> "
                f"{str(current.get(key))[:12]}){where}: " + ALONE)
    return None


def revision_held(path: str, revision: str) -> bool:
    """A model dir holds this revision, complete (its marker's files at their sizes), on the current host now."""
    state = current_host.get_fact(ModelDirState, path=path)
    marker = state.marker or {}
    return bool(marker) and model_complete(state, str(marker.get("repo")), revision)


def venv_packages(path: str) -> dict[str, str]:
    """A venv's installed packages, read on the current host now ({} when there is none)."""
    return current_host.get_fact(VenvPackages, path=path) or {}


def _say(host, line: str) -> None:
    host.log_styled(line, fg="red", log_func=logger.error)


def ready_or_rolled_back(state, host, command: str, timeout: int, spec: Spec, plan: LaunchPlan | None = None) -> bool:
    """FunctionCommand body of the readiness step: wait until ready (core/ops.stream), and what the
    server chose matches ``plan`` (core/fingerprint.py). When the server this run (re)started fails
    either, put the last good configuration back (when allowed and possible), wait until it serves,
    and fail with ``rolled back: <cause>``."""
    run = run_state(state)
    # the wait changes no file but the fingerprint it keeps
    if stream(state, host, command, timeout, step=STEP, changes=(fingerprint_path(spec),)) and (
            plan is None or gates_pass(state, host, spec, plan, last_good_dir(spec))):
        if host.name in run.restarted_at:  # the time to ready, for the rollout's summary (tasks/readiness.py)
            run.ready_s[host.name] = time.monotonic() - run.restarted_at[host.name]
        return True
    if not spec.rollback_on_failure or host.name not in run.restarted:
        return False
    failures = run.failures.setdefault(host.name, [])
    if not failures:
        failures.append(Failure(STEP, f"{spec.unit_name} is not ready"))
    failure = failures[-1]
    last_good = read_host_json(host, last_good_stamp_path(spec))
    why_not = why_not_rolled_back(spec, last_good, read_host_json(host, stamp_path(spec)),
                                  lambda path: host.get_fact(VenvPackages, path=path) or {})
    if why_not:
        _say(host, f"readiness: not rolled back: {why_not}")
        return False
    recorded = read_host_text(host, f"{last_good_dir(spec)}/recorded_at")
    _say(host, f"readiness: rolling back to the last good configuration (serving as of {recorded or '?'}): "
               f"{spec.unit_name} restarts with it")
    ok, output = host.run_shell_command(StringCommand("sh", "-c", QuoteString(restore_script(spec))),
                                        print_output=False, print_input=False)
    if not ok:
        lines = list(output.stderr_lines) + list(output.stdout_lines)
        failures[-1] = Failure(STEP, f"rollback failed: {lines[-1] if lines else 'restore script failed'} "
                                     f"(after {failure.cause})", failure.detail + tuple(lines))
        _say(host, f"readiness: {failures[-1].cause}")
        return False
    if not stream(state, host, command, timeout, step=STEP, changes=(fingerprint_path(spec),)):
        again = failures.pop()
        failures[-1] = Failure(STEP, f"rollback failed: the last good configuration does not serve either "
                                     f"({again.cause}); first: {failure.cause}", failure.detail + again.detail)
        _say(host, f"readiness: {failures[-1].cause}")
        return False
    failures[-1] = Failure(STEP, f"rolled back: {failure.cause}", failure.detail)
    _say(host, f"readiness: rolled back: {spec.unit_name} serves the last good configuration again; the new one "
               f"failed: {failure.cause}")
    _trimmed_like_after_a_good_restart(host, spec, last_good)
    _back_in_router(state, host, spec)
    return False


def _trimmed_like_after_a_good_restart(host, spec: Spec, last_good: dict[str, Any]) -> None:
    """The rollback was a good restart: the venvs and model revisions beyond keep_envs / keep_revisions by
    what now serves (the last good stamp's) go, as after any good restart (tasks/readiness.py), so that the
    next run of the good configuration has nothing to remove. The one that failed is the newest switched
    to: it stays (keep_* >= 2) for a retry without a new download or build."""
    remove = revisions_beyond_keep(host, spec, last_good.get("model_path"), last_good.get("draft_path"))
    if last_good.get("venv"):
        remove += envs_to_remove(host.get_fact(ServerEnvs, root=spec.envs_dir), last_good["venv"], spec.keep_envs)
    if not remove:
        return
    host.log(f"readiness: after the rollback, remove what lies beyond keep_revisions = {spec.keep_revisions} / "
             f"keep_envs = {spec.keep_envs}: {', '.join(remove)}", logger.warning)
    for path in remove:
        ok, output = host.run_shell_command(removal_command(path), print_output=False, print_input=False)
        if not ok:  # the next run finishes a removal cut off; this one is said, not failed on
            lines = list(output.stderr_lines) + list(output.stdout_lines)
            _say(host, f"readiness: could not remove {path}: {lines[-1] if lines else 'no output'}")


def _back_in_router(state, host, spec: Spec) -> None:
    """The rolled-back server serves: back into the router it was drained from (the run still fails)."""
    if spec.router_url is None or spec.worker_url is None:
        return
    if registered(state, host, spec.venv_python, spec.router_url, spec.worker_url, spec.auth_file):
        _say(host, f"readiness: {spec.worker_url} is back in the router at {spec.router_url} (the last good "
                   f"configuration serves)")
    else:
        _say(host, f"readiness: the rolled-back server could not be put back in the router at {spec.router_url}: "
                   f"the next successful run registers it")


def rollback_source(spec: Spec) -> tuple[str | None, str]:
    """(the kept dir to restore, what it is) or (None, why there is none)."""
    current = read_stamp(stamp_path(spec))
    for kept_dir in (last_good_dir(spec), previous_good_dir(spec)):
        kept = read_stamp(f"{kept_dir}/stamp.json")
        if kept and not same_files(kept, current):
            why_not = not_by_files_alone(kept, current, venv_packages, spec.venv_path, revision_held)
            if why_not:
                return None, f"the kept configuration in {kept_dir} cannot be put back: {why_not}"
            recorded = (current_host.get_fact(FileText, path=f"{kept_dir}/recorded_at") or "?").strip()
            return kept_dir, f"the configuration that served as of {recorded} ({kept_dir})"
    return None, (f"no earlier good configuration is kept for {spec.unit_name} ({last_good_dir(spec)}, "
                  f"{previous_good_dir(spec)}: one is kept each time a new configuration serves)")
