"""The field types of the settings: pydantic ``Annotated`` types, each check
written once and shared by the model profile, the server settings and the
router settings.

A check raises ``ValueError("why: allowed ...")`` (shown as ``field = value:
why``), or ``spec_lines(...)`` when it words whole lines itself (one per
problem of a list, say). Checks that take an example (``abs_path("e.g.
'/opt/sglang/venv'")``) return the validator to put in ``Annotated``.
"""

from __future__ import annotations

import difflib
import fnmatch
import ipaddress
import posixpath
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlparse

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, StrictInt, StrictStr, ValidationInfo

from core.paths import REPO_ROOT
from tasks.spec.errors import HIDDEN, redact_args, show, spec_lines
from tasks.spec.tables import (
    ATTENTION_BACKENDS,
    FORBIDDEN_ENV,
    MANAGED_FLAGS,
    ROUTER_MANAGED_FLAGS,
    ROUTER_SECRET_FLAGS,
    SECRET_FLAGS,
    SPECULATIVE_ALGORITHMS,
)

# Every settings model: immutable, unknown keys refused, ``model`` is a field name like any other.
FROZEN = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_REPO_ID = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?/[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")
_SERVED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_PKG_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
_UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.\\-]+(?:@[A-Za-z0-9:_.\\-]+)?\.service$")
_ANY_UNIT_NAME = re.compile(
    r"^[A-Za-z0-9:_.\\-]+(?:@[A-Za-z0-9:_.\\-]*)?"
    r"\.(?:service|scope|slice|socket|timer|mount|automount|swap|target|path|device)$"
)
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
_DRIVER_VERSION = re.compile(r"^\d+(\.\d+){1,2}$")
_DIST_INIT_ADDR = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[^:\[\]]+):(\d{1,5})$")
_GROUP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+:@-]{0,127}$")

# ---------------------------------------------------------------- plain types

GpuId = Annotated[StrictInt, Field(ge=0)]
Number = Annotated[float, Field(strict=True)]
Port = Annotated[StrictInt, Field(ge=1, le=65535)]
PositiveInt = Annotated[StrictInt, Field(ge=1)]
NonNegativeInt = Annotated[StrictInt, Field(ge=0)]

# ---------------------------------------------------------------- shared checks


def is_host_address(value: str) -> bool:
    """An IP address (v4 or v6) or a DNS hostname.

    A name whose last label is all digits ('999.1.1.1', '10.0.0.256') is no
    host name: resolvers read it as an IPv4 address, and it is not a valid one.
    """
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        return bool(_HOSTNAME.match(value)) and not value.rsplit(".", 1)[-1].isdigit()


def _looks_like_ipv4(value: str) -> bool:
    return bool(re.fullmatch(r"[0-9.]+", value)) and any(c.isdigit() for c in value)


def normalized_abs_path(value: str, what: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"must be an absolute path on the host (starting with '/'), {what}")
    norm = posixpath.normpath(value)
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    return norm


def abs_path(what: str) -> AfterValidator:
    """An absolute path on the host, normalized; ``what`` ends the message (an example)."""
    return AfterValidator(lambda v: normalized_abs_path(v, what))


# Directories of the system: the deploy never writes into one, nor into a directory directly under one.
SYSTEM_DIRS: frozenset[str] = frozenset({
    "/", "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/var", "/boot",
    "/proc", "/sys", "/dev", "/run", "/home", "/root", "/tmp",
})
# Examples of a good value, per field (the message of a refused one shows it).
_DIR_EXAMPLES = {"router_venv_path": "/opt/sglang-router/venv", "model_dir": "/srv/models/kimi-k2.6",
                 "draft_dir": "/srv/models/kimi-k2.6-draft"}


