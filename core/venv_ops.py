"""Venv operations shared by the server's and the router's steps: the venv,
a working pip in it (ensurepip, get-pip.py or an uploaded wheel), packages.

Facts (facts/venv.py): ``VenvState`` (exists, python version, pip or not, made
by uv or not, ensurepip available) and ``VenvPackages`` (installed
distributions, read with importlib.metadata so it works in a venv without pip).

One pip at a time per venv: every pip that changes a venv runs under its lock
(``locked``, flock on ``VENV/.sgc-pip.lock``). A pip whose ssh session died
with the controller (or the connection) goes on running on the host, holding
the lock; the next run waits for it (bounded, then fails naming the lock)
instead of installing into the same site-packages at the same time.
"""

from __future__ import annotations

import json
import os.path
import shlex

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, FunctionCommand, QuoteString, StringCommand, operation

from facts.venv import VenvPackages, VenvState, venv_python
from core.ops import explaining_line, plan, record_failure
from core.paths import CACHE_DIR

BOOTSTRAP_DIR = CACHE_DIR  # get-pip.py and uploaded pip wheels
PIP_LOCK_NAME = ".sgc-pip.lock"
PIP_LOCK_WAIT_S = 1800  # an interrupted install of torch & co. finishes well within this
PIP_LOCK_TIMEOUT_RC = 75  # flock -E: the lock was not free in time


def pip(path: str, *args) -> StringCommand:
    """``VENV/bin/python -m pip ...``: a venv's bin/pip may be missing (uv) or stale."""
    return StringCommand(QuoteString(venv_python(path)), "-m pip --disable-pip-version-check", *args)


def pip_lock(path: str) -> str:
    """The venv's pip lock file (flock): held by whichever pip changes the venv."""
    return f"{path.rstrip('/')}/{PIP_LOCK_NAME}"


def locked(path: str, command: str) -> str:
    """Shell text: ``command`` under the venv's pip lock, waiting at most PIP_LOCK_WAIT_S for it.

    pip inherits the lock, so a pip left running by a dropped session keeps it until it ends.

    >>> print(locked("/opt/v", "pip install x"))  # doctest: +NORMALIZE_WHITESPACE
    flock -w 1800 -E 75 /opt/v/.sgc-pip.lock sh -c 'pip install x'; rc=$?; [ $rc -ne 75 ] || echo
    'timed out after 1800 s waiting for /opt/v/.sgc-pip.lock: another pip has been changing /opt/v all that time' >&2;
    exit $rc
    """
    lock = pip_lock(path)
    why = f"timed out after {PIP_LOCK_WAIT_S} s waiting for {lock}: another pip has been changing {path} all that time"
    return (f"flock -w {PIP_LOCK_WAIT_S} -E {PIP_LOCK_TIMEOUT_RC} {shlex.quote(lock)} sh -c {shlex.quote(command)}; "
            f"rc=$?; [ $rc -ne {PIP_LOCK_TIMEOUT_RC} ] || echo {shlex.quote(why)} >&2; exit $rc")


def say_if_locked(host, path: str, step: str) -> None:
    """Before a ``locked`` pip: say so when another pip holds the venv's lock (the locked
    command then waits for it), as ``step: another pip is changing PATH ...``."""
    free, _ = host.run_shell_command(StringCommand("flock -n", QuoteString(pip_lock(path)), "true"),
                                     print_output=False, print_input=False)
    if not free:
        host.log(f"{step}: another pip is changing {path} (left running by an interrupted run?): "
                 f"waiting for it to finish (at most {PIP_LOCK_WAIT_S} s)", logger.warning)


def _pip_locked(state, host, path: str, command: str, what: str) -> bool:
    """FunctionCommand body: run ``command`` under the venv's pip lock, saying so when
    another pip holds it; a failure is recorded with the line that explains it."""
    say_if_locked(host, path, "python env")
    ok, output = host.run_shell_command(StringCommand(locked(path, command)), print_output=state.print_output,
                                        print_input=state.print_input)
    if not ok:
        lines = [line for line in output.output_lines if line.strip()][-8:]
        for line in lines:
            host.log_styled(f"python env: {line}", fg="red", log_func=logger.error)
        record_failure(state, host, f"python env: {what} failed: {explaining_line(lines)}", lines)
    return ok


def run_locked(path: str, command: StringCommand, what: str) -> FunctionCommand:
    """``command`` (a pip that changes the venv at ``path``) under the venv's pip lock (see ``locked``)."""
    return FunctionCommand(_pip_locked, (path, command.get_raw_value(), what), {})


def pip_locked(path: str, what: str, *args) -> FunctionCommand:
    """``VENV/bin/python -m pip ARGS`` under the venv's pip lock."""
    return run_locked(path, pip(path, *args), what)


@operation()
def venv(path: str, python: str = "/usr/bin/python3"):
    """
    Make sure a venv exists at ``path``; an existing one (python -m venv or uv) is adopted.

    It is created without pip: ``pip_bootstrapped`` then installs pip the same
    way whether the venv is new, made by uv, or lost its pip.

    .. code:: python

        venv(path="/opt/sglang/venv", python="/usr/bin/python3")
    """
    state = host.get_fact(VenvState, path=path)
    if state.exists:
        made_by = f", made by uv {state.uv_version}" if state.uv_version else ""
        host.noop(f"venv {path} exists (python {state.python_version}{made_by})")
        return
    plan(f"create venv {path} with {python}")
    # under the venv's pip lock, and only if still missing: the servers of one host that share the
    # venv create it at the same moment on a fresh host (two `python -m venv` race on its dirs)
    create = f"[ -x {shlex.quote(venv_python(path))} ] || {shlex.quote(python)} -m venv --without-pip {shlex.quote(path)}"
    yield StringCommand("install -d -m 755", QuoteString(path))
    yield StringCommand(locked(path, create))


