"""The NCCL check (tasks/nccl_check.py) on the shared converged sandbox host (sgc280): the sandbox's
group data turns it off (its CPU cost on every fresh host); here it is on. The host's 8 simulated
GPUs span two "sockets" (its nvidia-smi topo -m: SYS between GPUs 0-3 and 4-7), so the unit's env
carries NCCL_P2P_LEVEL=SYS (core/host_fitness.py) and the check runs with it: gloo on the CPU, said
SIMULATED.

- With the server stopped (as before a first start), a rank that never enters its all-reduce
  (SGC_ALLREDUCE_STALL_RANK) fails the run within allreduce_timeout_s, naming the env and what to
  try, before the service step: nothing is started, nothing is kept.
- Without the fault the check passes, its result is kept, the service starts; the next run repeats
  nothing (the kept result's key holds); the positive control of "not run" is the first run's line.
"""

from __future__ import annotations

import json
import runpy

import pytest

from tests.integration.helpers import SHARED_CONVERGED_GROUP, ROOT, grand_total, pyinfra, shared_converged_host, unit_props

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group(SHARED_CONVERGED_GROUP)]

TIMINGS: dict[str, float] = {}
KEPT = "/var/lib/sglang-converge/allreduce-sglang.json"


@pytest.fixture(scope="module")
def host(request):
    return shared_converged_host(request, TIMINGS)


def check_on(tmp_path, name: str, **env) -> str:
    """group_data turning the check on (a short bound), with extra env for the check's ranks."""
    extra = {**runpy.run_path(str(ROOT / "group_data" / "sandbox.py"))["extra_env"], **env}
    (tmp_path / name).mkdir()
    (tmp_path / name / "sandbox.py").write_text(f"extra_env = {extra!r}\nallreduce_check = True\n"
                                                "allreduce_timeout_s = 20\n")
    return str(tmp_path / name)


def test_the_unit_env_has_the_topologys_p2p_level(host):
    env = host.run("cat /etc/sglang/sglang.env").stdout
    assert "NCCL_P2P_LEVEL=SYS" in env, env
    assert "NCCL_P2P_LEVEL=SYS: " in host.converge_out and "meet only across the CPU interconnect" in host.converge_out


def test_the_default_sandbox_host_is_judged_good_on_its_simulated_pcie_tree(host):
    """Issue 37: the sandbox's default host presents a good PCIe tree (sandbox/pcisim.py: IOMMU passthrough,
    no ACS redirect) where the facts read it; the converge judged it and passed (a bad one:
    tests/integration/test_host_fitness_faults.py)."""
    out = host.converge_out
    assert ("preflight: host fitness: GPUs 0, 1, 2, 3, 4, 5, 6, 7 judged on the sandbox's SIMULATED PCIe tree (IOMMU "
            "domain identity; the 12 bridge(s) above them read by its lspci stand-in)") in out, out[-5000:]
    assert "IOMMU and ACS not checked" not in out and "IOMMU translation on" not in out and "ACS redirect on" not in out


def test_a_hung_all_reduce_fails_before_the_start_and_a_good_one_is_kept_once(host, tmp_path):
    host.run("systemctl stop sglang.service; rm -f " + KEPT, timeout=120)
    try:
        hung = pyinfra("deploy.py", "--group-data", check_on(tmp_path, "hung", SGC_ALLREDUCE_STALL_RANK="3"),
                       limit=host.name)
        assert hung.returncode != 0, hung.out[-4000:]
        assert "all-reduce check failed over GPUs 0,1,2,3,4,5,6,7: rank(s)" in hung.out, hung.out[-5000:]
        assert "did not finish an all-reduce within 20 s (a hang); env: CUDA_DEVICE_ORDER=PCI_BUS_ID, " \
               "NCCL_IB_DISABLE=1, NCCL_P2P_LEVEL=SYS; try: the host fitness fixes the preflight names" in hung.out, \
               [line for line in hung.out.splitlines() if "all-reduce" in line or "allreduce" in line]
        assert unit_props(host, "sglang.service")["ActiveState"] == "inactive"  # the service step never ran
        assert host.run(f"test -e {KEPT}", check=False).returncode == 1
        good = pyinfra("deploy.py", "--group-data", check_on(tmp_path, "good"), limit=host.name)
        assert good.returncode == 0, good.out[-5000:]
        kept = json.loads(host.run(f"cat {KEPT}").stdout)
        assert kept["ok"] and kept["backend"] == "gloo (SIMULATED: the sandbox's CPU, no GPU)", kept
        assert kept["gpus"] == [str(i) for i in range(8)] and kept["busbw_gbs"] > 0
        assert kept["env"]["NCCL_P2P_LEVEL"] == "SYS"
        assert unit_props(host, "sglang.service")["ActiveState"] == "active"
        again = pyinfra("deploy.py", "--group-data", check_on(tmp_path, "again"), limit=host.name)
        assert again.returncode == 0 and grand_total(again.out)[:2] == (0, 0), again.out[-4000:]
        assert json.loads(host.run(f"cat {KEPT}").stdout) == kept
    finally:
        if unit_props(host, "sglang.service")["ActiveState"] != "active":
            restored = pyinfra("deploy.py", limit=host.name)  # the next module finds it serving
            assert restored.returncode == 0, restored.out[-4000:]