def own_dir_problem(norm: str) -> str | None:
    """Why a normalized absolute path is no directory the deploy may write into and delete in (None: fine).

    It must not be a system directory, nor directly under one, nor directly under
    '/' (so '/opt' and '/srv' are refused, '/opt/sglang/venv' and '/srv/models/x' are fine).
    """
    parent = posixpath.dirname(norm)
    if norm == "/":
        return "the root directory"
    if norm in SYSTEM_DIRS:
        return "a system directory"
    if parent == "/":
        return "a top-level directory (directly under /)"
    if parent in SYSTEM_DIRS:
        return f"directly under the system directory {parent}"
    return None


def _own_dir(value: str, info: ValidationInfo) -> str:
    example = _DIR_EXAMPLES.get(info.field_name or "", "/opt/sglang/venv")
    norm = normalized_abs_path(value, f"e.g. {example!r}")
    problem = own_dir_problem(norm)
    if problem:
        shown = f"is {norm!r}, " if norm != value else ""
        raise ValueError(
            f"{shown}{problem}: the deploy creates and deletes files in it; allowed: a directory of its own "
            f"at least two levels below / and not directly under a system directory "
            f"({', '.join(sorted(SYSTEM_DIRS - {'/'}))}), e.g. {example!r}"
        )
    return norm


def http_url(value: str) -> str:
    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError("must be an http:// or https:// URL with a host")
    return value


def base_url(value: str) -> str:
    """An http(s) URL of a router or worker: scheme, host, optional port, no path."""
    http_url(value)
    parsed = urlparse(value)
    try:
        _ = parsed.port  # raises for a port out of range
    except ValueError:
        raise ValueError("has an invalid port: allowed: 1..65535, e.g. 'http://10.0.0.5:30000'") from None
    if not is_host_address(parsed.hostname or ""):
        raise ValueError(
            f"host {parsed.hostname or ''!r} is not an IP address or DNS hostname: allowed: "
            "scheme://host[:port], e.g. 'http://10.0.0.5:30000' or 'http://gpu-a.example.com:30000'"
        )
    if parsed.path not in ("", "/") or parsed.query or parsed.fragment:
        raise ValueError("must be scheme://host[:port] without a path, e.g. 'http://10.0.0.5:30000'")
    return value.rstrip("/")


def url_port(value: str) -> int:
    parsed = urlparse(value)
    return parsed.port or (443 if parsed.scheme == "https" else 80)


def _host_address(value: str) -> str:
    if not is_host_address(value):
        why = "looks like an IPv4 address but is not one (four numbers 0..255): " if _looks_like_ipv4(value) else ""
        raise ValueError(
            f"{why}allowed: an IP address or hostname (an IPv4 or IPv6 address, or DNS labels of letters, "
            "digits and '-' joined by '.', none starting or ending with '-', the last not all digits), "
            "e.g. '0.0.0.0', '::1' or 'gpu-a.example.com'"
        )
    return value


def _secret_env_name(value: str) -> str:
    if not _SECRET_ENV_NAME.match(value):
        raise ValueError(
            "must be the NAME of an environment variable on the controller (upper-case letters, "
            "digits, '_', e.g. 'SGLANG_API_KEY'), never the secret itself"
        )
    return value


def _pip_wheel_file(value: str) -> str:
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = REPO_ROOT / path
    if not path.name.endswith(".whl") or not path.name.startswith("pip-"):
        raise ValueError("must be the path of a pip wheel (pip-<version>-py3-none-any.whl) on the controller")
    if not path.is_file():
        raise ValueError(f"no such file on the controller ({path}): give an existing pip-*.whl, or None")
    return str(path)


# Units of the system (fnmatch patterns): never ours to write and restart. The host-side
# check (core/ops.py managed_file: no marker line, no overwrite) covers every other unit.
SYSTEM_UNITS: tuple[str, ...] = (
    "ssh.service", "ssh@*.service", "sshd.service", "sshd@*.service", "systemd-*.service", "dbus*.service",
    "getty@*.service", "serial-getty@*.service", "console-getty.service", "user@*.service",
    "user-runtime-dir@*.service", "cron.service", "crond.service", "networking.service",
    "NetworkManager*.service", "docker.service", "containerd.service", "nvidia-persistenced.service",
    "nvidia-fabricmanager.service", "polkit.service", "rsyslog.service", "emergency.service", "rescue.service",
)


