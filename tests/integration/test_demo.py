"""`make demo`, the README's first command, run as a newcomer runs it: the same entry point (make, its
setup, `python -m sandbox.demo`), its output read for the story's milestones.

The demo checks its own chapters (sandbox/demo.py: `demo: milestone: ...` lines, exit 1 when one does
not hold); this test holds it to them, to the lines of the deploy that prove them, and to leaving
nothing behind. It shares the xdist group of test_sandbox.py: both use sgc1, and the group's order
runs this module first, before test_sandbox boots sgc1 and sgc2 for the rest of the worker's session.
"""

from __future__ import annotations

import subprocess

import pytest

from sandbox import hosts as H
from tests.conftest import netns_names
from tests.integration.helpers import newcomer_env, ROOT, SGC1_GROUP

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group(SGC1_GROUP)]

MILESTONES = (
    "demo: milestone: the plan already knows run 1 will be refused for the disk (the dry run exits 1 saying so)",
    "demo: milestone: run 1 refused at the disk check before any download (/srv/models is still empty)",
    "demo: milestone: run 2 converged: compressed-tensors upgraded as SGLang requires (0.18.0, "
    "compressed-tensors==0.18.0)",
    "demo: milestone: run 2: the server is ready",
    "demo: milestone: run 3 changed nothing (no operation changed the host)",
)


@pytest.fixture(scope="module")
def demo() -> subprocess.CompletedProcess:
    if H.host_name(1) in {h.name for h in H.load_hosts()}:
        pytest.fail("sgc1 is already up: the demo boots its own sgc1 (run `python -m sandbox down` first)")
    # a newcomer's shell: no make variables of an outer make (`make test` runs this test)
    env = newcomer_env()
    proc = subprocess.run(["make", "demo"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    proc.out = proc.stdout + proc.stderr  # type: ignore[attr-defined]
    return proc


def test_make_demo_exits_0_and_says_every_milestone_in_order(demo):
    out = demo.out
    assert demo.returncode == 0, out[-6000:]
    positions = [out.find(line) for line in MILESTONES]
    assert -1 not in positions, (dict(zip(MILESTONES, positions, strict=True)), out[-6000:])
    assert positions == sorted(positions), positions


def test_the_milestones_rest_on_the_deploys_own_lines(demo):
    out = demo.out
    plan = out.index("2. the plan")
    run1, run2, run3 = (out.index(f"{n}. run {k}") for n, k in ((3, 1), (5, 2), (6, 3)))
    # the plan says, from its facts, that the real run would be refused, and exits 1
    assert ("dry run: the real run would fail on sgc1: preflight: not enough disk for "
            "sandbox/tiny-kimi-int4@0123456789ab: need 0.040 GB") in out[plan:run1], out[plan:run1][-4000:]
    assert "(exit 1, " in out[plan:run1]
    # run 1 is refused before the first change
    assert "preflight: not enough disk for sandbox/tiny-kimi-int4@0123456789ab" in out[run1:run2]
    assert "Starting operation: Python environment" not in out[run1:run2]
    assert "Starting operation: Python environment" in out[run2:run3]  # positive control: run 2 gets there
    # run 2: the incident's fix
    assert "quant deps: pip install compressed-tensors==0.18.0 because sglang 0.5.23 requires" in out[run2:run3]
    assert "stale GPU processes: systemctl stop embedder.service" in out[run2:run3]
    assert "ready: sglang.service serves tiny at http://127.0.0.1:30000" in out[run2:run3]
    # the server answered the chat request (the stand-in: simulated, and said so)
    assert "7. the server answers (SIMULATED SGLang stand-in, real HTTP)" in out
    assert "'role': 'assistant'" in out[out.index("7. the server answers"):]


def test_the_demo_leaves_no_sandbox_host_or_namespace_behind(demo):
    assert "demo: sgc1 removed" in demo.out
    assert "sgc1" not in {h.name for h in H.load_hosts()}
    assert H.netns_name(1) not in netns_names()
    assert not (H.VAR_DIR / "sgc1").exists()
