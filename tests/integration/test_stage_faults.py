"""Stage then switch on a converged sandbox host (the shared sgc280): stage.py prepares a package change
and the next model revision beside what serves; the controller killed, or its ssh connection dropped,
while pip builds the new venv leaves the serving server untouched (its venv's package list, the serving
revision's files, the unit file, the same invocation); the next stage finishes without a restart, and
the deploy after it only switches (one restart, nothing installed or downloaded in it).
"""

from __future__ import annotations

import json
import runpy

import pytest

from tests.integration.helpers import (SHARED_CONVERGED_GROUP, ROOT, BackgroundDeploy, grand_total, pyinfra, shared_converged_host,
                                       unit_props, wait_until)
from tests.integration.test_faults_controller import drop_ssh
from tests.integration.test_model_revision import NEW_DIR, OLD_DIR, inodes, model_path_of_the_unit
from tests.integration.test_server_envs import ENVS, EXTRA, invocation, package_list, serving_venv

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group(SHARED_CONVERGED_GROUP)]

TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def host(request):
    host = shared_converged_host(request, TIMINGS)
    yield host
    # the host is shared: its later users expect the default profile, and no other venv or revision
    back = pyinfra("deploy.py", "--data", "keep_envs=1", "--data", "keep_revisions=1", limit=host.name)
    assert back.returncode == 0, back.out[-4000:]
    assert model_path_of_the_unit(host) == OLD_DIR
    assert host.run(f"test -e {NEW_DIR}", check=False).returncode != 0


def change() -> tuple[str, ...]:
    packages = runpy.run_path(str(ROOT / "group_data" / "sandbox.py"))["packages"]
    return ("--data", f"packages={json.dumps([*packages, EXTRA])}", "--data", "model=sandbox-tiny-next")


def serving(host) -> dict:
    """What serves, as a later comparison needs it."""
    venv = serving_venv(host)
    return {"venv": venv, "packages": package_list(host, venv), "files": inodes(host, OLD_DIR),
            "unit": host.run("sha256sum /etc/systemd/system/sglang.service").stdout,
            "model": model_path_of_the_unit(host), "invocation": invocation(host)}


@pytest.mark.parametrize("how", ["killed", "dropped"])
def test_a_fault_during_a_stage_leaves_what_serves_untouched(host, how):
    before = serving(host)
    assert before["model"] == OLD_DIR
    stage = BackgroundDeploy("stage.py", *change(), limit=host.name, env={"PYINFRA_PROGRESS": "off"})
    stage.wait_for("Starting operation: Python environment | pinned packages", timeout=300)
    new_site = f"{ENVS}/*/lib/python3.11/site-packages"
    wait_until(lambda: host.run(f"ls -d {new_site}/torch 2>/dev/null | grep -v ^{before['venv']}/",
                                check=False).stdout.strip(), timeout=300, what="pip installing torch into the new venv")
    if how == "killed":
        stage.kill()
    else:
        drop_ssh(host)
        stage.finish(timeout=120)
        assert stage.proc.returncode != 0, stage.out[-3000:]
    assert serving(host) == before
    assert unit_props(host, "sglang.service")["ActiveState"] == "active"
    assert host.run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health").stdout == "200"


def test_the_next_stage_finishes_without_a_restart_and_the_deploy_only_switches(host):
    before = serving(host)
    # the README's `pyinfra INVENTORY stage.py --dry`: the plan, and nothing moves
    dry = pyinfra("stage.py", *change(), "--dry", limit=host.name)
    assert dry.returncode == 0, dry.out[-4000:]
    assert "plan: download " in dry.out, dry.out[-4000:]
    assert serving(host) == before
    staged = pyinfra("stage.py", *change(), limit=host.name, timeout=1200)
    assert staged.returncode == 0, staged.out[-6000:]
    assert serving(host) == before  # built and downloaded beside it, verified, nothing switched
    assert host.run(f"test -d {NEW_DIR}", check=False).returncode == 0
    assert "fetched" in staged.out, staged.out[-4000:]  # the next revision's own bytes came in the stage
    again = pyinfra("stage.py", *change(), limit=host.name)
    assert again.returncode == 0 and grand_total(again.out)[:2] == (0, 0), again.out[-4000:]
    switched = pyinfra("deploy.py", *change(), limit=host.name)
    assert switched.returncode == 0, switched.out[-6000:]
    assert "restart sglang.service" in switched.out, switched.out[-4000:]
    assert "fetched" not in switched.out, switched.out[-4000:]  # ... and none in the switch
    after = serving(host)
    assert after["invocation"] != before["invocation"] and after["model"] == NEW_DIR
    assert after["packages"] == sorted([*before["packages"], EXTRA])
    assert package_list(host, before["venv"]) == before["packages"] and inodes(host, OLD_DIR) == before["files"]
    # the README's `pyinfra INVENTORY rollback.py --dry`: it names what it would put back, and nothing moves
    dry = pyinfra("rollback.py", "--dry", limit=host.name)
    assert dry.returncode == 0, dry.out[-4000:]
    assert "plan: put back " in dry.out and " and restart sglang.service" in dry.out, dry.out[-4000:]
    assert serving(host) == after