def system_unit(name: str) -> str | None:
    """The SYSTEM_UNITS pattern ``name`` matches (None: not a system unit)."""
    return next((p for p in SYSTEM_UNITS if fnmatch.fnmatchcase(name, p)), None)


def service_unit(example: str) -> AfterValidator:
    """A systemd unit name ending in '.service' (one '@instance' allowed), not a unit of the system."""

    def check(value: str) -> str:
        if len(value) > 255 or not _UNIT_NAME.match(value) or value.endswith("@.service"):
            raise ValueError(
                "must be a systemd unit name ending in '.service' (letters, digits, ':', '_', '.', '-', "
                f"'\\', one '@instance'; no '/'), e.g. {example!r}"
            )
        pattern = system_unit(value)
        if pattern:
            raise ValueError(
                f"a unit of the system ({pattern!r}): the deploy would overwrite its unit file and restart it; "
                f"allowed: a unit of our own, e.g. {example!r}"
            )
        return value

    return AfterValidator(check)


def python_module(example: str) -> AfterValidator:
    """A dotted Python module name, as run with 'python -m'."""

    def check(value: str) -> str:
        if not _MODULE.match(value):
            raise ValueError(f"must be a dotted Python module name, e.g. {example!r}")
        return value

    return AfterValidator(check)


# ---------------------------------------------------------------- pinned requirements


def _requirement(spec: str) -> Requirement:
    try:
        return Requirement(spec)
    except InvalidRequirement as e:
        raise ValueError(f"not a pip requirement ({str(e).splitlines()[0]})") from None


def _pin_problem(req: Requirement, example: str) -> str | None:
    specifiers = list(req.specifier)
    pinned = bool(req.url) or (
        len(specifiers) == 1 and specifiers[0].operator in ("==", "===") and "*" not in specifiers[0].version
    )
    if pinned:
        return None
    return f"not pinned: write 'name==version' (e.g. {example!r}) so every host installs the same release"


def pinned_requirement(example: str) -> AfterValidator:
    """One pip requirement pinned to one release ('name==version' or 'name @ URL')."""

    def check(value: str) -> str:
        problem = _pin_problem(_requirement(value), example)
        if problem:
            raise ValueError(problem)
        return value

    return AfterValidator(check)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pinned_requirements(value: list[str], info: ValidationInfo) -> list[str]:
    problems: list[str] = []
    seen: dict[str, str] = {}
    for i, spec in enumerate(value):
        where = f"{info.field_name}[{i}] = {spec!r}"
        try:
            req = _requirement(spec)
        except ValueError as e:
            problems.append(f"{where}: {e}")
            continue
        problem = _pin_problem(req, "sglang==0.5.23")
        if problem:
            problems.append(f"{where}: {problem}")
        name = _canonical(req.name)
        if name in seen:
            problems.append(f"{where}: {req.name} is already listed as {seen[name]!r}")
        seen[name] = spec
    if problems:
        raise spec_lines(*problems)
    return value


# ---------------------------------------------------------------- lists and dicts


def _each(check: Callable[[str], bool], why: str) -> AfterValidator:
    """A list of strings each passing ``check``; the message lists the others, then ``why``."""

    def validate(value: list[str]) -> list[str]:
        bad = [item for item in value if not check(item)]
        if bad:
            raise ValueError(f"{', '.join(map(repr, bad))}: {why}")
        return value

    return AfterValidator(validate)


def _not_compressed_tensors(value: list[str]) -> list[str]:
    if any(_canonical(n) == "compressed-tensors" for n in value):
        raise ValueError("cannot hold compressed-tensors itself: it is the package being upgraded")
    return value


