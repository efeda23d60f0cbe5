"""Quantization deps: the venv's compressed-tensors must know the model's format.

Reads the model's config.json quantization_config. When quant_method is
compressed-tensors and a format it names (top level or any config group) is
not a CompressionFormat member of the venv's compressed-tensors, upgrade it to
a release that has it, holding torch / sglang / flashinfer at their installed
versions with a constraints file; then compare `pip check` before and after:
a conflict the upgrade introduced fails the step naming the package and its
pin, unless the settings allow that package to conflict (then a warning).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from functools import cache

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version
from pyinfra import host, logger
from pyinfra.api import FunctionCommand, StringCommand, deploy, operation

from facts.compressed_tensors import CompressedTensorsRequirers, CompressionFormats
from facts.model_dir import ModelConfig
from facts.venv import ExactPins, VenvPackages, venv_python
from core.ops import explaining_line, fail_command, plan, record_failure
from core.paths import CACHE_DIR
from tasks.spec import COMPRESSED_TENSORS_FORMATS, Spec
PACKAGE = "compressed-tensors"


def hold_constraints(held: dict[str, str], pins: dict[str, list[str]], explicit: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Constraint lines for the upgrade: the held packages at their installed
    versions, the settings' own pinned packages (the python_env step would
    only put them back), and the exact pins the held packages declare on
    others (an upgrade of compressed-tensors must not drag transformers past
    the version sglang pins).

    >>> hold_constraints({"sglang": "0.5.23", "torch": "2.13.0+cpu"},
    ...                  {"sglang": ["torch==2.14.1", "transformers==5.19.0", "huggingface-hub==1.33.0",
    ...                              "compressed-tensors==0.18.0"]},
    ...                  ["huggingface_hub==2.4.0"])
    ['sglang==0.5.23', 'torch==2.13.0+cpu', 'huggingface_hub==2.4.0', 'transformers==5.19.0']
    """
    lines = [f"{name}=={version}" for name, version in sorted(held.items())]
    pinned = {canonicalize_name(name) for name in held} | {PACKAGE}
    sources = [("settings", text) for text in explicit]
    sources += [(owner, text) for owner in sorted(pins) for text in pins[owner]]
    for _owner, text in sources:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        name = canonicalize_name(requirement.name)
        if name not in pinned:
            pinned.add(name)
            lines.append(f"{requirement.name}{requirement.specifier}")
    return lines


@cache
def hub_config(repo: str, revision: str, endpoint: str | None, token: str | None) -> dict:
    """config.json of a pinned revision, from the Hub (for the plan before the download)."""
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(repo, "config.json", revision=revision, endpoint=endpoint, token=token)
    with open(path) as handle:
        return json.load(handle)


def needed_formats(config: dict) -> list[str]:
    """CompressionFormat member names a config.json needs (empty if not compressed-tensors)."""
    quant = config.get("quantization_config") or {}
    if quant.get("quant_method") != "compressed-tensors":
        return []
    formats = {quant.get("format")}
    for group in (quant.get("config_groups") or {}).values():
        if isinstance(group, dict):
            formats.add(group.get("format"))
    return sorted(value.replace("-", "_") for value in formats if value)


def first_release_with(members: list[str]) -> Version:
    """The first compressed-tensors release that has every member (FACTS table)."""
    by_member = {value.replace("-", "_"): Version(release) for value, release in COMPRESSED_TENSORS_FORMATS.items()}
    return max((by_member.get(member, Version("0.4.0")) for member in members), default=Version("0.4.0"))


@dataclass(frozen=True)
class UpgradePlan:
    requirement: str | None  # what pip installs, e.g. "compressed-tensors==0.18.0"
    blockers: list[str]  # pins that exclude every release with the format (not allowed to conflict)
    tolerated: list[str]  # pins that will conflict, allowed by the settings


