"""The steps' operations that read the Spec, with facts in and commands out
(pyinfra-testing's fake host; the Hub is not asked: hub_files is patched)."""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import patch

import pytest
from pyinfra.api import FunctionCommand
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.util import FakeState, create_host

from facts.gpu_topology import Topology
from facts.server_envs import EnvsDir
from facts.compressed_tensors import CompressedTensors
from facts.gpu import Gpu
from facts.model_dir import ModelDir, Revisions
from facts.ports import PortHolder
from facts.systemd import UnitState
from core import checks, disk as disk_check, venv_ops
from core.render import packages_digest, render, systemd_quote
from core.paths import CACHE_DIR, revisions_root
from core.runstate import run_state
from core.stamps import restart_reasons, stamp_path
from tasks import model, preflight, quant_deps, service
from tasks.spec import build_spec

ROOT = Path(__file__).resolve().parents[2]
REVISION = "0123456789abcdef0123456789abcdef01234567"
HUB_FILES = {"config.json": 2_000, "model-00001-of-00002.safetensors": 20_000_000,
             "model-00002-of-00002.safetensors": 18_000_000}


def sandbox_spec(**overrides):
    data = {}
    for group in ("all", "sandbox"):
        data.update({k: v for k, v in runpy.run_path(str(ROOT / "group_data" / f"{group}.py")).items()
                     if not k.startswith("_")})
    data.update(hf_endpoint="http://10.77.0.1:18080", **overrides)
    return build_spec("sgc1", data, environ={}).resolve(compute_cap="12.0", p2p_ok=True)


def gpus(count=8, used=0):
    return [Gpu(i, f"GPU-{i}", "NVIDIA RTX PRO 6000", 97887, used, "12.0", "580.95.05", f"0:{i}") for i in range(count)]


SERVER_VENV = "/opt/sglang/venv"  # how the tests' facts name the server's venv: run() points them at spec.server_venv


def at_server_venv(facts: dict, spec) -> dict:
    """``facts`` with every fact argument naming SERVER_VENV (or a path in it) naming ``spec.server_venv``."""
    pattern = re.compile(rf"{re.escape(SERVER_VENV)}(?=/|,|$)")
    moved = {fact: {pattern.sub(spec.server_venv, key): value for key, value in by_args.items()}
             if isinstance(by_args, dict) else by_args for fact, by_args in facts.items()}
    return at_revision_dirs(moved, spec)


def at_revision_dirs(facts: dict, spec) -> dict:
    """``facts`` with the model dir's (and draft dir's) path facts naming the pinned revision's dir
    (spec.model_path: the model dirs hold no revision of the old layout), and no other revision kept."""
    dirs = [(spec.model_dir, spec.model_path)]
    if spec.draft_path is not None:
        dirs.append((spec.draft_dir, spec.draft_path))
    out = {}
    for fact, by_args in facts.items():
        if isinstance(by_args, dict) and fact in ("model_dir.ModelDirState", "model_dir.ModelConfig",
                                                   "files.FreeBytes", "model_dir.SafetensorsIndex"):
            by_args = dict(by_args)
            for old, new in dirs:
                if f"path={old}" in by_args and f"path={new}" not in by_args:
                    by_args[f"path={new}"] = by_args.pop(f"path={old}")
        out[fact] = by_args
    states = out.setdefault("model_dir.ModelDirState", {})
    revisions = out.setdefault("model_dir.ModelRevisions", {})
    for old, _new in dirs:
        states.setdefault(f"path={old}", ModelDir(marker=None, files={}, partial_bytes=0))
        revisions.setdefault(f"root={revisions_root(old)}", Revisions((), ()))
    return out


def run(op, facts, _hub=None, **kwargs):
    """The op's commands with these facts (the server's venv named SERVER_VENV: ``at_server_venv``); the
    Hub's file sizes from ``_hub(repo, revision, endpoint, token)`` (default: HUB_FILES for every repo)."""
    state = FakeState()
    spec = kwargs.get("spec")
    host = create_host(state, facts=at_server_venv(facts, spec) if spec is not None else facts)
    hub = {"side_effect": _hub} if _hub else {"return_value": HUB_FILES}
    with ctx_state.use(state), ctx_host.use(host), patch.object(disk_check, "hub_files", **hub):
        commands = list(op._inner(**kwargs))
    return host, commands


