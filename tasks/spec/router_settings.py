"""A router host's settings (role = 'router', group_data/routers.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictStr, model_validator

from tasks.spec.base import CommonSettings
from tasks.spec.errors import spec_lines
from tasks.spec.fields import (
    BaseUrl,
    HostAddress,
    Number,
    OwnDir,
    Port,
    RouterArgs,
    SecretEnvName,
    pinned_requirement,
    python_module,
    service_unit,
)
from tasks.spec.server_settings import DATA_KEYS
from tasks.spec.tables import ROUTER_KEY_MODULE, ROUTER_POLICIES, RouterPolicy


class RouterSettings(CommonSettings):
    """A router host's settings (group_data/routers.py): SGLang's router from
    PyPI in its own venv, run by a systemd unit. The servers' keys of
    group_data/all.py (model, gpu_ids, ...) do not apply to a router host."""

    role: Literal["router"] = Field(description="'router'")
    router_url: BaseUrl | None = Field(
        None,
        description="http(s) URL clients and servers reach this router at; the servers with the same "
        "router_url are registered by the router's deploy (None: none)",
    )
    router_package: Annotated[StrictStr, pinned_requirement("sglang-router==0.3.2")] = Field(
        "sglang-router==0.3.2", description="the router's pinned pip requirement, e.g. 'sglang-router==0.3.2'"
    )
    router_module: Annotated[StrictStr, python_module("sglang_router.launch_router")] = Field(
        "sglang_router.launch_router", description="dotted Python module run with 'python -m'"
    )
    router_venv_path: OwnDir = Field(
        "/opt/sglang-router/venv",
        description="absolute path of the router's venv on the host, a directory of its own (at least two "
        "levels below /, not directly under a system directory)",
    )
    router_listen_host: HostAddress = Field("0.0.0.0", description="an IP address or hostname to listen on")
    router_listen_port: Port = Field(30000, description="an integer 1..65535")
    router_prometheus_host: HostAddress = Field("127.0.0.1", description="an IP address or hostname for /metrics")
    router_prometheus_port: Port = Field(29000, description="an integer 1..65535, not router_listen_port")
    router_policy: RouterPolicy = Field("round_robin", description="one of " + ", ".join(map(repr, ROUTER_POLICIES)))
    router_extra_args: RouterArgs = Field(default_factory=list, description="extra router flags, a list of strings")
    router_unit_name: Annotated[StrictStr, service_unit("sglang-router.service")] = Field(
        "sglang-router.service", description="a systemd unit name ending in .service"
    )
    router_readiness_timeout_s: Number = Field(120.0, gt=0, description="seconds, a number > 0")
    api_key_env: SecretEnvName | None = Field(
        "SGLANG_API_KEY",
        description="NAME of a controller environment variable holding the API key the router demands from "
        "clients and gives its workers (its servers' key), or None",
    )

    @model_validator(mode="after")
    def _ports(self) -> RouterSettings:
        if self.router_prometheus_port == self.router_listen_port:
            raise spec_lines(
                f"router_prometheus_port = {self.router_prometheus_port}: the same port as router_listen_port: "
                "allowed: another free port, e.g. 29000"
            )
        return self

    @model_validator(mode="after")
    def _key_launcher(self) -> RouterSettings:
        if self.api_key_env is not None and self.router_module != ROUTER_KEY_MODULE:
            raise spec_lines(
                f"router_module = {self.router_module!r}: with api_key_env = {self.api_key_env!r} the key reaches "
                f"the router through our launcher for {ROUTER_KEY_MODULE!r} (never argv): allowed: "
                f"{ROUTER_KEY_MODULE!r}, or api_key_env = None"
            )
        return self


# Keys only a router host has (documented in group_data/routers.py).
ROUTER_KEYS: frozenset[str] = frozenset(RouterSettings.model_fields) - DATA_KEYS
