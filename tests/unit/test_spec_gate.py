"""config.py + tasks/spec_gate.py: `pyinfra INVENTORY deploy.py` stops on bad
settings before it connects to any host."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tasks.spec_gate import runs_this_deploy

REPO = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).with_name("pyinfra")


def run_deploy(tmp_path: Path, port_setting: str) -> subprocess.CompletedProcess:
    # 127.0.0.1:1 refuses ssh at once: a run that connects says so in its output.
    inventory = tmp_path / "gpus.py"
    inventory.write_text(textwrap.dedent(f"""
        gpus = [("gpu-x", {{
            "ssh_hostname": "127.0.0.1", "ssh_port": 1,
            "model": "sandbox-tiny", "gpu_ids": [0, 1], "tp_size": 2,
            "api_key_env": "GATE_TEST_KEY", {port_setting}
        }})]
    """))
    env = dict(os.environ, GATE_TEST_KEY="sk-gate-test")
    return subprocess.run(
        [str(PYINFRA), str(inventory), "deploy.py", "--dry"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )


def test_bad_settings_stop_before_connecting(tmp_path):
    result = run_deploy(tmp_path, '"listen_port": 70000')
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "gpu-x: listen_port = 70000" in out
    assert "Connecting to hosts" not in out


def test_good_settings_go_on_to_connect(tmp_path):
    result = run_deploy(tmp_path, '"listen_port": 30000')
    out = result.stdout + result.stderr
    assert "invalid settings" not in out
    assert "Connecting to hosts" in out


def test_only_this_projects_deploy_is_gated():
    assert runs_this_deploy(["pyinfra", "inventory/ct200.py", "deploy.py", "--dry"])
    assert runs_this_deploy(["pyinfra", "inv.py", str(REPO / "deploy.py")])
    assert not runs_this_deploy(["pyinfra", "inventory/ct200.py", "exec", "--", "true"])
    assert not runs_this_deploy(["pyinfra", "@local", "other/deploy.py"])
