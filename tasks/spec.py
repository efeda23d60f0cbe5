"""The typed, validated view of one host's settings.

Data flows one way::

    inventory + group_data/*.py + models/<model>.yaml
        -> host.data -> Spec (validated once, every derived value computed here)
        -> the steps read the Spec (never raw host.data) and facts

``build_spec`` turns one host's data into a frozen ``Spec`` or raises one
``SpecError`` listing every problem of that host, one line each, naming the
host, the field, the bad value and what is allowed. ``validate_inventory``
does that for every targeted host before any operation runs.

Host-dependent values (the attention backend for ``"auto"``, NCCL's P2P
environment, the SM120 DeepGEMM switch) are filled in by
``Spec.resolve(compute_cap, p2p_ok)`` once preflight has the GPU facts.

Secrets (the API key, the HF token) are read from the controller's process
environment when the spec is built, held as ``SecretStr`` and never shown in
repr/str or in error messages.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import posixpath
import re
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pyinfra.api.exceptions import PyinfraError

REPO_ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = REPO_ROOT / "models"

CONFIG_DIR = "/etc/sglang"
SYSTEMD_DIR = "/etc/systemd/system"
MODELS_ROOT = "/srv/models"
GB = 10**9  # "GB" in messages and settings is decimal, like disk sizes

# SGLang's --attention-backend choices (union over recent releases; the
# service step still checks the final command line with the installed
# SGLang's own parser). "auto" is ours: resolved per host by Spec.resolve().
ATTENTION_BACKENDS: tuple[str, ...] = (
    "triton",
    "torch_native",
    "flex_attention",
    "dsa",
    "nsa",
    "dsv4",
    "cutlass_mla",
    "fa3",
    "fa4",
    "flashinfer",
    "flashmla",
    "trtllm_mla",
    "cutedsl_mla",
    "tokenspeed_mla",
    "trtllm_mha",
    "dual_chunk_flash_attn",
    "hpc_ops",
    "aiter",
    "wave",
    "intel_amx",
    "ascend",
    "intel_xpu",
)
# Backends that only implement MLA (DeepSeek/Kimi-style latent attention)
# or only MHA: a mismatch with the model's attention type is an error.
MLA_ONLY_BACKENDS = frozenset({"cutlass_mla", "flashmla", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla"})
MHA_ONLY_BACKENDS = frozenset({"trtllm_mha"})

# "auto" resolution, by (compute capability major, attention type). Sources:
#  - SM120 (RTX PRO 6000 Blackwell): triton is SGLang's own choice for MLA
#    and works; fa3 fails; trtllm_mla prefill fails; flashinfer works for MHA.
#  - SM90 (Hopper): fa3 is SGLang's default there, for MLA and MHA.
# Anything else: triton for MLA (works everywhere), flashinfer for MHA
# (SGLang's default on non-Hopper GPUs).
AUTO_BACKEND: dict[tuple[int, str], str] = {
    (12, "mla"): "triton",
    (12, "mha"): "flashinfer",
    (9, "mla"): "fa3",
    (9, "mha"): "fa3",
}
AUTO_BACKEND_FALLBACK: dict[str, str] = {"mla": "triton", "mha": "flashinfer"}

# Explicit backends known to fail on some compute capabilities:
# backend -> (predicate on (major, minor), why).
BACKEND_SUPPORT: dict[str, tuple[Any, str]] = {
    "fa3": (
        lambda cc: (8, 0) <= cc <= (9, 0),
        "FlashAttention v3 Backend requires SM>=80 and SM<=90",
    ),
    "trtllm_mla": (
        lambda cc: cc[0] == 10,
        "TRT-LLM MLA needs Blackwell SM100; on SM120 its prefill fails",
    ),
}

# compressed-tensors CompressionFormat values (dash spelling, as in a model's
# config.json) -> first compressed-tensors release that has the member.
COMPRESSED_TENSORS_FORMATS: dict[str, str] = {
    "dense": "0.4.0",
    "int-quantized": "0.4.0",
    "pack-quantized": "0.4.0",
    "marlin-24": "0.4.0",
    "float-quantized": "0.5.0",
    "naive-quantized": "0.5.0",
    "sparse-24-bitmask": "0.9.0",
    "nvfp4-pack-quantized": "0.10.0",
    "mixed-precision": "0.11.0",
    "mxfp4-pack-quantized": "0.13.0",
    "mxfp8-quantized": "0.15.0",
}

# Server flags that the spec itself sets: in extra_server_args they would
# contradict (or duplicate) a setting, so they are refused with the key to use.
MANAGED_FLAGS: dict[str, str] = {
    "--model-path": "model_dir",
    "--model": "model_dir",
    "--served-model-name": "the model profile's served_model_name",
    "--tp-size": "tp_size",
    "--tp": "tp_size",
    "--tensor-parallel-size": "tp_size",
    "--attention-backend": "attention_backend",
    "--host": "listen_host",
    "--port": "listen_port",
    "--trust-remote-code": "the model profile's trust_remote_code",
    "--nnodes": "nnodes",
    "--node-rank": "node_rank",
    "--dist-init-addr": "dist_init_addr",
    "--config": "(the spec writes the options file itself)",
}
SECRET_FLAGS = frozenset({"--api-key", "--admin-api-key"})

# Environment variables extra_env may not set, and why.
FORBIDDEN_ENV: dict[str, str] = {
    "NCCL_SHM_DISABLE": (
        "shared memory is NCCL's fallback transport when P2P is off; disabling it "
        "too leaves only slow or hanging paths (P2P is handled by NCCL_P2P_DISABLE/"
        "NCCL_P2P_LEVEL, derived from the host's P2P topology)"
    ),
    "CUDA_VISIBLE_DEVICES": "it is derived from gpu_ids: set gpu_ids instead",
    "HF_TOKEN": "a secret never goes in the repo: set hf_token_env to the NAME of a controller environment variable",
    "HUGGING_FACE_HUB_TOKEN": "a secret never goes in the repo: set hf_token_env to the NAME of a controller environment variable",
}

# host.data keys that would hold a literal secret.
LITERAL_SECRET_KEYS: dict[str, str] = {
    "api_key": "api_key_env",
    "sglang_api_key": "api_key_env",
    "hf_token": "hf_token_env",
}

# Keys of pyinfra's own that live in host.data: connection settings and
# global operation arguments (_sudo, ...). They are not ours to validate.
IGNORED_PREFIXES = ("ssh_", "_")

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
_COMPUTE_CAP = re.compile(r"^(\d+)\.(\d+)$")


class SpecError(PyinfraError):
    """Invalid settings. ``lines`` holds one problem per line, each naming
    the host, the field, the bad value and what is allowed."""

    def __init__(self, lines: Iterable[str], header: str | None = None):
        self.lines = list(lines)
        self.header = header
        text = "\n".join(self.lines)
        super().__init__(f"{header}\n{text}" if header else text)


# ---------------------------------------------------------------- helpers


def _show(value: Any) -> str:
    """A value as it appears in messages: repr for strings, else str/repr."""
    if isinstance(value, SecretStr):
        return "<hidden>"
    return repr(value)


def _redact_args(args: Any) -> Any:
    """A copy of an argument list with the values of secret flags hidden."""
    if not isinstance(args, (list, tuple)):
        return args
    out, hide_next = [], False
    for arg in args:
        if hide_next:
            out.append("<hidden>")
            hide_next = False
            continue
        if isinstance(arg, str) and arg.split("=", 1)[0] in SECRET_FLAGS:
            if "=" in arg:
                out.append(arg.split("=", 1)[0] + "=<hidden>")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return out


def _lines(*lines: str) -> PydanticCustomError:
    """An error whose text is complete message lines (field = value: why)."""
    return PydanticCustomError("spec_lines", "{text}", {"text": "\n".join(lines)})


def _abs_path(value: str, what: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"must be an absolute path on the host (starting with '/'), {what}")
    norm = posixpath.normpath(value)
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    return norm


def _url(value: str) -> str:
    from urllib.parse import urlparse

    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError("must be an http:// or https:// URL with a host")
    return value


def _router_url(value: str) -> str:
    """An http(s) URL of a router or worker: scheme, host, optional port, no path."""
    from urllib.parse import urlparse

    _url(value)
    parsed = urlparse(value)
    try:
        parsed.port
    except ValueError:
        raise ValueError("has an invalid port: allowed: 1..65535, e.g. 'http://10.0.0.5:30000'") from None
    if parsed.path not in ("", "/") or parsed.query or parsed.fragment:
        raise ValueError("must be scheme://host[:port] without a path, e.g. 'http://10.0.0.5:30000'")
    return value.rstrip("/")


def _url_port(value: str) -> int:
    from urllib.parse import urlparse

    parsed = urlparse(value)
    return parsed.port or (443 if parsed.scheme == "https" else 80)


_DRIVER_VERSION = re.compile(r"^\d+(\.\d+){1,2}$")


def _check_host(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        return bool(_HOSTNAME.match(value))


def _check_server_args(args: list[str]) -> list[str]:
    """Reasons why a list of extra server args is refused (empty: fine)."""
    problems = []
    for arg in args:
        if not arg or "\n" in arg or "\x00" in arg:
            problems.append(f"{arg!r} is empty or holds a newline/NUL")
            continue
        flag = arg.split("=", 1)[0]
        if flag in SECRET_FLAGS:
            problems.append(
                f"{flag} would put a secret in argv and in the repo: set api_key_env to the NAME "
                "of a controller environment variable instead"
            )
        elif flag in MANAGED_FLAGS:
            problems.append(f"{flag} is set by {MANAGED_FLAGS[flag]}: use that setting, not an extra arg")
    return problems


def _connector_data_keys() -> frozenset[str]:
    """host.data keys declared by the installed pyinfra connectors (@fake's
    fake_responses, @docker's docker_*, ...): pyinfra's, not ours."""
    keys: set[str] = set()
    try:
        from pyinfra.api.connectors import get_all_connectors

        for connector in get_all_connectors().values():
            keys.update(getattr(connector, "data_meta", {}) or {})
    except Exception:  # a broken third-party connector must not hide our errors
        pass
    return frozenset(keys)


_CONNECTOR_KEYS: frozenset[str] | None = None


def _is_pyinfra_key(key: str) -> bool:
    global _CONNECTOR_KEYS
    if key.startswith(IGNORED_PREFIXES):
        return True
    if _CONNECTOR_KEYS is None:
        _CONNECTOR_KEYS = _connector_data_keys()
    return key in _CONNECTOR_KEYS


# ---------------------------------------------------------------- model profile

_Frozen = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())


class Quantization(BaseModel):
    """A model's quantization, as its config.json quantization_config says."""

    model_config = _Frozen

    quant_method: StrictStr = Field(description="e.g. 'compressed-tensors', 'fp8', 'awq'")
    format: StrictStr | None = Field(
        None,
        description="compressed-tensors CompressionFormat value (dashes), e.g. 'pack-quantized'",
    )

    @model_validator(mode="after")
    def _format_known(self) -> Quantization:
        if self.quant_method == "compressed-tensors":
            if self.format not in COMPRESSED_TENSORS_FORMATS:
                raise _lines(
                    f"quantization.format = {self.format!r} is not a compressed-tensors "
                    f"CompressionFormat value: allowed: {', '.join(COMPRESSED_TENSORS_FORMATS)}"
                )
        return self

    @property
    def compressed_tensors_member(self) -> str | None:
        """CompressionFormat member name (underscores), e.g. 'nvfp4_pack_quantized'."""
        if self.quant_method != "compressed-tensors" or self.format is None:
            return None
        return self.format.replace("-", "_")

    @property
    def compressed_tensors_min_version(self) -> str | None:
        """First compressed-tensors release that has the needed format."""
        if self.quant_method != "compressed-tensors" or self.format is None:
            return None
        return COMPRESSED_TENSORS_FORMATS[self.format]


class ModelProfile(BaseModel):
    """models/<name>.yaml: what to serve, pinned."""

    model_config = _Frozen

    name: StrictStr = Field(description="the profile's file stem (filled in by the loader)")
    description: StrictStr | None = Field(None, description="free text")
    repo: StrictStr = Field(description="Hugging Face repo id 'org/name'")
    revision: StrictStr = Field(description="the commit: 40 lowercase hex characters")
    served_model_name: StrictStr = Field(description="the name clients ask for in /v1/models")
    quantization: Quantization | None = Field(None, description="{quant_method, format} or absent")
    attention: Literal["mla", "mha"] = Field(description="'mla' or 'mha'")
    size_bytes: StrictInt = Field(gt=0, description="approximate total bytes of the weights (> 0)")
    extra_server_args: list[StrictStr] = Field(
        default_factory=list, description="extra SGLang flags, a list of strings"
    )
    trust_remote_code: StrictBool = Field(False, description="true or false")

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str) -> str:
        if not _REPO_ID.match(v) or "--" in v or ".." in v:
            raise ValueError("must be a Hugging Face repo id 'org/name' (letters, digits, '.', '_', '-')")
        return v

    @field_validator("revision")
    @classmethod
    def _revision(cls, v: str) -> str:
        if not _HEX40.match(v):
            raise ValueError(
                "must be a pinned commit: 40 lowercase hex characters (a branch or tag such as "
                "'main' moves, so two hosts could serve different weights)"
            )
        return v

    @field_validator("served_model_name")
    @classmethod
    def _served(cls, v: str) -> str:
        if not _SERVED_NAME.match(v):
            raise ValueError("must be non-empty, without spaces (letters, digits, '.', '_', ':', '/', '-')")
        return v

    @field_validator("extra_server_args")
    @classmethod
    def _args(cls, v: list[str]) -> list[str]:
        problems = _check_server_args(v)
        if problems:
            raise _lines(
                *(f"extra_server_args = {_redact_args(v)!r}: {p}" for p in problems)
            )
        return v


