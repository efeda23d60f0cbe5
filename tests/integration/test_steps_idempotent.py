"""Each step on a fresh sandbox host (plain `python -m venv` path, ensurepip,
a stale process outside any service): converge the pipeline one step at a
time; the first run of a step changes the host, the second changes nothing.
"""

import os
import signal
import subprocess
import sys

import pytest

from core.paths import fetch_unit_name
from sandbox import hubd, stale
from tasks.pipeline import SERVER_PIPELINE
from tests.integration.helpers import ROOT, boot_extra_host, grand_total, pyinfra, remove_host, unit_props

pytestmark = pytest.mark.sandbox

# the server pipeline's steps in order (tasks/pipeline.py); a host with no router
# and no restart to time has nothing for drain, register and time_to_ready to do
STEPS = [step.__name__ for step in SERVER_PIPELINE if step.__name__ not in ("drain", "register", "time_to_ready")]
# what the first run of each step must show
FIRST_RUN_SAYS = {
    "preflight": "preflight: 8 x NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "python_env": "Python environment | pinned packages",
    "model": "model: verified 10 files",
    "quant_deps": "quant deps: compressed-tensors is now 0.18.0",
    "stale_gpu": "stale GPU processes: SIGTERM to pid",
    # the sandbox turns it off (group_data/sandbox.py: its CPU cost); tests/integration/test_nccl_check.py runs it
    "nccl_check": "Starting operation: NCCL check | all-reduce check off (allreduce_check = False)",
    "service": "service: start sglang.service",
    "readiness": "Readiness | sglang.service ready",
    "gpu_balance": "gpu_balance: GPUs [0, 1, 2, 3, 4, 5, 6, 7] hold only sglang.service's memory",
}
# how many operations the first run of each step changes: preflight only checks;
# readiness waits (1) only if the server the service step started is still loading
MANY = range(1, 1000)
# the pinned revision's own dir's download unit (<model_dir>-revisions/<revision[:12]>)
FETCH_UNIT = fetch_unit_name(f"/srv/models/{hubd.profile()['served_model_name']}-revisions/{hubd.profile()['revision'][:12]}")
FIRST_RUN_CHANGES = {"preflight": range(0, 1), "python_env": MANY, "model": MANY, "quant_deps": MANY,
                     "stale_gpu": MANY, "nccl_check": range(0, 1), "service": MANY, "readiness": range(1, 3),  # (wait +) last good kept
                     "gpu_balance": range(0, 1)}  # a check: changes nothing


@pytest.fixture(scope="module")
def fresh_host():
    host = boot_extra_host(4)
    try:
        yield host
    finally:
        remove_host(host)


@pytest.fixture(scope="module")
def stale_pid(fresh_host):
    return stale.start_stale(fresh_host, gpu=5, gib=20)


def interrupted_then_attached(fresh_host, steps: str) -> subprocess.CompletedProcess:
    """The controller's ssh session dies mid-download: the download goes on in
    its transient unit, and the next run attaches to it instead of starting over."""
    hubd.THROTTLE_FILE.write_text("4")  # ~10 s for the model: time to pull the plug
    try:
        argv = [sys.executable, "-m", "pyinfra", "-y", "--limit", fresh_host.name, "inventory/sandbox.py",
                "tests/integration/steps_deploy.py"]
        proc = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, "SGC_STEPS": steps}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        for line in proc.stdout:
            if f"model: downloading in {FETCH_UNIT}" in line:
                break
        os.killpg(proc.pid, signal.SIGKILL)  # the operator's laptop loses the connection
        proc.wait()
        assert fresh_host.run(f"systemctl is-active {FETCH_UNIT}").stdout.strip() == "active"
        again = pyinfra("tests/integration/steps_deploy.py", limit=fresh_host.name, env={"SGC_STEPS": steps})
    finally:
        hubd.THROTTLE_FILE.unlink(missing_ok=True)
    assert "model: attaching to the download already running" in again.out, again.out
    return again


@pytest.mark.parametrize("step", STEPS)
def test_step_changes_then_is_a_no_op(fresh_host, stale_pid, step):
    steps = ",".join(STEPS[: STEPS.index(step) + 1])
    if step == "model":
        first = interrupted_then_attached(fresh_host, steps)
    else:
        first = pyinfra("tests/integration/steps_deploy.py", limit=fresh_host.name, env={"SGC_STEPS": steps})
    assert first.returncode == 0, first.out
    assert grand_total(first.out)[0] in FIRST_RUN_CHANGES[step], first.out
    assert FIRST_RUN_SAYS[step] in first.out, first.out
    before = unit_props(fresh_host, "sglang.service")
    second = pyinfra("tests/integration/steps_deploy.py", limit=fresh_host.name, env={"SGC_STEPS": steps})
    assert second.returncode == 0, second.out
    assert grand_total(second.out)[:2] == (0, 0), second.out
    assert unit_props(fresh_host, "sglang.service") == before  # nothing restarted
    # the stale process lives until the stale_gpu step ran (the steps run cumulatively), then is gone
    alive = fresh_host.run(f"test -d /proc/{stale_pid}", check=False).returncode == 0
    assert alive == (STEPS.index(step) < STEPS.index("stale_gpu")), (step, stale_pid)


