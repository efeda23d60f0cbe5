"""Building specs: one host's data (host.data as a dict) -> a Spec or a
RouterSpec, or one SpecError listing every problem of that host.

``host_spec`` builds a pyinfra host's spec once and keeps it on the host
object itself (so a fresh inventory, or a fresh host, is built afresh)."""

from __future__ import annotations

import difflib
import functools
import os
import re
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from pydantic import SecretStr, ValidationError
from pyinfra.api.host import Host

from core.paths import MODELS_DIR
from tasks.spec.base import CommonSettings
from tasks.spec.built import AnySpec, RouterSpec, Spec
from tasks.spec.errors import HIDDEN, SpecError, format_errors, show
from tasks.spec.profile import ModelProfile, load_profile
from tasks.spec.router_settings import ROUTER_KEYS, RouterSettings
from tasks.spec.server_settings import DATA_KEYS, HostSettings, NodeGroup
from tasks.spec.tables import IGNORED_PREFIXES, LITERAL_SECRET_KEYS

# Where host_spec keeps a host's spec: an attribute of the pyinfra Host object.
SPEC_ATTR = "_sglang_converge_spec"

_API_KEY_CHARS = re.compile(r"^[\x21-\x7e]+$")
_DERIVED_BY_GROUP = ("nnodes", "node_rank", "dist_init_addr")

# Keys that are ours but do not belong in a server's host data, and why.
_NOT_FOR_SERVERS: dict[str, str] = {
    **{
        key: "a router setting, for router hosts only: set role = 'router' for this host "
        "(group_data/routers.py), or remove the key"
        for key in ROUTER_KEYS
    },
    **{
        key: "is a model profile key, not a host data key: set it in models/<model>.yaml (or add a new profile there)"
        for key in ModelProfile.model_fields
    },
}


@functools.cache
def _connector_data_keys() -> frozenset[str]:
    """host.data keys declared by the installed pyinfra connectors (@fake's
    fake_responses, @docker's docker_*, ...): pyinfra's, not ours."""
    keys: set[str] = set()
    try:
        from pyinfra.api.connectors import get_all_connectors

        for connector in get_all_connectors().values():
            keys.update(getattr(connector, "data_meta", {}) or {})
    except Exception:  # noqa: BLE001  # a broken third-party connector must not hide our errors
        pass
    return frozenset(keys)


def is_pyinfra_key(key: str) -> bool:
    """A host.data key of pyinfra's own (ssh_*, _sudo, a connector's keys)."""
    return key.startswith(IGNORED_PREFIXES) or key in _connector_data_keys()


def split_data(
    data: Mapping[Any, Any],
    fields: Collection[str],
    misplaced: Mapping[str, str],
    skipped: Collection[str] = (),
    allowed: str = "allowed",
) -> tuple[dict[str, Any], list[str]]:
    """(our keys of ``data``, problem lines). ``fields``: the keys validated
    here; ``misplaced``: keys refused with a reason; ``skipped``: keys of
    another host kind, ignored like pyinfra's own; anything else is unknown."""
    ours: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in data.items():
        if not isinstance(key, str):
            problems.append(f"{key!r} is not a valid data key")
        elif key in LITERAL_SECRET_KEYS:
            problems.append(
                f"{key} = {HIDDEN}: a literal secret is not allowed in the inventory or group data: "
                f"set {LITERAL_SECRET_KEYS[key]} to the NAME of an environment variable on the controller that holds it"
            )
        elif key in fields:
            ours[key] = value
        elif key in misplaced:
            problems.append(f"{key} = {show(value)}: {misplaced[key]}")
        elif key not in skipped and not is_pyinfra_key(key):
            known = sorted(fields)
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(
                f"{key} = {show(value)}: unknown data key{hint}: {allowed}: {', '.join(known)} "
                "(and pyinfra's own ssh_*/_* keys)"
            )
    return ours, problems


def secret_from_env(
    settings: CommonSettings, environ: Mapping[str, str], without: str
) -> tuple[SecretStr | None, str | None]:
    """(the API key from the controller's environment, or the problem line)."""
    name = settings.api_key_env
    if name is None:
        return None, None
    value = environ.get(name)
    if value and not _API_KEY_CHARS.match(value):
        return None, (
            f"api_key_env = {name!r}: the value of {name} holds spaces, control characters or non-ASCII "
            "characters: allowed: a key of printable ASCII characters without spaces (it travels in an "
            "HTTP Authorization header)"
        )
    if value:
        return SecretStr(value), None
    if not settings.api_key_required:
        return None, None
    return None, (
        f"api_key_env = {name!r}: the environment variable {name} is not set (or empty) on the controller, "
        f"where pyinfra runs: export {name}=..., or set api_key_env = None to {without} without a key "
        "(or api_key_required = False to make it optional)"
    )