def available_profiles(models_dir: Path = MODELS_DIR) -> list[str]:
    return sorted(p.stem for p in Path(models_dir).glob("*.yaml"))


def load_profile(name: str, models_dir: Path = MODELS_DIR) -> ModelProfile:
    """Read and validate models/<name>.yaml; SpecError lines (without host)."""
    models_dir = Path(models_dir)
    available = available_profiles(models_dir)
    if not isinstance(name, str) or not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", name) or name not in available:
        raise SpecError(
            [
                f"model = {_show(name)} is not a model profile in {models_dir}: "
                f"allowed: {', '.join(available) or '(none found)'}"
            ]
        )
    path = models_dir / f"{name}.yaml"
    where = f"model {name!r} ({path.name})"
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SpecError([f"{where}: not valid YAML: {e}"]) from None
    if not isinstance(raw, dict):
        raise SpecError([f"{where}: must be a YAML mapping of profile keys, got {type(raw).__name__}"])
    if "name" in raw and raw["name"] != name:
        raise SpecError([f"{where}: name = {raw['name']!r} must match the file name {name!r} or be left out"])
    try:
        return ModelProfile.model_validate({**raw, "name": name})
    except ValidationError as e:
        raise SpecError([f"{where}: {line}" for line in _format_errors(e, ModelProfile)]) from None


# ---------------------------------------------------------------- host settings

GpuId = Annotated[StrictInt, Field(ge=0)]
Number = Annotated[float, Field(strict=True)]

_GROUP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+:@-]{0,127}$")


class NodeGroup(BaseModel):
    """A multi-node TP group, described once (group data shared by its hosts).

    Each host's --nnodes, --node-rank and --dist-init-addr are derived from it:
    nnodes = len(hosts), node_rank = this host's position in hosts, and
    dist_init_addr = dist_init_host (default: rank 0's ssh_hostname) : dist_init_port.

    .. code:: python

        kimi_tp16 = (["gpu-a", "gpu-b"], {"node_group": {"hosts": ["gpu-a", "gpu-b"], "dist_init_port": 20000}})
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    hosts: list[StrictStr] = Field(
        description="the inventory names of the group's hosts in rank order (rank 0 first), at least 2, each once"
    )
    dist_init_port: Annotated[StrictInt, Field(ge=1, le=65535)] = Field(
        description="the TCP port rank 0 listens on for the rendezvous, an integer 1..65535"
    )
    dist_init_host: StrictStr | None = Field(
        None,
        description="rank 0's address as the other ranks reach it, an IP address or hostname; "
        "unset: rank 0's ssh_hostname (or its inventory name)",
    )
    name: StrictStr | None = Field(
        None, description="a label for the group in messages; unset: the hosts joined with '+'"
    )

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, v: list[str]) -> list[str]:
        if len(v) < 2:
            raise ValueError(
                f"a node group needs at least 2 hosts (got {len(v)}): allowed: a list of the group's "
                "inventory host names in rank order, e.g. ['gpu-a', 'gpu-b']; a single host needs no node_group"
            )
        problems = []
        for name in dict.fromkeys(v):
            ranks = [i for i, other in enumerate(v) if other == name]
            if len(ranks) > 1:
                problems.append(
                    f"{name!r} is listed {len(ranks)} times (ranks {', '.join(map(str, ranks))}): "
                    f"each rank 0..{len(v) - 1} needs exactly one host and each host has exactly one rank"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return v

    @field_validator("dist_init_host")
    @classmethod
    def _dist_host(cls, v: str | None) -> str | None:
        if v is not None and not _check_host(v.strip("[]")):
            raise ValueError("must be an IP address or hostname that the other ranks reach rank 0 at, e.g. '10.0.0.1'")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not _GROUP_NAME.match(v):
            raise ValueError("must be a short label: letters, digits and '._+:@-', e.g. 'kimi-tp16'")
        return v

    @property
    def label(self) -> str:
        return self.name or "+".join(self.hosts)

    def address(self, addresses: Mapping[str, str] | None = None) -> str:
        """dist_init_addr: rank 0's address (bracketed when IPv6) and the port."""
        host = self.dist_init_host or (addresses or {}).get(self.hosts[0]) or self.hosts[0]
        host = host.strip("[]")
        if ":" in host:
            host = f"[{host}]"
        return f"{host}:{self.dist_init_port}"