def test_the_converged_host_serves(fresh_host):
    """Once the readiness step ran (after the step tests, a no-op) the server serves the model."""
    proc = pyinfra("tests/integration/steps_deploy.py", limit=fresh_host.name, env={"SGC_STEPS": ",".join(STEPS)})
    assert proc.returncode == 0, proc.out
    assert FIRST_RUN_SAYS["readiness"] in proc.out, proc.out
    assert fresh_host.run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health").stdout == "200"
    assert '"id":"tiny"' in fresh_host.run("curl -s http://127.0.0.1:30000/v1/models").stdout.replace(" ", "")


def invocation(host) -> str:
    return host.run("systemctl show sglang.service -p InvocationID --value").stdout.strip()


def serves(host) -> bool:
    return (host.run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health").stdout == "200"
            and '"id":"tiny"' in host.run("curl -s http://127.0.0.1:30000/v1/models").stdout.replace(" ", ""))


def test_a_change_that_crashes_at_start_is_rolled_back_and_the_last_good_config_serves(fresh_host, tmp_path):
    """A flag SGLang's parser accepts but the server cannot start with (GPUs 7..14 of 8): the
    deploy puts the last good files back, restarts them, sees them serve, and fails the run
    saying so; the same change again fails the same way without leaving the host down; the
    good settings afterwards change nothing."""
    unit = "/etc/systemd/system/sglang.service"
    good_unit = fresh_host.run(f"cat {unit}").stdout
    kept = fresh_host.run("ls /var/lib/sglang-converge/last-good/sglang; "
                          "stat -c '%a' /var/lib/sglang-converge/last-good/sglang").stdout.split()
    # the configuration, and what SGLang chose and measured with it (core/fingerprint.py, core/speed_gate.py)
    assert kept == ["env", "fingerprint.json", "options", "recorded_at", "speed.json", "stamp.json", "unit", "700"], kept
    (tmp_path / "sandbox.py").write_text('extra_server_args = ["--base-gpu-id", "7"]\n')
    for attempt in (1, 2):
        before = invocation(fresh_host)
        proc = pyinfra("deploy.py", "--group-data", str(tmp_path), limit=fresh_host.name)
        assert proc.returncode != 0, proc.out[-4000:]
        assert "restart sglang.service: unit file changed" in proc.out, (attempt, proc.out[-4000:])
        assert "invalid device ordinal" in proc.out  # the journal line of the failed start
        assert "readiness: rolled back: sglang.service serves the last good configuration again" in proc.out
        # the host: the good unit back, a new process of it serving, the stamp saying what runs
        assert fresh_host.run(f"cat {unit}").stdout == good_unit, attempt
        assert "--base-gpu-id" not in fresh_host.run(f"cat {unit}").stdout
        assert invocation(fresh_host) != before
        assert serves(fresh_host), attempt
    serving = invocation(fresh_host)
    again = pyinfra("deploy.py", "-v", limit=fresh_host.name)  # -v: the no-op reasons are shown
    assert again.returncode == 0 and grand_total(again.out)[:2] == (0, 0), again.out[-4000:]
    assert "sglang.service runs as wanted: no restart" in again.out
    assert invocation(fresh_host) == serving


def test_a_failing_server_is_reported_fast_with_the_journal_line(fresh_host, tmp_path):
    """Another service holds GPU 3 and the settings say to ignore it: SGLang's TP
    memory-balance check kills the server; the deploy says so within a second
    or two, the traceback's last line first, instead of waiting out a timeout."""
    stale.start_stale(fresh_host, gpu=3, gib=40, unit="other-tenant.service", restart_always=True)
    try:
        (tmp_path / "sandbox.py").write_text(
            'stale_policy = "ignore"\n'
            'extra_env = {"PYTHONPATH": "/usr/local/lib/sandbox-gpu", "SANDBOX_LOAD_SECONDS": "3",'
            ' "SGC_TEST_GENERATION": "2"}\n'
        )
        proc = pyinfra("tests/integration/steps_deploy.py", "--group-data", str(tmp_path), limit=fresh_host.name,
                       env={"SGC_STEPS": ",".join(STEPS)})
        assert proc.returncode != 0, proc.out
        assert "cause: RuntimeError: The memory capacity is unbalanced. Some GPUs may be occupied" in proc.out
        failed = [line for line in proc.out.splitlines() if "FAILED: sglang.service is" in line]
        assert failed, proc.out
        seconds = float(failed[0].split(" after ")[1].split(" s")[0])
        # far below the 120 s readiness timeout: the wait ends when the unit fails (make bench
        # measures the reaction itself: ~0.3 s)
        assert seconds < 60, failed[0]
    finally:
        stale.stop_stale(fresh_host, unit="other-tenant.service")
