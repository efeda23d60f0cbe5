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


def run_op(processes, source="nvml", unit_files: dict[str, str] | None = None, **kwargs):
    """``unit_files``: {unit: its file's text} (default: no file, not ours) for the stale processes' units."""
    state = FakeState()
    usage = GpuUsage(source, "nvidia-ml-py 13.615.71, driver 580.95.05", GPUS, processes)
    units = {p.unit: None for p in processes if p.unit and p.unit.endswith(".service")} | (unit_files or {})
    host = create_host(state, facts={"nvml.NvmlGpuUsage": {f"python={PYTHON}": usage},
                                     "files.FileText": {f"path=/etc/systemd/system/{u}": t for u, t in units.items()}})
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


# --- sibling servers: another server of this deploy on the same machine is never stopped

SIBLING = GpuApp(7000, "python3", 40960 * MIB, 2, "GPU-2", "sglang-b.service")
OURS_MARKED = "# Managed by sglang-converge (inventory): edits are overwritten by the next deploy.\n[Unit]\n"


@pytest.mark.parametrize("kwargs, why", [
    ({"siblings": {"sglang-b.service": "sgc240-b"}}, "the server of inventory host sgc240-b on this machine"),
    ({"unit_files": {"sglang-b.service": OURS_MARKED}}, "a server of sglang-converge (its unit file carries our marker)"),
])
def test_a_sibling_server_on_our_gpus_fails_the_step_and_nothing_is_stopped(kwargs, why):
    _host, commands = run_op([SIBLING, EMBEDDER], **kwargs)
    assert len(commands) == 1 and commands[0].function.__name__ == "_fail"  # not even the embedder: touch nothing
    message = commands[0].args[0]
    assert "sibling servers of this deploy (never stopped" in message
    assert f"pid 7000 (python3 of sglang-b.service) holds 40960 MiB on GPU 2: {why}" in message
    assert "embedder" not in message


def test_a_sibling_server_on_other_gpus_is_not_our_business_and_a_foreign_unit_still_stops():
    host, commands = run_op([OURS, GpuApp(7000, "python3", 1, 3, "GPU-3", "sglang-b.service")],
                            siblings={"sglang-b.service": "sgc240-b"})
    assert commands == [] and host.noop_description == "no other compute process on GPUs [0, 1, 2]"
    # a unit file without our marker is someone else's: stopped as before
    _host, commands = run_op([EMBEDDER], unit_files={"embedder.service": "[Unit]\nDescription=embedder\n"},
                             siblings={"sglang-b.service": "sgc240-b"})
    assert commands[0].function.__name__ == "_stop" and commands[0].args[0] == ["embedder.service"]
