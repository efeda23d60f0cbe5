"""The README's sandbox commands, run as a reader runs them (`python -m sandbox ...`, `make up/status/down`).

`up --hosts 3` boots sgc1..sgc3 and `down` removes every sandbox host, so this module runs in the last,
serial phase of `make test` (marker runs_last), after every other module's hosts are gone:

    python -m sandbox build                                       # the cached rootfs
    make up HOSTS=3 | make status | make down
    python -m sandbox up --hosts 3
    python -m sandbox status | down | ssh NAME -- CMD
    python -m sandbox kill sgc3                                   # then `up` boots it again on its disk
    python -m sandbox hub-stats [--reset]
    python -m sandbox up --scenario ct200-incident
    python -m sandbox grow-disk sgc1 /srv/models 256
    python -m sandbox up --gpus 8 --gpu-mib MIB --compute-cap 12.0 --p2p OK --gpu-name NAME
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sandbox import hosts as H
from sandbox import rootfs, scenario
from tests.conftest import netns_names
from tests.integration.helpers import newcomer_env, ROOT

pytestmark = [pytest.mark.sandbox, pytest.mark.runs_last]


def cli(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "sandbox", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    proc.out = proc.stdout + proc.stderr  # type: ignore[attr-defined]
    if check:
        assert proc.returncode == 0, proc.out
    return proc


def make(*args: str) -> subprocess.CompletedProcess:
    env = newcomer_env()
    proc = subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def status_rows(text: str) -> dict[str, str]:
    """name -> state from `python -m sandbox status`."""
    return {cols[0]: cols[2] for line in text.splitlines() if len(cols := line.split("\t")) >= 4}


@pytest.fixture(autouse=True)
def nothing_up_before_or_after():
    # the session fixture's sgc1 and sgc2 (tests/conftest.py, booted again by test_sandbox's last
    # test) may be up: any other host would be another module's, still running beside this one
    others = [h.name for h in H.load_hosts() if h.name not in ("sgc1", "sgc2")]
    assert not others, f"another module's hosts are still up: {others} (this module runs last, alone)"
    cli("down")
    yield
    cli("down")


def test_build_up_status_ssh_kill_hub_stats_and_down():
    assert cli("build").stdout.strip() == str(rootfs.rootfs_path())  # cached: printed, not rebuilt
    make("up", "HOSTS=3")
    assert status_rows(make("status").stdout) == {"sgc1": "running", "sgc2": "running", "sgc3": "running"}
    up = cli("up", "--hosts", "3")  # the running hosts are kept
    assert "3 sandbox host(s) up" in up.stdout, up.out
    assert cli("ssh", "sgc2", "--", "hostname").stdout.strip() == "sgc2"
    assert "killed" in cli("kill", "sgc3").stdout
    rows = status_rows(cli("status", check=False).stdout)
    assert rows["sgc3"] != "running" and rows["sgc1"] == "running", rows
    cli("up", "--hosts", "3")  # boots sgc3 again on its kept disk
    assert set(status_rows(cli("status").stdout).values()) <= {"running", "degraded"}
    stats = json.loads(cli("hub-stats", "--reset").stdout)
    assert {"clients", "file_bytes"} <= set(stats), stats
    make("down")
    assert cli("status").stdout.startswith("no sandbox hosts")
    assert not [ns for ns in netns_names() if ns.startswith(f"{H.PREFIX}-ns")]


def test_the_incident_scenario_and_its_disk_fix():
    up = cli("up", "--scenario", "ct200-incident")
    assert "scenario ct200-incident prepared" in up.stdout, up.out
    host = H.get_host("sgc1")
    assert H.free_bytes(host, scenario.MODEL_DISK) < 40 * 10**6  # too small for the ~40 MB model
    grown = cli("grow-disk", "sgc1", scenario.MODEL_DISK, str(scenario.GROWN_DISK_MIB))
    assert f"{scenario.MODEL_DISK} now {scenario.GROWN_DISK_MIB} MiB" in grown.stdout
    assert H.free_bytes(host, scenario.MODEL_DISK) > 200 * 2**20


def test_another_gpu_layout():
    cli("up", "--gpus", "4", "--gpu-mib", "49152", "--compute-cap", "8.9", "--p2p", "NS", "--gpu-name", "NVIDIA L40S")
    out = cli("ssh", "sgc1", "--", "nvidia-smi --query-gpu=index,name,memory.total,compute_cap --format=csv,noheader")
    assert out.stdout.splitlines() == [f"{i}, NVIDIA L40S, 49152 MiB, 8.9" for i in range(4)], out.stdout