def failure(commands) -> str:
    assert len(commands) == 1 and isinstance(commands[0], FunctionCommand), commands
    assert commands[0].function.__name__ == "_fail"
    return commands[0].args[0]


def disk(free):
    return {"path=/srv/models/tiny": {"path": "/srv/models", "mount": "/srv/models", "free_bytes": free,
                                      "total_bytes": free}}


NO_ENVS = EnvsDir((), frozenset())  # no server venv built yet
# the host fitness facts of a host that says nothing (core/host_fitness.py): an empty topology, no sockets
# (not None: pyinfra-testing wraps an unkeyed fact's None in a FakeFact, which is not None)
NO_FITNESS = {"kernel.KernelCmdline": {}, "kernel.NvidiaUvmHmm": None, "gpu_topology.GpuTopology": Topology(gpus=()),
              "cpu.CpuSockets": 0, "gpu.SimulatedGpus": False}
EMPTY_DIR = {"path=/srv/models/tiny": ModelDir(marker=None, files={}, partial_bytes=0)}


# --- preflight ------------------------------------------------------------------

def preflight_facts(gpu_list, holder=None, free=10**9):
    from facts.interpreter import Interpreter
    from facts.venv import Venv

    return {**NO_FITNESS, "gpu.NvidiaGpus": gpu_list, "ports.PortListener": {"port=30000": holder},
            "gpu.SimulatedGpus": True, "model_dir.ModelDirState": EMPTY_DIR, "files.FreeBytes": disk(free),
            "venv.VenvState": {"path=/opt/sglang/venv": Venv(exists=False)},
            "server_envs.ServerEnvs": {"root=/opt/sglang/venv-envs, sizes=False": NO_ENVS},
            "interpreter.PythonInterpreter": {"python=/usr/bin/python3": Interpreter((3, 11, 2), True)},
            "model_dir.ModelConfig": {"path=/srv/models/tiny": {"num_hidden_layers": 2, "kv_lora_rank": 64,
                                                                "qk_rope_head_dim": 16, "torch_dtype": "bfloat16",
                                                                "max_position_embeddings": 4096}}}


def test_preflight_passes_on_a_host_that_can_serve():
    host, commands = run(preflight.gpu_host_can_serve, preflight_facts(gpus()), spec=sandbox_spec())
    assert commands == []
    assert "8 x NVIDIA RTX PRO 6000 (97887 MiB, SM 12.0)" in host.noop_description
    assert "attention backend triton (auto); GPUs SIMULATED" in host.noop_description


def test_preflight_names_every_problem_before_anything_changes():
    holder = PortHolder(pid=77, process_name="python3", unit="other.service")
    _host, commands = run(preflight.gpu_host_can_serve, preflight_facts(gpus(4), holder, free=20_000_000),
                          spec=sandbox_spec())
    message = failure(commands)
    assert "GPU(s) [4, 5, 6, 7] do not exist; the host has 4 GPU(s): [0, 1, 2, 3]" in message
    assert "port 30000 is held by pid 77 (python3 of other.service), not by sglang.service" in message
    assert "need 0.038 GB (38.0 MB) more (of 0.038 GB (38.0 MB)), /srv/models has 0.020 GB (20.0 MB) free" in message


def test_preflight_accepts_the_port_held_by_our_own_unit():
    holder = PortHolder(pid=812, process_name="python", unit="sglang.service")
    _host, commands = run(preflight.gpu_host_can_serve, preflight_facts(gpus(), holder), spec=sandbox_spec())
    assert commands == []


def rank0_spec():
    return sandbox_spec(nnodes=2, node_rank=0, tp_size=16, dist_init_addr="10.77.20.2:20000")


