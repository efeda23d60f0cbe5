"""The README's settings reference, generated from the typed settings so it cannot drift.

    python -m core.settings_table            # print the tables
    python -m core.settings_table --readme   # rewrite README.md's block between the markers

One row per field of ``HostSettings`` (a server host) and of ``RouterSettings``
(a router host), each with:

- **name** and **default**: the pydantic field and its default ("required" when it has none);
- **what it does**: the comment that documents the key where its default is set,
  ``group_data/all.py`` (servers) or ``group_data/routers.py`` (routers; then
  ``all.py`` for the keys routers share with servers). A key's comment is the
  comment at the end of its assignment line plus the indented comment-only
  lines right below it; a required key (no assignment) is documented in the
  header as ``#   NAME - text`` with deeper-indented continuation lines. A
  key with no comment gets the field's ``description`` (what is allowed).
- **restarts the server** (the router): computed, not kept by hand. For each
  field, ``CHANGES`` gives one change of it (with the companion keys a
  change needs to stay valid, and a context where the field matters). Both
  the settings before and after are built into specs (``build_spec``) and
  resolved for an SM120 host; what a restart is decided from is then
  compared (``server_restart_inputs``: the rendered unit, env and options
  files, the venv, the model and draft revision dirs, i.e. the inputs of
  ``core/stamps.py`` ``wanted_stamp``; for a router ``router_restart_inputs``:
  its unit file, package and API key, as ``router_restart_reasons``). The cell
  names what changed ("yes: unit file"), or says "no".

``tests/unit/test_readme.py`` holds the README's block to ``settings_table()``,
``CHANGES`` to every field, and ``server_restart_inputs`` to ``wanted_stamp``.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import json
import re
import sys
import tempfile
import tokenize
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from core.paths import REPO_ROOT
from core.render import render, render_router_unit
from tasks.spec import HostSettings, RouterSettings, RouterSpec, Spec, build_spec

README = REPO_ROOT / "README.md"
START = "<!-- settings-table:start -->"
END = "<!-- settings-table:end -->"
SERVER_DOCS = REPO_ROOT / "group_data" / "all.py"
ROUTER_DOCS = REPO_ROOT / "group_data" / "routers.py"

# The host the rows are computed for: the settings' defaults, the real model profile on 8 GPUs,
# resolved as on ct200 (SM120, P2P working), and a controller environment holding two keys and tokens.
HOST = "gpu-a"
SERVER_BASE: dict[str, Any] = {"model": "kimi-k2.6", "gpu_ids": [0, 1, 2, 3, 4, 5, 6, 7]}
ROUTER_BASE: dict[str, Any] = {"role": "router"}
COMPUTE_CAP = "12.0"
ENVIRON = {"SGLANG_API_KEY": "key-a", "OTHER_API_KEY": "key-b", "HF_TOKEN": "hf-a", "OTHER_HF_TOKEN": "hf-b"}
PIP_WHEEL = "<a pip wheel on the controller>"  # replaced by a real (empty) file while the rows are computed
MULTINODE = {"nnodes": 2, "dist_init_addr": "10.0.0.1:20000"}

# field -> (context, change): the settings the field is changed in (over the base), and the
# change itself, with the keys it needs beside it to stay valid (tp_size equals GPUs x nodes).
CHANGES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # both kinds of host (CommonSettings)
    "venv_python": ({}, {"venv_python": "/usr/local/bin/python3.12"}),
    "get_pip_url": ({}, {"get_pip_url": "https://mirror.example/get-pip.py"}),
    "pip_wheel": ({}, {"pip_wheel": PIP_WHEEL}),
    "api_key_env": ({}, {"api_key_env": "OTHER_API_KEY"}),
    "api_key_required": ({}, {"api_key_required": False}),
    # servers
    "model": ({}, {"model": "sandbox-tiny"}),
    "model_dir": ({}, {"model_dir": "/srv/models/other"}),
    "draft_dir": ({"model": "sandbox-tiny-eagle3"}, {"draft_dir": "/srv/models/other-draft"}),
    "size_margin_gb": ({}, {"size_margin_gb": 10.0}),
    "keep_revisions": ({}, {"keep_revisions": 3}),
    "model_update": ({}, {"model_update": "in-place"}),
    "download_attempts": ({}, {"download_attempts": 3}),
    "download_backoff_s": ({}, {"download_backoff_s": 1.0}),
    "download_read_timeout_s": ({}, {"download_read_timeout_s": 60}),
    "venv_path": ({}, {"venv_path": "/opt/sglang-b/venv"}),
    "keep_envs": ({}, {"keep_envs": 3}),
    "packages": ({}, {"packages": ["sglang==0.5.22"]}),
    "packages_no_deps": ({}, {"packages_no_deps": ["sgl-kernel==0.3.0"]}),
    "compressed_tensors_allow_conflicts": ({}, {"compressed_tensors_allow_conflicts": ["vllm"]}),
    "compressed_tensors_hold": ({}, {"compressed_tensors_hold": ["torch", "sglang"]}),
    "gpu_ids": ({}, {"gpu_ids": [8, 9, 10, 11, 12, 13, 14, 15]}),
    "tp_size": ({}, {"tp_size": 4, "gpu_ids": [0, 1, 2, 3]}),
    "attention_backend": ({}, {"attention_backend": "flashinfer"}),
    "listen_host": ({}, {"listen_host": "127.0.0.1"}),
    "listen_port": ({}, {"listen_port": 30001}),
    "hf_token_env": ({}, {"hf_token_env": "OTHER_HF_TOKEN"}),
    "hf_endpoint": ({}, {"hf_endpoint": "http://hub-mirror.example:8080"}),
    "extra_env": ({}, {"extra_env": {"NCCL_DEBUG": "INFO"}}),
    "extra_server_args": ({}, {"extra_server_args": ["--enable-metrics"]}),
    "unit_name": ({}, {"unit_name": "sglang-b.service"}),
    "server_module": ({}, {"server_module": "sglang_standin"}),
    "readiness_timeout_s": ({}, {"readiness_timeout_s": 7200.0}),
    "start_stall_s": ({}, {"start_stall_s": None}),
    "kv_plan_tolerance": ({}, {"kv_plan_tolerance": 0.0}),
    "perf_tolerance": ({}, {"perf_tolerance": 0.0}),
    "speed_check_max_s": ({}, {"speed_check_max_s": 120.0}),
    "speed_check_tokens": ({}, {"speed_check_tokens": 32}),
    "rollback_on_failure": ({}, {"rollback_on_failure": False}),
    "stale_policy": ({}, {"stale_policy": "fail"}),
    "host_fitness": ({}, {"host_fitness": "warn"}),
    "allreduce_check": ({}, {"allreduce_check": False}),
    "allreduce_timeout_s": ({}, {"allreduce_timeout_s": 300.0}),
    "allreduce_min_busbw_gbs": ({}, {"allreduce_min_busbw_gbs": 10.0}),
    "stale_grace_s": ({}, {"stale_grace_s": 5.0}),
    "protect_units": ({}, {"protect_units": ["embedder.service"]}),
    "protect_process_names": ({}, {"protect_process_names": ["embedder"]}),
    "nnodes": ({}, MULTINODE),
    "node_rank": (MULTINODE, {"node_rank": 1}),
    "dist_init_addr": (MULTINODE, {"dist_init_addr": "10.0.0.2:20000"}),
    "node_group": ({}, {"node_group": {"hosts": [HOST, "gpu-b"], "dist_init_port": 20000}}),
    "role": ({}, {"role": "router"}),
    "router_url": ({}, {"router_url": "http://10.0.0.9:30000", "worker_url": "http://10.0.0.5:30000"}),
    "worker_url": ({"router_url": "http://10.0.0.9:30000", "worker_url": "http://10.0.0.5:30000"},
                   {"worker_url": "http://10.0.0.6:30000"}),
    "drain_timeout_s": ({}, {"drain_timeout_s": 60.0}),
    "min_driver_version": ({}, {"min_driver_version": "570.86"}),
    # routers
    "router_package": ({}, {"router_package": "sglang-router==0.3.1"}),
    "router_module": ({"api_key_env": None}, {"router_module": "smg.launch_router"}),
    "router_venv_path": ({}, {"router_venv_path": "/opt/router-b/venv"}),
    "router_listen_host": ({}, {"router_listen_host": "127.0.0.1"}),
    "router_listen_port": ({}, {"router_listen_port": 30001}),
    "router_prometheus_host": ({}, {"router_prometheus_host": "0.0.0.0"}),
    "router_prometheus_port": ({}, {"router_prometheus_port": 29001}),
    "router_policy": ({}, {"router_policy": "cache_aware"}),
    "router_extra_args": ({}, {"router_extra_args": ["--log-level", "debug"]}),
    "router_unit_name": ({}, {"router_unit_name": "sglang-router-b.service"}),
    "router_readiness_timeout_s": ({}, {"router_readiness_timeout_s": 300.0}),
}
# The router's own row for these: a router's role is 'router' (another value makes it a server).
ROUTER_CHANGES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "role": ({}, {"role": "server", **SERVER_BASE}),
    "router_url": ({}, {"router_url": "http://10.0.0.9:30000"}),
}


# ---------------------------------------------------------------- what a restart is decided from


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def server_restart_inputs(spec: Spec) -> dict[str, str | None]:
    """What a server's restart is decided from (core/stamps.py wanted_stamp), read from the spec:
    the three rendered files, the venv it runs from (its packages: a new package set is a new
    venv), the model's and the draft's revision dirs (their revisions), and the unit itself."""
    rendered = render(spec)
    return {
        "the unit itself": spec.unit_name,
        "unit file": _sha(rendered.unit),
        "env file": _sha(rendered.env),
        "options file": _sha(rendered.options),
        "venv": spec.server_venv,
        "model revision dir": spec.model_path,
        "draft revision dir": spec.draft_path,
    }


def router_restart_inputs(spec: RouterSpec) -> dict[str, str | None]:
    """What a router's restart is decided from (core/stamps.py router_restart_reasons): its
    unit file, its pinned package and its API key."""
    return {
        "the unit itself": spec.router_unit_name,
        "unit file": _sha(render_router_unit(spec)),
        "package": spec.router_package,
        "API key": _sha(spec.auth_header()),
    }


@contextmanager
def pip_wheel_file() -> Iterator[str]:
    """An empty pip wheel file on the controller (pip_wheel must name an existing one)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pip-24.0-py3-none-any.whl"
        path.write_bytes(b"")
        yield str(path)


