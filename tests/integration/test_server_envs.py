"""Venvs by content on a converged sandbox host (the shared sgc280): a package change is built into
a venv of its own beside the serving one, which nothing changes; the restart switches the unit to it;
rollback.py switches back and the serving package list is the old one exactly; keep_envs removes the
rest after a good restart.

- the controller killed while pip builds the new venv: the server runs on (same invocation), its
  venv's package list and the unit file are as before;
- the next run finishes the build and restarts once (`venv A -> B`); a third changes nothing;
- rollback.py: the old venv serves again, with the old package list;
- keep_envs = 1 on the default configuration: the other venv is removed, the serving one stays.
"""

from __future__ import annotations

import json
import re
import runpy

import pytest

from tests.integration.helpers import (SHARED_CONVERGED_GROUP, ROOT, BackgroundDeploy, grand_total, pyinfra, shared_converged_host,
                                       unit_props, wait_until)

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group(SHARED_CONVERGED_GROUP)]

TIMINGS: dict[str, float] = {}
ENVS = "/opt/sglang/venv-envs"
EXTRA = "six==1.17.0"  # the package change: a small pure-Python wheel
PACKAGES_PY = ("import importlib.metadata as m, json; "
               "print(json.dumps(sorted(f\"{d.metadata['Name'].lower()}=={d.version}\" for d in m.distributions())))")


@pytest.fixture(scope="module")
def host(request):
    return shared_converged_host(request, TIMINGS)


def serving_venv(host) -> str:
    """The venv the unit file's ExecStart runs."""
    unit = host.run("cat /etc/systemd/system/sglang.service").stdout
    found = re.findall(rf"^ExecStart=({re.escape(ENVS)}/[0-9a-f]{{12}})/bin/python ", unit, re.M)
    assert len(found) == 1, unit
    return found[0]


def package_list(host, venv: str) -> list[str]:
    return json.loads(host.run(f"{venv}/bin/python -c {json.dumps(PACKAGES_PY)}").stdout)


def invocation(host) -> str:
    return host.run("systemctl show -p InvocationID --value sglang.service").stdout.strip()


def test_a_package_change_is_built_beside_the_serving_venv_switched_at_the_restart_and_rolled_back_exactly(host):
    packages = runpy.run_path(str(ROOT / "group_data" / "sandbox.py"))["packages"]
    changed = ("--data", f"packages={json.dumps([*packages, EXTRA])}")
    old = serving_venv(host)
    old_packages, old_invocation = package_list(host, old), invocation(host)
    unit_before = host.run("sha256sum /etc/systemd/system/sglang.service").stdout

    # the controller dies while pip fills the new venv: nothing that serves is touched
    controller = BackgroundDeploy("deploy.py", *changed, limit=host.name)
    controller.wait_for("Starting operation: Python environment | pinned packages", timeout=300)
    new_site = f"{ENVS}/*/lib/python3.11/site-packages"
    wait_until(lambda: host.run(f"ls -d {new_site}/torch 2>/dev/null | grep -v ^{old}/", check=False).stdout.strip(),
               timeout=300, what="pip installing torch into the new venv")
    controller.kill()
    assert invocation(host) == old_invocation and unit_props(host, "sglang.service")["ActiveState"] == "active"
    assert serving_venv(host) == old and host.run("sha256sum /etc/systemd/system/sglang.service").stdout == unit_before
    assert package_list(host, old) == old_packages

    # the next run finishes the build (waiting for the pip left running), then switches once
    switched = pyinfra("deploy.py", *changed, limit=host.name, timeout=1200)
    assert switched.returncode == 0, switched.out[-6000:]
    new = serving_venv(host)
    assert new != old and re.search(rf"restart sglang\.service: .*venv {re.escape(old)} -> {re.escape(new)}",
                                    switched.out), switched.out[-6000:]
    assert package_list(host, new) == sorted([*old_packages, EXTRA])
    assert package_list(host, old) == old_packages  # kept as it was: the rollback point
    assert invocation(host) != old_invocation
    again = pyinfra("deploy.py", *changed, limit=host.name)
    assert again.returncode == 0 and grand_total(again.out)[:2] == (0, 0), again.out[-4000:]
    assert host.run(f"test -d {old}", check=False).returncode == 0  # keep_envs = 2: the serving one and old

    # rollback.py: the previous good configuration, with its venv, serves again
    back = pyinfra("rollback.py", limit=host.name)
    assert back.returncode == 0, back.out[-6000:]
    assert serving_venv(host) == old and package_list(host, old) == old_packages
    assert host.run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health").stdout == "200"

    # the default configuration runs from the old venv: nothing to restart; keep_envs = 1 removes the other
    pruned = pyinfra("deploy.py", "--data", "keep_envs=1", limit=host.name)
    assert pruned.returncode == 0, pruned.out[-6000:]
    assert f"remove 1 old venv(s) beyond keep_envs = 1: {new} (" in pruned.out, pruned.out[-4000:]
    assert "restart sglang.service" not in pruned.out
    assert host.run(f"test -e {new}", check=False).returncode != 0 and serving_venv(host) == old
    settled = pyinfra("deploy.py", limit=host.name)
    assert settled.returncode == 0 and grand_total(settled.out)[:2] == (0, 0), settled.out[-4000:]
