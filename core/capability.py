"""Can this host run the pinned stack? Checked before anything is downloaded
or installed, for the preflight step and the rollout's fleet preflight:

- the venv's interpreter against the pinned packages' Requires-Python;
- the NVIDIA driver against the CUDA build of the pinned torch (derived from
  the torch wheel's CUDA dependency, then NVIDIA's CUDA compatibility table);
- curl, when pip must come from get-pip.py.

Package metadata comes from a table of known pins (tasks/spec/tables.py
PINNED_METADATA, copied from the releases' METADATA): a pin not in it is
named as not checked, never guessed.

    problems, notes = stack_check(spec, gpus)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from pyinfra import host
from pyinfra.facts.server import Which

from facts.gpu import Gpu
from facts.interpreter import PythonInterpreter
from facts.venv import VenvState
from tasks.spec import Spec
from tasks.spec.tables import CUDA_MIN_DRIVER, PINNED_METADATA

_CU_SUFFIX = re.compile(r"-cu(\d+)$")


@dataclass
class StackCheck:
    """What the checks found: problems refuse the host, notes are for the plan."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def version_key(text: str) -> tuple[int, ...]:
    """'580.95.05' -> (580, 95, 5), for comparing driver versions."""
    return tuple(int(part) for part in re.findall(r"\d+", text))


def pins(spec: Spec) -> list[tuple[str, str, bool]]:
    """(name, pinned version, installed with its dependencies) of every exact pin."""
    out: list[tuple[str, str, bool]] = []
    for texts, with_deps in ((spec.packages, True), (getattr(spec, "packages_no_deps", []) or [], False)):
        for text in texts:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            exact = [s.version for s in req.specifier if s.operator in ("==", "===")]
            if exact:
                out.append((canonicalize_name(req.name), exact[0], with_deps))
    return out


def torch_build(spec: Spec) -> tuple[str, str] | None:
    """(torch version, why that one): pinned directly, else required by a pinned package installed with its deps."""
    listed = pins(spec)
    for name, version, _deps in listed:
        if name == "torch":
            return version, "pinned in packages"
    for name, version, deps in listed:
        for text in PINNED_METADATA.get((name, version), ("", ()))[1] if deps else ():
            req = Requirement(text)
            exact = [s.version for s in req.specifier if s.operator == "=="]
            if canonicalize_name(req.name) == "torch" and exact:
                return exact[0], f"required by {name} {version}"
    return None


def cuda_major(requirements: tuple[str, ...]) -> tuple[int, str] | None:
    """The CUDA major version a wheel's requirements pin, and the requirement that says so.

    >>> cuda_major(("filelock", "cuda-toolkit==13.0.3", "nvidia-nccl-cu13==2.30.7"))
    (13, 'cuda-toolkit==13.0.3')
    """
    for text in requirements:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        exact = [s.version for s in req.specifier if s.operator == "=="]
        if name == "cuda-toolkit" and exact:
            return int(exact[0].split(".")[0]), text
        match = _CU_SUFFIX.search(name)
        if match:
            return int(match.group(1)), text
    return None


def interpreter_of(spec: Spec) -> tuple[str | None, str, bool | None]:
    """(python version, which interpreter, has ensurepip): the existing venv's, else venv_python's."""
    venv = host.get_fact(VenvState, path=spec.server_venv)
    if venv.exists:
        return venv.python_version, f"the venv's python {spec.python_bin}", venv.has_ensurepip
    found = host.get_fact(PythonInterpreter, python=spec.venv_python)
    if found is None:
        return None, f"venv_python = {spec.venv_python!r}", None
    return found.version_text, f"venv_python = {spec.venv_python!r}", found.has_ensurepip


