"""Every file the deploy renders, in one place: the server's unit, env and
options files and the router's unit (templates/*.j2), with systemd quoting.

    rendered = render(spec)        # Rendered(unit=..., env=..., options=...)
    unit_text = render_router_unit(router_spec)
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import jinja2

from core.paths import REMOTE_SRC_DIR, TEMPLATES_DIR
from tasks.spec import ROUTER_LAUNCHER
from tasks.spec.built import SERVER_LAUNCHER

if TYPE_CHECKING:
    from tasks.spec import RouterSpec, Spec

LAUNCHER_SCRIPT = REMOTE_SRC_DIR / "router_launch.py"
SERVER_LAUNCHER_SCRIPT = REMOTE_SRC_DIR / "server_launch.py"  # uploaded to SERVER_LAUNCHER
_SAFE_ARG = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")
# The header line names where the settings come from; kept as it was so that
# upgrading this tool does not change (and so restart) every unit in a fleet.
_SERVER_SOURCE = "tasks/spec.py"
_ROUTER_SOURCE = "tasks/router.py"


def systemd_quote(arg: str) -> str:
    """One ExecStart word: systemd expands % specifiers and $VARS, so escape them."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if _SAFE_ARG.match(arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_env_quote(value: str) -> str:
    """One value of an EnvironmentFile line."""
    value = str(value)
    if value and _SAFE_ARG.match(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


_jinja = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
)
_jinja.filters["systemd_env_quote"] = systemd_env_quote


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Rendered:
    """The server's three files, as they must be on the host."""

    unit: str
    env: str
    options: str

    def digests(self) -> dict[str, str]:
        return {"unit": sha256(self.unit), "env": sha256(self.env), "options": sha256(self.options)}


def render(spec: Spec) -> Rendered:
    """The unit, its environment file and SGLang's options file for a spec."""
    unit = _jinja.get_template("sglang.service.j2").render(
        spec_source=_SERVER_SOURCE,
        served_name=spec.served_model_name,
        tp_size=spec.tp_size,
        nnodes=spec.nnodes,
        node_rank=spec.node_rank,
        env_path=spec.env_path,
        exec_start=" ".join(systemd_quote(arg) for arg in spec.server_argv),
        # a new launcher changes the unit, so the server restarts with it
        launcher=SERVER_LAUNCHER,
        launcher_sha256=sha256(SERVER_LAUNCHER_SCRIPT.read_text()),
        model_gb=round(spec.model_bytes / 1e9),
        timeout_start_s=int(max(1800, spec.readiness_timeout_s)),
    )
    env = _jinja.get_template("sglang.env.j2").render(unit_name=spec.unit_name, env=spec.unit_env)
    options = render_options(spec.server_options)
    return Rendered(unit=unit, env=env, options=options)


def render_options(options: Mapping[str, object]) -> str:
    """SGLang's --config file (YAML) for the options kept out of argv."""
    return _jinja.get_template("sglang-options.yaml.j2").render(options=options)


def render_router_unit(spec: RouterSpec) -> str:
    """The router's systemd unit for a RouterSpec."""
    return _jinja.get_template("sglang-router.service.j2").render(
        spec_source=_ROUTER_SOURCE,
        policy=spec.router_policy,
        port=spec.router_listen_port,
        exec_start=" ".join(systemd_quote(arg) for arg in spec.router_argv),
        # a new launcher changes the unit, so the router restarts with it
        launcher=ROUTER_LAUNCHER if spec.api_key else None,
        launcher_sha256=sha256(LAUNCHER_SCRIPT.read_text()) if spec.api_key else None,
    )


def packages_digest(packages: dict[str, str]) -> str:
    return sha256(json.dumps(packages, sort_keys=True))
