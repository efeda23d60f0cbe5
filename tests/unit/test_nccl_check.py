"""The NCCL check (tasks/nccl_check.py, remote/allreduce_check.py): the command the step yields, run
here by bash with the parser venv's CPU torch (gloo over 2 "GPUs", as on the sandbox's simulated
ones): a pass is kept with its key and bandwidth; a rank that never enters its all-reduce fails
within the bound, naming the env and what to try, and keeps nothing. The noop cases are fixtures
(tests/fixtures/ops/tasks.nccl_check.allreduce_checked/)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

from tasks.nccl_check import check_command, check_key

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".sandbox" / "sglang-venv" / "bin" / "python"  # torch 2.13.0 (CPU): make test-venvs


def test_the_key_changes_with_what_the_check_ran_on():
    base = check_key("580.95.05", {"iommu": "pt"}, ["00000000:06:00.0", "00000000:07:00.0"], {"NCCL_P2P_LEVEL": "SYS"})
    assert base == check_key("580.95.05", {"iommu": "pt"}, ["00000000:06:00.0", "00000000:07:00.0"],
                             {"NCCL_P2P_LEVEL": "SYS", "HF_HUB_OFFLINE": "1"})  # not an NCCL variable
    for changed in (check_key("590.10", {"iommu": "pt"}, ["00000000:06:00.0", "00000000:07:00.0"], {"NCCL_P2P_LEVEL": "SYS"}),
                    check_key("580.95.05", {}, ["00000000:06:00.0", "00000000:07:00.0"], {"NCCL_P2P_LEVEL": "SYS"}),
                    check_key("580.95.05", {"iommu": "pt"}, ["00000000:06:00.0"], {"NCCL_P2P_LEVEL": "SYS"}),
                    check_key("580.95.05", {"iommu": "pt"}, ["00000000:06:00.0", "00000000:07:00.0"], {})):
        assert changed != base


def test_the_check_passes_and_keeps_its_result_and_a_stalled_rank_fails_within_the_bound(tmp_path):
    assert PYTHON.exists(), "make test-venvs builds it (make test does, before the unit tests)"
    out = tmp_path / "allreduce.json"
    command = check_command(str(PYTHON), [0, 1], {"NCCL_P2P_LEVEL": "SYS"}, "k1", str(out), 60.0, None, True)
    assert command.startswith("d=$(mktemp -d) && printf %s ") and "--simulated" in command
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kept = json.loads(out.read_text())
    assert kept["ok"] and kept["key"] == "k1" and kept["busbw_gbs"] > 0 and kept["gpus"] == ["0", "1"]
    assert kept["backend"] == "gloo (SIMULATED: the sandbox's CPU, no GPU)" and kept["env"] == {"NCCL_P2P_LEVEL": "SYS"}
    assert oct(out.stat().st_mode & 0o777) == "0o600"
    out.unlink()
    # rank 0 stalls: the other two wait on it in their all-reduce. A hang, also once the bound kills them (one
    # after another, the waiting ranks saw rank 0 go and failed with "Connection closed by peer": reported
    # as ranks that exited with an error, a cold CI run's test_nccl_check failure)
    stalled = check_command(str(PYTHON), [0, 1, 2], {"SGC_ALLREDUCE_STALL_RANK": "0"}, "k2", str(out), 5.0, None, True)
    proc = subprocess.run(["bash", "-c", stalled], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "all-reduce check failed over GPUs 0,1,2: rank(s) [0, 1, 2] did not finish an all-reduce within 5 s " \
        "(a hang)" in proc.stderr, proc.stderr
    assert "try: the host fitness fixes the preflight names" in proc.stderr
    assert not out.exists()  # a failure keeps nothing: the next run checks again


def test_a_rank_that_fails_is_named_with_its_error_and_one_the_kernel_killed_with_its_signal(tmp_path):
    """Not "did not start within 600 s" (what a rank killed by the OOM killer read as before): the rank and why."""
    assert PYTHON.exists(), "make test-venvs builds it (make test does, before the unit tests)"
    out = tmp_path / "allreduce.json"
    failing = check_command(str(PYTHON), [0, 1], {"SGC_ALLREDUCE_FAIL_RANK": "1"}, "k3", str(out), 60.0, None, True)
    proc = subprocess.run(["bash", "-c", failing], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ("all-reduce check failed over GPUs 0,1: rank(s) [1] exited with an error (rank 1: RuntimeError: "
            "SIMULATED rank failure (SGC_ALLREDUCE_FAIL_RANK))") in proc.stderr, proc.stderr
    assert not out.exists()
    spec = importlib.util.spec_from_file_location("allreduce_check", ROOT / "remote" / "allreduce_check.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.exit_reason(-9) == "killed by SIGKILL (out of memory?)"
    assert script.exit_reason(-15) == "killed by SIGTERM" and script.exit_reason(1) == "exit code 1"


def test_only_the_units_nccl_cuda_and_torch_variables_reach_the_checks_command_line():
    """extra_env may hold a secret; the check's command line (world-readable in ps) gets only what bears on
    NCCL, CUDA and torch, and the sandbox's stall fault."""
    from tasks.nccl_check import check_env

    env = {"NCCL_P2P_LEVEL": "SYS", "CUDA_VISIBLE_DEVICES": "0,1", "SGC_ALLREDUCE_STALL_RANK": "1",
           "HF_TOKEN": "hf_secret", "MY_API_KEY": "sk-secret"}
    assert check_env(env) == {"NCCL_P2P_LEVEL": "SYS", "CUDA_VISIBLE_DEVICES": "0,1", "SGC_ALLREDUCE_STALL_RANK": "1"}