def test_preflight_fails_rank0_when_the_rendezvous_port_is_taken():
    facts = preflight_facts(gpus())
    holder = PortHolder(pid=91, process_name="nc", unit="debug.service")
    facts["ports.PortListener"] = {"port=30000": None, "port=20000": holder}
    _host, commands = run(preflight.gpu_host_can_serve, facts, spec=rank0_spec())
    assert ("port 20000 (dist_init_addr 10.77.20.2:20000, where the other ranks join rank 0) is held by pid 91 "
            "(nc of debug.service), not by sglang.service") in failure(commands)
    # held by our own rank 0: it is the running group
    facts["ports.PortListener"]["port=20000"] = PortHolder(pid=812, process_name="python", unit="sglang.service")
    assert run(preflight.gpu_host_can_serve, facts, spec=rank0_spec())[1] == []


def test_preflight_checks_the_rendezvous_port_only_on_rank0():
    rank1 = sandbox_spec(nnodes=2, node_rank=1, tp_size=16, dist_init_addr="10.77.20.2:20000")
    assert checks.rendezvous_port(rank1) is None and checks.rendezvous_port(sandbox_spec()) is None
    assert checks.rendezvous_port(rank0_spec()) == 20000


# --- model ------------------------------------------------------------------------

def model_kwargs(spec):
    return dict(repo=spec.profile.repo, revision=spec.profile.revision, local_dir=spec.model_dir,
                python=spec.python_bin, margin_bytes=spec.margin_bytes, endpoint=spec.hf_endpoint)


def test_model_complete_is_a_no_op():
    marker = {"repo": "sandbox/tiny-kimi-int4", "revision": REVISION, "files": HUB_FILES}
    state = {"path=/srv/models/tiny": ModelDir(marker=marker, files=dict(HUB_FILES), partial_bytes=0)}
    host, commands = run(model.model_downloaded, {"model_dir.ModelDirState": state}, **model_kwargs(sandbox_spec()))
    assert commands == [] and host.noop_description == f"sandbox/tiny-kimi-int4@{REVISION[:12]} is in /srv/models/tiny, verified"


def test_model_refuses_with_both_numbers_when_it_does_not_fit():
    facts = {"model_dir.ModelDirState": EMPTY_DIR, "files.FreeBytes": disk(30_000_000)}
    _host, commands = run(model.model_downloaded, facts, **model_kwargs(sandbox_spec()))
    message = failure(commands)
    assert "need 0.038 GB (38.0 MB) more" in message and "/srv/models has 0.030 GB (30.0 MB) free" in message
    assert "nothing was downloaded" in message


def test_model_downloads_only_what_is_missing_in_a_transient_unit():
    state = {"path=/srv/models/tiny": ModelDir(marker=None, files={"config.json": 2_000,
                                                                    "model-00001-of-00002.safetensors": 20_000_000},
                                               partial_bytes=0)}
    facts = {"model_dir.ModelDirState": state, "files.FreeBytes": disk(25_000_000)}
    _host, commands = run(model.model_downloaded, facts, **model_kwargs(sandbox_spec()))
    fetch = commands[-1]
    assert fetch.function.__name__ == "_fetch"
    (download,) = fetch.args
    assert download.need == 18_000_000 and download.token_file is None and download.local_dir == "/srv/models/tiny"
    assert download.expected == HUB_FILES and download.revision == REVISION  # what the host must hold at the end
    assert "--endpoint http://10.77.0.1:18080" in download.argv and "--margin-bytes 5000000" in download.argv


def test_a_marker_of_another_revision_is_not_a_no_op():
    spec = sandbox_spec()
    marker = {"repo": spec.profile.repo, "revision": "f" * 40, "files": HUB_FILES}
    state = {"path=/srv/models/tiny": ModelDir(marker=marker, files=dict(HUB_FILES), partial_bytes=0)}
    facts = {"model_dir.ModelDirState": state, "files.FreeBytes": disk(10**9)}
    _host, commands = run(model.model_downloaded, facts, **model_kwargs(spec))
    assert commands[-1].function.__name__ == "_fetch"


