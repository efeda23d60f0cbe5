"""Quantization deps: the venv's compressed-tensors must suit the software that
loads the model (SGLang) and the model's own format.

A compressed-tensors model goes through SGLang's compressed_tensors layer,
whose code touches CompressionFormat members whatever the model's format
(sglang 0.5.23's utils.is_activation_quantization_format lists
nvfp4_pack_quantized among others: an INT4 pack-quantized model dies with
`AttributeError: nvfp4_pack_quantized` under compressed-tensors < 0.10). So
three demands are read on the host and the highest wins:

- what the installed SGLang declares (its metadata's Requires-Dist, e.g.
  sglang 0.5.23: compressed-tensors==0.18.0; an exact pin is the target);
- the CompressionFormat members SGLang's code references (its source files,
  read without importing it), each needing the first release that has it;
- the formats the model's config.json names (quantization_config).

When one is not met, compressed-tensors is installed at the target, holding
torch / sglang / flashinfer at their installed versions with a constraints
file; another package's pin the target breaks fails the step naming both,
unless the settings allow that package to conflict (then a warning). After
the install the step re-reads the venv: the version must satisfy the target
and SGLang's requirement and every needed member must exist, else it fails
naming the member.

Before python_env has installed SGLang (a new or adopted venv without it, in
the plan), only the model's formats can be read: the step says so, and
decides again when it runs, after python_env.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass, field
from functools import cache

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pyinfra import host, logger
from pyinfra.api import FunctionCommand, StringCommand, deploy, operation

from facts.compressed_tensors import (
    CompressedTensors,
    CompressedTensorsRequirers,
    CompressionFormatReferences,
    CompressionFormats,
    FormatReferences,
    Requirer,
)
from facts.model_dir import ModelConfig
from facts.venv import ExactPins, VenvPackages, venv_python
from core.disk import HUB, hub_failure
from core.ops import explaining_line, fail_command, plan, record_failure, report
from core.paths import CACHE_DIR
from core.stamps import read_stamp, stamp_path
from core.venv_ops import locked, say_if_locked
from tasks.spec import COMPRESSED_TENSORS_FORMATS, Spec

PACKAGE = "compressed-tensors"
LOADER = "sglang"  # the package whose code loads the model (and references CompressionFormat members)
_FLOOR = Version("0.4.0")  # the first release in the table: every release has its members


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
        requirement = _requirement(text)
        if requirement is None:
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


_FIRST_RELEASE = {value.replace("-", "_"): Version(release) for value, release in COMPRESSED_TENSORS_FORMATS.items()}


def first_release(member: str) -> Version | None:
    """The first compressed-tensors release with this CompressionFormat member (FACTS table), None if unknown.

    >>> first_release("nvfp4_pack_quantized"), first_release("pack_quantized"), first_release("int8_future")
    (<Version('0.10.0')>, <Version('0.4.0')>, None)
    """
    return _FIRST_RELEASE.get(member)


def first_release_with(members: list[str] | set[str]) -> Version:
    """The first compressed-tensors release that has every (known) member."""
    return max((first_release(member) or _FLOOR for member in members), default=_FLOOR)


def _requirement(text: str) -> Requirement | None:
    try:
        return Requirement(text)
    except InvalidRequirement:
        return None


def _contains(specifier: SpecifierSet, version: str | Version) -> bool:
    try:
        return specifier.contains(str(version), prereleases=True)
    except InvalidVersion:
        return False


def _member(name: str) -> str:
    release = first_release(name)
    return f"CompressionFormat.{name} ({PACKAGE} >= {release})" if release else (
        f"CompressionFormat.{name} (not in the table of first releases)")


@dataclass(frozen=True)
class Need:
    """What compressed-tensors must be for this venv and model, and who demands it."""

    reasons: list[str]  # the demands the installed one does not meet, each naming who (plan / report lines)
    minimum: Version  # the first release with every member needed
    members: dict[str, str]  # every member needed -> who needs it, e.g. "sglang 0.5.23 references"
    loader: str | None  # e.g. "sglang 0.5.23"; None: SGLang is not installed in the venv
    loader_requires: list[str] = field(default_factory=list)  # its Requires-Dist on compressed-tensors


def _loader(requirers: dict[str, Requirer]) -> tuple[str, Requirer] | None:
    for name, requirer in requirers.items():
        if canonicalize_name(name) == LOADER:
            return name, requirer
    return None


def assess(model_members: list[str], installed: CompressedTensors, refs: FormatReferences,
           requirers: dict[str, Requirer]) -> Need:
    """The demands on compressed-tensors: SGLang's declared requirement, the
    members SGLang's code references and the model's formats; which of them
    the installed release does not meet.

    >>> ct = CompressedTensors("0.8.1", ["dense", "pack_quantized"])
    >>> refs = FormatReferences("sglang", "0.5.23", 1, {"nvfp4_pack_quantized": ["sglang/x.py"]})
    >>> assess(["pack_quantized"], ct, refs, {"sglang": Requirer("0.5.23", ["compressed-tensors==0.18.0"])}).reasons
    ['sglang 0.5.23 requires compressed-tensors==0.18.0; installed 0.8.1', \
'sglang 0.5.23 references CompressionFormat.nvfp4_pack_quantized (compressed-tensors >= 0.10.0); \
installed 0.8.1 lacks it (sglang/x.py)']
    """
    found = _loader(requirers)
    loader = f"{LOADER} {refs.version}" if refs.version else (f"{found[0]} {found[1].version}" if found else None)
    loader_requires = list(found[1].requires) if found else []
    have = installed.version
    reasons = []
    for text in loader_requires:
        requirement = _requirement(text)
        if have is None or (requirement is not None and not _contains(requirement.specifier, have)):
            reasons.append(f"{loader} requires {text}; installed {have or 'none'}")
    members = {name: f"{loader} references" for name in sorted(refs.members)}
    for name in model_members:  # a member SGLang touches anyway is its demand first
        members.setdefault(name, "the model's config.json names")
    if have is None:
        reasons.append(f"the model uses {', '.join(model_members)} and no {PACKAGE} is installed")
    else:
        newest_first = sorted(sorted(refs.members), key=lambda m: first_release(m) or _FLOOR, reverse=True)
        lacking = [name for name in newest_first if name not in installed.members]
        reasons += [f"{loader} references {_member(name)}; installed {have} lacks it ({refs.members[name][0]})"
                    for name in lacking]
        reasons += [f"the model's config.json names {_member(name)}; installed {have} lacks it"
                    for name in model_members if name not in installed.members]
    return Need(reasons, first_release_with(set(members)), members, loader, loader_requires)


@dataclass(frozen=True)
class UpgradePlan:
    requirement: str | None  # what pip installs, e.g. "compressed-tensors==0.18.0"; None: blocked
    because: str  # who demands that target, e.g. "sglang 0.5.23 requires compressed-tensors==0.18.0"
    blockers: list[str]  # pins the target breaks, of packages not allowed to conflict
    tolerated: list[str]  # pins the target breaks, allowed by the settings


def _excludes(pins: SpecifierSet, target: str | None, minimum: Version) -> bool:
    """Whether ``pins`` leave out the exact target, or (no target) every release >= minimum we can name."""
    if target is not None:
        return not _contains(pins, target)
    candidates = {minimum, Version(f"{minimum.major}.{minimum.minor}.{minimum.micro + 1}")}
    for spec in pins:
        try:
            candidates.add(Version(spec.version.rstrip(".*")))
        except InvalidVersion:
            continue
    return not any(_contains(pins, version) for version in candidates if version >= minimum)


def upgrade_plan(need: Need, requirers: dict[str, Requirer], allow: list[str]) -> UpgradePlan:
    """Which compressed-tensors to install: SGLang's exact pin when it declares
    one (a pin below what the members need blocks), else at least
    ``need.minimum`` inside every pin of a package not allowed to conflict.

    >>> need = Need([], Version("0.10.0"), {}, "sglang 0.5.23", ["compressed-tensors==0.18.0"])
    >>> plan_ = upgrade_plan(need, {"vllm": Requirer("0.6.5", ["compressed-tensors==0.8.1"])}, ["vllm"])
    >>> plan_.requirement, plan_.because, plan_.tolerated
    ('compressed-tensors==0.18.0', 'sglang 0.5.23 requires compressed-tensors==0.18.0', \
['vllm 0.6.5 requires compressed-tensors==0.8.1'])
    """
    allowed = {canonicalize_name(name) for name in allow} - {LOADER}
    specifier = SpecifierSet(f">={need.minimum}")
    newest = [name for name in need.members if (first_release(name) or _FLOOR) == need.minimum]
    because = f"{need.members[newest[0]]} {_member(newest[0])}" if newest else f"{PACKAGE} >= {need.minimum}"
    blockers: list[str] = []
    loader_pins = [req for req in map(_requirement, need.loader_requires) if req is not None]
    exact = [spec.version for req in loader_pins for spec in req.specifier if spec.operator in ("==", "===")]
    target = exact[0] if exact and "*" not in exact[0] else None
    if target is not None:
        because = f"{need.loader} requires {PACKAGE}=={target}"
        if Version(target) < need.minimum:
            blockers.append(f"{PACKAGE} >= {need.minimum} is needed for " +
                            ", ".join(m for m in need.members if (first_release(m) or _FLOOR) > Version(target)))
    else:
        for req in loader_pins:
            specifier &= req.specifier
        if loader_pins:
            because = f"{need.loader} requires {', '.join(str(req) for req in loader_pins)}"
    tolerated = []
    for name, requirer in sorted(requirers.items()):
        if canonicalize_name(name) == LOADER:
            continue
        for text in requirer.requires:
            requirement = _requirement(text)
            if requirement is None:
                continue
            pins, who = requirement.specifier, f"{name} {requirer.version} requires {text}"
            breaks = _excludes(pins, target, need.minimum)
            if canonicalize_name(name) in allowed:
                if breaks or (target is None and not _contains(pins, need.minimum)):
                    tolerated.append(who)
            elif breaks:
                blockers.append(who)
            else:
                specifier &= pins
    if blockers:
        return UpgradePlan(None, because, blockers, tolerated)
    return UpgradePlan(f"{PACKAGE}=={target}" if target else f"{PACKAGE}{_simplest(specifier)}", because,
                       blockers, tolerated)


def _simplest(specifier: SpecifierSet) -> str:
    exact = [spec for spec in specifier if spec.operator == "=="]
    if exact:
        return f"=={exact[0].version}"
    return str(specifier)


def postcondition(installed: CompressedTensors, requirement: str, need: Need) -> list[str]:
    """What is still wrong after the install (empty: the postcondition holds).

    >>> need = Need([], Version("0.10.0"), {"nvfp4_pack_quantized": "sglang 0.5.23 references"},
    ...             "sglang 0.5.23", ["compressed-tensors==0.18.0"])
    >>> postcondition(CompressedTensors("0.18.0", ["nvfp4_pack_quantized"]), "compressed-tensors==0.18.0", need)
    []
    >>> postcondition(CompressedTensors("0.9.0", ["pack_quantized"]), "compressed-tensors>=0.9", need)
    ['compressed-tensors 0.9.0 does not satisfy compressed-tensors==0.18.0 (sglang 0.5.23 requires it)', \
'compressed-tensors 0.9.0 lacks CompressionFormat.nvfp4_pack_quantized (sglang 0.5.23 references it)']
    """
    if installed.version is None:
        return [f"{PACKAGE} is not installed after pip install {requirement}"]
    problems = []
    wanted = [(requirement, "the install's target")] + [(text, f"{need.loader} requires it")
                                                         for text in need.loader_requires]
    for text, who in wanted:
        parsed = _requirement(text)
        if parsed is not None and not _contains(parsed.specifier, installed.version):
            problems.append(f"{PACKAGE} {installed.version} does not satisfy {text} ({who})")
    problems += [f"{PACKAGE} {installed.version} lacks CompressionFormat.{name} ({who} it)"
                 for name, who in need.members.items() if name not in installed.members]
    return problems


_PIP_CHECK_RE = re.compile(r"^(?P<pkg>\S+) (?P<ver>\S+) (?:has requirement|requires) (?P<req>.+?)(?:,|\.$| which)")


def _run(host, command: str):
    return host.run_shell_command(StringCommand(command), print_output=False, print_input=False)


def _fatal(state, host, message: str, lines: list[str]) -> bool:
    for line in lines or [message]:
        host.log_styled(f"quant deps: {line}" if lines else line, fg="red", log_func=logger.error)
    record_failure(state, host, message, lines)
    return False


def _new_conflicts(host, before, after, allow: list[str], because: str) -> list[str]:
    """`pip check` lines the install introduced, warning about the allowed ones; the others are returned."""
    old = {line.strip() for line in before.stdout_lines if line.strip()}
    new = [line.strip() for line in after.stdout_lines
           if line.strip() and line.strip() not in old and "No broken requirements" not in line]
    allowed = {canonicalize_name(name) for name in allow}
    fatal = []
    for line in new:
        match = _PIP_CHECK_RE.match(line)
        if match and canonicalize_name(match.group("pkg")) in allowed:
            host.log(f"quant deps: WARNING: {line} (allowed: compressed_tensors_allow_conflicts "
                     f"includes {match.group('pkg')}; {because})", logger.warning)
        else:
            fatal.append(line)
    previous = [line for line in old if "No broken requirements" not in line]
    if previous:
        host.log(f"quant deps: {len(previous)} pip check problem(s) were there before the upgrade "
                 f"(not caused by it), e.g.: {sorted(previous)[0]}", logger.warning)
    return fatal


def constraints_path(text: str) -> str:
    """The constraints file of one hold list, named by its content (and renamed into place): servers of
    one host may upgrade at the same moment, and none reads another's half-written or other list."""
    return f"{CACHE_DIR}/hold-constraints-{hashlib.sha256(text.encode()).hexdigest()[:12]}.txt"