class HostSettings(BaseModel):
    """One field per host.data key of ours (defaults match group_data/all.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    model: StrictStr = Field(description="the name of a profile in models/ (models/<model>.yaml)")
    model_dir: StrictStr | None = Field(
        None, description=f"absolute path on the host; unset: {MODELS_ROOT}/<served_model_name>"
    )
    size_margin_gb: Number = Field(50.0, ge=0, description="GB kept free on the model's disk, a number >= 0")
    venv_path: StrictStr = Field("/opt/sglang/venv", description="absolute path of the server's venv on the host")
    venv_python: StrictStr = Field(
        "/usr/bin/python3", description="absolute path of the interpreter that creates the venv"
    )
    packages: list[StrictStr] = Field(
        default_factory=lambda: ["sglang==0.5.23"],
        description="pinned pip requirements: 'name==version' (or 'name @ URL')",
    )
    packages_no_deps: list[StrictStr] = Field(
        default_factory=list,
        description="pinned pip requirements installed with --no-deps (e.g. sglang beside a CPU-only torch)",
    )
    get_pip_url: StrictStr = Field(
        "https://bootstrap.pypa.io/get-pip.py", description="http(s) URL of get-pip.py"
    )
    pip_wheel: StrictStr | None = Field(
        None, description="path on the controller of a pip *.whl uploaded to offline hosts, or None"
    )
    compressed_tensors_allow_conflicts: list[StrictStr] = Field(
        default_factory=list, description="package names whose pip-check conflict is tolerated"
    )
    compressed_tensors_hold: list[StrictStr] = Field(
        default_factory=lambda: ["torch", "sglang", "flashinfer-python"],
        description="package names held at their installed versions during the upgrade",
    )
    gpu_ids: list[GpuId] = Field(description="a non-empty list of distinct GPU indexes >= 0 (nvidia-smi order)")
    tp_size: Annotated[StrictInt, Field(ge=1)] | None = Field(
        None, description="an integer >= 1 equal to len(gpu_ids) x nnodes; unset: derived"
    )
    attention_backend: StrictStr = Field("auto", description="'auto' or one of SGLang's backends")
    listen_host: StrictStr = Field("0.0.0.0", description="an IP address or hostname to listen on")
    listen_port: Annotated[StrictInt, Field(ge=1, le=65535)] = Field(
        30000, description="an integer 1..65535"
    )
    api_key_env: StrictStr | None = Field(
        None, description="NAME of a controller environment variable holding the API key, or None"
    )
    api_key_required: StrictBool = Field(
        True, description="true: a missing api_key_env variable is an error; false: serve without a key"
    )
    hf_token_env: StrictStr | None = Field(
        "HF_TOKEN", description="NAME of a controller environment variable holding the HF token, or None"
    )
    hf_endpoint: StrictStr | None = Field(None, description="http(s) URL of a Hub mirror, or None")
    extra_env: dict[StrictStr, StrictStr] = Field(
        default_factory=dict, description="environment of the server: a dict of string -> string"
    )
    extra_server_args: list[StrictStr] = Field(
        default_factory=list, description="extra SGLang flags, a list of strings"
    )
    unit_name: StrictStr = Field("sglang.service", description="a systemd unit name ending in .service")
    server_module: StrictStr = Field(
        "sglang.launch_server", description="dotted Python module run with 'python -m'"
    )
    readiness_timeout_s: Number = Field(3600.0, gt=0, description="seconds, a number > 0")
    stale_policy: Literal["stop", "fail", "ignore"] = Field("stop", description="'stop', 'fail' or 'ignore'")
    stale_grace_s: Number = Field(30.0, ge=0, description="seconds between SIGTERM and SIGKILL, >= 0")
    protect_units: list[StrictStr] = Field(default_factory=list, description="systemd unit names never touched")
    protect_process_names: list[StrictStr] = Field(
        default_factory=list, description="process names never touched"
    )
    nnodes: Annotated[StrictInt, Field(ge=1)] = Field(1, description="an integer >= 1")
    node_rank: Annotated[StrictInt, Field(ge=0)] = Field(0, description="an integer 0..nnodes-1")
    dist_init_addr: StrictStr | None = Field(
        None, description="'host:port' of rank 0, required when nnodes > 1"
    )
    node_group: NodeGroup | None = Field(
        None,
        description="None, or a dict {hosts: [rank 0, rank 1, ...], dist_init_port: PORT, dist_init_host?: ADDR, "
        "name?: LABEL} that derives nnodes, node_rank and dist_init_addr",
    )
    # -- fleets: the role of the host, and the router a server registers with (tasks/router.py)
    role: Literal["server", "router"] = Field(
        "server",
        description="'server' (an SGLang server: the whole pipeline) or 'router' (SGLang's router: "
        "group_data/routers.py)",
    )
    router_url: StrictStr | None = Field(
        None, description="http(s) URL of the SGLang router this server registers with, or None"
    )
    worker_url: StrictStr | None = Field(
        None, description="http(s) URL at which the router reaches this server (required with router_url), or None"
    )
    drain_timeout_s: Number = Field(
        600.0, gt=0, description="seconds a server taken out of its router may take to finish its requests, > 0"
    )
    min_driver_version: StrictStr | None = Field(
        None, description="lowest NVIDIA driver version the fleet preflight accepts, e.g. '570.86', or None"
    )

    # -- single fields

    @field_validator("model_dir")
    @classmethod
    def _model_dir(cls, v: str | None) -> str | None:
        return None if v is None else _abs_path(v, f"or None for {MODELS_ROOT}/<served_model_name>")

    @field_validator("venv_path")
    @classmethod
    def _venv_path(cls, v: str) -> str:
        return _abs_path(v, "e.g. '/opt/sglang/venv'")

    @field_validator("venv_python")
    @classmethod
    def _venv_python(cls, v: str) -> str:
        return _abs_path(v, "e.g. '/usr/bin/python3'")

    @field_validator("packages", "packages_no_deps")
    @classmethod
    def _packages(cls, v: list[str], info) -> list[str]:
        problems, seen = [], {}
        for i, spec in enumerate(v):
            try:
                req = Requirement(spec)
            except InvalidRequirement as e:
                problems.append(f"{info.field_name}[{i}] = {spec!r}: not a pip requirement ({str(e).splitlines()[0]})")
                continue
            pinned = bool(req.url) or (
                len(req.specifier) == 1
                and next(iter(req.specifier)).operator in ("==", "===")
                and "*" not in next(iter(req.specifier)).version
            )
            if not pinned:
                problems.append(
                    f"{info.field_name}[{i}] = {spec!r}: not pinned: write 'name==version' "
                    "(e.g. 'sglang==0.5.23') so every host installs the same release"
                )
            name = re.sub(r"[-_.]+", "-", req.name).lower()
            if name in seen:
                problems.append(f"{info.field_name}[{i}] = {spec!r}: {req.name} is already listed as {seen[name]!r}")
            seen[name] = spec
        if problems:
            raise _lines(*problems)
        return v

    @field_validator("get_pip_url", "hf_endpoint")
    @classmethod
    def _urls(cls, v: str | None) -> str | None:
        return None if v is None else _url(v)

    @field_validator("pip_wheel")
    @classmethod
    def _pip_wheel(cls, v: str | None) -> str | None:
        return _pip_wheel_file(v)

    @field_validator("compressed_tensors_allow_conflicts", "compressed_tensors_hold", mode="after")
    @classmethod
    def _package_names(cls, v: list[str]) -> list[str]:
        bad = [n for n in v if not _PKG_NAME.match(n)]
        if bad:
            raise ValueError(
                f"{', '.join(map(repr, bad))}: not a package name: allowed: bare names like 'vllm', 'flashinfer-python'"
            )
        return v

    @field_validator("compressed_tensors_hold")
    @classmethod
    def _hold(cls, v: list[str]) -> list[str]:
        if any(re.sub(r"[-_.]+", "-", n).lower() == "compressed-tensors" for n in v):
            raise ValueError("cannot hold compressed-tensors itself: it is the package being upgraded")
        return v

    @field_validator("gpu_ids")
    @classmethod
    def _gpu_ids(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("must list at least one GPU index, e.g. [0, 1, 2, 3]")
        dups = sorted({i for i in v if v.count(i) > 1})
        if dups:
            raise ValueError(f"GPU {', '.join(map(str, dups))} listed twice: each GPU index may appear once")
        return v

    @field_validator("attention_backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        if v != "auto" and v not in ATTENTION_BACKENDS:
            close = difflib.get_close_matches(v, ATTENTION_BACKENDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown backend{hint}: allowed: 'auto', {', '.join(map(repr, ATTENTION_BACKENDS))}")
        return v

    @field_validator("listen_host")
    @classmethod
    def _listen_host(cls, v: str) -> str:
        if not _check_host(v):
            raise ValueError("must be an IP address or hostname, e.g. '0.0.0.0' or '127.0.0.1'")
        return v

    @field_validator("api_key_env", "hf_token_env")
    @classmethod
    def _secret_env(cls, v: str | None) -> str | None:
        if v is not None and not _SECRET_ENV_NAME.match(v):
            raise ValueError(
                "must be the NAME of an environment variable on the controller (upper-case letters, "
                "digits, '_', e.g. 'SGLANG_API_KEY'), never the secret itself"
            )
        return v

    @field_validator("extra_env", mode="before")
    @classmethod
    def _extra_env(cls, v: Any) -> Any:
        if not isinstance(v, Mapping):
            return v  # pydantic reports the type
        problems = []
        for key, value in v.items():
            where = f"extra_env[{key!r}] = {_show(value)}"
            if not isinstance(key, str) or not _ENV_NAME.match(key):
                problems.append(f"extra_env key {key!r}: not an environment variable name (letters, digits, '_')")
            elif key in FORBIDDEN_ENV:
                shown = "<hidden>" if "TOKEN" in key else _show(value)
                problems.append(f"extra_env[{key!r}] = {shown}: not allowed: {FORBIDDEN_ENV[key]}")
            elif not isinstance(value, str):
                problems.append(
                    f"{where}: environment values must be strings: write {str(value)!r}"
                    if isinstance(value, (int, float)) and not isinstance(value, bool)
                    else f"{where}: environment values must be strings"
                )
            elif "\n" in value or "\x00" in value:
                problems.append(f"{where}: must not hold a newline or NUL")
        if problems:
            raise _lines(*problems)
        return v

    @field_validator("extra_server_args")
    @classmethod
    def _extra_args(cls, v: list[str]) -> list[str]:
        problems = _check_server_args(v)
        if problems:
            raise _lines(*(f"extra_server_args = {_redact_args(v)!r}: {p}" for p in problems))
        return v

    @field_validator("unit_name")
    @classmethod
    def _unit_name(cls, v: str) -> str:
        if len(v) > 255 or not _UNIT_NAME.match(v) or v.endswith("@.service"):
            raise ValueError(
                "must be a systemd unit name ending in '.service' (letters, digits, ':', '_', '.', '-', "
                "'\\', one '@instance'; no '/'), e.g. 'sglang.service'"
            )
        return v

    @field_validator("server_module")
    @classmethod
    def _server_module(cls, v: str) -> str:
        if not _MODULE.match(v):
            raise ValueError("must be a dotted Python module name, e.g. 'sglang.launch_server'")
        return v

    @field_validator("protect_units")
    @classmethod
    def _protect_units(cls, v: list[str]) -> list[str]:
        bad = [u for u in v if not _ANY_UNIT_NAME.match(u)]
        if bad:
            raise ValueError(
                f"{', '.join(map(repr, bad))}: not a full systemd unit name: allowed: names with their type, "
                "such as 'nvidia-persistenced.service'"
            )
        return v

    @field_validator("protect_process_names")
    @classmethod
    def _protect_names(cls, v: list[str]) -> list[str]:
        bad = [n for n in v if not n or n != n.strip() or "\n" in n or "/" in n]
        if bad:
            raise ValueError(
                f"{', '.join(map(repr, bad))}: process names must be non-empty, without '/', newlines or edge spaces"
            )
        return v

    @field_validator("dist_init_addr")
    @classmethod
    def _dist_init_addr(cls, v: str | None) -> str | None:
        if v is None:
            return None
        m = re.match(r"^(\[[0-9A-Fa-f:.]+\]|[^:\[\]]+):(\d{1,5})$", v)
        host = m.group(1).strip("[]") if m else ""
        if not m or not _check_host(host) or not 1 <= int(m.group(2)) <= 65535:
            raise ValueError("must be 'host:port' of rank 0 (port 1..65535), e.g. '10.0.0.1:20000'")
        return v

    @field_validator("router_url", "worker_url")
    @classmethod
    def _fleet_urls(cls, v: str | None) -> str | None:
        return None if v is None else _router_url(v)

    @field_validator("min_driver_version")
    @classmethod
    def _min_driver(cls, v: str | None) -> str | None:
        if v is not None and not _DRIVER_VERSION.match(v):
            raise ValueError("must be an NVIDIA driver version as nvidia-smi prints it, e.g. '570.86' or '580.95.05'")
        return v

    @model_validator(mode="after")
    def _fleet(self) -> HostSettings:
        lines = []
        if self.router_url is not None and self.worker_url is None:
            lines.append(
                f"worker_url = None: required when router_url = {self.router_url!r}: the URL at which the "
                f"router reaches this server, e.g. 'http://10.0.0.5:{self.listen_port}'"
            )
        if self.worker_url is not None:
            port = _url_port(self.worker_url)
            if port != self.listen_port:
                lines.append(
                    f"worker_url = {self.worker_url!r}: its port {port} is not listen_port {self.listen_port}: "
                    f"allowed: a URL of this server's port, e.g. 'http://HOST:{self.listen_port}'"
                )
        if lines:
            raise _lines(*lines)
        return self

    # -- fields together (no model profile needed)

    @model_validator(mode="after")
    def _together(self) -> HostSettings:
        lines = []
        n = len(self.gpu_ids)
        if self.tp_size is not None:
            if self.nnodes == 1 and self.tp_size != n:
                lines.append(
                    f"tp_size = {self.tp_size} does not match gpu_ids {self.gpu_ids} ({n} GPUs): "
                    "tp_size must equal the number of GPUs"
                )
            elif self.nnodes > 1 and self.tp_size != n * self.nnodes:
                lines.append(
                    f"tp_size = {self.tp_size} does not match gpu_ids {self.gpu_ids} ({n} GPUs) x "
                    f"nnodes {self.nnodes}: tp_size must equal GPUs per node x nnodes = {n * self.nnodes}"
                )
        if self.node_rank >= self.nnodes:
            lines.append(
                f"node_rank = {self.node_rank} is out of range for nnodes = {self.nnodes}: "
                f"allowed: 0..{self.nnodes - 1}"
            )
        if self.nnodes > 1 and self.node_rank > 0 and (self.router_url or self.worker_url):
            # Only rank 0 of a multi-node group serves HTTP; the group is one router worker.
            field = "router_url" if self.router_url else "worker_url"
            lines.append(
                f"{field} = {getattr(self, field)!r}: node_rank {self.node_rank} of a {self.nnodes}-node group "
                "serves no HTTP: allowed: None here; set router_url and worker_url on rank 0 only, which "
                "registers the whole group as one worker"
            )
        if self.nnodes > 1 and self.dist_init_addr is None:
            lines.append(
                f"dist_init_addr = None: required when nnodes = {self.nnodes}: "
                "'host:port' of rank 0, e.g. '10.0.0.1:20000'"
            )
        if self.unit_name in self.protect_units:
            lines.append(
                f"protect_units = {self.protect_units!r}: contains our own unit_name {self.unit_name!r}: "
                "a protected unit is never touched, so the deploy could not manage it"
            )
        if lines:
            raise _lines(*lines)
        return self


# Our host.data keys, all documented in group_data/all.py.
DATA_KEYS: frozenset[str] = frozenset(HostSettings.model_fields)


# ---------------------------------------------------------------- router hosts (role = "router")

# The router module whose Python API our launcher (remote/router_launch.py) drives to give it the API key.
ROUTER_KEY_MODULE = "sglang_router.launch_router"
# Where the launcher is installed on a router host.
ROUTER_LAUNCHER = "/usr/local/lib/sglang-converge/router_launch.py"

# SGLang router (sglang-router / smg) policies.
ROUTER_POLICIES = ("round_robin", "cache_aware", "random", "power_of_two")
# Router flags the router settings set: in router_extra_args they are refused.
ROUTER_MANAGED_FLAGS: dict[str, str] = {
    "--host": "router_listen_host",
    "--port": "router_listen_port",
    "--policy": "router_policy",
    "--prometheus-host": "router_prometheus_host",
    "--prometheus-port": "router_prometheus_port",
    "--worker-urls": "the servers' router_url/worker_url (they register through the router's /workers API)",
}


def _pip_wheel_file(v: str | None) -> str | None:
    if v is None:
        return None
    path = Path(v).expanduser()
    if not path.is_absolute():
        path = REPO_ROOT / path
    if not path.name.endswith(".whl") or not path.name.startswith("pip-"):
        raise ValueError("must be the path of a pip wheel (pip-<version>-py3-none-any.whl) on the controller")
    if not path.is_file():
        raise ValueError(f"no such file on the controller ({path}): give an existing pip-*.whl, or None")
    return str(path)


class RouterSettings(BaseModel):
    """A router host's settings (group_data/routers.py): SGLang's router from
    PyPI in its own venv, run by a systemd unit. The servers' keys of
    group_data/all.py (model, gpu_ids, ...) do not apply to a router host."""

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    role: Literal["router"] = Field(description="'router'")
    router_url: StrictStr | None = Field(
        None,
        description="http(s) URL clients and servers reach this router at; the servers with the same "
        "router_url are registered by the router's deploy (None: none)",
    )
    router_package: StrictStr = Field(
        "sglang-router==0.3.2", description="the router's pinned pip requirement, e.g. 'sglang-router==0.3.2'"
    )
    router_module: StrictStr = Field(
        "sglang_router.launch_router", description="dotted Python module run with 'python -m'"
    )
    router_venv_path: StrictStr = Field(
        "/opt/sglang-router/venv", description="absolute path of the router's venv on the host"
    )
    router_listen_host: StrictStr = Field("0.0.0.0", description="an IP address or hostname to listen on")
    router_listen_port: Annotated[StrictInt, Field(ge=1, le=65535)] = Field(30000, description="an integer 1..65535")
    router_prometheus_host: StrictStr = Field("127.0.0.1", description="an IP address or hostname for /metrics")
    router_prometheus_port: Annotated[StrictInt, Field(ge=1, le=65535)] = Field(
        29000, description="an integer 1..65535, not router_listen_port"
    )
    router_policy: Literal[ROUTER_POLICIES] = Field(  # type: ignore[valid-type]
        "round_robin", description="one of " + ", ".join(map(repr, ROUTER_POLICIES))
    )
    router_extra_args: list[StrictStr] = Field(default_factory=list, description="extra router flags, a list of strings")
    router_unit_name: StrictStr = Field(
        "sglang-router.service", description="a systemd unit name ending in .service"
    )
    router_readiness_timeout_s: Number = Field(120.0, gt=0, description="seconds, a number > 0")
    venv_python: StrictStr = Field(
        "/usr/bin/python3", description="absolute path of the interpreter that creates the venv"
    )
    get_pip_url: StrictStr = Field(
        "https://bootstrap.pypa.io/get-pip.py", description="http(s) URL of get-pip.py"
    )
    pip_wheel: StrictStr | None = Field(
        None, description="path on the controller of a pip *.whl uploaded to offline hosts, or None"
    )
    api_key_env: StrictStr | None = Field(
        "SGLANG_API_KEY",
        description="NAME of a controller environment variable holding the API key the router demands from "
        "clients and gives its workers (its servers' key), or None",
    )
    api_key_required: StrictBool = Field(
        True, description="true: a missing api_key_env variable is an error; false: run the router without a key"
    )

    @field_validator("router_url")
    @classmethod
    def _router_url(cls, v: str | None) -> str | None:
        return None if v is None else _router_url(v)

    @field_validator("api_key_env")
    @classmethod
    def _router_key_env(cls, v: str | None) -> str | None:
        return HostSettings._secret_env(v)

    @field_validator("router_package")
    @classmethod
    def _router_package(cls, v: str) -> str:
        try:
            req = Requirement(v)
        except InvalidRequirement as e:
            raise ValueError(f"not a pip requirement ({str(e).splitlines()[0]})") from None
        pinned = bool(req.url) or (
            len(req.specifier) == 1
            and next(iter(req.specifier)).operator in ("==", "===")
            and "*" not in next(iter(req.specifier)).version
        )
        if not pinned:
            raise ValueError("not pinned: write 'name==version' (e.g. 'sglang-router==0.3.2')")
        return v

    @field_validator("router_module")
    @classmethod
    def _router_module(cls, v: str) -> str:
        if not _MODULE.match(v):
            raise ValueError("must be a dotted Python module name, e.g. 'sglang_router.launch_router'")
        return v

    @field_validator("router_venv_path", "venv_python")
    @classmethod
    def _paths(cls, v: str) -> str:
        return _abs_path(v, "e.g. '/opt/sglang-router/venv'")

    @field_validator("router_listen_host", "router_prometheus_host")
    @classmethod
    def _hosts(cls, v: str) -> str:
        if not _check_host(v):
            raise ValueError("must be an IP address or hostname, e.g. '0.0.0.0' or '127.0.0.1'")
        return v

    @field_validator("router_extra_args")
    @classmethod
    def _router_args(cls, v: list[str]) -> list[str]:
        problems = []
        for arg in v:
            flag = arg.split("=", 1)[0]
            if not arg or "\n" in arg or "\x00" in arg:
                problems.append(f"{arg!r} is empty or holds a newline/NUL")
            elif flag in ROUTER_MANAGED_FLAGS:
                problems.append(f"{flag} is set by {ROUTER_MANAGED_FLAGS[flag]}: use that setting, not an extra arg")
            elif flag in ("--api-key",):
                problems.append(f"{flag} would put a secret in argv and in the repo")
        if problems:
            raise _lines(*(f"router_extra_args = {_redact_args(v)!r}: {p}" for p in problems))
        return v

    @field_validator("router_unit_name")
    @classmethod
    def _router_unit(cls, v: str) -> str:
        if len(v) > 255 or not _UNIT_NAME.match(v) or v.endswith("@.service"):
            raise ValueError("must be a systemd unit name ending in '.service', e.g. 'sglang-router.service'")
        return v

    @field_validator("get_pip_url")
    @classmethod
    def _get_pip(cls, v: str) -> str:
        return _url(v)

    @field_validator("pip_wheel")
    @classmethod
    def _wheel(cls, v: str | None) -> str | None:
        return _pip_wheel_file(v)

    @model_validator(mode="after")
    def _ports(self) -> RouterSettings:
        if self.router_prometheus_port == self.router_listen_port:
            raise _lines(
                f"router_prometheus_port = {self.router_prometheus_port}: the same port as router_listen_port: "
                "allowed: another free port, e.g. 29000"
            )
        return self

    @model_validator(mode="after")
    def _key_launcher(self) -> RouterSettings:
        if self.api_key_env is not None and self.router_module != ROUTER_KEY_MODULE:
            raise _lines(
                f"router_module = {self.router_module!r}: with api_key_env = {self.api_key_env!r} the key reaches "
                f"the router through our launcher for {ROUTER_KEY_MODULE!r} (never argv): allowed: "
                f"{ROUTER_KEY_MODULE!r}, or api_key_env = None"
            )
        return self


# Keys only a router host has (documented in group_data/routers.py).
ROUTER_KEYS: frozenset[str] = frozenset(RouterSettings.model_fields) - DATA_KEYS


def local_http_url(listen_host: str, port: int) -> str:
    """The URL of a server listening on listen_host:port, as its own host reaches it."""
    address = "127.0.0.1" if listen_host in ("0.0.0.0", "::", "") else listen_host
    if ":" in address:
        address = f"[{address}]"
    return f"http://{address}:{port}"


class _UnitFiles:
    """Paths derived from a spec's ``unit_name`` (servers and routers alike), and
    its API key as the header line of the root-only auth file. Needs
    ``unit_name`` and ``api_key`` (not annotated here: pydantic would take
    them for fields)."""

    @property
    def unit_stem(self) -> str:
        return self.unit_name[: -len(".service")]

    @property
    def unit_path(self) -> str:
        return f"{SYSTEMD_DIR}/{self.unit_name}"

    @property
    def auth_path(self) -> str:
        """Root-only (0600) file with the API key as an HTTP header line, read by
        curl -H @FILE, remote/router_client.py and (routers) remote/router_launch.py."""
        return f"{CONFIG_DIR}/{self.unit_stem}.auth"

    @property
    def auth_file(self) -> str | None:
        """auth_path when there is a key, else None."""
        return self.auth_path if self.api_key is not None else None

    def auth_header(self) -> str:
        """The API key as an HTTP header line ('' without a key)."""
        return "" if self.api_key is None else f"Authorization: Bearer {self.api_key.get_secret_value()}\n"


class RouterSpec(_UnitFiles, RouterSettings):
    """One router host's settings, validated, with the derived values.

    .. code:: python

        spec = build_spec("sgc10", {"role": "router", "router_url": "http://10.77.10.2:30000"})
        spec.router_argv  # [venv python, -m, sglang_router.launch_router, --host, ...]
    """

    host_name: StrictStr
    api_key: SecretStr | None = None

    # a router host is never part of a multi-node TP group
    is_multinode: typing.ClassVar[bool] = False
    group_key: typing.ClassVar[None] = None
    group_label: typing.ClassVar[None] = None

    @property
    def python_bin(self) -> str:
        return f"{self.router_venv_path}/bin/python"

    @property
    def unit_name(self) -> str:
        return self.router_unit_name

    @property
    def local_url(self) -> str:
        """The router as seen from its own host."""
        return local_http_url(self.router_listen_host, self.router_listen_port)

    @property
    def router_argv(self) -> list[str]:
        """The router's command line (workers are added at run time through POST /workers).
        With an API key: our launcher, which reads the key from the root-only
        key file and hands it to the router's Python API, never to argv."""
        start = [self.python_bin, "-m", self.router_module]
        if self.api_key is not None:
            start = [self.python_bin, ROUTER_LAUNCHER, "--auth-file", self.auth_path, "--"]
        return [
            *start,
            "--host", self.router_listen_host,
            "--port", str(self.router_listen_port),
            "--policy", self.router_policy,
            "--prometheus-host", self.router_prometheus_host,
            "--prometheus-port", str(self.router_prometheus_port),
            *self.router_extra_args,
        ]  # fmt: skip


