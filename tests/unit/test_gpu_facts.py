"""GPU facts and the post-ready GPU balance check.

- nvidia-smi's `[N/A]` / `[Not Supported]` parse as None (the stand-in prints them as the real tool does);
- ``NvmlGpuUsage``'s command run here for real: the REAL pynvml (nvidia-ml-py 13.615.71) over the NVML
  stand-in, and its nvidia-smi fallback over the nvidia-smi stand-in, agree on GPUs, memory and processes;
- ``tasks.gpu_balance``: a no-op with one line per GPU when balanced, a failure naming the GPU and the
  foreign process when one shares a GPU, judged after readiness when the server restarts this run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.util import FakeState, create_host, get_command_string

from facts.gpu import GpuComputeProcesses, NvidiaGpus
from facts.nvml import GpuApp, GpuMemory, GpuUsage, NvmlGpuUsage
from sandbox import gpusim
from tasks import gpu_balance
from tests.unit.test_nvml_sim import nvml_dir, pynvml_python, state  # noqa: F401 - fixtures
from tests.unit.test_step_operations import at_server_venv, sandbox_spec, service_facts, stamp_for

ROOT = Path(__file__).resolve().parents[2]
SMI = ROOT / "sandbox" / "nvidia_smi.py"
MIB = 1024 * 1024
GIB = 1024 * MIB


# --- nvidia-smi: values it cannot report -------------------------------------------------------

def smi_lines(state, *args: str) -> list[str]:
    out = subprocess.run([sys.executable, str(SMI), *args], env=state["env"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stdout
    return out.stdout.splitlines()


def test_unified_memory_values_parse_as_unknown(state):
    layout = gpusim.mark_unavailable(state["layout"], gpusim.UNIFIED_MEMORY_FIELDS, gpus=[1])
    gpusim.mark_unavailable(layout, ["used_gpu_memory"], value=gpusim.NOT_SUPPORTED, gpus=[1], apps=True)
    state["write"](layout)
    pid = state["hold"]("1", 2048, name="python3")
    fact = NvidiaGpus()
    gpus = fact.process(smi_lines(state, *fact.command().split()[1:]))
    assert "[N/A]" in " ".join(smi_lines(state, *fact.command().split()[1:]))  # positive control: the raw text
    assert (gpus[0].memory_total_mib, gpus[0].memory_used_mib, gpus[0].memory_free_mib) == (97887, 0, 97887)
    assert (gpus[1].memory_total_mib, gpus[1].memory_used_mib, gpus[1].memory_free_mib) == (None, None, None)
    assert gpus[1].compute_cap == "12.0" and gpus[1].driver_version == "580.95.05"
    apps = smi_lines(state, "--query-compute-apps=pid,used_memory,gpu_uuid,process_name",
                     "--format=csv,noheader,nounits")
    assert apps == [f"{pid}, [Not Supported], {gpus[1].uuid}, python3"]
    (held,) = GpuComputeProcesses().process([f"app: {line}" for line in apps])
    assert (held.pid, held.used_mib, held.gpu_uuid) == (pid, None, gpus[1].uuid)


def test_a_number_where_nvidia_smi_prints_garbage_is_an_error_not_a_guess():
    with pytest.raises(ValueError, match="nvidia-smi printed 'lots' where a number was expected"):
        NvidiaGpus().process(["0, GPU-0, NVIDIA X, lots, 0, 9.0, 570.86.15, 00000000:19:00.0"])


# --- NvmlGpuUsage: real pynvml over the NVML stand-in vs its nvidia-smi fallback -------------

def run_usage(state, python: str, lib_dir: Path, tmp_path: Path) -> tuple[GpuUsage, str]:
    """The fact's own command, run here with bash; nvidia-smi on PATH is the stand-in."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\nexec {sys.executable} {SMI} \"$@\"\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = dict(state["env"], LD_LIBRARY_PATH=str(lib_dir), PATH=f"{bin_dir}:{os.environ['PATH']}")
    fact = NvmlGpuUsage()
    command = get_command_string(fact.command(python=python))
    out = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return fact.process(out.stdout.splitlines()), out.stdout


def test_nvml_and_its_nvidia_smi_fallback_see_the_same_gpus_memory_and_processes(state, nvml_dir, pynvml_python,
                                                                                  tmp_path):
    own = state["hold"]("0,1,2,3", 40960, name="python3")
    stale = state["hold"]("2", 3072, name="stale-llm")
    nvml, raw = run_usage(state, str(pynvml_python), nvml_dir, tmp_path)
    assert nvml.source == "nvml" and nvml.note == "nvidia-ml-py 13.615.71, driver 580.95.05", raw
    smi, raw_smi = run_usage(state, str(tmp_path / "no-venv" / "bin" / "python"), nvml_dir, tmp_path)
    assert smi.source == "nvidia-smi", raw_smi
    assert smi.note == f"no python at {tmp_path}/no-venv/bin/python (the venv is not made yet)"
    assert nvml.gpus == smi.gpus
    assert [(g.index, g.used_bytes) for g in nvml.gpus] == [(0, 40 * GIB), (1, 40 * GIB), (2, 43 * GIB),
                                                            (3, 40 * GIB)]
    key = sorted((p.gpu_index, p.pid, p.used_bytes, p.gpu_uuid, p.name, p.unit) for p in nvml.processes)
    assert key == sorted((p.gpu_index, p.pid, p.used_bytes, p.gpu_uuid, p.name, p.unit) for p in smi.processes)
    assert (2, stale, 3 * GIB) in [(p.gpu_index, p.pid, p.used_bytes) for p in nvml.processes]
    assert len([p for p in nvml.processes if p.pid == own]) == 4