def built(data: Mapping[str, Any], wheel: str) -> Spec | RouterSpec:
    """The spec of ``data`` as deploy.py has it (a server resolved for an SM120 host)."""
    data = {key: wheel if value == PIP_WHEEL else value for key, value in data.items()}
    spec = build_spec(HOST, data, environ=ENVIRON)
    return spec.resolve(COMPUTE_CAP, True) if isinstance(spec, Spec) else spec


def spec_pair(field: str, router: bool, wheel: str) -> tuple[Spec | RouterSpec, Spec | RouterSpec]:
    """The specs before and after ``CHANGES[field]`` (a router's: ``ROUTER_CHANGES`` first)."""
    context, change = (ROUTER_CHANGES if router and field in ROUTER_CHANGES else CHANGES)[field]
    base = {**(ROUTER_BASE if router else SERVER_BASE), **context}
    return built(base, wheel), built({**base, **change}, wheel)


def restart_inputs(spec: Spec | RouterSpec) -> dict[str, str | None]:
    return router_restart_inputs(spec) if isinstance(spec, RouterSpec) else server_restart_inputs(spec)


def restarts(field: str, router: bool, wheel: str) -> str:
    """The "restarts" cell of ``field``: what a change of it changes among the restart inputs."""
    before, after = spec_pair(field, router, wheel)
    if type(before) is not type(after):
        return "another kind of host: " + ("a server (the table above)" if router else "a router (below)")
    old, new = restart_inputs(before), restart_inputs(after)
    changed = [name for name in old if old[name] != new[name]]
    return "yes: " + ", ".join(changed) if changed else "no"