def test_model_refuses_a_revision_the_hub_does_not_have_before_any_change():
    message = ("sandbox/tiny@0123456789ab: revision 0123456789abcdef0123456789abcdef01234567 not found on the Hub "
               "(http://10.77.0.1:18080, HTTP 404): pin a commit that exists")
    facts = {"model_dir.ModelDirState": EMPTY_DIR, "files.FreeBytes": disk(10**9)}
    with patch.object(model, "disk_need", side_effect=disk_check.HubError(message)):
        _host, commands = run(model.model_downloaded, facts, **model_kwargs(sandbox_spec()))
    assert failure(commands) == f"model: {message}"  # the only command: nothing uploaded, no unit started


def test_the_token_goes_in_a_root_only_file_never_in_argv():
    facts = {"model_dir.ModelDirState": EMPTY_DIR, "files.FreeBytes": disk(10**9)}
    _host, commands = run(model.model_downloaded, facts, token="hf_secret", **model_kwargs(sandbox_spec()))
    assert "install -m 600 -o root -g root /dev/null /etc/sglang/sglang.hf-token" in [str(c) for c in commands]
    argv = commands[-1].args[0].argv
    assert "hf_secret" not in argv and "--token-file /etc/sglang/sglang.hf-token" in argv
    # nowhere in what the FunctionCommand carries (positive control: its repr shows the argv)
    assert "hf_secret" not in repr(commands[-1].args) and "--token-file" in repr(commands[-1].args)


# --- quantization deps ------------------------------------------------------------
# SGLang 0.5.23 as its metadata and source say (tests/fixtures/facts/compressed_tensors.*/sglang_0_5_23.json)

FIXTURES = ROOT / "tests" / "fixtures" / "facts"
VENV = "path=/opt/sglang/venv"


def fact_fixture(fact: str, case: str):
    return json.loads((FIXTURES / f"compressed_tensors.{fact}" / f"{case}.json").read_text())["fact"]


def ct_config(fmt: str) -> dict:
    return {"quantization_config": {"quant_method": "compressed-tensors", "format": fmt,
                                    "config_groups": {"group_0": {"targets": ["Linear"]}}}}


KIMI_INT4 = ct_config("pack-quantized")  # moonshotai/Kimi-K2.6: W4A16, group 32
NVFP4 = ct_config("nvfp4-pack-quantized")
CT_0_8_1 = fact_fixture("CompressionFormats", "old")  # dense, float, int, marlin_24, naive, pack, sparse_bitmask
CT_0_18_0 = {"version": "0.18.0", "members": sorted(CT_0_8_1["members"] + [
    "mixed_precision", "mxfp4_pack_quantized", "mxfp8_quantized", "nvfp4_pack_quantized", "sparse_24_bitmask"])}
SGLANG_REFS = fact_fixture("CompressionFormatReferences", "sglang_0_5_23")
NO_SGLANG = fact_fixture("CompressionFormatReferences", "not_installed")
SGLANG_REQUIRES = fact_fixture("CompressedTensorsRequirers", "sglang_0_5_23")  # compressed-tensors==0.18.0
VLLM_PIN = {"vllm": {"version": "0.6.5", "requires": ["compressed-tensors==0.8.1"]}}
STUB_PIN = {"vllm-stub": {"version": "0.6.5", "requires": ["compressed-tensors==0.8.1"]}}


def quant_facts(config, installed, refs=SGLANG_REFS, requirers=SGLANG_REQUIRES):
    sglang = {"sglang": "0.5.23"} if refs["version"] else {}
    return {"model_dir.ModelConfig": {"path=/srv/models/tiny": config},
            "files.FileText": {"path=/var/lib/sglang-converge/sglang.json": None},  # never started
            "compressed_tensors.CompressionFormats": {VENV: installed},
            "compressed_tensors.CompressionFormatReferences": {f"package=sglang, {VENV}": refs},
            "compressed_tensors.CompressedTensorsRequirers": {VENV: requirers},
            "venv.VenvPackages": {VENV: {"torch": "2.13.0+cpu", **sglang, "compressed-tensors": "0.8.1"}},
            "venv.ExactPins": {f"packages={sorted(['torch', *sglang])!r}, {VENV}": {
                "sglang": ["transformers==5.19.0", "torch==2.14.1"]} if sglang else {}}}


