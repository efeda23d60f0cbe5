"""tests/conftest.py's CI rule: under CI=true a skipped test fails the run and is
named with its reason; without CI a skip is still a skip (exit 0).

Each case runs pytest in a subprocess on a tiny test file, with tests/conftest.py
loaded as a plugin (-p tests.conftest), as `make test` loads it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARK_REASON = "planted skip reason 7f3a"
FIXTURE_REASON = "planted fixture skip 91c2"
SECTION = "skipped test(s) fail the run"

TINY = f"""
import pytest

@pytest.fixture
def unavailable():
    pytest.skip("{FIXTURE_REASON}")

def test_passes():
    assert 1 + 1 == 2

@pytest.mark.skip(reason="{MARK_REASON}")
def test_marked_skip():
    raise AssertionError("never runs")

def test_fixture_skips(unavailable):
    raise AssertionError("never runs")
"""


def run_pytest(tmp_path: Path, source: str, ci: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "test_tiny.py").write_text(textwrap.dedent(source))
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(ROOT)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-rs",
         str(tmp_path / "test_tiny.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_under_ci_a_skip_fails_the_run_and_names_the_test_and_reason(tmp_path):
    proc = run_pytest(tmp_path, TINY, ci="true")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 passed, 2 skipped" in out, out  # the hook failed the run, not a test
    assert f"CI=true: 2 {SECTION}" in out, out
    assert f"SKIPPED (a failure under CI) test_tiny.py::test_marked_skip: {MARK_REASON}" in out, out
    assert f"SKIPPED (a failure under CI) test_tiny.py::test_fixture_skips: {FIXTURE_REASON}" in out, out


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_without_ci_a_skip_is_a_skip(tmp_path, ci):
    proc = run_pytest(tmp_path, TINY, ci=ci)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "1 passed, 2 skipped" in out, out
    assert MARK_REASON in out  # positive control: pytest's own -rs summary names the skip...
    assert SECTION not in out  # ...but the CI section is not there
    assert SECTION in run_pytest(tmp_path, TINY, ci="true").stdout  # (which the same run prints under CI)


@pytest.mark.parametrize("ci", ["1", "yes", "TRUE"])
def test_other_spellings_of_ci_count(tmp_path, ci):
    assert run_pytest(tmp_path, TINY, ci=ci).returncode == 1


def test_under_ci_a_run_without_skips_passes_and_failures_stay_failures(tmp_path):
    clean = run_pytest(tmp_path, "def test_passes():\n    assert True\n", ci="true")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "1 passed" in clean.stdout and SECTION not in clean.stdout
    failing = run_pytest(tmp_path, "def test_fails():\n    assert False\n", ci="true")
    assert failing.returncode == 1 and "1 failed" in failing.stdout, failing.stdout