def _upgrade(state, host, venv: str, requirement: str, constraints_lines: list[str], allow: list[str],
             need: Need, because: str) -> bool:
    python = shlex.quote(venv_python(venv))
    pip = f"{python} -m pip --disable-pip-version-check"
    held_text = "".join(line + "\n" for line in constraints_lines)
    constraints = constraints_path(held_text)
    _ok, before = _run(host, f"{pip} check 2>&1")
    _run(host, f"install -d -m 755 {CACHE_DIR} && printf %s {shlex.quote(held_text)} > {constraints}.$$ "
               f"&& mv -f {constraints}.$$ {constraints}")
    held = ", ".join(constraints_lines) or "nothing"
    host.log(f"quant deps: pip install {requirement} because {because} (constraints: {held})", logger.warning)
    # under the venv's pip lock, like every pip that changes the venv (core/venv_ops.py): a pip
    # left running by an interrupted run finishes first, the two never install at the same time
    say_if_locked(host, venv, "quant deps")
    ok, out = _run(host, locked(venv, f"{pip} install --upgrade -c {constraints} {shlex.quote(requirement)} 2>&1"))
    if not ok:
        # pip's own lines (2>&1), then the lock's timeout line (stderr, outside the lock)
        tail = [line for line in out.stdout_lines + out.stderr_lines if line.strip()][-6:]
        return _fatal(state, host, f"quant deps: pip install {requirement} failed: {explaining_line(tail)}", tail)
    _ok, after = _run(host, f"{pip} check 2>&1")
    fatal = _new_conflicts(host, before, after, allow, because)
    if fatal:
        lines = [f"the upgrade broke a pin: {line}; {because}. Allow it with "
                 f"compressed_tensors_allow_conflicts, or remove that package." for line in fatal]
        return _fatal(state, host, f"quant deps: the upgrade broke a pin: {fatal[0]}; {because}", lines)
    installed = host.get_fact(CompressionFormats, path=venv)  # read again: the postcondition on the host
    problems = postcondition(installed, requirement, need)
    if problems:
        return _fatal(state, host, f"quant deps: after pip install {requirement}: {problems[0]}",
                      [f"after pip install {requirement}: {problem}" for problem in problems])
    host.log(f"quant deps: {PACKAGE} is now {installed.version}: it satisfies {requirement} and has the "
             f"{len(need.members)} CompressionFormat member(s) {need.loader or 'the model'} needs", logger.warning)
    return True


