"""The typed, validated view of one host's settings.

Data flows one way::

    inventory + group_data/*.py + models/<model>.yaml
        -> host.data -> Spec (validated once, every derived value computed here)
        -> the steps read the Spec (never raw host.data) and facts

``build_spec`` turns one host's data into a frozen ``Spec`` (a server) or
``RouterSpec`` (role = 'router'), or raises one ``SpecError`` listing every
problem of that host, one line each, naming the host, the field, the bad
value and what is allowed. ``validate_inventory`` does that for every
targeted host before any operation runs.

Host-dependent values (the attention backend for ``"auto"``, NCCL's P2P
environment, the SM120 DeepGEMM switch) are filled in by
``Spec.resolve(compute_cap, p2p_ok)`` once preflight has the GPU facts.

Secrets (the API key, the HF token) are read from the controller's process
environment when the spec is built, held as ``SecretStr`` and never shown in
repr/str or in error messages.

The modules, in the order they build on each other:

- tables: SGLang's and the router's tables (backends, formats, flags, policies)
- errors: SpecError and pydantic's errors as message lines
- fields: the field types (Annotated, each check written once)
- profile: models/<name>.yaml (ModelProfile, load_profile)
- base, server_settings, router_settings: the settings of each host kind
- built: Spec and RouterSpec, the derived values
- build: host data -> a spec (build_spec, host_spec)
- machines: several servers on one machine (sibling_units, machine_problems)
- inventory: checks across hosts (validate_inventory, node_groups)
"""

from __future__ import annotations

from core.paths import CONFIG_DIR, GB, MODELS_DIR, MODELS_ROOT, REPO_ROOT, SYSTEMD_DIR
from tasks.spec.base import CommonSettings
from tasks.spec.build import (
    build_router_spec,
    build_server_spec,
    build_spec,
    host_data_dict,
    host_spec,
)
from tasks.spec.built import AnySpec, RouterSpec, Spec, backend_choices, local_http_url
from tasks.spec.errors import SpecError
from tasks.spec.fields import GpuId, Number
from tasks.spec.inventory import node_groups, router_key_problems, validate_inventory
from tasks.spec.machines import machine_of, machine_problems, sibling_units
from tasks.spec.profile import DraftModel, ModelProfile, Quantization, available_profiles, load_profile
from tasks.spec.router_settings import ROUTER_KEYS, RouterSettings
from tasks.spec.server_settings import DATA_KEYS, HostSettings, NodeGroup
from tasks.spec.tables import (
    ATTENTION_BACKENDS,
    AUTO_BACKEND,
    AUTO_BACKEND_FALLBACK,
    BACKEND_SUPPORT,
    COMPRESSED_TENSORS_FORMATS,
    FORBIDDEN_ENV,
    IGNORED_PREFIXES,
    LITERAL_SECRET_KEYS,
    MANAGED_FLAGS,
    MHA_ONLY_BACKENDS,
    MLA_ONLY_BACKENDS,
    ROUTER_KEY_MODULE,
    ROUTER_LAUNCHER,
    ROUTER_MANAGED_FLAGS,
    ROUTER_POLICIES,
    SECRET_FLAGS,
)

__all__ = [
    "ATTENTION_BACKENDS",
    "AUTO_BACKEND",
    "AUTO_BACKEND_FALLBACK",
    "BACKEND_SUPPORT",
    "COMPRESSED_TENSORS_FORMATS",
    "CONFIG_DIR",
    "DATA_KEYS",
    "FORBIDDEN_ENV",
    "GB",
    "IGNORED_PREFIXES",
    "LITERAL_SECRET_KEYS",
    "MANAGED_FLAGS",
    "MHA_ONLY_BACKENDS",
    "MLA_ONLY_BACKENDS",
    "MODELS_DIR",
    "MODELS_ROOT",
    "REPO_ROOT",
    "ROUTER_KEYS",
    "ROUTER_KEY_MODULE",
    "ROUTER_LAUNCHER",
    "ROUTER_MANAGED_FLAGS",
    "ROUTER_POLICIES",
    "SECRET_FLAGS",
    "SYSTEMD_DIR",
    "AnySpec",
    "CommonSettings",
    "DraftModel",
    "GpuId",
    "HostSettings",
    "ModelProfile",
    "NodeGroup",
    "Number",
    "Quantization",
    "RouterSettings",
    "RouterSpec",
    "Spec",
    "SpecError",
    "available_profiles",
    "backend_choices",
    "build_router_spec",
    "build_server_spec",
    "build_spec",
    "host_data_dict",
    "host_spec",
    "load_profile",
    "local_http_url",
    "machine_of",
    "machine_problems",
    "node_groups",
    "router_key_problems",
    "sibling_units",
    "validate_inventory",
]
