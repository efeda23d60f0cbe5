"""Each step on a fresh sandbox host (plain `python -m venv` path, ensurepip,
a stale process outside any service): converge the pipeline one step at a
time; the first run of a step changes the host, the second changes nothing.
"""

import pytest

from sandbox import stale
from tests.integration.helpers import boot_extra_host, grand_total, pyinfra, remove_host, unit_props

pytestmark = pytest.mark.sandbox

STEPS = ["preflight", "python_env", "model", "quant_deps", "stale_gpu", "service", "readiness"]
# what the first run of each step must show (preflight and readiness only check)
FIRST_RUN_SAYS = {
    "preflight": "preflight: 8 x NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "python_env": "Python environment | pinned packages",
    "model": "model: verified 10 files",
    "quant_deps": "quant deps: compressed-tensors is now 0.18.0",
    "stale_gpu": "stale GPU processes: SIGTERM to pid",
    "service": "service: start sglang.service",
    "readiness": "is ready at" ,
}


@pytest.fixture(scope="module")
def fresh_host(sandbox_hosts):
    host = boot_extra_host(4)
    try:
        yield host
    finally:
        remove_host(host)


@pytest.fixture(scope="module")
def stale_pid(fresh_host):
    return stale.start_stale(fresh_host, gpu=5, gib=20)


@pytest.mark.parametrize("step", STEPS)
def test_step_changes_then_is_a_no_op(fresh_host, stale_pid, step):
    steps = ",".join(STEPS[: STEPS.index(step) + 1])
    first = pyinfra("tests/integration/steps_deploy.py", limit=fresh_host.name, env={"SGC_STEPS": steps})
    assert first.returncode == 0, first.out
    if step not in ("preflight", "readiness"):
        assert grand_total(first.out)[0] > 0, first.out
        assert FIRST_RUN_SAYS[step] in first.out, first.out
    before = unit_props(fresh_host, "sglang.service")
    second = pyinfra("tests/integration/steps_deploy.py", limit=fresh_host.name, env={"SGC_STEPS": steps})
    assert second.returncode == 0, second.out
    assert grand_total(second.out)[:2] == (0, 0), second.out
    assert unit_props(fresh_host, "sglang.service") == before  # nothing restarted
    if step == "stale_gpu":
        assert fresh_host.run(f"test -d /proc/{stale_pid}", check=False).returncode != 0
