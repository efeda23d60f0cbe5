"""Service: the SGLang systemd unit, its environment and options files.

Fact: ``SystemdUnitState`` (facts/systemd.py) - what systemd says of one unit
(loaded, active, main PID, restarts, enabled), from one ``systemctl show``.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass
from io import StringIO
from pathlib import Path

import jinja2
from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, FunctionCommand, QuoteString, StringCommand, deploy, operation

from facts.files import FileText
from facts.model_dir import ModelDirState
from facts.systemd import SystemdUnitState, UnitState
from facts.venv import VenvPackages
from tasks._common import managed_file, plan, report

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
STATE_DIR = "/var/lib/sglang-converge"
_SAFE_ARG = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def systemd_quote(arg: str) -> str:
    """One ExecStart word: systemd expands % specifiers and $VARS, so escape them."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if _SAFE_ARG.match(arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_env_quote(value: str) -> str:
    value = str(value)
    if value and _SAFE_ARG.match(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


_jinja = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATES)),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
)
_jinja.filters["systemd_env_quote"] = systemd_env_quote


@dataclass(frozen=True)
class Rendered:
    unit: str
    env: str
    options: str

    def digests(self) -> dict[str, str]:
        return {name: sha256(getattr(self, name)) for name in ("unit", "env", "options")}


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def render(spec) -> Rendered:
    """The unit, its environment file and SGLang's options file for a spec."""
    unit = _jinja.get_template("sglang.service.j2").render(
        spec_source="tasks/spec.py",
        served_name=spec.served_model_name,
        tp_size=spec.tp_size,
        nnodes=spec.nnodes,
        node_rank=spec.node_rank,
        env_path=spec.env_path,
        exec_start=" ".join(systemd_quote(arg) for arg in spec.server_argv),
        model_gb=round(spec.model_bytes / 1e9),
        timeout_start_s=int(max(1800, spec.readiness_timeout_s)),
    )
    env = _jinja.get_template("sglang.env.j2").render(unit_name=spec.unit_name, env=spec.unit_env)
    options = _jinja.get_template("sglang-options.yaml.j2").render(options=spec.server_options)
    return Rendered(unit=unit, env=env, options=options)


def packages_digest(packages: dict[str, str]) -> str:
    return sha256(json.dumps(packages, sort_keys=True))


def stamp_path(spec) -> str:
    return f"{STATE_DIR}/{spec.unit_stem}.json"


def wanted_stamp(spec, rendered: Rendered) -> dict:
    """What the running server must have been started with, as of now."""
    packages = host.get_fact(VenvPackages, path=spec.venv_path)
    model_dir = host.get_fact(ModelDirState, path=spec.model_dir)
    marker = model_dir.marker or {}
    return {
        **rendered.digests(),
        "packages": packages_digest(packages),
        "package_versions": packages,
        "model_revision": marker.get("revision"),
    }


def restart_reasons(spec, rendered: Rendered, unit_state: UnitState | None = None) -> list[str]:
    """Why the server must be (re)started now; empty when it runs as wanted.

    The stamp written at the last restart records what the server was started
    with, so a run that changed files but failed before restarting still
    restarts the next time. ``unit_state``: the unit's SystemdUnitState when
    the caller has it already.
    """
    unit = unit_state or host.get_fact(SystemdUnitState, unit=spec.unit_name)
    text = host.get_fact(FileText, path=stamp_path(spec))
    try:
        started_with = json.loads(text) if text else {}
    except ValueError:
        started_with = {}
    wanted = wanted_stamp(spec, rendered)
    reasons = []
    if not unit.running:
        reasons.append(f"{spec.unit_name} is {unit.active_state if unit.exists else 'not installed'}")
    for key, what in (("unit", "unit file"), ("env", "environment file"), ("options", "options file")):
        if started_with.get(key) != wanted[key]:
            reasons.append(f"{what} changed")
    if started_with.get("packages") != wanted["packages"]:
        before = started_with.get("package_versions", {})
        changed = [
            f"{name} {before.get(name, '-')} -> {version}"
            for name, version in sorted(wanted["package_versions"].items())
            if before.get(name) != version
        ]
        changed += [f"{name} {version} -> -" for name, version in sorted(before.items())
                    if name not in wanted["package_versions"]]
        reasons.append("venv packages changed" + (f" ({', '.join(changed[:4])}{', ...' if len(changed) > 4 else ''})"
                                                   if before else ""))
    if started_with.get("model_revision") != wanted["model_revision"]:
        reasons.append(f"model revision {str(started_with.get('model_revision'))[:12]} -> "
                       f"{str(wanted['model_revision'])[:12]}")
    if not unit.running and len(reasons) > 1 and not started_with:
        reasons = [reasons[0]]  # first start: the files are new, no need to list them
    return reasons


# --- operations -----------------------------------------------------------------

def _check_args(state, host, command: str, shown: str) -> bool:
    ok, output = host.run_shell_command(StringCommand(command), print_output=False, print_input=False)
    if ok:
        host.log(f"service: SGLang's parser accepts {shown}", logger.warning)
        return True
    lines = [line for line in output.stderr_lines if line.strip()] or output.stdout_lines
    reason = next((line for line in reversed(lines) if "error" in line.lower()), lines[-1] if lines else "?")
    host.log_styled(f"service: SGLang's parser rejects the new command line: {reason}", fg="red",
                    log_func=logger.error)
    host.log_styled("service: nothing was changed; the running server (if any) keeps serving", fg="red",
                    log_func=logger.error)
    return False


