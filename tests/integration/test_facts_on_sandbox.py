"""Every fact, gathered over ssh from a real sandbox host (systemd, sshd, venvs)."""

import pytest

from sandbox import stale
from tests.integration.helpers import boot_extra_host, facts, remove_host

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def host():
    host = boot_extra_host(6)
    try:
        yield host
    finally:
        remove_host(host)


def test_every_fact_over_ssh(host):
    host.run("python3 -m venv --without-pip /opt/facts-nopip && python3 -m venv /opt/facts-pip")
    pid = stale.start_stale(host, gpu=3, gib=2, unit="facts-holder.service", restart_always=True)
    try:
        got = facts(
            host.name,
            "facts.gpu.NvidiaGpus",
            "facts.gpu.GpuP2P",
            "facts.gpu.SimulatedGpus",
            "facts.gpu.GpuComputeProcesses",
            "facts.files.FreeBytes", "path=/srv/not/yet/there",
        )
        gpus = got["facts.gpu.NvidiaGpus"]
        assert [gpu["index"] for gpu in gpus] == list(range(8))
        assert {gpu["compute_cap"] for gpu in gpus} == {"12.0"}
        assert gpus[3]["memory_used_mib"] == 2048 and gpus[2]["memory_used_mib"] == 0
        p2p = got["facts.gpu.GpuP2P"]
        assert p2p["gpus"] == list(range(8)) and p2p["status"][0][1] == "OK" and p2p["status"][1][1] == "X"
        assert got["facts.gpu.SimulatedGpus"] is True
        held = got["facts.gpu.GpuComputeProcesses"]
        assert [(p["pid"], p["used_mib"], p["unit"]) for p in held] == [(pid, 2048, "facts-holder.service")]
        assert held[0]["gpu_uuid"] == gpus[3]["uuid"]
        space = got["facts.files.FreeBytes"]
        assert space["path"] == "/srv" and space["free_bytes"] > 0 and space["total_bytes"] >= space["free_bytes"]

        venvs = facts(
            host.name,
            "facts.venv.VenvState", "path=/opt/facts-nopip",
        )["facts.venv.VenvState"]
        assert venvs["exists"] and venvs["pip_version"] is None and venvs["python_version"].startswith("3.11")
        with_pip = facts(host.name, "facts.venv.VenvState", "path=/opt/facts-pip")["facts.venv.VenvState"]
        assert with_pip["pip_version"] and with_pip["has_ensurepip"] is True
        absent = facts(host.name, "facts.venv.VenvState", "path=/opt/none")["facts.venv.VenvState"]
        assert absent["exists"] is False
        packages = facts(host.name, "facts.venv.VenvPackages", "path=/opt/facts-pip")["facts.venv.VenvPackages"]
        assert packages["pip"] == with_pip["pip_version"]
        unit = facts(host.name, "facts.systemd.SystemdUnitState", "unit=facts-holder.service")["facts.systemd.SystemdUnitState"]
        assert unit["active_state"] == "active" and unit["main_pid"] == pid and unit["load_state"] == "loaded"
        missing = facts(host.name, "facts.systemd.SystemdUnitState", "unit=nope.service")["facts.systemd.SystemdUnitState"]
        assert missing["load_state"] == "not-found"
        port = facts(host.name, "facts.ports.PortListener", "port=22")["facts.ports.PortListener"]
        assert port["process_name"] == "sshd" and port["unit"] == "ssh.service"
    finally:
        stale.stop_stale(host, unit="facts-holder.service")
        host.run("rm -rf /opt/facts-nopip /opt/facts-pip")
