"""The integration tests' host groups under pytest-xdist (tests/conftest.py): the modules that share a
host run on one worker, and the scheduler really keeps a group together."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import group_of_nodeid
from tests.integration.fleet_helpers import FLEET_GROUP
from tests.integration.helpers import REAL_GROUP, SGC1_GROUP, SHARED_CONVERGED_GROUP

ROOT = Path(__file__).resolve().parents[2]
INTEGRATION = sorted((ROOT / "tests" / "integration").glob("test_*.py"))

# what in a module's source shows it uses a shared host, and the group that host's modules must share
SHARED_HOSTS = {
    r"\bshared_converged_host\(": SHARED_CONVERGED_GROUP,  # sgc280
    r"\bshared_real_host\(": REAL_GROUP,  # sgc290
    r"\bfleet\(request\)": FLEET_GROUP,  # sgc10-14
    r"\bsandbox_hosts\b|\[\"make\", \"demo\"\]": SGC1_GROUP,  # sgc1 (and sgc2); `make demo REAL=1` uses sgc290
}


@pytest.mark.parametrize("pattern, group", SHARED_HOSTS.items(), ids=SHARED_HOSTS.values())
def test_every_module_that_uses_a_shared_host_is_in_its_group(pattern, group):
    users = [p for p in INTEGRATION if re.search(pattern, p.read_text())]
    assert len(users) >= 2, users  # positive control: the pattern finds the modules that share it
    groups = {p.name: group_of_nodeid(f"tests/integration/{p.name}::test_x") for p in users}
    assert set(groups.values()) == {group}, groups


def test_a_module_without_a_group_mark_is_a_group_of_its_own():
    assert group_of_nodeid("tests/integration/test_get_pip.py::test_x") == "test_get_pip"
    assert group_of_nodeid("tests/integration/test_rollout.py::test_x") == FLEET_GROUP  # positive control


def test_the_scheduler_keeps_a_group_on_one_worker(tmp_path):
    """Two modules of one group and two of their own, on two workers: the group's four tests run on one
    worker (xdist's own loadgroup would scatter them under pytest 9.2: its node-id suffix is lost)."""
    pytest.importorskip("xdist")
    pkg = tmp_path / "suite"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(tmp_path)!r}, {str(ROOT)!r}]
        from tests.conftest import pytest_xdist_make_scheduler  # noqa: F401
    """))
    for name, group in (("a", "shared"), ("b", None), ("c", "shared"), ("d", None)):
        mark = f"pytestmark = [pytest.mark.xdist_group({group!r})]" if group else ""
        (pkg / f"test_{name}.py").write_text(textwrap.dedent(f"""
            import os, time, pytest
            {mark}
            def test_1(): time.sleep(0.2); print("WORKER", os.environ["PYTEST_XDIST_WORKER"])
            def test_2(): time.sleep(0.2); print("WORKER", os.environ["PYTEST_XDIST_WORKER"])
        """))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder",
                           "-v", "-p", "no:cacheprovider", "suite"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = re.findall(r"\[(gw\d)\] \[\s*\d+%\] PASSED suite/test_(\w)\.py::test_\d", proc.stdout)
    assert len(ran) == 8, proc.stdout
    workers = {module: {gw for gw, m in ran if m == module} for module in "abcd"}
    assert all(len(w) == 1 for w in workers.values()), workers  # a module on one worker...
    assert workers["a"] == workers["c"], workers  # ...and the group's two modules on the same one
    assert len({gw for gw, _ in ran}) == 2, ran  # positive control: both workers got work
