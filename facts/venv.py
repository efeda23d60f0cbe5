"""Python venvs: state of a venv (python, pip or not, made by uv or not), its
installed distributions, and the exact pins some of them declare; all read
with the venv's own python (importlib.metadata), so they work without pip."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand

from facts._value import FactValue

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

_EXACT_PINS_PY = """
import importlib.metadata as md, json, re, sys
wanted = {re.sub(r"[-_.]+", "-", name).lower() for name in sys.argv[1:]}
out = {}
for dist in md.distributions():
    name = re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower()
    if name in wanted:
        out[name] = [req for req in dist.requires or [] if "==" in req and ";" not in req]
print(json.dumps(out, sort_keys=True))
"""


def venv_python(path: str) -> str:
    """The python of the venv at ``path``.

    >>> venv_python("/opt/sglang/venv/")
    '/opt/sglang/venv/bin/python'
    """
    return path.rstrip("/") + "/bin/python"


def venv_python_command(path: str, code: str, absent: str, *args: str) -> StringCommand:
    """Run ``code`` (with ``args``) with the venv's python; echo ``absent`` (a
    shell word, quoted by the caller where needed) when the venv has no python."""
    python = venv_python(path)
    return StringCommand(
        "if [ -x", QuoteString(python), "]; then",
        QuoteString(python), "-c", QuoteString(code), *[QuoteString(arg) for arg in args],
        f"; else echo {absent}; fi",
    )


def last_json_line(output: list[str]) -> Any:
    """The JSON value on the last non-empty output line."""
    return json.loads([line for line in output if line.strip()][-1])


@dataclass(frozen=True)
class Venv(FactValue):
    exists: bool
    python_version: str | None = None
    pip_version: str | None = None  # None: the venv has no pip (e.g. made by uv)
    has_ensurepip: bool = False
    uv_version: str | None = None  # set when uv made the venv


class VenvState(FactBase[Venv]):
    """
    State of the venv at ``path``: exists, python version, pip or not, made by
    uv or not, ensurepip available.

    .. code:: python

        venv = host.get_fact(VenvState, path="/opt/sglang/venv")
        venv.exists and venv.pip_version is None  # a uv venv: pip must be bootstrapped
    """

    def command(self, path: str) -> StringCommand:
        return venv_python_command(path, _VENV_STATE_PY, "absent")

    def process(self, output: list[str]) -> Venv:
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
        return venv_python_command(path, _VENV_PACKAGES_PY, "{}")

    def process(self, output: list[str]) -> dict[str, str]:
        text = "\n".join(output).strip()
        packages: dict[str, str] = json.loads(text.splitlines()[-1]) if text else {}
        return packages


class ExactPins(FactBase[dict[str, list[str]]]):
    """
    The exact (==) requirements, without markers, of some installed distributions.

    .. code:: python

        host.get_fact(ExactPins, path="/opt/sglang/venv", packages=["sglang"])
        # {"sglang": ["transformers==5.19.0", "compressed-tensors==0.18.0", ...]}
    """

    def command(self, path: str, packages: list[str]) -> StringCommand:
        return venv_python_command(path, _EXACT_PINS_PY, "'{}'", *packages)

    def process(self, output: list[str]) -> dict[str, list[str]]:
        pins: dict[str, list[str]] = last_json_line(output)
        return pins
