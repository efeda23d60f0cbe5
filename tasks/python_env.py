"""Python environment: the venv SGLang runs from, with a working pip.

Facts: ``VenvState`` (exists, python version, pip or not, made by uv or not,
ensurepip available) and ``VenvPackages`` (installed distributions, read with
importlib.metadata so it works in a venv without pip).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tasks._facts import FactValue
from pyinfra.api import FactBase, QuoteString, StringCommand

# Runs with the venv's own python: one process, no pip needed.
_VENV_STATE_PY = """
import json, sys, importlib.util, importlib.metadata as md
try:
    pip = md.version("pip") if importlib.util.find_spec("pip") else None
except md.PackageNotFoundError:
    pip = None
cfg = {}
try:
    for line in open(sys.prefix + "/pyvenv.cfg"):
        key, sep, value = line.partition("=")
        if sep:
            cfg[key.strip()] = value.strip()
except OSError:
    pass
print(json.dumps({
    "python": "%d.%d.%d" % sys.version_info[:3],
    "pip": pip,
    "ensurepip": importlib.util.find_spec("ensurepip") is not None,
    "uv": cfg.get("uv"),
    "is_venv": sys.prefix != sys.base_prefix,
}))
"""

_VENV_PACKAGES_PY = """
import json, re, importlib.metadata as md
out = {}
for dist in md.distributions():
    name = dist.metadata["Name"]
    if name:
        out[re.sub(r"[-_.]+", "-", name).lower()] = dist.version
print(json.dumps(out, sort_keys=True))
"""


@dataclass(frozen=True)
class Venv(FactValue):
    exists: bool
    python_version: str | None = None
    pip_version: str | None = None  # None: the venv has no pip (e.g. made by uv)
    has_ensurepip: bool = False
    uv_version: str | None = None  # set when uv made the venv


def venv_python(path: str) -> str:
    return path.rstrip("/") + "/bin/python"


def _run_in_venv(path: str, code: str, absent: str) -> StringCommand:
    python = venv_python(path)
    return StringCommand(
        "if [ -x", QuoteString(python), "]; then",
        QuoteString(python), "-c", QuoteString(code),
        f"; else echo {absent}; fi",
    )


class VenvState(FactBase[Venv]):
    """
    State of the venv at ``path``.

    .. code:: python

        venv = host.get_fact(VenvState, path="/opt/sglang/venv")
        venv.exists and venv.pip_version is None  # a uv venv: pip must be bootstrapped
    """

    def command(self, path: str) -> StringCommand:
        return _run_in_venv(path, _VENV_STATE_PY, "absent")

    def process(self, output) -> Venv:
        text = "\n".join(output).strip()
        if text == "absent" or not text:
            return Venv(exists=False)
        state = json.loads(text.splitlines()[-1])
        return Venv(
            exists=True,
            python_version=state["python"],
            pip_version=state["pip"],
            has_ensurepip=state["ensurepip"],
            uv_version=state["uv"],
        )


class VenvPackages(FactBase[dict[str, str]]):
    """
    Installed distributions of the venv at ``path``: normalized name -> version.

    Read with importlib.metadata, so it works in a venv that has no pip.
    Empty when the venv does not exist.

    .. code:: python

        host.get_fact(VenvPackages, path="/opt/sglang/venv").get("compressed-tensors")
    """

    def command(self, path: str) -> StringCommand:
        return _run_in_venv(path, _VENV_PACKAGES_PY, "{}")

    def process(self, output) -> dict[str, str]:
        text = "\n".join(output).strip()
        return json.loads(text.splitlines()[-1]) if text else {}


# --- operations -------------------------------------------------------------

import os.path  # noqa: E402

from packaging.requirements import Requirement  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402
from pyinfra import host  # noqa: E402
from pyinfra.api import FileUploadCommand, deploy, operation  # noqa: E402

from tasks._common import plan  # noqa: E402

BOOTSTRAP_DIR = "/var/cache/sglang-converge"


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


@deploy("Python environment")
def python_env(spec):
    """The venv SGLang runs from, pip working in it, the pinned packages."""
    venv(path=spec.venv_path, python=spec.venv_python, name=f"venv {spec.venv_path}")
    pip_bootstrapped(
        path=spec.venv_path,
        get_pip_url=spec.get_pip_url,
        pip_wheel=spec.pip_wheel,
        name="pip works in the venv",
    )
    if spec.packages:
        packages(path=spec.venv_path, requirements=list(spec.packages), name="pinned packages")
    no_deps = list(getattr(spec, "packages_no_deps", []) or [])
    if no_deps:
        packages(path=spec.venv_path, requirements=no_deps, no_deps=True, name="pinned packages (--no-deps)")
