"""core/dry_run.py: a dry run that already knows the real run would fail exits
non-zero and names each host and failure in its last lines - pyinfra's CLI
(config.py's hook) and the rollout's --dry alike; a real run is unchanged."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import patch

from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.util import FakeState, create_host

from core import disk as disk_check
from core.dry_run import exit_nonzero_on_known_failures, known_failures, record_known_failure, verdict_lines
from core.ops import fail_command
from facts.ports import PortHolder
from tasks import model, preflight
from tests.unit.test_step_operations import (at_server_venv, EMPTY_DIR, HUB_FILES, disk, gpus, model_kwargs, preflight_facts,
                                             sandbox_spec)

REPO = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).with_name("pyinfra")
MISSING = "model: sandbox/x@0123456789ab: repo sandbox/x not found on the Hub (http://10.77.0.1:18080, HTTP 404)"

Host = namedtuple("Host", "name")  # what pyinfra's failed_hosts holds: hashable, named
FAILING_DEPLOY = f"""
    from pyinfra.api import operation

    from core.ops import fail_command, plan


    @operation()
    def refuses(message: str):
        plan(message)
        yield fail_command(message)


    refuses(message={MISSING!r}, name="model")
    refuses(message="preflight: GPU(s) [4] do not exist\\npreflight: port 30000 is held", name="preflight")
"""
FINE_DEPLOY = """
    from pyinfra import host
    from pyinfra.api import operation


    @operation()
    def fine():
        host.noop("nothing to do")
        yield from ()


    fine(name="fine")