def _not_yet_installed(spec: Spec) -> str:
    """The plan's note when SGLang is not in the venv yet."""
    wanted = [text for text in (*spec.packages, *spec.packages_no_deps)
              if (req := _requirement(text)) is not None and canonicalize_name(req.name) == LOADER]
    by = f"python_env installs {wanted[0]}" if wanted else f"the settings do not install {LOADER}"
    return (f"quant deps: {LOADER} is not installed in {spec.server_venv} yet ({by}): what it requires of "
            f"{PACKAGE} and the CompressionFormat members its code references are read when this step runs")


def _hold_lines(spec: Spec) -> tuple[dict[str, str], list[str]]:
    packages = host.get_fact(VenvPackages, path=spec.server_venv)
    hold = {name: packages[canonicalize_name(name)] for name in spec.compressed_tensors_hold
            if canonicalize_name(name) in packages}
    lines = hold_constraints(hold, host.get_fact(ExactPins, path=spec.server_venv, packages=sorted(hold)),
                             list(spec.packages) + list(spec.packages_no_deps))
    return hold, lines


@operation()
def compression_format_supported(spec: Spec):
    """
    Make the venv's compressed-tensors what the installed SGLang requires and
    references and what the model's config.json names; no change when it is.

    .. code:: python

        compression_format_supported(spec=spec)
    """
    config = host.get_fact(ModelConfig, path=spec.model_path)
    if config is None:
        token = spec.hf_token.get_secret_value() if spec.hf_token else None
        try:
            config = hub_config(spec.profile.repo, spec.profile.revision, spec.hf_endpoint, token)
        except Exception as err:  # noqa: BLE001 - huggingface_hub's errors, each named by hub_failure
            line, _transient, _wait = hub_failure(err, spec.profile.repo, spec.profile.revision,
                                                  spec.hf_endpoint or HUB, token)
            message = f"quant deps: cannot read {spec.profile.repo}@{spec.profile.revision[:12]}'s config.json: {line}"
            plan(message)
            yield fail_command(message)
            return
    model_members = needed_formats(config)
    if not model_members:
        host.noop("the model does not use compressed-tensors")
        return
    installed = host.get_fact(CompressionFormats, path=spec.server_venv)
    refs = host.get_fact(CompressionFormatReferences, path=spec.server_venv, package=LOADER)
    requirers = host.get_fact(CompressedTensorsRequirers, path=spec.server_venv)
    need = assess(model_members, installed, refs, requirers)
    if need.loader is None:
        plan(_not_yet_installed(spec))
    if not need.reasons:
        by = f"{need.loader}'s requirement and the {len(need.members)} member(s) it and the model use" \
            if need.loader else f"the model's {', '.join(model_members)}"
        host.noop(f"{PACKAGE} {installed.version} meets {by}")
        return
    for reason in need.reasons:
        plan(f"quant deps: {reason}")
        report(f"quant deps: {reason}")
    upgrade = upgrade_plan(need, requirers, list(spec.compressed_tensors_allow_conflicts))
    if upgrade.requirement is None:
        names = [blocker.split()[0] for blocker in upgrade.blockers if not blocker.startswith(PACKAGE)]
        fix = (f": allow the conflict with compressed_tensors_allow_conflicts = {names} or remove the package"
               if names else "")
        message = f"quant deps: {upgrade.because} but {'; '.join(upgrade.blockers)}{fix}"
        plan(message)
        yield fail_command(message)
        return
    if read_stamp(stamp_path(spec)).get("venv") == spec.server_venv:
        # its package set's inputs say nothing of this: the model's config.json asks more than its
        # profile declares (Spec.env_inputs), or the venv was changed by hand since it was built
        serving = (f"quant deps: {spec.server_venv} is the venv {spec.unit_name} was started from: this changes "
                   "it in place, under the running server (the profile's quantization format does not say what "
                   "the model's config.json needs)")
        plan(serving)
        report(serving)
    hold, constraints_lines = _hold_lines(spec)
    tolerated = f"; will conflict, allowed: {'; '.join(upgrade.tolerated)}" if upgrade.tolerated else ""
    plan(f"install {upgrade.requirement} ({upgrade.because}), holding "
         f"{', '.join(f'{k} {v}' for k, v in sorted(hold.items())) or 'nothing'} and their exact pins{tolerated}")
    yield FunctionCommand(
        _upgrade,
        (spec.server_venv, upgrade.requirement, constraints_lines, list(spec.compressed_tensors_allow_conflicts),
         need, upgrade.because),
        {},
    )


@deploy("Quantization deps")
def quant_deps(spec: Spec) -> None:
    """compressed-tensors as the installed SGLang and the model's quantization format need it."""
    compression_format_supported(spec=spec, name=f"{PACKAGE} suits SGLang and the model's format")