def build_router_spec(host_name: str, data: Mapping[str, Any],
                      environ: Mapping[str, str] = os.environ) -> RouterSpec:
    """Validate a router host's data (role = 'router') into a RouterSpec, or
    raise SpecError listing every problem, one line each, prefixed with the host.
    The servers' keys (group_data/all.py defaults) are not used and not checked."""
    problems: list[str] = []
    ours: dict[str, Any] = {}
    fields = RouterSettings.model_fields
    for key, value in data.items():
        if not isinstance(key, str):
            problems.append(f"{key!r} is not a valid data key")
        elif key in LITERAL_SECRET_KEYS:
            problems.append(
                f"{key} = <hidden>: a literal secret is not allowed in the inventory or group data: "
                f"set {LITERAL_SECRET_KEYS[key]} to the NAME of an environment variable on the controller that holds it"
            )
        elif key in fields:
            ours[key] = value
        elif key in DATA_KEYS or _is_pyinfra_key(key):
            continue  # a server's setting (group_data/all.py): not used by a router
        else:
            close = difflib.get_close_matches(key, sorted(fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(
                f"{key} = {_show(value)}: unknown data key{hint}: allowed for a router host: "
                f"{', '.join(sorted(fields))} (and pyinfra's own ssh_*/_* keys)"
            )
    if not problems:
        try:
            settings = RouterSettings.model_validate(ours)
        except ValidationError as e:
            problems.extend(_format_errors(e, RouterSettings))
        else:
            key, problem = _secret_from_env(settings.api_key_env, settings.api_key_required, environ,
                                            "run the router")
            if problem:
                problems.append(problem)
            else:
                return RouterSpec.model_validate({**settings.model_dump(), "host_name": host_name, "api_key": key})
    raise SpecError([f"{host_name}: {line}" for line in problems])




_API_KEY_CHARS = re.compile(r"^[\x21-\x7e]+$")


def _secret_from_env(name: str | None, required: bool, environ: Mapping[str, str],
                     without: str) -> tuple[SecretStr | None, str | None]:
    """(the API key from the controller's environment, or the problem line)."""
    if name is None:
        return None, None
    value = environ.get(name)
    if value and not _API_KEY_CHARS.match(value):
        return None, (f"api_key_env = {name!r}: the value of {name} holds spaces, control characters or non-ASCII "
                      "characters: allowed: a key of printable ASCII characters without spaces (it travels in an "
                      "HTTP Authorization header)")
    if value:
        return SecretStr(value), None
    if not required:
        return None, None
    return None, (
        f"api_key_env = {name!r}: the environment variable {name} is not set (or empty) on the controller, "
        f"where pyinfra runs: export {name}=..., or set api_key_env = None to {without} without a key "
        "(or api_key_required = False to make it optional)"
    )


# ---------------------------------------------------------------- the spec


class Spec(_UnitFiles, HostSettings):
    """One host's settings, validated, with every derived value.

    Derived (properties): python_bin, unit_stem, options_path, env_path,
    unit_path, served_model_name, model_bytes, margin_bytes, is_multinode,
    server_argv, server_options, server_options_yaml(), unit_env, resolved.
    """

    host_name: StrictStr
    profile: ModelProfile
    model_dir: StrictStr  # type: ignore[assignment]  # derived when unset
    tp_size: Annotated[StrictInt, Field(ge=1)]  # type: ignore[assignment]  # derived when unset
    api_key: SecretStr | None = None
    hf_token: SecretStr | None = None
    # Set by resolve(): the facts the host-dependent values came from.
    compute_cap: StrictStr | None = None
    p2p_ok: StrictBool | None = None
    attention_backend_requested: StrictStr | None = None

    @model_validator(mode="before")
    @classmethod
    def _derive(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("model_dir") is None:
            profile = data.get("profile")
            served = getattr(profile, "served_model_name", None)
            if served is None and isinstance(profile, Mapping):
                served = profile.get("served_model_name")
            data["model_dir"] = f"{MODELS_ROOT}/{served or data.get('model', 'model')}"
        if data.get("tp_size") is None:
            gpus, nnodes = data.get("gpu_ids"), data.get("nnodes", 1)
            per_node = len(gpus) if isinstance(gpus, list) and gpus else 1
            data["tp_size"] = per_node * (nnodes if isinstance(nnodes, int) and nnodes >= 1 else 1)
        return data

    @model_validator(mode="after")
    def _with_profile(self) -> Spec:
        lines = []
        if self.attention_backend in MLA_ONLY_BACKENDS and self.profile.attention != "mla":
            lines.append(
                f"attention_backend = {self.attention_backend!r} implements only MLA attention but model "
                f"{self.model!r} uses {self.profile.attention}: allowed: 'auto' or a non-MLA-only backend"
            )
        if self.attention_backend in MHA_ONLY_BACKENDS and self.profile.attention != "mha":
            lines.append(
                f"attention_backend = {self.attention_backend!r} implements only MHA attention but model "
                f"{self.model!r} uses {self.profile.attention}: allowed: 'auto' or an MLA-capable backend"
            )
        if lines:
            raise _lines(*lines)
        return self

    # -- paths

    @property
    def python_bin(self) -> str:
        """The venv's interpreter, which runs the server."""
        return f"{self.venv_path}/bin/python"

    @property
    def options_path(self) -> str:
        """SGLang --config YAML (0600, holds the API key)."""
        return f"{CONFIG_DIR}/{self.unit_stem}.yaml"

    @property
    def env_path(self) -> str:
        """The unit's EnvironmentFile (0600)."""
        return f"{CONFIG_DIR}/{self.unit_stem}.env"

    # -- model

    @property
    def served_model_name(self) -> str:
        return self.profile.served_model_name

    @property
    def model_bytes(self) -> int:
        """The profile's approximate size; the model step asks the Hub for exact sizes."""
        return self.profile.size_bytes

    @property
    def margin_bytes(self) -> int:
        return int(self.size_margin_gb * GB)

    @property
    def is_multinode(self) -> bool:
        return self.nnodes > 1

    @property
    def group_key(self) -> str | None:
        """What identifies this host's TP group (None: single node): the
        node_group's label, or dist_init_addr for the per-host fields."""
        if not self.is_multinode:
            return None
        return self.node_group.label if self.node_group is not None else str(self.dist_init_addr)

    @property
    def group_label(self) -> str | None:
        """The TP group in messages."""
        if not self.is_multinode:
            return None
        return self.node_group.label if self.node_group is not None else f"at {self.dist_init_addr}"

    @property
    def resolved(self) -> bool:
        """True once resolve() filled in the host-dependent values."""
        return self.compute_cap is not None

    # -- the server

    @property
    def server_argv(self) -> list[str]:
        """The server's command line. No secret: the API key is in the
        options file (--config), which SGLang merges in-process."""
        argv = [
            self.python_bin,
            "-m",
            self.server_module,
            "--model-path",
            self.model_dir,
            "--served-model-name",
            self.served_model_name,
            "--tp-size",
            str(self.tp_size),
        ]
        if self.attention_backend != "auto":  # unresolved auto: SGLang chooses
            argv += ["--attention-backend", self.attention_backend]
        argv += ["--host", self.listen_host, "--port", str(self.listen_port)]
        if self.profile.trust_remote_code:
            argv.append("--trust-remote-code")
        if self.is_multinode:
            argv += [
                "--nnodes",
                str(self.nnodes),
                "--node-rank",
                str(self.node_rank),
                "--dist-init-addr",
                str(self.dist_init_addr),
            ]
        argv += list(self.profile.extra_server_args) + list(self.extra_server_args)
        if self.server_options:
            argv += ["--config", self.options_path]
        return argv

    @property
    def server_options(self) -> dict[str, str]:
        """The options file's content (dash-spelled keys, as SGLang's --config
        wants them). Holds the secret in plain text: write it 0600 only."""
        options = {}
        if self.api_key is not None:
            options["api-key"] = self.api_key.get_secret_value()
        return options

    def server_options_yaml(self) -> str:
        """server_options as the YAML text of the options file."""
        return yaml.safe_dump(self.server_options, default_flow_style=False, sort_keys=True)

    @property
    def unit_env(self) -> dict[str, str]:
        """The server's environment (the unit's EnvironmentFile). extra_env wins."""
        env = {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, self.gpu_ids)),
            "HF_HUB_OFFLINE": "1",  # the server reads the downloaded model only
        }
        if not self.is_multinode:
            env["NCCL_IB_DISABLE"] = "1"
        explicit_p2p = any(k.startswith("NCCL_P2P_") for k in self.extra_env)
        if self.p2p_ok is not None and len(self.gpu_ids) > 1 and not explicit_p2p:
            if self.p2p_ok:
                env["NCCL_P2P_LEVEL"] = "SYS"
            else:
                env["NCCL_P2P_DISABLE"] = "1"
        if self.compute_cap is not None and _parse_cc(self.compute_cap)[0] == 12:
            env["SGLANG_ENABLE_JIT_DEEPGEMM"] = "0"  # DeepGEMM does not support SM120
        env.update(self.extra_env)
        return env

    # -- host-dependent resolution

    def resolve(self, compute_cap: str, p2p_ok: bool) -> Spec:
        """A copy with the host-dependent values filled in from preflight's
        facts: compute_cap as nvidia-smi prints it ('12.0'), p2p_ok whether
        P2P works between the GPUs used. Raises SpecError for a backend known
        to fail on this compute capability."""
        cc = _parse_cc(compute_cap, self.host_name)
        requested = self.attention_backend_requested or self.attention_backend
        if requested == "auto":
            backend = AUTO_BACKEND.get((cc[0], self.profile.attention), AUTO_BACKEND_FALLBACK[self.profile.attention])
        else:
            backend = requested
            support = BACKEND_SUPPORT.get(backend)
            if support is not None and not support[0](cc):
                auto = AUTO_BACKEND.get((cc[0], self.profile.attention), AUTO_BACKEND_FALLBACK[self.profile.attention])
                ok = [b for b in backend_choices(compute_cap, self.profile.attention) if b != "auto"]
                raise SpecError(
                    [
                        f"{self.host_name}: attention_backend = {backend!r} does not work on compute "
                        f"capability {compute_cap} ({support[1]}): allowed: 'auto' (-> {auto!r} here), "
                        + ", ".join(map(repr, ok))
                    ]
                )
        return self.model_copy(
            update={
                "attention_backend": backend,
                "attention_backend_requested": requested,
                "compute_cap": compute_cap,
                "p2p_ok": bool(p2p_ok),
            }
        )


def _parse_cc(compute_cap: str, host_name: str | None = None) -> tuple[int, int]:
    m = _COMPUTE_CAP.match(compute_cap) if isinstance(compute_cap, str) else None
    if not m:
        prefix = f"{host_name}: " if host_name else ""
        raise SpecError([f"{prefix}compute_cap = {compute_cap!r}: expected 'MAJOR.MINOR' as nvidia-smi prints it, e.g. '12.0'"])
    return int(m.group(1)), int(m.group(2))


def backend_choices(compute_cap: str, attention: str) -> list[str]:
    """'auto' plus the backends not known to fail for this compute
    capability and attention type (NVIDIA ones; the rest are not ruled out)."""
    cc = _parse_cc(compute_cap)
    nvidia = ["triton", "flashinfer", "fa3", "fa4", "flashmla", "cutlass_mla", "trtllm_mla", "trtllm_mha", "torch_native"]
    out = ["auto"]
    for b in nvidia:
        if attention == "mha" and b in MLA_ONLY_BACKENDS or attention == "mla" and b in MHA_ONLY_BACKENDS:
            continue
        support = BACKEND_SUPPORT.get(b)
        if support is not None and not support[0](cc):
            continue
        out.append(b)
    return out


# ---------------------------------------------------------------- error formatting


_SECRET_NAME_FIELDS = frozenset({"api_key_env", "hf_token_env"})


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif out:
            out += f".{part}"
        else:
            out = str(part)
    return out


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel]:
    """The (nested) model that a location points into."""
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            break
        candidates = [field.annotation, *typing.get_args(field.annotation)]
        nested = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not nested:
            break
        model = nested[0]
    return model