def plans(caplog) -> list[str]:
    return [r.getMessage().split("plan: ", 1)[1] for r in caplog.records if "plan: " in r.getMessage()]


@pytest.mark.parametrize("config", [KIMI_INT4, NVFP4], ids=["kimi-int4", "nvfp4"])
def test_sglang_needs_what_its_metadata_pins_whatever_the_model_format(config, caplog):
    requirers = {**SGLANG_REQUIRES, **STUB_PIN}
    _host, commands = run(quant_deps.compression_format_supported, quant_facts(config, CT_0_8_1, requirers=requirers),
                          spec=sandbox_spec())
    (upgrade,) = commands
    venv, requirement, constraints, allow, need, because = upgrade.args
    assert requirement == "compressed-tensors==0.18.0" and allow == ["vllm-stub"]
    assert because == "sglang 0.5.23 requires compressed-tensors==0.18.0"
    assert constraints[:2] == ["sglang==0.5.23", "torch==2.13.0+cpu"] and "transformers==5.19.0" in constraints
    assert need.members["nvfp4_pack_quantized"] == "sglang 0.5.23 references"
    lines = plans(caplog)
    assert "quant deps: sglang 0.5.23 requires compressed-tensors==0.18.0; installed 0.8.1" in lines
    assert ("quant deps: sglang 0.5.23 references CompressionFormat.nvfp4_pack_quantized (compressed-tensors >= "
            "0.10.0); installed 0.8.1 lacks it (sglang/srt/layers/quantization/compressed_tensors/utils.py)") in lines
    assert lines[-1].startswith("install compressed-tensors==0.18.0 (sglang 0.5.23 requires compressed-tensors=="
                                "0.18.0), holding sglang 0.5.23, torch 2.13.0+cpu and their exact pins; will conflict,"
                                " allowed: vllm-stub 0.6.5 requires compressed-tensors==0.8.1")


@pytest.mark.parametrize("config", [KIMI_INT4, NVFP4], ids=["kimi-int4", "nvfp4"])
def test_everything_satisfied_is_a_no_op(config, caplog):
    host, commands = run(quant_deps.compression_format_supported, quant_facts(config, CT_0_18_0), spec=sandbox_spec())
    assert commands == [] and plans(caplog) == []
    assert host.noop_description == ("compressed-tensors 0.18.0 meets sglang 0.5.23's requirement and the 7 "
                                     "member(s) it and the model use")


def test_a_vllm_pin_fails_naming_vllm_and_sglangs_requirement():
    requirers = {**SGLANG_REQUIRES, **VLLM_PIN}
    _host, commands = run(quant_deps.compression_format_supported,
                          quant_facts(KIMI_INT4, CT_0_8_1, requirers=requirers),
                          spec=sandbox_spec(compressed_tensors_allow_conflicts=[]))
    assert failure(commands) == (
        "quant deps: sglang 0.5.23 requires compressed-tensors==0.18.0 but vllm 0.6.5 requires "
        "compressed-tensors==0.8.1: allow the conflict with compressed_tensors_allow_conflicts = ['vllm'] or "
        "remove the package")


def test_an_adopted_venv_with_every_member_but_an_older_release_than_sglang_pins_is_upgraded(caplog):
    installed = {**CT_0_18_0, "version": "0.17.0"}
    _host, (upgrade,) = run(quant_deps.compression_format_supported, quant_facts(KIMI_INT4, installed),
                            spec=sandbox_spec())
    assert upgrade.args[1] == "compressed-tensors==0.18.0"
    assert plans(caplog)[0] == "quant deps: sglang 0.5.23 requires compressed-tensors==0.18.0; installed 0.17.0"