# ---------------------------------------------------------------- what each key does


def documented(path: Path) -> dict[str, str]:
    """Each key's comment in a group_data file: the comment ending its assignment line and the
    indented comment-only lines right below it; a required key's ``#   NAME - text`` header line
    (and its deeper-indented continuation lines). See the module's docstring."""
    source = path.read_text()
    lines = source.splitlines()
    comments = {tok.start[0]: tok for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT}
    docs: dict[str, str] = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)):
            continue
        row, parts = node.end_lineno or node.lineno, []
        if row in comments:
            parts.append(comments[row].string)
            row += 1
            while row in comments and _comment_only(lines[row - 1], comments[row].start[1]):
                parts.append(comments[row].string)
                row += 1
        docs[node.targets[0].id] = _joined(parts)
    key = None
    for line in lines:
        header = re.match(r"^#\s+([a-z_][a-z0-9_]*)\s+-\s+(.*)$", line)
        more = re.match(r"^#\s{4,}(\S.*)$", line)
        if header:
            key = header.group(1)
            docs.setdefault(key, header.group(2).strip())
        elif key and more and not re.match(r"^#\s+[a-z_][a-z0-9_]*\s+-\s", line):
            docs[key] += " " + more.group(1).strip()
        else:
            key = None
    return docs


def _comment_only(line: str, column: int) -> bool:
    """An indented line holding only the comment that starts at ``column``."""
    return column > 0 and not line[:column].strip()