_PARSE_PY = (
    "import sys\n"
    "try:\n"
    "    from sglang.srt.server_args import prepare_server_args\n"
    "except ImportError as e:\n"
    "    print('sglang not importable:', e); sys.exit(0)\n"
    "prepare_server_args(sys.argv[1:])\n"
)


@operation()
def server_args_accepted(spec, rendered: Rendered):
    """
    Before a (re)start, check the new command line with the installed SGLang's
    own parser (``prepare_server_args``), options file included, so a typo in
    an extra argument stops the deploy and the running server keeps serving.

    .. code:: python

        server_args_accepted(spec=spec, rendered=render(spec))
    """
    reasons = restart_reasons(spec, rendered)
    if not reasons:
        host.noop("no restart planned: nothing to check")
        return
    packages = host.get_fact(VenvPackages, path=spec.venv_path)
    if "sglang" not in packages:
        host.noop("sglang is not installed in the venv: its parser cannot check the command line")
        return
    argv = list(spec.server_argv[3:])  # after "python -m module"
    staged = None
    if "--config" in argv:
        # SGLang wants a .yaml suffix on --config files
        staged = spec.options_path.removesuffix(".yaml") + ".sgc-check.yaml"
        argv[argv.index("--config") + 1] = staged
        yield StringCommand("install -d -m 755", QuoteString(spec.options_path.rsplit("/", 1)[0]))
        yield StringCommand("install -m 600 -o root -g root /dev/null", QuoteString(staged))
        yield FileUploadCommand(StringIO(rendered.options), staged)
    command = " ".join(shlex.quote(part) for part in [spec.python_bin, "-c", _PARSE_PY, *argv])
    if staged:
        command = f"{command}; rc=$?; rm -f {shlex.quote(staged)}; exit $rc"
    plan("check the new command line with SGLang's parser (prepare_server_args)")
    yield FunctionCommand(_check_args, (command, " ".join(spec.server_argv[3:9]) + " ..."), {})


@operation()
def unit_installed(unit: str):
    """
    Load the unit file systemd has on disk (daemon-reload only when systemd
    says it is out of date) and enable the unit at boot.

    .. code:: python

        unit_installed(unit="sglang.service")
    """
    state = host.get_fact(SystemdUnitState, unit=unit)
    changed = False
    if state.need_daemon_reload or state.load_state != "loaded":
        plan(f"systemctl daemon-reload ({unit} changed on disk)")
        yield "systemctl daemon-reload"
        changed = True
    if state.unit_file_state != "enabled":
        plan(f"enable {unit} at boot")
        yield StringCommand("systemctl enable", QuoteString(unit))
        changed = True
    if not changed:
        host.noop(f"{unit} is loaded and enabled")


# hosts whose server this run (re)started: readiness must then wait, not trust a stale 200
RESTARTED_THIS_RUN: set[str] = set()


def _restart(state, host, unit: str) -> bool:
    ok, output = host.run_shell_command(StringCommand("systemctl restart", QuoteString(unit)),
                                        print_output=False, print_input=False)
    if ok:
        RESTARTED_THIS_RUN.add(host.name)
    else:
        for line in output.stderr_lines:
            host.log_styled(f"service: {line}", fg="red", log_func=logger.error)
    return ok


@operation()
def server_restarted(spec, rendered: Rendered):
    """
    (Re)start the server only when what it runs changed since it was started
    (unit, env, options, venv packages, model revision) or it is not running;
    record what it was started with.

    .. code:: python

        server_restarted(spec=spec, rendered=render(spec))
    """
    reasons = restart_reasons(spec, rendered)
    if not reasons:
        host.noop(f"{spec.unit_name} runs as wanted: no restart")
        return
    unit = host.get_fact(SystemdUnitState, unit=spec.unit_name)
    verb = "restart" if unit.running else "start"
    plan(f"{verb} {spec.unit_name}: " + "; ".join(reasons))
    report(f"service: {verb} {spec.unit_name}: " + "; ".join(reasons))
    stamp = json.dumps(wanted_stamp(spec, rendered), sort_keys=True)
    yield StringCommand("systemctl reset-failed", QuoteString(spec.unit_name), "2>/dev/null; true")
    yield FunctionCommand(_restart, (spec.unit_name,), {})
    yield StringCommand("install -d -m 700", STATE_DIR)  # stamps hold digests of secret files: root only
    yield FileUploadCommand(StringIO(stamp + "\n"), stamp_path(spec) + ".tmp")
    yield StringCommand("mv -f", QuoteString(stamp_path(spec) + ".tmp"), QuoteString(stamp_path(spec)))


@deploy("Service")
def service(spec):
    """The unit, env file and options file; restart only when something changed."""
    rendered = render(spec)
    secrets = [spec.api_key.get_secret_value()] if spec.api_key else []
    server_args_accepted(spec=spec, rendered=rendered, name="SGLang parser accepts the command line")
    managed_file(dest=spec.options_path, content=rendered.options, mode="600", secrets=secrets,
                 name=f"options file {spec.options_path}")
    managed_file(dest=spec.env_path, content=rendered.env, mode="600", secrets=secrets,
                 name=f"environment file {spec.env_path}")
    managed_file(dest=spec.unit_path, content=rendered.unit, mode="644", secrets=secrets,
                 name=f"unit file {spec.unit_path}")
    unit_installed(unit=spec.unit_name, name=f"{spec.unit_name} loaded and enabled")
    if spec.is_multinode:  # a TP group restarts all its ranks together (tasks/multinode.py)
        from tasks.multinode import group_restarted

        group_restarted(spec=spec, rendered=rendered,
                        name=f"{spec.unit_name} running the wanted config (node group {spec.group_label})")
        return
    server_restarted(spec=spec, rendered=rendered, name=f"{spec.unit_name} running the wanted config")