def test_before_sglang_is_installed_the_model_alone_decides_and_the_plan_says_so(caplog):
    facts = quant_facts(KIMI_INT4, CT_0_8_1, refs=NO_SGLANG, requirers=STUB_PIN)
    host, commands = run(quant_deps.compression_format_supported, facts, spec=sandbox_spec())
    assert commands == [] and host.noop_description == "compressed-tensors 0.8.1 meets the model's pack_quantized"
    assert plans(caplog) == [
        f"quant deps: sglang is not installed in {sandbox_spec().server_venv} yet (python_env installs sglang==0.5.23): what it "
        "requires of compressed-tensors and the CompressionFormat members its code references are read when this "
        "step runs"]
    # an nvfp4 model needs 0.10.0 on its own
    facts = quant_facts(NVFP4, CT_0_8_1, refs=NO_SGLANG, requirers=STUB_PIN)
    _host, (upgrade,) = run(quant_deps.compression_format_supported, facts, spec=sandbox_spec())
    assert upgrade.args[1] == "compressed-tensors>=0.10.0"
    assert upgrade.args[5] == ("the model's config.json names CompressionFormat.nvfp4_pack_quantized "
                               "(compressed-tensors >= 0.10.0)")


def test_a_model_without_compressed_tensors_needs_nothing():
    host, commands = run(quant_deps.compression_format_supported,
                         quant_facts({"quantization_config": {"quant_method": "fp8"}}, CT_0_8_1), spec=sandbox_spec())
    assert commands == [] and host.noop_description == "the model does not use compressed-tensors"



class ShellHost:
    """A host for a FunctionCommand body: its shell commands recorded and answered by
    ``script(command) -> (ok, stdout lines, stderr lines)``; facts from ``facts`` by class name."""

    name = "sgc1"

    def __init__(self, script, facts=None):
        self.script, self.facts = script, facts or {}
        self.commands: list[str] = []
        self.logs: list[str] = []

    def run_shell_command(self, command, **kwargs):
        self.commands.append(command.get_raw_value())
        ok, out, err = self.script(self.commands[-1])
        return ok, SimpleNamespace(stdout_lines=out, stderr_lines=err, stdout="\n".join(out))

    def get_fact(self, fact, **kwargs):
        return self.facts[fact.__name__]

    def log(self, message, log_func=None):
        self.logs.append(message)

    def log_styled(self, message, log_func=None, **kwargs):
        self.logs.append(message)


def upgrade_command():
    _host, (upgrade,) = run(quant_deps.compression_format_supported, quant_facts(KIMI_INT4, CT_0_8_1),
                            spec=sandbox_spec())
    return upgrade


VENV_AT = sandbox_spec().server_venv  # the sandbox's server venv (its package set's own)
LOCK = f"{VENV_AT}/.sgc-pip.lock"


def test_the_compressed_tensors_upgrade_runs_under_the_venvs_pip_lock():
    upgrade = upgrade_command()
    lock_held = lambda command: (not command.startswith("flock -n"), [], [])  # noqa: E731 - another pip holds it
    host = ShellHost(lock_held, {"CompressionFormats": CompressedTensors(**CT_0_18_0)})
    assert upgrade.function(FakeState(), host, *upgrade.args) is True
    installs = [c for c in host.commands if " install --upgrade " in c]
    assert len(installs) == 1
    # the same lock, taken the same way, as python_env's pip (core/venv_ops.locked)
    assert installs[0].startswith(f"flock -w {venv_ops.PIP_LOCK_WAIT_S} -E {venv_ops.PIP_LOCK_TIMEOUT_RC} {LOCK} sh -c ")
    held = quant_deps.constraints_path("".join(line + "\n" for line in upgrade.args[2]))
    assert held.startswith(f"{CACHE_DIR}/hold-constraints-")  # named by the hold list: siblings never mix theirs
    assert installs[0] == venv_ops.locked(VENV_AT, (
        f"{VENV_AT}/bin/python -m pip --disable-pip-version-check install --upgrade "
        f"-c {held} compressed-tensors==0.18.0 2>&1"))
    # the lock is looked at first, and a held one is said: the upgrade waits for the other pip
    assert host.commands.index(f"flock -n {LOCK} true") < host.commands.index(installs[0])
    assert any(line.startswith(f"quant deps: another pip is changing {VENV_AT}") for line in host.logs)
    # pip check only reads the venv: not under the lock
    assert [c for c in host.commands if c.endswith(" check 2>&1")] and not any(
        c.startswith("flock -w") for c in host.commands if c.endswith(" check 2>&1"))


