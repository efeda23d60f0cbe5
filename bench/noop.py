"""Bench (a): a no-op re-run of the deploy on a converged host, side by side with

  ansible: the same checks written as an Ansible playbook (bench/ansible/noop.yml:
           pip with the pinned versions, copy of the unit/env/options/launcher
           files, systemd_service, uri on /health and /v1/models, the model
           marker via slurp, ...), pipelining and ControlPersist on; ansible-core
           comes from its own venv (ANSIBLE_VENV, made by `make bench`);
  floor:   every distinct command the no-op deploy sends to the host, recorded
           (bench/record_commands.py), run in one ssh round trip: the least any
           tool can spend to look at the same things (a fact read again after
           the deploy's prefetch read it is looked at once, as it was before).

Runs are interleaved (deploy, ansible, floor, deploy, ...) so that a busy machine
slows all three alike; each figure is the median.

    python -m bench --part noop
"""

from __future__ import annotations

import json
import os
import re
import runpy
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ANSIBLE_VENV = ROOT / ".sandbox" / "ansible-venv"
PLAYBOOK = Path(__file__).resolve().parent / "ansible" / "noop.yml"
RECAP = re.compile(r"ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)")


def host_spec(name: str, entry: dict):
    """The spec the deploy builds for a sandbox host (group_data/all.py + sandbox.py + its inventory data)."""
    from sandbox import hubd
    from sandbox.inventory_data import connection_data
    from tasks.spec.build import build_spec

    data: dict = {}
    for path in ("group_data/all.py", "group_data/sandbox.py"):
        data.update({k: v for k, v in runpy.run_path(str(ROOT / path)).items() if not k.startswith("_")})
    return build_spec(name, {**data, **connection_data(entry), "hf_endpoint": hubd.ENDPOINT})


def deploy_once(pyinfra_argv: list[str], record: Path | None = None) -> tuple[float, str]:
    argv = ([sys.executable, "-m", "bench.record_commands", str(record), *pyinfra_argv] if record
            else [sys.executable, "-m", "pyinfra", *pyinfra_argv])
    env = None
    if record:
        # the first run writes the bytecode a re-run finds, as it does in a plain shell (a shell with
        # PYTHONDONTWRITEBYTECODE set would have every run compile deploy.py's modules again)
        env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env)
    seconds = time.monotonic() - started
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Grand total" in out, out[-3000:]
    return seconds, out


def distinct(commands: list[str]) -> list[str]:
    """The commands, each once, in the order first sent. A command already run inside an earlier
    one counts as sent: a fact the deploy's prefetch reads (core/factcache.py) and reads again later,
    as it did when each read was a command of its own (then the second read was the same command)."""
    out: list[str] = []
    for command in dict.fromkeys(commands):
        body = command[len("sh -c '"):-1] if command.startswith("sh -c '") and command.endswith("'") else command
        if not any(body in earlier for earlier in out):
            out.append(command)
    return out


def floor_script(commands: list[str]) -> str:
    """The distinct commands, in order, each with its own stdin closed, as one shell script."""
    return "".join(f"{command} </dev/null\n" for command in distinct(commands))


def floor_once(host, script: str) -> float:
    started = time.monotonic()
    subprocess.run([*host.ssh_args(), "sh -s"], input=script, capture_output=True, text=True, check=True)
    return time.monotonic() - started