def _gpu_ids(value: list[int]) -> list[int]:
    if not value:
        raise ValueError("must list at least one GPU index, e.g. [0, 1, 2, 3]")
    dups = sorted({i for i in value if value.count(i) > 1})
    if dups:
        raise ValueError(f"GPU {', '.join(map(str, dups))} listed twice: each GPU index may appear once")
    return value


def arg_problems(args: list[str], managed: Mapping[str, str], secret: frozenset[str]) -> list[str]:
    """Reasons why a list of extra args of a command is refused (empty: fine)."""
    problems = []
    for arg in args:
        if not arg or "\n" in arg or "\x00" in arg:
            problems.append(f"{arg!r} is empty or holds a newline/NUL")
            continue
        flag = arg.split("=", 1)[0]
        if flag in secret:
            problems.append(
                f"{flag} would put a secret in argv and in the repo: set api_key_env to the NAME "
                "of a controller environment variable instead"
            )
        elif flag in managed:
            problems.append(f"{flag} is set by {managed[flag]}: use that setting, not an extra arg")
    return problems


def _extra_args(managed: Mapping[str, str], secret: frozenset[str]) -> AfterValidator:
    def check(value: list[str], info: ValidationInfo) -> list[str]:
        problems = arg_problems(value, managed, secret)
        if problems:
            raise spec_lines(*(f"{info.field_name} = {redact_args(value)!r}: {p}" for p in problems))
        return value

    return AfterValidator(check)


def _extra_env(value: Any) -> Any:
    if not isinstance(value, Mapping):
        return value  # pydantic reports the type
    problems = []
    for key, item in value.items():
        where = f"extra_env[{key!r}] = {show(item)}"
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            problems.append(f"extra_env key {key!r}: not an environment variable name (letters, digits, '_')")
        elif key in FORBIDDEN_ENV:
            shown = HIDDEN if "TOKEN" in key else show(item)
            problems.append(f"extra_env[{key!r}] = {shown}: not allowed: {FORBIDDEN_ENV[key]}")
        elif not isinstance(item, str):
            problems.append(
                f"{where}: environment values must be strings: write {str(item)!r}"
                if isinstance(item, (int, float)) and not isinstance(item, bool)
                else f"{where}: environment values must be strings"
            )
        elif "\n" in item or "\x00" in item:
            problems.append(f"{where}: must not hold a newline or NUL")
    if problems:
        raise spec_lines(*problems)
    return value


# ---------------------------------------------------------------- single values