def test_a_pip_lock_that_stays_held_fails_the_upgrade_naming_the_lock():
    upgrade = upgrade_command()
    timed_out = f"timed out after 1800 s waiting for {LOCK}: another pip has been changing {VENV_AT} all that time"

    def script(command):
        if command.startswith("flock -w"):
            return False, [], [timed_out]  # flock -E 75, its line on stderr
        return not command.startswith("flock -n"), [], []

    state = FakeState()
    host = ShellHost(script, {"CompressionFormats": CompressedTensors(**CT_0_18_0)})
    assert upgrade.function(state, host, *upgrade.args) is False
    failure_ = run_state(state).first_failure("sgc1")
    assert failure_ is not None and failure_.cause == (
        f"quant deps: pip install compressed-tensors==0.18.0 failed: {timed_out}")
    assert host.commands[-1].startswith("flock -w")  # nothing ran after the install that did not


# --- service ----------------------------------------------------------------------

def service_facts(spec, stamp, active="active"):
    unit = {"load_state": "loaded", "active_state": active, "sub_state": "running", "main_pid": 812,
            "unit_file_state": "enabled", "fragment_path": spec.unit_path, "restarts": 0, "invocation_id": "x",
            "started_monotonic_us": 1, "need_daemon_reload": False}
    return {"systemd.SystemdUnitState": {f"unit={spec.unit_name}": UnitState(**unit)},
            "files.FileText": {f"path={stamp_path(spec)}": stamp, f"path={service.pending_stamp_path(spec)}": None},
            "venv.VenvPackages": {"path=/opt/sglang/venv": {"sglang": "0.5.23"}},
            "model_dir.ModelDirState": {"path=/srv/models/tiny": ModelDir({"revision": REVISION}, {}, 0)}}


def stamp_for(spec):
    import json

    rendered = render(spec)
    return json.dumps({**rendered.digests(), "packages": packages_digest({"sglang": "0.5.23"}),
                       "package_versions": {"sglang": "0.5.23"}, "model_revision": REVISION,
                       "venv": spec.server_venv})


def test_a_server_running_what_it_should_is_not_restarted():
    spec = sandbox_spec()
    host, commands = run(service.server_restarted, service_facts(spec, stamp_for(spec)), spec=spec,
                         rendered=render(spec))
    assert commands == [] and host.noop_description == "sglang.service runs as wanted: no restart"


def test_a_changed_environment_restarts_and_says_why():
    spec = sandbox_spec()
    changed = sandbox_spec(extra_env={"PYTHONPATH": "/usr/local/lib/sandbox-gpu", "NCCL_DEBUG": "INFO"})
    facts = service_facts(changed, stamp_for(spec))
    _host, commands = run(service.server_restarted, facts, spec=changed, rendered=render(changed))
    assert [c.function.__name__ for c in commands if isinstance(c, FunctionCommand)] == ["_restart"]
    state = FakeState()
    with ctx_state.use(state), ctx_host.use(create_host(state, facts=at_server_venv(facts, changed))):
        assert restart_reasons(changed, render(changed)) == ["environment file changed"]


@pytest.mark.parametrize("arg, quoted", [("/opt/a b/python", '"/opt/a b/python"'), ("50%", "50%%"),
                                          ("$HOME", '"$$HOME"'), ("--port", "--port")])
def test_exec_start_words_are_quoted_for_systemd(arg, quoted):
    assert systemd_quote(arg) == quoted