def _joined(comments: list[str]) -> str:
    return " ".join(c.lstrip("#").strip() for c in comments).strip()


# ---------------------------------------------------------------- the tables


def _value(value: Any) -> str:
    """A default as it is written in group_data (Python, double-quoted strings)."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_value(k)}: {_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def cell(text: str) -> str:
    """Markdown table cell text: code spans kept as written; outside them, characters that would
    end the cell or read as HTML or emphasis escaped."""
    parts = re.split(r"(`[^`]*`)", text.replace("\n", " "))
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(part.replace("|", "\\|"))
        else:
            out.append(part.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
                       .replace("*", "\\*"))
    return "".join(out)


def _default(model: type[BaseModel], name: str) -> str:
    field = model.model_fields[name]
    return "required" if field.is_required() else f"`{_value(field.get_default(call_default_factory=True))}`"


def rows(model: type[BaseModel], docs: Mapping[str, str], router: bool, wheel: str) -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        what = docs.get(name) or field.description or ""
        out.append(f"| `{name}` | {_default(model, name)} | {cell(what)} | {cell(restarts(name, router, wheel))} |")
    return out


def settings_table() -> str:
    """The README's settings reference: a table of the server settings, then one of the router's."""
    server_docs = documented(SERVER_DOCS)
    router_docs = {**server_docs, **documented(ROUTER_DOCS)}
    with pip_wheel_file() as wheel:
        servers = rows(HostSettings, server_docs, False, wheel)
        routers = rows(RouterSettings, router_docs, True, wheel)
    return "\n".join([
        "Server hosts (`HostSettings`; defaults in `group_data/all.py`):",
        "",
        "| name | default | what it does | restarts the server |",
        "|---|---|---|---|",
        *servers,
        "",
        "Router hosts (`role = \"router\"`, `RouterSettings`; defaults in `group_data/routers.py`; "
        "the servers' keys do not apply):",
        "",
        "| name | default | what it does | restarts the router |",
        "|---|---|---|---|",
        *routers,
    ]) + "\n"


# ---------------------------------------------------------------- the README's block


def readme_block(text: str) -> str | None:
    """What README text holds between the markers (None: no markers)."""
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        return None
    return text[start + len(START):end].removeprefix("\n")


def with_block(text: str, table: str) -> str:
    """README text with ``table`` between the markers."""
    start, end = text.index(START), text.index(END)
    return text[: start + len(START)] + "\n" + table + text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.settings_table", description=__doc__.split("\n\n")[0])
    parser.add_argument("--readme", nargs="?", const=str(README), metavar="PATH",
                        help="rewrite the block between the markers in PATH (default README.md) instead of printing")
    args = parser.parse_args(argv)
    table = settings_table()
    if args.readme is None:
        sys.stdout.write(table)
        return 0
    path = Path(args.readme)
    path.write_text(with_block(path.read_text(), table))
    print(f"{path}: settings table written ({table.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