"""


def deploy_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "a_deploy.py"
    path.write_text(textwrap.dedent(text))
    return path


def test_fail_command_while_planning_records_the_failure_per_host_once():
    state = FakeState()  # is_executing False: pyinfra prepares
    with ctx_state.use(state), ctx_host.use(create_host(state, name="sgc1")):
        fail_command(MISSING)
        fail_command("preflight: disk short")
        fail_command(MISSING)  # the same failure again: listed once
    assert known_failures(state) == {"sgc1": [MISSING, "preflight: disk short"]}


def test_fail_command_while_executing_records_nothing_known():
    state = FakeState()
    state.is_executing = True
    with ctx_state.use(state), ctx_host.use(create_host(state, name="sgc1")):
        command = fail_command(MISSING)
    assert command.function.__name__ == "_fail" and command.args == (MISSING,)  # the command as before
    assert known_failures(state) == {}


def planned(op, facts, **kwargs):
    """(the FakeState, the host) once pyinfra-testing's fake host planned ``op`` (the Hub's sizes: HUB_FILES)."""
    state = FakeState()
    host = create_host(state, facts=at_server_venv(facts, kwargs["spec"]) if "spec" in kwargs else facts)
    host.name = "sgc1"  # (create_host names it after its last fact)
    with ctx_state.use(state), ctx_host.use(host), patch.object(disk_check, "hub_files", return_value=HUB_FILES):
        list(op._inner(**kwargs))
    return state, host


def test_a_repo_missing_on_the_hub_is_known_while_planning():
    facts = {"model_dir.ModelDirState": EMPTY_DIR, "files.FreeBytes": disk(10**9)}
    with patch.object(model, "disk_need", side_effect=disk_check.HubError(MISSING.removeprefix("model: "))):
        state, _host = planned(model.model_downloaded, facts, **model_kwargs(sandbox_spec()))
    assert known_failures(state) == {"sgc1": [MISSING]}


def test_every_preflight_problem_is_a_verdict_line():
    holder = PortHolder(pid=77, process_name="python3", unit="other.service")
    state, _host = planned(preflight.gpu_host_can_serve, preflight_facts(gpus(4), holder), spec=sandbox_spec())
    assert verdict_lines(known_failures(state))[1:] == [
        "dry run: the real run would fail on sgc1: preflight: gpu_ids [0, 1, 2, 3, 4, 5, 6, 7]: GPU(s) [4, 5, 6, 7] "
        "do not exist; the host has 4 GPU(s): [0, 1, 2, 3]",
        "dry run: the real run would fail on sgc1: preflight: port 30000 is held by pid 77 (python3 of "
        "other.service), not by sglang.service",
    ]


def test_verdict_lines_one_per_host_and_failure_details_indented():
    lines = verdict_lines({"sgc1": [MISSING, "stale GPU processes, not stopped: stale_policy = 'fail'\n  GPU 0: pid 7"],
                           "sgc2": [], "sgc3": ["preflight: disk short\npreflight: port held"]})
    assert lines == [
        "dry run: nothing was changed; planning already knows the real run would fail on 2 host(s):",
        f"dry run: the real run would fail on sgc1: {MISSING}",
        "dry run: the real run would fail on sgc1: stale GPU processes, not stopped: stale_policy = 'fail'",
        "    GPU 0: pid 7",
        "dry run: the real run would fail on sgc3: preflight: disk short",
        "dry run: the real run would fail on sgc3: preflight: port held",
    ]
    assert verdict_lines({}) == [] and verdict_lines({"sgc1": []}) == []


def test_the_cli_hook_fails_each_host_with_a_known_failure_and_prints_the_verdict_at_exit():
    state = SimpleNamespace(failed_hosts=set())
    sgc1, sgc2, sgc3 = (Host(n) for n in ("sgc1", "sgc2", "sgc3"))
    at_exit, said = [], []
    exit_nonzero_on_known_failures(state, echo=said.append, at_exit=at_exit.append)
    record_known_failure(state, sgc2, MISSING)
    state.failed_hosts.add(sgc3)  # pyinfra's own failure (connect): named too
    assert state.failed_hosts == {sgc2, sgc3} and sgc1 not in state.failed_hosts
    assert said == []  # printed at exit, after pyinfra's own last lines
    (print_verdict,) = at_exit
    print_verdict()
    assert said[1:] == [f"dry run: the real run would fail on sgc2: {MISSING}",
                        "dry run: the real run would fail on sgc3: pyinfra failed it while connecting or planning "
                        "(its error is above)"]


def test_without_the_hook_pyinfras_failed_hosts_stay_as_they_are():
    state = SimpleNamespace(failed_hosts=set())
    record_known_failure(state, Host("sgc1"), MISSING)  # a real run's prepare
    assert state.failed_hosts == set() and known_failures(state) == {"sgc1": [MISSING]}


def pyinfra_local(*args: str) -> subprocess.CompletedProcess:
    """pyinfra's own CLI from the project root (config.py loaded) against @local."""
    proc = subprocess.run([str(PYINFRA), "@local", *args], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYINFRA_PROGRESS": "off"})
    proc.out = proc.stdout + proc.stderr  # type: ignore[attr-defined]
    return proc


def test_pyinfra_dry_exits_1_and_its_last_lines_name_every_known_failure(tmp_path):
    proc = pyinfra_local(str(deploy_file(tmp_path, FAILING_DEPLOY)), "--dry")
    assert proc.returncode == 1, proc.out
    assert f"[@local] plan: {MISSING}" in proc.stderr  # the plan line, as before
    assert proc.stderr.strip().splitlines()[-4:] == [
        "dry run: nothing was changed; planning already knows the real run would fail on 1 host(s):",
        f"dry run: the real run would fail on @local: {MISSING}",
        "dry run: the real run would fail on @local: preflight: GPU(s) [4] do not exist",
        "dry run: the real run would fail on @local: preflight: port 30000 is held",
    ], proc.out


def test_pyinfra_dry_without_a_known_failure_exits_0_and_says_nothing_more(tmp_path):
    proc = pyinfra_local(str(deploy_file(tmp_path, FINE_DEPLOY)), "--dry")
    assert proc.returncode == 0, proc.out
    assert "dry run:" not in proc.out


def test_a_real_run_fails_at_the_command_as_before_with_no_dry_verdict(tmp_path):
    proc = pyinfra_local("-y", str(deploy_file(tmp_path, FAILING_DEPLOY)))
    assert proc.returncode == 1, proc.out
    assert f"[@local] {MISSING}" in proc.out and "dry run:" not in proc.out


DRIVE = """
import sys
from types import SimpleNamespace

import rollout.__main__  # noqa: F401  (gevent's monkey patching first, as python -m rollout)
from rollout.driver import Batch, Driver, HostResult, RolloutReport
from rollout.summary import print_summary

driver = Driver(sys.argv[1], dry=True, deploy_file=sys.argv[2], preflight=False, seed=False)
batches = [Batch("canary", ["@local"])]
report = RolloutReport(results={"@local": HostResult("@local", "canary")}, batches=batches, exit_code=0, dry=True)
try:
    driver._run_batches(batches, report, SimpleNamespace(offers=lambda names: {}, converged=lambda names: None))
finally:
    driver.close()
print_summary(report)
sys.exit(report.exit_code)
"""


def dry_rollout(tmp_path: Path, deploy_text: str) -> subprocess.CompletedProcess:
    """The rollout driver's dry batch (a real pyinfra State) over @local with a deploy file; its summary."""
    inventory = tmp_path / "local_inventory.py"
    inventory.write_text('hosts = ["@local"]\n')
    script = tmp_path / "drive.py"
    script.write_text(DRIVE)
    return subprocess.run([sys.executable, str(script), str(inventory), str(deploy_file(tmp_path, deploy_text))],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), "PYINFRA_PROGRESS": "off", "COLUMNS": "200"})


def test_a_dry_rollout_that_knows_a_failure_exits_1_naming_it_last(tmp_path):
    proc = dry_rollout(tmp_path, FAILING_DEPLOY)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"rollout: plan @local: model, preflight; the real run would fail: {MISSING}" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith("│ @local")]
    assert rows and "would fail" in rows[0], proc.stdout
    assert proc.stdout.strip().splitlines()[-3:] == [
        f"dry run: the real run would fail on @local: {MISSING}",
        "dry run: the real run would fail on @local: preflight: GPU(s) [4] do not exist",
        "dry run: the real run would fail on @local: preflight: port 30000 is held",
    ], proc.stdout


def test_a_dry_rollout_without_a_known_failure_exits_0(tmp_path):
    proc = dry_rollout(tmp_path, FINE_DEPLOY)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "planned" in proc.stdout and "the real run would fail" not in proc.stdout