def test_without_pynvml_in_the_venv_the_fact_falls_back_and_says_why(state, nvml_dir, tmp_path):
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    usage, _raw = run_usage(state, str(venv / "bin" / "python"), nvml_dir, tmp_path)
    assert usage.source == "nvidia-smi" and len(usage.gpus) == 4
    assert usage.note == (f"pynvml is not importable in {venv} (ModuleNotFoundError: No module named 'pynvml')")


def test_nvml_memory_not_supported_is_none(state, nvml_dir, pynvml_python, tmp_path):
    state["write"](gpusim.mark_unavailable(state["layout"], gpusim.UNIFIED_MEMORY_FIELDS, gpus=[3]))
    usage, raw = run_usage(state, str(pynvml_python), nvml_dir, tmp_path)
    assert usage.source == "nvml", raw
    assert (usage.gpus[3].total_bytes, usage.gpus[3].used_bytes) == (None, None)
    assert usage.gpus[0].total_bytes == 97887 * MIB


# --- the balance check ---------------------------------------------------------------------------

UNIT = "sglang.service"
PYTHON = "/opt/sglang/venv/bin/python"


def usage_with(extra: list[GpuApp] = (), own_gib: dict[int, float] | None = None, source="nvml") -> GpuUsage:
    own_gib = own_gib or {i: 81.25 for i in range(8)}
    apps = [GpuApp(812, "python3", int(gib * GIB), i, f"GPU-{i}", UNIT) for i, gib in own_gib.items()]
    apps += list(extra)
    used = {i: sum(a.used_bytes or 0 for a in apps if a.gpu_index == i) for i in range(8)}
    gpus = [GpuMemory(i, f"GPU-{i}", "NVIDIA RTX PRO 6000", 97887 * MIB, used[i]) for i in range(8)]
    return GpuUsage(source, "nvidia-ml-py 13.615.71, driver 580.95.05", gpus, apps)


STALE = GpuApp(4242, "/usr/bin/python3", 3 * GIB, 3, "GPU-3", "other-llm.service")


def test_judge_balanced():
    verdict = gpu_balance.judge(usage_with(), list(range(8)), UNIT)
    assert verdict.problems == [] and verdict.ratio == 1.0
    assert verdict.lines[0] == "GPU 0: 87.24 GB used of 102.64 GB; pid 812 (python3, sglang.service) 87.24 GB"
    assert len(verdict.lines) == 8


def test_judge_names_the_gpu_and_the_foreign_process():
    verdict = gpu_balance.judge(usage_with([STALE]), list(range(8)), UNIT)
    assert verdict.shared == ["GPU 3 is shared: pid 4242 (python3, other-llm.service) holds 3.22 GB there "
                              "beside sglang.service"] and verdict.problems == []
    assert verdict.lines[3] == ("GPU 3: 90.46 GB used of 102.64 GB; pid 812 (python3, sglang.service) 87.24 GB, "
                                "pid 4242 (python3, other-llm.service) 3.22 GB")


def test_judge_unbalanced_and_missing_rank():
    own = {i: 81.25 for i in range(7)}
    own[2] = 60.0
    verdict = gpu_balance.judge(usage_with(own_gib=own), list(range(8)), UNIT)
    assert "GPU 7 holds no memory of sglang.service: none of its TP ranks uses it" in verdict.problems
    assert ("sglang.service's GPU memory is unbalanced: GPU 0 holds 87.24 GB, GPU 2 64.42 GB (max/min 1.35, "
            "allowed <= 1.1)") in verdict.problems
    # within the tolerance: fine
    own[2] = 78.0
    assert gpu_balance.judge(usage_with(own_gib=own), list(range(7)), UNIT).problems == []


def test_judge_per_process_memory_unknown_is_said_not_assumed():
    apps = [GpuApp(812, "python3", None, i, f"GPU-{i}", UNIT) for i in range(2)]
    gpus = [GpuMemory(i, f"GPU-{i}", "NVIDIA GB10", None, None) for i in range(2)]
    verdict = gpu_balance.judge(GpuUsage("nvml", "", gpus, apps), [0, 1], UNIT)
    assert verdict.problems == [] and verdict.ratio is None
    assert verdict.notes == ["memory per process unknown ([N/A]) on GPU(s) [0, 1]: balance not checked"]
    assert verdict.lines[0] == "GPU 0: [N/A] used of [N/A]; pid 812 (python3, sglang.service) [N/A]"