def _attention_backend(value: str) -> str:
    if value != "auto" and value not in ATTENTION_BACKENDS:
        close = difflib.get_close_matches(value, ATTENTION_BACKENDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown backend{hint}: allowed: 'auto', {', '.join(map(repr, ATTENTION_BACKENDS))}")
    return value


def _dist_init_addr(value: str) -> str:
    m = _DIST_INIT_ADDR.match(value)
    host = m.group(1).strip("[]") if m else ""
    if not m or not is_host_address(host) or not 1 <= int(m.group(2)) <= 65535:
        raise ValueError("must be 'host:port' of rank 0 (port 1..65535), e.g. '10.0.0.1:20000'")
    return value


def _rank0_address(value: str) -> str:
    if not is_host_address(value.strip("[]")):
        raise ValueError("must be an IP address or hostname that the other ranks reach rank 0 at, e.g. '10.0.0.1'")
    return value


def _group_name(value: str) -> str:
    if not _GROUP_NAME.match(value):
        raise ValueError("must be a short label: letters, digits and '._+:@-', e.g. 'kimi-tp16'")
    return value


def _driver_version(value: str) -> str:
    if not _DRIVER_VERSION.match(value):
        raise ValueError("must be an NVIDIA driver version as nvidia-smi prints it, e.g. '570.86' or '580.95.05'")
    return value


def _repo_id(value: str) -> str:
    if not _REPO_ID.match(value) or "--" in value or ".." in value:
        raise ValueError("must be a Hugging Face repo id 'org/name' (letters, digits, '.', '_', '-')")
    return value


def _revision(value: str) -> str:
    if not _HEX40.match(value):
        raise ValueError(
            "must be a pinned commit: 40 lowercase hex characters (a branch or tag such as "
            "'main' moves, so two hosts could serve different weights)"
        )
    return value


def _speculative_algorithm(value: str) -> str:
    if value not in SPECULATIVE_ALGORITHMS:
        raise ValueError(
            f"not a speculative algorithm the deploy supports: allowed: {', '.join(map(repr, SPECULATIVE_ALGORITHMS))} "
            "(the only one for now: a draft model of the EAGLE3 kind, e.g. AQ-MedAI/Kimi-K26-eagle3)"
        )
    return value


def _served_name(value: str) -> str:
    if not _SERVED_NAME.match(value):
        raise ValueError("must be non-empty, without spaces (letters, digits, '.', '_', ':', '/', '-')")
    if any(part in ("", ".", "..") for part in value.split("/")):
        # it names the default model_dir (/srv/models/<served_model_name>): no way out of it
        raise ValueError("must not hold empty, '.' or '..' path parts: allowed: e.g. 'kimi-k2.6' or 'org/model'")
    return value


# ---------------------------------------------------------------- the field types

HostAddress = Annotated[StrictStr, AfterValidator(_host_address)]
# A directory the deploy creates and deletes content in (venv_path, model_dir, router_venv_path).
OwnDir = Annotated[StrictStr, AfterValidator(_own_dir)]
HttpUrl = Annotated[StrictStr, AfterValidator(http_url)]
BaseUrl = Annotated[StrictStr, AfterValidator(base_url)]  # a router's or worker's URL, no path
SecretEnvName = Annotated[StrictStr, AfterValidator(_secret_env_name)]
PipWheel = Annotated[StrictStr, AfterValidator(_pip_wheel_file)]
PinnedRequirements = Annotated[list[StrictStr], AfterValidator(_pinned_requirements)]
PackageNames = Annotated[
    list[StrictStr],
    _each(lambda n: bool(_PKG_NAME.match(n)), "not a package name: allowed: bare names like 'vllm', 'flashinfer-python'"),
]
HeldPackages = Annotated[PackageNames, AfterValidator(_not_compressed_tensors)]
UnitNames = Annotated[
    list[StrictStr],
    _each(
        lambda u: bool(_ANY_UNIT_NAME.match(u)),
        "not a full systemd unit name: allowed: names with their type, such as 'nvidia-persistenced.service'",
    ),
]
ProcessNames = Annotated[
    list[StrictStr],
    _each(
        lambda n: bool(n) and n == n.strip() and "\n" not in n and "/" not in n,
        "process names must be non-empty, without '/', newlines or edge spaces",
    ),
]
GpuIds = Annotated[list[GpuId], AfterValidator(_gpu_ids)]
ServerArgs = Annotated[list[StrictStr], _extra_args(MANAGED_FLAGS, SECRET_FLAGS)]
RouterArgs = Annotated[list[StrictStr], _extra_args(ROUTER_MANAGED_FLAGS, ROUTER_SECRET_FLAGS)]
ExtraEnv = Annotated[dict[StrictStr, StrictStr], BeforeValidator(_extra_env)]
AttentionBackend = Annotated[StrictStr, AfterValidator(_attention_backend)]
DistInitAddr = Annotated[StrictStr, AfterValidator(_dist_init_addr)]
Rank0Address = Annotated[StrictStr, AfterValidator(_rank0_address)]
GroupName = Annotated[StrictStr, AfterValidator(_group_name)]
DriverVersion = Annotated[StrictStr, AfterValidator(_driver_version)]
RepoId = Annotated[StrictStr, AfterValidator(_repo_id)]
Revision = Annotated[StrictStr, AfterValidator(_revision)]
ServedName = Annotated[StrictStr, AfterValidator(_served_name)]
SpeculativeAlgorithm = Annotated[StrictStr, AfterValidator(_speculative_algorithm)]
