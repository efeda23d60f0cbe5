"""What the server's steps share: its files on the host, the unit loaded and
enabled, SGLang's own parser checking a new command line before a restart,
the local URL it serves on, and "restarted this run" on the run state.

    server_files(spec, rendered)             # unit, options and env file (never someone else's), unit enabled
    server_args_accepted(spec=spec, rendered=rendered)
"""

from __future__ import annotations

import shlex
from pathlib import Path
import time
from io import StringIO
from typing import TYPE_CHECKING

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, FunctionCommand, QuoteString, StringCommand, operation

from core.fingerprint import wait_args as fingerprint_wait_args
from core.ops import managed_file, plan, record_failure
from core.paths import REMOTE_SRC_DIR
from core.render import SERVER_LAUNCHER_SCRIPT, Rendered, packages_digest, sha256
from core.runstate import run_state
from core.stamps import read_stamp, restart_reasons, stamp_path
from facts.systemd import SystemdUnitState
from facts.venv import VenvPackages
from tasks.spec import local_http_url
from tasks.spec.built import SERVER_LAUNCHER

if TYPE_CHECKING:
    from tasks.spec import Spec

WAIT_SCRIPT = REMOTE_SRC_DIR / "wait_ready.py"  # run on the host by the readiness steps


def start_progress_args(spec: Spec) -> list[str]:
    """wait_ready.py's start-progress flags: this host's TP ranks, and the stall bound (start_stall_s)."""
    per_node = max(spec.tp_size // spec.nnodes, 1)
    args = ["--ranks", str(per_node), "--first-rank", str(spec.node_rank * per_node)]
    return args + (["--stall", str(spec.start_stall_s)] if spec.start_stall_s else [])


def local_url(spec: Spec) -> str:
    """Where the server answers on its own host."""
    return local_http_url(spec.listen_host, spec.listen_port)


def restarted_this_run(host_name: str) -> bool:
    """This run (re)started the host's server (or router): readiness must wait, not trust a stale 200."""
    return host_name in run_state().restarted


def mark_restarted(state, host) -> bool:
    """FunctionCommand body: record that this run (re)started the host's server, and when."""
    run = run_state(state)
    run.restarted.add(host.name)
    run.restarted_at[host.name] = time.monotonic()
    return True


def server_files(spec: Spec, rendered: Rendered) -> None:
    """The unit, options and env files (root-only where they hold the key); the unit loaded and enabled."""
    secrets = [spec.api_key.get_secret_value()] if spec.api_key else []
    # Each refuses to overwrite a file there without our marker line (someone else's unit or file).
    # The unit file first: a foreign unit (unit_name = 'docker.service', say) stops the host before
    # anything is written. Nothing loads or restarts before all three are written.
    managed_file(dest=spec.unit_path, content=rendered.unit, mode="644", secrets=secrets,
                 setting="unit_name", name=f"unit file {spec.unit_path}")
    managed_file(dest=spec.options_path, content=rendered.options, mode="600", secrets=secrets,
                 setting="unit_name", name=f"options file {spec.options_path}")
    managed_file(dest=spec.env_path, content=rendered.env, mode="600", secrets=secrets,
                 setting="unit_name", name=f"environment file {spec.env_path}")
    # shared by the host's servers, which may write it at the same moment: a temp file each
    managed_file(dest=SERVER_LAUNCHER, content=SERVER_LAUNCHER_SCRIPT.read_text(), mode="644",
                 writer=spec.unit_stem, name=f"launcher {SERVER_LAUNCHER} (keeps the API key out of the journal)")
    unit_installed(unit=spec.unit_name, name=f"{spec.unit_name} loaded and enabled")


_ACCEPTED = "sglang_args_accepted"  # run-state extension: (host, command line digest) the parser accepted


def _check_args(state, host, command: str, shown: str, key: str = "") -> bool:
    ok, output = host.run_shell_command(StringCommand(command), print_output=False, print_input=False)
    if ok:
        host.log(f"service: SGLang's parser accepts {shown}", logger.warning)
        if key:
            run_state(state).extension(_ACCEPTED, set).add((host.name, key))
        return True
    lines = [line for line in output.stderr_lines if line.strip()] or output.stdout_lines
    reason = next((line for line in reversed(lines) if "error" in line.lower()), lines[-1] if lines else "?")
    host.log_styled(f"service: SGLang's parser rejects the new command line: {reason}", fg="red",
                    log_func=logger.error)
    record_failure(state, host, f"service: SGLang's parser rejects the new command line: {reason}", lines)
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
def server_args_accepted(spec: Spec, rendered: Rendered):
    """
    Before a (re)start, check the new command line with the installed SGLang's
    own parser (``prepare_server_args``), options file included, so a typo in
    an extra argument stops the deploy and the running server keeps serving.
    Once per run and command line (the drain step's check serves the service
    step), and not when the running server was started with this very unit,
    options file and venv packages (only its environment changed, say).

    .. code:: python

        server_args_accepted(spec=spec, rendered=render(spec))
    """
    unit = host.get_fact(SystemdUnitState, unit=spec.unit_name)
    reasons = restart_reasons(spec, rendered, unit_state=unit)
    if not reasons:
        host.noop("no restart planned: nothing to check")
        return
    packages = host.get_fact(VenvPackages, path=spec.server_venv)
    if "sglang" not in packages:
        host.noop("sglang is not installed in the venv: its parser cannot check the command line")
        return
    # the command line (in the unit file), the options file and the installed packages, as checked
    key = sha256("\n".join([sha256(rendered.unit), sha256(rendered.options), packages_digest(packages)]))
    if (host.name, key) in run_state().extension(_ACCEPTED, set):
        host.noop("SGLang's parser accepted this command line earlier in this run")
        return
    started_with = read_stamp(stamp_path(spec))
    if unit.running and [started_with.get(k) for k in ("unit", "options", "packages")] == \
            [sha256(rendered.unit), sha256(rendered.options), packages_digest(packages)]:
        host.noop("the running server was started with this command line and these packages: "
                  "nothing new for SGLang's parser")
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
    yield FunctionCommand(_check_args, (command, " ".join(spec.server_argv[3:9]) + " ...", key), {})


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


def script_command(spec: Spec, script: Path, args: list[str]) -> str:
    """A remote/ script run by the venv's python on the host (its text as -c: nothing uploaded), with the
    options file it reads the API key from (never argv), quoted for the shell. Always the unit's options
    file, also when this run's settings hold no key: a rollback restores the last good configuration's
    file, key included, and its readiness must ask with that key (without it: 401, a healthy rollback
    reported failed). The scripts send no key when the file has none."""
    argv = [spec.venv_python, "-u", "-c", script.read_text(), *args, "--options-file", spec.options_path]
    return " ".join(shlex.quote(arg) for arg in argv)


def wait_command(spec: Spec, timeout: float) -> str:
    """remote/wait_ready.py on the host: until ready (at most ``timeout`` s), then /server_info kept."""
    return script_command(spec, WAIT_SCRIPT, [
        "--unit", spec.unit_name, "--url", local_url(spec), "--served-name", spec.served_model_name,
        "--timeout", str(timeout), *start_progress_args(spec), *fingerprint_wait_args(spec),
    ])