def python_check(spec: Spec, version: str | None, who: str, out: StackCheck) -> None:
    if version is None:
        out.problems.append(f"{who}: no python runs at that path on this host: allowed: the path of a "
                            "python that can make the venv (e.g. '/usr/bin/python3')")
        return
    checked, unknown = [], []
    for name, pinned, _deps in pins(spec):
        meta = PINNED_METADATA.get((name, pinned))
        if meta is None:
            unknown.append(f"{name} {pinned}")
            continue
        if not meta[0]:
            continue
        if not SpecifierSet(meta[0]).contains(version, prereleases=True):
            remedy = " (or remove the venv so that it is made again)" if who.startswith("the venv") else ""
            out.problems.append(f"{who} is Python {version}, but {name} {pinned} requires Python {meta[0]} "
                                f"(its Requires-Python): allowed: venv_python = a python {meta[0]}{remedy}")
        else:
            checked.append(f"{name} {pinned} ({meta[0]})")
    line = f"Python {version} ({who})"
    line += f" meets Requires-Python of {', '.join(checked)}" if checked else ""
    if unknown:
        line += f"; not in the table of known pins, not checked: {len(unknown)} ({', '.join(unknown[:3])}"
        line += ", ...)" if len(unknown) > 3 else ")"
    out.notes.append(line)


def driver_check(spec: Spec, gpus: list[Gpu], out: StackCheck) -> None:
    build = torch_build(spec)
    if build is None or not gpus:
        return
    version, via = build
    meta = PINNED_METADATA.get(("torch", version))
    if meta is None:
        out.notes.append(f"torch {version} ({via}): its CUDA build is not in the table of known pins: the "
                         "driver is checked against min_driver_version only")
        return
    cuda = cuda_major(meta[1])
    if cuda is None:
        out.notes.append(f"torch {version} ({via}) needs no CUDA driver (no CUDA dependency)")
        return
    major, because = cuda
    wanted = CUDA_MIN_DRIVER.get(major)
    have = gpus[0].driver_version
    if wanted is None:
        out.notes.append(f"torch {version} is a CUDA {major} build: no minimum driver known for CUDA {major}")
    elif have is None:
        out.notes.append(f"WARNING: torch {version} ({via}) is a CUDA {major} build needing driver >= {wanted}, "
                         "but nvidia-smi does not report the driver version ([N/A]): not checked")
    elif version_key(have) < version_key(wanted):
        out.problems.append(
            f"NVIDIA driver {have} is too old for torch {version} ({via}): its wheel depends on {because} "
            f"(CUDA {major}), which needs driver >= {wanted} (NVIDIA's CUDA compatibility table): allowed: "
            f"a driver >= {wanted}, or pins whose torch is built for the CUDA this driver runs"
        )
    else:
        out.notes.append(f"torch {version} ({via}) is a CUDA {major} build ({because}): driver {have} >= {wanted}")


def getpip_check(spec: Spec, has_ensurepip: bool | None, who: str, out: StackCheck) -> None:
    """get-pip.py is downloaded with curl (core/venv_ops.py) when the venv has no pip and no ensurepip."""
    if spec.pip_wheel or has_ensurepip is None or has_ensurepip:
        return
    venv = host.get_fact(VenvState, path=spec.server_venv)
    if venv.exists and venv.pip_version:
        return
    if host.get_fact(Which, command="curl"):
        out.notes.append(f"pip will come from get-pip.py ({spec.get_pip_url}): {who} has no ensurepip; curl is there")
        return
    out.problems.append(
        f"pip must come from get_pip_url = '{spec.get_pip_url}' ({who} has no ensurepip) but curl, which "
        "downloads it, is not installed: allowed: install curl, or python3-venv (ensurepip), or set pip_wheel "
        "to a pip wheel on the controller (uploaded, no download)"
    )


def stack_check(spec: Spec, gpus: list[Gpu]) -> StackCheck:
    """Python, driver vs torch's CUDA, get-pip tools: problems and plan notes."""
    out = StackCheck()
    version, who, has_ensurepip = interpreter_of(spec)
    python_check(spec, version, who, out)
    driver_check(spec, gpus, out)
    getpip_check(spec, has_ensurepip, who, out)
    return out