def ansible_setup(host, spec, folder: Path) -> Path:
    """ansible.cfg, inventory, vars.json and files/ (the deploy's files, read from the host) in ``folder``."""
    from tasks.spec.built import SERVER_LAUNCHER

    (folder / "files").mkdir(parents=True)
    for name, path in (("unit", spec.unit_path), ("options", spec.options_path), ("env", spec.env_path),
                       ("launcher", SERVER_LAUNCHER)):
        (folder / "files" / name).write_text(host.run(["cat", str(path)]).stdout)
    # what the deploy converged: the pinned revision's dir and the package set's venv (paths from the spec)
    marker = json.loads(host.run(["cat", f"{spec.model_path}/.sglang-converge.json"]).stdout)
    variables = {
        "gpu_count": len(spec.gpu_ids), "listen_port": spec.listen_port, "model_dir": spec.model_path,
        "venv_python": spec.venv_python, "venv_path": spec.server_venv, "packages": list(spec.packages),
        "packages_no_deps": list(getattr(spec, "packages_no_deps", []) or []), "model_revision": marker["revision"],
        "unit_name": spec.unit_name, "unit_path": spec.unit_path, "options_path": spec.options_path,
        "env_path": spec.env_path, "launcher_path": str(SERVER_LAUNCHER), "served_name": spec.served_model_name,
    }
    (folder / "vars.json").write_text(json.dumps(variables, indent=1))
    shutil.copy(PLAYBOOK, folder / "noop.yml")
    ssh_key = host.ssh_args()[host.ssh_args().index("-i") + 1]
    (folder / "inventory.ini").write_text(
        f"{host.name} ansible_host={host.address} ansible_user=root ansible_ssh_private_key_file={ssh_key} "
        "ansible_python_interpreter=/usr/bin/python3\n")
    (folder / "ansible.cfg").write_text(
        "[defaults]\nhost_key_checking = False\nretry_files_enabled = False\n"
        "[ssh_connection]\npipelining = True\n"
        "ssh_args = -o ControlMaster=auto -o ControlPersist=60s -o UserKnownHostsFile=/dev/null "
        "-o StrictHostKeyChecking=no -o IdentitiesOnly=yes -o LogLevel=ERROR\n"
        f"control_path_dir = {folder / 'cp'}\n")
    return folder


def ansible_once(folder: Path) -> tuple[float, dict[str, int]]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(folder / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_LOCAL_TEMP": str(folder / "tmp"), "ANSIBLE_HOME": str(folder / "home")}
    started = time.monotonic()
    proc = subprocess.run([str(ANSIBLE_VENV / "bin" / "ansible-playbook"), "-i", "inventory.ini", "noop.yml"],
                          cwd=folder, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    found = RECAP.search(proc.stdout)
    assert proc.returncode == 0 and found, (proc.stdout + proc.stderr)[-3000:]
    ok, changed, _unreachable, _failed = map(int, found.groups())
    return seconds, {"ok": ok, "changed": changed}


def measure(host, pyinfra_argv: list[str], repeats: int) -> dict:
    """noop_s, ansible_noop_s and floor_noop_s (medians of interleaved runs) and their ratios."""
    if not (ANSIBLE_VENV / "bin" / "ansible-playbook").exists():
        raise SystemExit(f"bench: no {ANSIBLE_VENV}/bin/ansible-playbook: run `make bench` (it installs ansible-core)")
    from sandbox import hosts as sandbox_api

    spec = host_spec(host.name, sandbox_api._read_state()["hosts"][host.name])
    runs: dict[str, list[float]] = {"deploy": [], "ansible": [], "floor": []}
    facts: list[int] = []
    with tempfile.TemporaryDirectory(prefix="sgc-bench-noop-") as tmp:
        recorded = Path(tmp) / "commands.json"
        deploy_once(pyinfra_argv, record=recorded)  # also warms both ends' caches
        commands = json.loads(recorded.read_text())
        script = floor_script(commands)
        folder = ansible_setup(host, spec, Path(tmp) / "ansible")
        _, recap = ansible_once(folder)  # the playbook must be a no-op: every task ok, none changed
        assert recap["changed"] == 0, f"the Ansible playbook is not a no-op on {host.name}: {recap}"
        for _ in range(repeats):
            seconds, out = deploy_once(pyinfra_argv)
            runs["deploy"].append(seconds)
            facts.append(len(re.findall(r"Loaded fact", out)))
            seconds, recap = ansible_once(folder)
            assert recap["changed"] == 0, recap
            runs["ansible"].append(seconds)
            runs["floor"].append(floor_once(host, script))
    median = {name: statistics.median(values) for name, values in runs.items()}
    return {
        "noop_s": median["deploy"], "ansible_noop_s": median["ansible"], "floor_noop_s": median["floor"],
        "ansible_over_noop": median["ansible"] / median["deploy"], "noop_over_floor": median["deploy"] / median["floor"],
        "noop_fact_reads": max(facts), "noop_host_commands": len(commands),
        "floor_distinct_commands": len(distinct(commands)), "ansible_tasks": recap["ok"],
    }