def balance_op(usage: GpuUsage, restart: bool = False, executing: bool = False, **settings):
    spec = sandbox_spec(**settings)
    host_facts = service_facts(spec, "" if restart else stamp_for(spec))
    host_facts["nvml.NvmlGpuUsage"] = {f"python={spec.python_bin}": usage}
    fake = FakeState()
    fake.is_executing = executing  # pyinfra runs the body again while executing, after readiness
    host = create_host(fake, facts=at_server_venv(host_facts, spec))
    with ctx_state.use(fake), ctx_host.use(host):
        commands = list(gpu_balance.gpu_memory_balanced._inner(spec=spec))
    return host, commands


def planned(caplog) -> list[str]:
    return [r.getMessage().split("plan: ", 1)[1] for r in caplog.records if "plan: " in r.getMessage()]


def test_balanced_is_a_no_op_with_the_summary_and_a_line_per_gpu(caplog):
    caplog.set_level("WARNING", logger="pyinfra")
    host, commands = balance_op(usage_with())
    assert commands == []
    assert host.noop_description == ("GPUs [0, 1, 2, 3, 4, 5, 6, 7] hold only sglang.service's memory "
                                     "(max/min 1.000 <= 1.1; nvml: nvidia-ml-py 13.615.71, driver 580.95.05)")
    lines = [line for line in planned(caplog) if line.startswith("gpu_balance: GPU ")]
    assert len(lines) == 8 and lines[7].startswith("gpu_balance: GPU 7: 87.24 GB used of 102.64 GB; pid 812")


FAILED_ON_GPU3 = ("gpu_balance: GPU 3 is shared: pid 4242 (python3, other-llm.service) holds 3.22 GB there "
                  "beside sglang.service")


def test_after_readiness_a_stale_process_fails_the_step_naming_gpu_and_process():
    _host, commands = balance_op(usage_with([STALE]), executing=True)
    assert len(commands) == 1 and commands[0].function.__name__ == "_fail"
    assert commands[0].args[0] == FAILED_ON_GPU3


def test_the_plan_fails_on_a_shared_gpu_the_stale_step_leaves_alone():
    _host, commands = balance_op(usage_with([STALE]), stale_policy="ignore")
    assert len(commands) == 1 and commands[0].args[0] == FAILED_ON_GPU3


def test_the_plan_leaves_a_shared_gpu_to_the_stale_step_that_stops_it(caplog):
    caplog.set_level("WARNING", logger="pyinfra")
    host, commands = balance_op(usage_with([STALE]))  # stale_policy "stop": stopped before readiness
    assert commands == [] and host.noop_description == ("GPU(s) shared now: left to the stale GPU processes step, "
                                                        "judged again after readiness")
    assert ("gpu_balance: the stale GPU processes step deals with the shared GPU(s) first (stale_policy = 'stop'); "
            "judged again after readiness") in planned(caplog)


def test_a_server_restarted_this_run_is_judged_after_readiness_not_before(caplog):
    caplog.set_level("WARNING", logger="pyinfra")
    host, commands = balance_op(usage_with([STALE]), restart=True)
    assert commands == [] and host.noop_description == ("sglang.service is (re)started by this run: judged after "
                                                        "readiness")
    assert planned(caplog) == ["gpu_balance: after readiness, check that GPUs [0, 1, 2, 3, 4, 5, 6, 7] hold only "
                               "sglang.service's memory, balanced (max/min <= 1.1), through NVML"]
    # while executing (after readiness) the same body judges what NVML says now
    _host, commands = balance_op(usage_with([STALE]), restart=True, executing=True)
    assert commands[0].args[0] == FAILED_ON_GPU3


def test_the_step_runs_after_readiness_in_both_pipelines():
    from tasks.pipeline import GROUP_PIPELINE, SERVER_PIPELINE

    for pipeline in (SERVER_PIPELINE, GROUP_PIPELINE):
        names = [step.__name__ for step in pipeline]
        assert names.index("gpu_balance") == names.index("group_readiness" if pipeline is GROUP_PIPELINE
                                                         else "readiness") + 1


def test_nvml_fixture_values_round_trip():
    # the fixture the fact tests replay is the one a stale process on GPU 1 gives: the check fails on it
    data = json.loads((ROOT / "tests/fixtures/facts/nvml.NvmlGpuUsage/nvml_server_and_stale.json").read_text())
    usage = NvmlGpuUsage().process(data["output"])
    verdict = gpu_balance.judge(usage, [0, 1], UNIT)
    assert verdict.failures == ["GPU 1 is shared: pid 4242 (python3, session-7.scope) holds 3.22 GB there "
                                "beside sglang.service"]
