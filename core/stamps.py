"""Restart stamps: what a server (or router) was last started with.

A stamp is written, root-only, in the state directory right after a
(re)start: the digests of the unit, env and options files, the venv's
packages, the model revision and, with a draft model, the draft's revision
(a router: its unit, package and key digest).
Comparing it with what is wanted now says whether - and why - a restart is
due, so a run that changed files but failed before restarting still
restarts the next time. A new input of a step that needs a restart belongs
in ``wanted_stamp`` (and a reason line in ``restart_reasons``).

    reasons = restart_reasons(spec, render(spec))   # [] when it runs as wanted
    yield from stamp_written(stamp_path(spec), wanted_stamp(spec, rendered))

A (re)start is announced first: the pending stamp (what the restart starts and
the InvocationID it replaces) is written just before it and removed once the
stamp is. A run cut off in between leaves it for the next run, which then
tells a restart that systemd finished alone (record it, no second restart)
from one that never reached the unit (restart).

    yield from pending_written(spec, stamp, unit)    # before the restart
    yield from stamp_recorded(spec, stamp)           # after it: the stamp, the announcement removed
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from io import StringIO
from typing import TYPE_CHECKING, Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pyinfra import host
from pyinfra.api import FileUploadCommand, QuoteString, StringCommand

from core.changes import changing
from core.paths import STATE_DIR
from core.render import Rendered, packages_digest, sha256
from facts.files import FileText
from facts.model_dir import ModelDirState
from facts.systemd import SystemdUnitState, UnitState
from facts.venv import VenvPackages

if TYPE_CHECKING:
    from tasks.spec import Spec


def stamp_path(spec: Spec) -> str:
    return f"{STATE_DIR}/{spec.unit_stem}.json"


def router_stamp_path(unit: str) -> str:
    return f"{STATE_DIR}/{unit.removesuffix('.service')}.json"


def read_stamp(path: str) -> dict[str, Any]:
    """The stamp at ``path`` ({} when there is none or it is unreadable)."""
    text = host.get_fact(FileText, path=path)
    try:
        found = json.loads(text) if text else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def stamp_written(path: str, stamp: dict[str, Any]) -> Iterator[StringCommand | FileUploadCommand]:
    """Commands that write a stamp atomically into the root-only state directory."""
    text = json.dumps(stamp, sort_keys=True)
    # stamps hold digests of secret files: root only; the facts kept of other files stay (core/factcache.py)
    yield changing(StringCommand("install -d -m 700", STATE_DIR), path, path + ".tmp")
    yield FileUploadCommand(StringIO(text + "\n"), path + ".tmp")
    yield changing(StringCommand("mv -f", QuoteString(path + ".tmp"), QuoteString(path)), path, path + ".tmp")


def pending_stamp_path(spec: Spec) -> str:
    """Written just before a (re)start, removed once its stamp is: what that (re)start starts."""
    return stamp_path(spec).removesuffix(".json") + ".pending.json"


def pending_written(spec: Spec, stamp: dict[str, Any], unit: UnitState) -> Iterator[StringCommand | FileUploadCommand]:
    """Before a (re)start: what it starts, and the invocation it replaces. A run cut off
    during the restart (the restart goes on in systemd) leaves it for the next run."""
    yield from stamp_written(pending_stamp_path(spec), {"stamp": stamp, "replaces": unit.invocation_id})


def stamp_recorded(spec: Spec, stamp: dict[str, Any]) -> Iterator[StringCommand | FileUploadCommand]:
    """After a (re)start, or for one a cut-off run made: the stamp, then the announcement removed."""
    yield from stamp_written(stamp_path(spec), stamp)
    yield changing(StringCommand("rm -f", QuoteString(pending_stamp_path(spec))), pending_stamp_path(spec))


def restarted_unrecorded(unit: UnitState, pending: dict, stamp: dict) -> bool:
    """A run wrote ``pending`` (wanting what is wanted now) and was cut off; since then the
    unit was started again (another InvocationID) and runs: it runs the wanted files,
    which were on disk and loaded before the pending stamp was written.

    >>> unit = UnitState("loaded", "active", "running", 9, "enabled", "", 0, "new", 1)
    >>> restarted_unrecorded(unit, {"stamp": {"env": "e"}, "replaces": "old"}, {"env": "e"})
    True
    >>> restarted_unrecorded(unit, {"stamp": {"env": "e"}, "replaces": "new"}, {"env": "e"})  # not restarted yet
    False
    """
    return (bool(pending) and pending.get("stamp") == stamp and unit.active_state == "active"
            and bool(unit.invocation_id) and pending.get("replaces") != unit.invocation_id)


def restart_cut_off(unit: UnitState, pending: dict, stamp: dict) -> bool:
    """A run wrote ``pending`` (wanting what is wanted now) and was cut off before the
    restart reached this unit: it still has the invocation that restart was to replace
    (running it, or stopped and not started again).

    >>> unit = UnitState("loaded", "active", "running", 9, "enabled", "", 0, "old", 1)
    >>> restart_cut_off(unit, {"stamp": {"env": "e"}, "replaces": "old"}, {"env": "e"})
    True
    >>> restart_cut_off(unit, {"stamp": {"env": "e"}, "replaces": "older"}, {"env": "e"})  # restarted since
    False
    >>> restart_cut_off(unit, {"stamp": {"env": "f"}, "replaces": "old"}, {"env": "e"})  # other settings since
    False
    """
    return (bool(pending) and pending.get("stamp") == stamp and bool(unit.invocation_id)
            and pending.get("replaces") == unit.invocation_id)


def wanted_stamp(spec: Spec, rendered: Rendered) -> dict[str, Any]:
    """What the running server must have been started with, as of now."""
    packages = host.get_fact(VenvPackages, path=spec.server_venv)
    model_dir = host.get_fact(ModelDirState, path=spec.model_path)
    marker = model_dir.marker or {}
    wanted = {
        **rendered.digests(),
        "packages": packages_digest(packages),
        "package_versions": packages,
        "model_revision": marker.get("revision"),
        "venv": spec.server_venv,  # the venv it runs from (a rollback needs it still there)
        "model_path": spec.model_path,  # the revision's own dir, likewise (the unit's digest covers a change)
    }
    if spec.draft_path is not None:  # only with a draft: the stamps of servers without one stay as they were
        wanted["draft_revision"] = (host.get_fact(ModelDirState, path=spec.draft_path).marker or {}).get("revision")
        wanted["draft_path"] = spec.draft_path
    return wanted


def package_changes(before: dict[str, str], now: dict[str, str]) -> str:
    """" (name old -> new, ...)" of what differs (at most 4 named; "" when nothing was recorded before)."""
    changed = [f"{name} {before.get(name, '-')} -> {version}"
               for name, version in sorted(now.items()) if before.get(name) != version]
    changed += [f"{name} {version} -> -" for name, version in sorted(before.items()) if name not in now]
    return f" ({', '.join(changed[:4])}{', ...' if len(changed) > 4 else ''})" if before else ""


def restart_reasons(spec: Spec, rendered: Rendered, unit_state: UnitState | None = None) -> list[str]:
    """Why the server must be (re)started now; empty when it runs as wanted.

    ``unit_state``: the unit's SystemdUnitState when the caller has it already.
    """
    unit = unit_state or host.get_fact(SystemdUnitState, unit=spec.unit_name)
    started_with = read_stamp(stamp_path(spec))
    wanted = wanted_stamp(spec, rendered)
    reasons = []
    if not unit.running:
        reasons.append(f"{spec.unit_name} is {unit.active_state if unit.exists else 'not installed'}")
    for key, what in (("unit", "unit file"), ("env", "environment file"), ("options", "options file")):
        if started_with.get(key) != wanted[key]:
            reasons.append(f"{what} changed")
    if started_with.get("venv", wanted["venv"]) != wanted["venv"]:
        reasons.append(f"venv {started_with['venv']} -> {wanted['venv']}")
    if started_with.get("packages") != wanted["packages"]:
        reasons.append("venv packages changed"
                       + package_changes(started_with.get("package_versions", {}), wanted["package_versions"]))
    if started_with.get("model_revision") != wanted["model_revision"]:
        reasons.append(f"model revision {str(started_with.get('model_revision'))[:12]} -> "
                       f"{str(wanted['model_revision'])[:12]}")
    if started_with.get("draft_revision") != wanted.get("draft_revision"):
        reasons.append(f"draft revision {str(started_with.get('draft_revision'))[:12]} -> "
                       f"{str(wanted.get('draft_revision'))[:12]}")
    if not unit.running and len(reasons) > 1 and not started_with:
        reasons = [reasons[0]]  # first start: the files are new, no need to list them
    return reasons


def package_name(requirement: str) -> str:
    return canonicalize_name(Requirement(requirement).name)


def auth_digest(auth_text: str) -> str | None:
    return sha256(auth_text) if auth_text else None


def unit_running(unit_state: UnitState) -> bool:
    """UnitState.running, from the fields (fixtures give the fields only)."""
    return unit_state.active_state in ("active", "activating", "reloading")


def wanted_router_stamp(unit_text: str, venv_path: str, package: str, auth_text: str = "") -> dict[str, Any]:
    started: dict[str, Any] = {"unit": sha256(unit_text),
                               "package": host.get_fact(VenvPackages, path=venv_path).get(package_name(package))}
    if auth_text:
        started["auth"] = auth_digest(auth_text)
    return started


def router_restart_reasons(unit: str, unit_text: str, venv_path: str, package: str, auth_text: str = "",
                           unit_state: UnitState | None = None) -> list[str]:
    """Why the router must be (re)started now; empty when it runs as wanted.

    ``unit_state``: the unit's SystemdUnitState when the caller has it already.
    """
    state = unit_state or host.get_fact(SystemdUnitState, unit=unit)
    if not unit_running(state):
        return [f"{unit} is {state.active_state if state.load_state == 'loaded' else 'not installed'}"]
    started_with = read_stamp(router_stamp_path(unit))
    name = package_name(package)
    version = host.get_fact(VenvPackages, path=venv_path).get(name)
    reasons = []
    if started_with.get("unit") != sha256(unit_text):
        reasons.append("unit file changed")
    if started_with.get("package") != version:
        reasons.append(f"{name} {started_with.get('package', '-')} -> {version}")
    if started_with.get("auth") != auth_digest(auth_text):
        reasons.append("API key changed")
    return reasons