def _format_errors(err: ValidationError, model: type[BaseModel]) -> list[str]:
    """pydantic's errors as 'field = value: why; allowed: ...' lines."""
    lines = []
    fields = model.model_fields
    for e in err.errors(include_url=False):
        loc = tuple(e["loc"])
        top = loc[0] if loc and isinstance(loc[0], str) else None
        field = fields.get(top) if top else None
        allowed = field.description if field is not None and field.description else None
        if len(loc) > 1 and isinstance(loc[-1], str):  # a nested model's own field says more (node_group.*)
            nested = _model_at(model, loc[:-1]).model_fields.get(loc[-1])
            if nested is not None and nested.description and _model_at(model, loc[:-1]) is not model:
                allowed = nested.description
        where = _loc(loc)
        value = e.get("input")
        shown = "<hidden>" if top in _SECRET_NAME_FIELDS else _show(_redact_args(value))
        if e["type"] == "spec_lines":
            lines.extend(e["ctx"]["text"].splitlines())
        elif e["type"] == "missing":
            lines.append(f"{where} is required: {allowed or 'set it'}")
        elif e["type"] == "extra_forbidden":
            known = list(_model_at(model, loc[:-1]).model_fields)
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            lines.append(f"{where} is not a known key{hint}: allowed: {', '.join(k for k in known if k != 'name')}")
        elif e["type"] == "value_error":
            reason = e["msg"].removeprefix("Value error, ")
            lines.append(f"{where} = {shown}: {reason}")
        else:
            reason = e["msg"]
            if allowed and e["type"] != "literal_error":
                reason += f"; allowed: {allowed}"
            lines.append(f"{where} = {shown}: {reason}")
    # Union members can report the same problem twice.
    return list(dict.fromkeys(lines))