def upgrade_plan(minimum: Version, requirers: dict[str, list[str]], allow: list[str]) -> UpgradePlan:
    """Which compressed-tensors to install: at least ``minimum``, inside every pin
    of a package not allowed to conflict; an exact pin that already has the
    format is taken as is (e.g. sglang 0.5.23's ==0.18.0).

    >>> upgrade_plan(Version("0.10.0"), {"vllm": ["compressed-tensors==0.8.1"]}, ["vllm"]).requirement
    'compressed-tensors>=0.10.0'
    >>> upgrade_plan(Version("0.10.0"), {"sglang": ["compressed-tensors==0.18.0"]}, []).requirement
    'compressed-tensors==0.18.0'
    """
    allowed = {canonicalize_name(name) for name in allow}
    specifier = SpecifierSet(f">={minimum}")
    blockers, tolerated = [], []
    for name, requirements in sorted(requirers.items()):
        for text in requirements:
            try:
                requirement = Requirement(text)
            except InvalidRequirement:
                continue
            pins = requirement.specifier
            exact = [spec.version for spec in pins if spec.operator in ("==", "===")]
            excludes = bool(exact) and all(Version(v.rstrip(".*")) < minimum for v in exact)
            if canonicalize_name(name) in allowed:
                if excludes or not pins.contains(str(minimum)):
                    tolerated.append(f"{name} requires {text}")
                continue
            if excludes:
                blockers.append(f"{name} requires {text}")
            else:
                specifier &= pins
    if blockers:
        return UpgradePlan(None, blockers, tolerated)
    return UpgradePlan(f"{PACKAGE}{_simplest(specifier, minimum)}", blockers, tolerated)


def _simplest(specifier: SpecifierSet, minimum: Version) -> str:
    exact = [spec for spec in specifier if spec.operator == "=="]
    if exact:
        return f"=={exact[0].version}"
    return str(specifier)


_PIP_CHECK_RE = re.compile(r"^(?P<pkg>\S+) (?P<ver>\S+) (?:has requirement|requires) (?P<req>.+?)(?:,|\.$| which)")


def _run(host, command: str):
    return host.run_shell_command(StringCommand(command), print_output=False, print_input=False)


def _upgrade(state, host, venv: str, requirement: str, constraints_lines: list[str], allow: list[str],
             need: str) -> bool:
    python = shlex.quote(venv_python(venv))
    pip = f"{python} -m pip --disable-pip-version-check"
    constraints = f"{CACHE_DIR}/hold-constraints.txt"
    _ok, before = _run(host, f"{pip} check 2>&1")
    text = shlex.quote("".join(line + "\n" for line in constraints_lines))
    ok, out = _run(host, f"install -d -m 755 {CACHE_DIR} && printf %s {text} > {constraints}")
    held = ", ".join(constraints_lines) or "nothing"
    host.log(f"quant deps: pip install {requirement} (constraints: {held})", logger.warning)
    ok, out = _run(host, f"{pip} install --upgrade -c {constraints} {shlex.quote(requirement)} 2>&1")
    if not ok:
        tail = [line for line in out.stdout_lines if line.strip()][-6:]
        for line in tail:
            host.log_styled(f"quant deps: {line}", fg="red", log_func=logger.error)
        record_failure(state, host, f"quant deps: pip install {requirement} failed: {explaining_line(tail)}", tail)
        return False
    _ok, after = _run(host, f"{pip} check 2>&1")
    old = {line.strip() for line in before.stdout_lines if line.strip()}
    new = [line.strip() for line in after.stdout_lines
           if line.strip() and line.strip() not in old and "No broken requirements" not in line]
    allowed = {canonicalize_name(name) for name in allow}
    fatal = []
    for line in new:
        match = _PIP_CHECK_RE.match(line)
        package = canonicalize_name(match.group("pkg")) if match else ""
        if match and package in allowed:
            host.log(f"quant deps: WARNING: {line} (allowed: compressed_tensors_allow_conflicts "
                     f"includes {match.group('pkg')}; the model needs {need})", logger.warning)
        else:
            fatal.append(line)
    previous = [line for line in old if "No broken requirements" not in line]
    if previous:
        host.log(f"quant deps: {len(previous)} pip check problem(s) were there before the upgrade "
                 f"(not caused by it), e.g.: {sorted(previous)[0]}", logger.warning)
    _ok, version = _run(host, f"{python} -c 'import importlib.metadata as m; print(m.version(\"{PACKAGE}\"))'")
    if fatal:
        for line in fatal:
            host.log_styled(f"quant deps: the upgrade broke a pin: {line}; the model needs {need}. "
                            f"Allow it with compressed_tensors_allow_conflicts, or remove that package.",
                            fg="red", log_func=logger.error)
        record_failure(state, host, f"quant deps: the upgrade broke a pin: {fatal[0]}; the model needs {need}", fatal)
        return False
    host.log(f"quant deps: {PACKAGE} is now {version.stdout.strip()}", logger.warning)
    return True