def derive_from_node_group(host_name: str, ours: dict[str, Any], addresses: Mapping[str, str] | None) -> list[str]:
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
    if host_name not in group.hosts:
        return [
            f"node_group.hosts = {group.hosts!r}: does not list this host {host_name!r}: every host that has "
            f"node group {group.label!r} must be in its hosts, in rank order (or set node_group = None for this host)"
        ]
    problems = []
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
                f"{key} = {show(value)}: contradicts node group {group.label!r}, which derives {key} = "
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


def build_server_spec(
    host_name: str,
    data: Mapping[str, Any],
    environ: Mapping[str, str] = os.environ,
    models_dir: Path = MODELS_DIR,
    addresses: Mapping[str, str] | None = None,
) -> Spec:
    """Validate a server host's data into a Spec, or raise SpecError listing
    every problem, one line each, prefixed with the host."""
    ours, problems = split_data(data, DATA_KEYS, _NOT_FOR_SERVERS)
    problems.extend(derive_from_node_group(host_name, ours, addresses))

    settings: HostSettings | None = None
    try:
        settings = HostSettings.model_validate(ours)
    except ValidationError as e:
        problems.extend(format_errors(e, HostSettings))

    profile: ModelProfile | None = None
    if isinstance(ours.get("model"), str):
        try:
            profile = load_profile(ours["model"], models_dir)
        except SpecError as e:
            problems.extend(e.lines)

    secrets: dict[str, SecretStr | None] = {"api_key": None, "hf_token": None}
    if settings is not None:
        secrets["api_key"], problem = secret_from_env(settings, environ, "serve")
        if problem:
            problems.append(problem)
        if settings.hf_token_env is not None and environ.get(settings.hf_token_env):
            secrets["hf_token"] = SecretStr(environ[settings.hf_token_env])

    if not problems and settings is not None and profile is not None:
        try:
            return Spec.model_validate({**settings.model_dump(), "host_name": host_name, "profile": profile, **secrets})
        except ValidationError as e:
            problems.extend(format_errors(e, Spec))

    raise SpecError([f"{host_name}: {line}" for line in problems])


def build_router_spec(host_name: str, data: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> RouterSpec:
    """Validate a router host's data (role = 'router') into a RouterSpec, or
    raise SpecError listing every problem, one line each, prefixed with the host.
    The servers' keys (group_data/all.py defaults) are not used and not checked."""
    ours, problems = split_data(
        data, RouterSettings.model_fields, {}, skipped=DATA_KEYS, allowed="allowed for a router host"
    )
    if not problems:
        try:
            settings = RouterSettings.model_validate(ours)
        except ValidationError as e:
            problems.extend(format_errors(e, RouterSettings))
        else:
            key, problem = secret_from_env(settings, environ, "run the router")
            if problem:
                problems.append(problem)
            else:
                return RouterSpec.model_validate({**settings.model_dump(), "host_name": host_name, "api_key": key})
    raise SpecError([f"{host_name}: {line}" for line in problems])


def build_spec(
    host_name: str,
    data: Mapping[str, Any],
    environ: Mapping[str, str] = os.environ,
    models_dir: Path = MODELS_DIR,
    addresses: Mapping[str, str] | None = None,
) -> AnySpec:
    """Validate one host's data (host.data as a dict) into a Spec (a server)
    or a RouterSpec (role = 'router', group_data/routers.py), or raise
    SpecError listing every problem, one line each, prefixed with the host.

    ``addresses`` (inventory host name -> address, e.g. ssh_hostname) gives
    rank 0's address when a node_group has no dist_init_host."""
    if data.get("role") == "router":
        return build_router_spec(host_name, data, environ)
    return build_server_spec(host_name, data, environ, models_dir, addresses)


def host_data_dict(host: Host) -> dict[str, Any]:
    """host.data merged the way pyinfra resolves it (override > host > groups > all)."""
    return dict(host.data.dict())


def _group_addresses(host: Host) -> dict[str, str]:
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


def host_spec(host: Host) -> AnySpec:
    """The spec of a pyinfra host, built from its data on first use and kept
    on the host object (``SPEC_ATTR``): later calls return the same spec."""
    spec = getattr(host, SPEC_ATTR, None)
    if isinstance(spec, (Spec, RouterSpec)):
        return spec
    spec = build_spec(host.name, host_data_dict(host), addresses=_group_addresses(host))
    setattr(host, SPEC_ATTR, spec)
    return spec