# ---------------------------------------------------------------- building


_DERIVED_BY_GROUP = ("nnodes", "node_rank", "dist_init_addr")


def _derive_from_node_group(host_name: str, ours: dict[str, Any], addresses: Mapping[str, str] | None) -> list[str]:
    """With a node_group: put the derived nnodes / node_rank / dist_init_addr
    into ``ours`` (before the fields are validated together) and return what
    contradicts it. An invalid node_group is left to HostSettings to report."""
    raw = ours.get("node_group")
    if raw is None:
        return []
    try:
        group = NodeGroup.model_validate(raw)
    except ValidationError:
        return []
    problems = []
    if host_name not in group.hosts:
        problems.append(
            f"node_group.hosts = {group.hosts!r}: does not list this host {host_name!r}: every host that has "
            f"node group {group.label!r} must be in its hosts, in rank order (or set node_group = None for this host)"
        )
        return problems
    derived = {
        "nnodes": len(group.hosts),
        "node_rank": group.hosts.index(host_name),
        "dist_init_addr": group.address(addresses),
    }
    defaults = {"nnodes": 1, "node_rank": 0, "dist_init_addr": None}
    for key in _DERIVED_BY_GROUP:
        value = ours.get(key, defaults[key])
        if value != defaults[key] and value != derived[key]:
            problems.append(
                f"{key} = {_show(value)}: contradicts node group {group.label!r}, which derives {key} = "
                f"{derived[key]!r} here: allowed: leave {key} unset (node_group sets it)"
            )
        ours[key] = derived[key]
    port = ours.get("listen_port", HostSettings.model_fields["listen_port"].default)
    if derived["node_rank"] == 0 and port == group.dist_init_port:
        problems.append(
            f"node_group.dist_init_port = {group.dist_init_port}: rank 0 ({host_name}) already serves HTTP on "
            f"listen_port {port}: allowed: a free port other than {port}, e.g. 20000"
        )
    return problems


