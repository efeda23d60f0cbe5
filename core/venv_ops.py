"""Venv operations shared by the server's and the router's steps: the venv,
a working pip in it (ensurepip, get-pip.py or an uploaded wheel), packages.

Facts (facts/venv.py): ``VenvState`` (exists, python version, pip or not, made
by uv or not, ensurepip available) and ``VenvPackages`` (installed
distributions, read with importlib.metadata so it works in a venv without pip).
"""

from __future__ import annotations

import os.path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pyinfra import host
from pyinfra.api import FileUploadCommand, QuoteString, StringCommand, operation

from facts.venv import VenvPackages, VenvState, venv_python
from core.ops import plan
from core.paths import CACHE_DIR

BOOTSTRAP_DIR = CACHE_DIR  # get-pip.py and uploaded pip wheels


def pip(path: str, *args) -> StringCommand:
    """``VENV/bin/python -m pip ...``: a venv's bin/pip may be missing (uv) or stale."""
    return StringCommand(QuoteString(venv_python(path)), "-m pip --disable-pip-version-check", *args)


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
    yield StringCommand(QuoteString(python), "-m venv --without-pip", QuoteString(path))


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
        yield StringCommand(python, "-m ensurepip --upgrade")
    elif pip_wheel:
        # a wheel is a zip that python can run: pip installs itself from it
        remote_wheel = f"{BOOTSTRAP_DIR}/{os.path.basename(pip_wheel)}"
        plan(f"bootstrap pip in {path} from the uploaded {os.path.basename(pip_wheel)} (no ensurepip, offline)")
        yield StringCommand("install -d -m 755", BOOTSTRAP_DIR)
        yield FileUploadCommand(pip_wheel, remote_wheel)
        yield StringCommand(
            python, QuoteString(remote_wheel + "/pip"), "install --no-index --disable-pip-version-check",
            QuoteString(remote_wheel),
        )
    else:
        script = f"{BOOTSTRAP_DIR}/get-pip.py"
        plan(f"bootstrap pip in {path} with get-pip.py from {get_pip_url} (no ensurepip)")
        yield StringCommand("install -d -m 755", BOOTSTRAP_DIR)
        yield StringCommand("curl -fsSL --retry 3 -o", QuoteString(script), QuoteString(get_pip_url))
        yield StringCommand(python, QuoteString(script), "--disable-pip-version-check")
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
    yield pip(path, "install", *(["--no-deps"] if no_deps else []), *[QuoteString(text) for text in missing])
