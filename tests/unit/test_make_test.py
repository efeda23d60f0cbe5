"""`make test` itself, as the README shows it with a part (`make test INTEGRATION=... UNIT=...`): its
phases (lint, `make unit`, the integration tests on xdist workers, the runs_last phase) and what
.ci/run prints from them (.ci/report.py: each phase's seconds, the slowest tests)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.integration.helpers import newcomer_env

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / ".ci" / "report.py"


def report(*args: str) -> str:
    proc = subprocess.run([sys.executable, str(REPORT), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_make_test_with_a_part_runs_its_phases_and_leaves_their_reports(tmp_path):
    """A unit module as the "integration" part (no sandbox host: this runs beside the real integration
    tests) on two xdist workers, another as the unit part; lint runs whole."""
    reports = tmp_path / "reports"
    env = newcomer_env()
    proc = subprocess.run(["make", "--no-print-directory", "test", "INTEGRATION=tests/unit/test_ci_groups.py",
                           "UNIT=tests/unit/test_bench_table.py", f"REPORTS={reports}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert "== integration tests: exit 0; lint + unit tests: exit 0 ==" in out, out[-3000:]
    assert "All checks passed!" in out and "Success: no issues found" in out  # make lint: ruff, mypy
    assert {p.name for p in reports.glob("*.xml")} >= {"unit.xml", "integration.xml"}
    printed = report("--reports", str(reports), "--setup-seconds", "7", "--wall-seconds", "99")
    assert "      7  setup (venv, apt tools)" in printed
    assert "lint, test venvs and unit tests (beside the integration tests)" in printed
    assert "integration tests" in printed and "     99  in all (wall)" in printed
    assert "test_the_scheduler_keeps_a_group_on_one_worker" in printed, printed  # from integration.xml
    assert "test_bench_table" in printed, printed  # from unit.xml


def test_report_prints_the_phases_and_the_slowest_tests_slowest_first(tmp_path):
    (tmp_path / "phases.txt").write_text("lint and unit\t120\nintegration tests\t1500\n")
    (tmp_path / "a.xml").write_text(textwrap.dedent("""\
        <testsuites><testsuite name="pytest">
          <testcase classname="tests.integration.test_a" name="test_slow" time="300.5"/>
          <testcase classname="tests.integration.test_a" name="test_fast" time="0.1"/>
          <testcase classname="tests.integration.test_b" name="test_broken" time="42"><failure message="x"/></testcase>
        </testsuite></testsuites>"""))
    (tmp_path / "b.xml").write_text('<testsuite><testcase classname="tests.unit.test_c" name="test_mid" time="50"/>'
                                    "</testsuite>")
    out = report("--reports", str(tmp_path), "--top", "3")
    assert "    120  lint and unit" in out and "   1500  integration tests" in out
    slowest = out[out.index("slowest tests"):].splitlines()[1:]
    assert slowest == ["  300.5  tests.integration.test_a::test_slow", "   50.0  tests.unit.test_c::test_mid",
                       "   42.0  tests.integration.test_b::test_broken  [failure]"], out
    assert "test_fast" not in out  # positive control above: test_slow, from the same file, is there


def test_report_sums_each_hosts_cpu_and_prints_the_hungriest(tmp_path):
    (tmp_path / "guest-cpu.tsv").write_text("sgc290\t1000.5\nsgc1\t30\nsgc280\t400\nsgc1\t45.5\nbroken line\n")
    out = report("--reports", str(tmp_path), "--top", "2")
    hungriest = out[out.index("hungriest"):].splitlines()
    assert "1476 in all" in out, out  # every line, sgc1 twice (booted by two modules)
    assert hungriest[1:] == [" 1000.5  sgc290", "  400.0  sgc280"], out
    assert "sgc1" not in out  # positive control: sgc280, third of four, is there; sgc1 (76) is not in the top 2


def test_a_removed_guest_leaves_its_cgroups_cpu_in_the_log(tmp_path, monkeypatch):
    from sandbox import hosts

    cgroup = tmp_path / "sgc-sgc7"
    cgroup.mkdir()
    (cgroup / "cpu.stat").write_text("usage_usec 12345678\nuser_usec 10000000\nsystem_usec 2345678\n")
    monkeypatch.setattr(hosts, "_cgroup_dirs", lambda name: [tmp_path / "missing", tmp_path / f"sgc-{name}"])
    log = tmp_path / "guest-cpu.tsv"
    monkeypatch.setenv("SANDBOX_CPU_LOG", str(log))
    hosts._record_cpu("sgc7")
    hosts._record_cpu("sgc8")  # no cgroup: nothing written
    assert log.read_text() == "sgc7\t12.3\n"
    monkeypatch.delenv("SANDBOX_CPU_LOG")
    hosts._record_cpu("sgc7")
    assert log.read_text() == "sgc7\t12.3\n"
