"""stale_gpu_processes_stopped: which processes count as stale and how each is stopped."""

from __future__ import annotations

import pytest
from pyinfra.api import FunctionCommand
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.util import FakeState, create_host

from facts.nvml import GpuApp, GpuMemory, GpuUsage
from tasks.stale_gpu import stale_gpu_processes_stopped

MIB = 1024 * 1024
PYTHON = "/opt/sglang/venv/bin/python"
GPUS = [GpuMemory(i, f"GPU-{i}", "NVIDIA RTX PRO 6000", 97887 * MIB, 0) for i in range(4)]
EMBEDDER = GpuApp(4242, "/usr/bin/python3", 56320 * MIB, 0, "GPU-0", "embedder.service")
OURS = GpuApp(900, "python3", 83203 * MIB, 1, "GPU-1", "sglang.service")
SESSION = GpuApp(5151, "python3", 1024 * MIB, 2, "GPU-2", "session-4.scope")
ELSEWHERE = GpuApp(6000, "python3", 1024 * MIB, 3, "GPU-3", None)  # on a GPU we do not use


def run_op(processes, source="nvml", **kwargs):
    state = FakeState()
    usage = GpuUsage(source, "nvidia-ml-py 13.615.71, driver 580.95.05", GPUS, processes)
    host = create_host(state, facts={"nvml.NvmlGpuUsage": {f"python={PYTHON}": usage}})
    with ctx_state.use(state), ctx_host.use(host):
        commands = list(stale_gpu_processes_stopped._inner(gpu_ids=[0, 1, 2], own_unit="sglang.service",
                                                           python=PYTHON, **kwargs))
    return host, commands


def test_only_our_own_unit_and_other_gpus_means_no_op():
    host, commands = run_op([OURS, ELSEWHERE])
    assert commands == []
    assert host.noop_description == "no other compute process on GPUs [0, 1, 2]"


def test_read_with_nvidia_smi_when_the_venv_cannot_says_so():
    host, _commands = run_op([OURS], source="nvidia-smi")
    assert host.noop_description == ("no other compute process on GPUs [0, 1, 2] (read with nvidia-smi: "
                                      "nvidia-ml-py 13.615.71, driver 580.95.05)")


def test_a_service_is_stopped_through_systemd_and_a_session_process_by_signal():
    _host, commands = run_op([EMBEDDER, OURS, SESSION], grace_s=7)
    assert len(commands) == 1 and isinstance(commands[0], FunctionCommand)
    units, pids, grace, _wait, names = commands[0].args
    assert units == ["embedder.service"] and pids == [5151] and grace == 7
    assert names[4242] == "pid 4242 (python3 of embedder.service) holds 56320 MiB on GPU 0"


@pytest.mark.parametrize(
    "kwargs, why",
    [
        ({"protect_units": ["embedder.service"]}, "protected"),
        ({"protect_process_names": ["python3"]}, "protected"),
        ({"policy": "fail"}, "stale_policy = 'fail'"),
    ],
)
def test_protected_or_policy_fail_fails_the_step_and_touches_nothing(kwargs, why):
    _host, commands = run_op([EMBEDDER], **kwargs)
    assert len(commands) == 1 and commands[0].function.__name__ == "_fail"
    message = commands[0].args[0]
    assert why in message and "pid 4242 (python3 of embedder.service) holds 56320 MiB on GPU 0" in message


def test_policy_ignore_changes_nothing():
    host, commands = run_op([EMBEDDER], policy="ignore")
    assert commands == []
    assert "stale GPU processes ignored" in host.noop_description