def build_spec(
    host_name: str,
    data: Mapping[str, Any],
    environ: Mapping[str, str] = os.environ,
    models_dir: Path = MODELS_DIR,
    addresses: Mapping[str, str] | None = None,
) -> Spec:
    """Validate one host's data (host.data as a dict) into a Spec, or raise
    SpecError listing every problem, one line each, prefixed with the host.

    ``addresses`` (inventory host name -> address, e.g. ssh_hostname) gives
    rank 0's address when a node_group has no dist_init_host."""
    if data.get("role") == "router":  # SGLang's router (group_data/routers.py): its own settings
        return build_router_spec(host_name, data, environ)  # type: ignore[return-value]
    problems: list[str] = []
    ours: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            problems.append(f"{key!r} is not a valid data key")
        elif key in LITERAL_SECRET_KEYS:
            use = LITERAL_SECRET_KEYS[key]
            problems.append(
                f"{key} = <hidden>: a literal secret is not allowed in the inventory or group data: "
                f"set {use} to the NAME of an environment variable on the controller that holds it"
            )
        elif key in DATA_KEYS:
            ours[key] = value
        elif key in ModelProfile.model_fields:
            problems.append(
                f"{key} = {_show(value)}: is a model profile key, not a host data key: "
                "set it in models/<model>.yaml (or add a new profile there)"
            )
        elif key in ROUTER_KEYS:
            problems.append(
                f"{key} = {_show(value)}: a router setting, for router hosts only: set role = 'router' for "
                "this host (group_data/routers.py), or remove the key"
            )
        elif not _is_pyinfra_key(key):
            close = difflib.get_close_matches(key, sorted(DATA_KEYS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(
                f"{key} = {_show(value)}: unknown data key{hint}: allowed: {', '.join(sorted(DATA_KEYS))} "
                "(and pyinfra's own ssh_*/_* keys)"
            )

    problems.extend(_derive_from_node_group(host_name, ours, addresses))

    settings: HostSettings | None = None
    try:
        settings = HostSettings.model_validate(ours)
    except ValidationError as e:
        problems.extend(_format_errors(e, HostSettings))

    profile: ModelProfile | None = None
    if isinstance(ours.get("model"), str):
        try:
            profile = load_profile(ours["model"], models_dir)
        except SpecError as e:
            problems.extend(e.lines)

    secrets: dict[str, SecretStr | None] = {"api_key": None, "hf_token": None}
    if settings is not None:
        secrets["api_key"], problem = _secret_from_env(settings.api_key_env, settings.api_key_required, environ,
                                                       "serve")
        if problem:
            problems.append(problem)
        if settings.hf_token_env is not None and environ.get(settings.hf_token_env):
            secrets["hf_token"] = SecretStr(environ[settings.hf_token_env])

    if not problems and settings is not None and profile is not None:
        try:
            return Spec.model_validate(
                {**settings.model_dump(), "host_name": host_name, "profile": profile, **secrets}
            )
        except ValidationError as e:
            problems.extend(_format_errors(e, Spec))

    raise SpecError([f"{host_name}: {line}" for line in problems])


_HOST_SPECS: dict[str, Spec] = {}
_INVENTORY_SPECS: dict[int, tuple[Any, dict[str, Spec]]] = {}


def host_data_dict(host: Any) -> dict[str, Any]:
    """host.data merged the way pyinfra resolves it (override > host > groups > all)."""
    return dict(host.data.dict())


def host_spec(host: Any) -> Spec:
    """The Spec of a pyinfra host, built once per host name."""
    spec = _HOST_SPECS.get(host.name)
    if spec is None:
        spec = build_spec(host.name, host_data_dict(host), addresses=_group_addresses(host))
        _HOST_SPECS[host.name] = spec
    return spec


def _group_addresses(host: Any) -> dict[str, str]:
    """ssh_hostname (else the name) of the hosts a node_group names, from the host's inventory."""
    group = host.data.get("node_group")
    inventory = getattr(host, "inventory", None)
    if not isinstance(group, Mapping) or not isinstance(group.get("hosts"), list) or inventory is None:
        return {}
    out = {}
    for name in group["hosts"]:
        other = inventory.get_host(name, None) if isinstance(name, str) else None
        if other is not None:
            out[name] = str(other.data.get("ssh_hostname") or name)
    return out


def node_groups(specs: Mapping[str, Spec]) -> dict[str, list[Spec]]:
    """The multi-node TP groups among ``specs``: {group key: specs in rank order}."""
    groups: dict[str, list[Spec]] = {}
    for spec in specs.values():
        if spec.group_key is not None:
            groups.setdefault(spec.group_key, []).append(spec)
    return {key: sorted(members, key=lambda s: (s.node_rank, s.host_name)) for key, members in groups.items()}


def _group_problems(specs: Mapping[str, Spec], inventory_names: set[str], targeted: set[str]) -> list[str]:
    """Cross-host checks of every node group: one line per problem, naming
    the host, the field, the value and what is allowed."""
    lines: list[str] = []
    for key, members in node_groups(specs).items():
        first = members[0]
        label = first.group_label
        group = first.node_group
        if group is not None:
            for spec in members[1:]:
                if spec.node_group != group:
                    lines.append(
                        f"{spec.host_name}: node_group = {spec.node_group.model_dump(exclude_none=True)!r}: "
                        f"differs from {first.host_name}'s {group.model_dump(exclude_none=True)!r}: every host of "
                        "a node group must have the same node_group (set it once, in the group's data)"
                    )
            for rank, name in enumerate(group.hosts):
                if name not in inventory_names:
                    lines.append(
                        f"{first.host_name}: node_group.hosts = {group.hosts!r}: rank {rank} {name!r} is not a host "
                        f"of the inventory: allowed: the inventory's host names ({', '.join(sorted(inventory_names))})"
                    )
                elif name not in targeted:
                    lines.append(
                        f"{first.host_name}: node group {label!r}: rank {rank} ({name}) is not targeted (--limit): "
                        "the ranks of a TP group are (re)started together: target all of its hosts or none"
                    )
                elif name not in specs:
                    pass  # its own errors are listed
                elif specs[name].node_group != group:
                    other = specs[name].node_group
                    lines.append(
                        f"{name}: node_group = {other.model_dump(exclude_none=True) if other else None!r}: "
                        f"node group {label!r} lists {name} as rank {rank}: allowed: the same node_group as "
                        f"{first.host_name}"
                    )
        else:
            nnodes = {s.nnodes for s in members}
            if len(nnodes) > 1:
                lines.append(
                    f"{first.host_name}: nnodes = {first.nnodes}: other hosts with dist_init_addr "
                    f"{key!r} say nnodes = {', '.join(str(s.nnodes) for s in members if s.nnodes != first.nnodes)}: "
                    "allowed: the same nnodes on every rank (or describe the group once with node_group)"
                )
            by_rank: dict[int, list[str]] = {}
            for spec in members:
                by_rank.setdefault(spec.node_rank, []).append(spec.host_name)
            for rank, names in sorted(by_rank.items()):
                if len(names) > 1:
                    lines.append(
                        f"{names[1]}: node_rank = {rank}: {names[0]} has node_rank {rank} too in the group at "
                        f"dist_init_addr {key!r}: allowed: each rank 0..{first.nnodes - 1} on exactly one host"
                    )
            missing = [r for r in range(first.nnodes) if r not in by_rank]
            if missing:
                lines.append(
                    f"{first.host_name}: dist_init_addr = {key!r}: no targeted host has node_rank "
                    f"{', '.join(map(str, missing))} of nnodes = {first.nnodes}: allowed: each rank 0..{first.nnodes - 1} "
                    "on exactly one targeted host (or describe the group once with node_group)"
                )
        for spec in members[1:]:
            if len(spec.gpu_ids) != len(first.gpu_ids):
                lines.append(
                    f"{spec.host_name}: gpu_ids = {spec.gpu_ids!r} ({len(spec.gpu_ids)} GPUs): rank "
                    f"{first.node_rank} ({first.host_name}) of node group {label!r} uses {len(first.gpu_ids)}: "
                    f"allowed: {len(first.gpu_ids)} GPUs on every rank (tp_size = GPUs per node x nnodes)"
                )
            if spec.tp_size != first.tp_size:
                lines.append(
                    f"{spec.host_name}: tp_size = {spec.tp_size}: rank {first.node_rank} ({first.host_name}) of "
                    f"node group {label!r} has tp_size {first.tp_size}: allowed: the same tp_size on every rank"
                )
            if spec.model != first.model:
                lines.append(
                    f"{spec.host_name}: model = {spec.model!r}: rank {first.node_rank} ({first.host_name}) of "
                    f"node group {label!r} runs {first.model!r}: allowed: the same model on every rank"
                )
            if spec.dist_init_addr != first.dist_init_addr:
                lines.append(
                    f"{spec.host_name}: dist_init_addr = {spec.dist_init_addr!r}: rank {first.node_rank} "
                    f"({first.host_name}) of node group {label!r} uses {first.dist_init_addr!r}: allowed: "
                    "one dist init address for the whole group"
                )
    return lines


def _targeted_hosts(inventory: Any) -> list[Any]:
    state = getattr(inventory, "state", None)
    hosts = list(inventory)
    if state is not None and hasattr(state, "is_host_in_limit"):
        hosts = [h for h in hosts if state.is_host_in_limit(h)]
    return hosts


def _router_key_problems(specs: Mapping[str, Any]) -> list[str]:
    """A router and the servers behind it share one API key: the servers use
    it to call the router's /workers API, the router gives it to them with
    each request, and a keyed server behind a keyless router would serve
    anyone who reaches the router."""
    routers = {s.router_url: s for s in specs.values() if getattr(s, "role", "server") == "router" and s.router_url}
    lines = []
    for spec in specs.values():
        router = routers.get(spec.router_url) if getattr(spec, "role", "server") == "server" else None
        if router is None:
            continue
        mine = spec.api_key.get_secret_value() if spec.api_key else None
        theirs = router.api_key.get_secret_value() if router.api_key else None
        if mine == theirs:
            continue
        if theirs is None:
            why = (f"this server demands an API key but its router {router.host_name} at {spec.router_url} runs "
                   f"without one (its api_key_env = {router.api_key_env!r}): through the router anyone could use it")
        elif mine is None:
            why = (f"its router {router.host_name} at {spec.router_url} demands an API key (its api_key_env = "
                   f"{router.api_key_env!r}) and this server has none to register with")
        else:
            why = (f"the key differs from the one of its router {router.host_name} at {spec.router_url} "
                   f"(its api_key_env = {router.api_key_env!r})")
        lines.append(f"{spec.host_name}: api_key_env = {spec.api_key_env!r}: {why}: allowed: the same key on a "
                     "router and its servers")
    return lines


def validate_inventory(inventory: Any) -> dict[str, Spec]:
    """Validate every targeted host (--limit respected) before anything runs.

    Returns {host name: Spec}; raises one SpecError listing every bad host.
    Memoized per inventory, so deploy.py may call it from each host's run.
    """
    cached = _INVENTORY_SPECS.get(id(inventory))
    if cached is not None and cached[0] is inventory:
        return cached[1]
    specs: dict[str, Spec] = {}
    lines: list[str] = []
    bad: list[str] = []
    targeted = _targeted_hosts(inventory)
    for host in targeted:
        try:
            specs[host.name] = host_spec(host)
        except SpecError as e:
            bad.append(host.name)
            lines.extend(e.lines)
    group_lines = _group_problems(specs, {h.name for h in inventory}, {h.name for h in targeted})
    for line in group_lines:
        name = line.split(":", 1)[0]
        if name not in bad:
            bad.append(name)
    lines.extend(group_lines)
    for line in _router_key_problems(specs):
        name = line.split(":", 1)[0]
        if name not in bad:
            bad.append(name)
        lines.append(line)
    if lines:
        raise SpecError(lines, header=f"invalid settings for {len(bad)} host(s): {', '.join(bad)}")
    _INVENTORY_SPECS[id(inventory)] = (inventory, specs)
    return specs


def clear_cache() -> None:
    """Forget memoized specs (tests, long-lived drivers that reload data)."""
    _HOST_SPECS.clear()
    _INVENTORY_SPECS.clear()