@operation()
def compression_format_supported(spec: Spec):
    """
    Make the venv's compressed-tensors know every format the model's
    config.json uses; no change when it already does.

    .. code:: python

        compression_format_supported(spec=spec)
    """
    config = host.get_fact(ModelConfig, path=spec.model_dir)
    if config is None:
        token = spec.hf_token.get_secret_value() if spec.hf_token else None
        config = hub_config(spec.profile.repo, spec.profile.revision, spec.hf_endpoint, token)
    needed = needed_formats(config)
    if not needed:
        host.noop("the model does not use compressed-tensors")
        return
    installed = host.get_fact(CompressionFormats, path=spec.venv_path)
    missing = [member for member in needed if member not in installed.members]
    if installed.version and not missing:
        host.noop(f"{PACKAGE} {installed.version} has {', '.join(needed)}")
        return
    minimum = first_release_with(needed)
    need = f"{', '.join(needed)} ({PACKAGE} >= {minimum})"
    requirers = host.get_fact(CompressedTensorsRequirers, path=spec.venv_path)
    upgrade = upgrade_plan(minimum, requirers, list(spec.compressed_tensors_allow_conflicts))
    have = f"{PACKAGE} {installed.version}" if installed.version else f"no {PACKAGE}"
    if upgrade.requirement is None:
        message = (
            f"quant deps: the model needs {need} but {'; '.join(upgrade.blockers)}: "
            f"allow the conflict with compressed_tensors_allow_conflicts = "
            f"{[b.split()[0] for b in upgrade.blockers]} or remove the package"
        )
        plan(message)
        yield fail_command(message)
        return
    packages = host.get_fact(VenvPackages, path=spec.venv_path)
    hold = {
        name: packages[canonicalize_name(name)]
        for name in spec.compressed_tensors_hold
        if canonicalize_name(name) in packages
    }
    constraints_lines = hold_constraints(
        hold,
        host.get_fact(ExactPins, path=spec.venv_path, packages=sorted(hold)),
        list(spec.packages) + list(spec.packages_no_deps),
    )
    tolerated = f"; will conflict, allowed: {'; '.join(upgrade.tolerated)}" if upgrade.tolerated else ""
    plan(f"{have} lacks {', '.join(missing) or 'everything'}: install {upgrade.requirement}, "
         f"holding {', '.join(f'{k} {v}' for k, v in sorted(hold.items())) or 'nothing'}"
         f" and their exact pins{tolerated}")
    yield FunctionCommand(
        _upgrade,
        (spec.venv_path, upgrade.requirement, constraints_lines, list(spec.compressed_tensors_allow_conflicts),
         need),
        {},
    )


@deploy("Quantization deps")
def quant_deps(spec: Spec) -> None:
    """compressed-tensors new enough for the model's quantization format."""
    compression_format_supported(spec=spec, name=f"{PACKAGE} supports the model's format")