@operation()
def pip_bootstrapped(path: str, get_pip_url: str, pip_wheel: str | None = None):
    """
    Make ``VENV/bin/python -m pip`` work: ensurepip where the host has it,
    else the pip wheel uploaded from the controller (offline hosts) run the
    way get-pip.py runs it, else get-pip.py from ``get_pip_url``.

    .. code:: python

        pip_bootstrapped(path="/opt/sglang/venv", get_pip_url="https://bootstrap.pypa.io/get-pip.py")
    """
    state = host.get_fact(VenvState, path=path)
    if state.pip_version:
        host.noop(f"pip {state.pip_version} works in {path}")
        return
    python = QuoteString(venv_python(path))
    if not state.exists:
        # the venv is made by the previous operation; at execution this runs again and picks the way
        plan(f"bootstrap pip in the new venv {path} (ensurepip, else "
             f"{'the uploaded pip wheel' if pip_wheel else 'get-pip.py'})")
        yield pip(path, "--version")
        return
    if state.has_ensurepip:
        plan(f"bootstrap pip in {path} with ensurepip")
        yield run_locked(path, StringCommand(python, "-m ensurepip --upgrade"), "ensurepip")
    elif pip_wheel:
        # a wheel is a zip that python can run: pip installs itself from it
        remote_wheel = f"{BOOTSTRAP_DIR}/{os.path.basename(pip_wheel)}"
        plan(f"bootstrap pip in {path} from the uploaded {os.path.basename(pip_wheel)} (no ensurepip, offline)")
        yield StringCommand("install -d -m 755", BOOTSTRAP_DIR)
        yield FileUploadCommand(pip_wheel, remote_wheel)
        yield run_locked(path, StringCommand(
            python, QuoteString(remote_wheel + "/pip"), "install --no-index --disable-pip-version-check",
            QuoteString(remote_wheel),
        ), "the pip bootstrap from the uploaded wheel")
    else:
        script = f"{BOOTSTRAP_DIR}/get-pip.py"
        plan(f"bootstrap pip in {path} with get-pip.py from {get_pip_url} (no ensurepip)")
        yield StringCommand("install -d -m 755", BOOTSTRAP_DIR)
        yield StringCommand("curl -fsSL --retry 3 -o", QuoteString(script), QuoteString(get_pip_url))
        yield run_locked(path, StringCommand(python, QuoteString(script), "--disable-pip-version-check"), "get-pip.py")
    yield pip(path, "--version")


def missing_requirements(requirements: list[str], installed: dict[str, str]) -> list[str]:
    """The requirements that the installed versions do not satisfy.

    >>> missing_requirements(["torch==2.13.0", "pyyaml==6.0.2"], {"torch": "2.13.0+cpu"})
    ['pyyaml==6.0.2']
    """
    missing = []
    for text in requirements:
        requirement = Requirement(text)
        version = installed.get(canonicalize_name(requirement.name))
        if version is None or not requirement.specifier.contains(version, prereleases=True):
            missing.append(text)
    return missing


@operation()
def packages(path: str, requirements: list[str], no_deps: bool = False):
    """
    Install pinned packages into the venv with its pip; nothing when all are there.

    + no_deps: install without dependencies (e.g. sglang beside a CPU torch)

    .. code:: python

        packages(path="/opt/sglang/venv", requirements=["sglang==0.5.23"])
    """
    installed = host.get_fact(VenvPackages, path=path)
    missing = missing_requirements(requirements, installed)
    if not missing:
        host.noop(f"{len(requirements)} pinned package(s) installed in {path}")
        return
    changes = []
    for text in missing:
        name = canonicalize_name(Requirement(text).name)
        changes.append(f"{name} {installed[name]} -> {text}" if name in installed else text)
    plan(f"pip install {', '.join(changes)}")
    yield pip_locked(path, f"pip install {', '.join(missing)}", "install", *(["--no-deps"] if no_deps else []),
                     *[QuoteString(text) for text in missing])
    yield FunctionCommand(_installed_as_wanted, (path, missing), {})  # pip exiting 0 is not the postcondition


_VERSIONS_PY = (
    "import importlib.metadata as m, json, sys\n"
    "found = {}\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        found[name] = m.version(name)\n"
    "    except m.PackageNotFoundError:\n"
    "        pass\n"
    "print(json.dumps(found))\n"
)


def _installed_as_wanted(state, host, path: str, requirements: list[str]) -> bool:
    """After pip: the venv really holds every requirement (read back with importlib.metadata)."""
    names = [canonicalize_name(Requirement(text).name) for text in requirements]
    command = " ".join(shlex.quote(part) for part in (venv_python(path), "-c", _VERSIONS_PY, *names))
    ok, output = host.run_shell_command(StringCommand(command), print_output=False, print_input=False)
    try:
        found: dict[str, str] = ({str(canonicalize_name(k)): str(v) for k, v in json.loads(output.stdout or "{}").items()}
                                 if ok else {})
    except ValueError:
        found = {}
    still = missing_requirements(requirements, found)
    if not still:
        return True
    have = ", ".join(f"{name} {found.get(canonicalize_name(Requirement(name).name), 'absent')}" for name in still)
    message = f"python env: pip finished but {path} does not hold {', '.join(still)} (found: {have})"
    host.log_styled(message, fg="red", log_func=logger.error)
    record_failure(state, host, message, output.stderr_lines)
    return False
