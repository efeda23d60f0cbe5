"""Preflight: can the host run the pinned stack (Python, the driver torch's CUDA
needs, curl for get-pip.py), does the model fit in GPU memory with KV cache room,
values nvidia-smi cannot report, and the NCCL P2P env from the P2P fact only.

Facts in (pyinfra-testing's fake host), the check's messages out; the Kimi
K2.6 figures come from inventory/ct200.py, models/kimi-k2.6.yaml and the
config.json fixture (tests/fixtures/facts/model_dir.ModelConfig/kimi_k2_6.json).
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from unittest.mock import patch

import pytest
from pyinfra.api import State
from pyinfra.context import ctx_host, ctx_state
from pyinfra_cli.inventory import make_inventory_from_files
from pyinfra_testing.util import FakeState, create_host

from core import checkpoint_tensors, checks, disk as disk_check, memory_fit
from core.tensor_plan import summarize
from facts.gpu import Gpu, P2PMatrix
from facts.interpreter import Interpreter
from facts.model_dir import ModelDir
from facts.venv import Venv
from tests.unit.test_step_operations import NO_ENVS, NO_FITNESS, at_server_venv
from tasks import preflight
from tasks.spec import build_spec

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "facts"
KIMI_CONFIG = json.loads((FIXTURES / "model_dir.ModelConfig" / "kimi_k2_6.json").read_text())["fact"]
CT200_GPU = json.loads((FIXTURES / "gpu.NvidiaGpus" / "ct200.json").read_text())["fact"][1]
KIMI_DIR, VENV = "/srv/models/kimi-k2.6", "/opt/sglang/venv"
ENV = {"SGLANG_API_KEY": "sk-test-key-1234"}
# Kimi K2.5's published config.json and tensor layout (tests/fixtures/kimi-k2.5/: sources there); K2.6 has
# the same architecture (Moonshot's deploy guidance)
K25 = ROOT / "tests" / "fixtures" / "kimi-k2.5"
K25_CONFIG = json.loads((K25 / "config.json").read_text())
K25_TENSORS = summarize(runpy.run_path(str(K25 / "layout.py"))["tensors"]())
# the pinned revision's files as the Hub lists them: 64 shards, 595 GB (the profile's size)
KIMI_HUB = {"config.json": 3_000, **{f"model-{i:05d}-of-00064.safetensors": 9_296_875_000 for i in range(1, 65)}}


def ct200_unresolved(**overrides):
    """ct200 as deploy.py sees it (inventory + group_data/all.py + the Kimi K2.6 profile)."""
    with ctx_state.use(State()):
        inventory = make_inventory_from_files(str(ROOT / "inventory" / "ct200.py"), cwd=str(ROOT))
    return build_spec("ct200", {**inventory.get_host("ct200").data.dict(), **overrides}, environ=ENV)


def ct200_spec(**overrides):
    return ct200_unresolved(**overrides).resolve(compute_cap="12.0", p2p_ok=True)


def ct200_gpus(count=8, driver="580.95.05", total=CT200_GPU["memory_total_mib"]):
    return [Gpu(i, f"GPU-{i}", CT200_GPU["name"], total, 0, "12.0", driver, f"0:{i}") for i in range(count)]


DEBIAN12_PYTHON = Interpreter((3, 11, 2), True)
NO_VENV = Venv(exists=False)


def facts(gpus, python=DEBIAN12_PYTHON, venv=NO_VENV, config=KIMI_CONFIG,
          curl="/usr/bin/curl", model_dir=KIMI_DIR):
    return {
        **NO_FITNESS, "gpu.NvidiaGpus": gpus, "gpu.SimulatedGpus": False, "ports.PortListener": {"port=30000": None},
        "venv.VenvState": {f"path={VENV}": venv},
        "server_envs.ServerEnvs": {f"root={VENV}-envs, sizes=False": NO_ENVS},
        "interpreter.PythonInterpreter": {"python=/usr/bin/python3": python},
        "server.Which": {"command=curl": curl},
        "model_dir.ModelDirState": {f"path={model_dir}": ModelDir(marker=None, files={}, partial_bytes=0)},
        "model_dir.ModelConfig": {f"path={model_dir}": config},
        "files.FreeBytes": {f"path={model_dir}": {"path": "/srv/models", "mount": "/srv/models",
                                                  "free_bytes": 2 * 10**12, "total_bytes": 4 * 10**12}},
    }  # fmt: skip


def run(spec, host_facts, hub=KIMI_HUB, tensors=None):
    """The preflight report and the preflight operation's commands on a fake host; the Hub not asked
    (``tensors``: the safetensors headers it would give, as TensorGroups; None: unreadable)."""
    state = FakeState()
    host = create_host(state, facts=at_server_venv(host_facts, spec))
    hub_files = patch.object(disk_check, "hub_files", side_effect=OSError("offline") if hub is None else None,
                             return_value=hub)
    hub_config = patch.object(memory_fit, "hub_config", side_effect=OSError("offline"))  # config.json: the host's
    hub_tensors = patch.object(checkpoint_tensors, "hub_tensor_groups", return_value=tensors,
                               side_effect=OSError("offline") if tensors is None else None)
    with ctx_state.use(state), ctx_host.use(host), hub_files, hub_config, hub_tensors:
        report = checks.preflight_report(spec)
        commands = list(preflight.gpu_host_can_serve._inner(spec=spec))
    return report, commands, host


def only(lines, needle):
    found = [line for line in lines if needle in line]
    assert len(found) == 1, (needle, lines)
    return found[0]


# --- the memory fit: Kimi K2.6 on ct200 ---------------------------------------------------

def test_kimi_k26_on_ct200_memory_fit_figures(caplog):
    """The plan on ct200 from K2.5's published config and tensor layout (the Hub's headers): weights
    counted per tensor, the CUDA/NCCL overhead and the multimodal reserve out of the static budget."""
    caplog.set_level("WARNING", logger="pyinfra")
    report, commands, host = run(ct200_spec(), facts(ct200_gpus(), config=K25_CONFIG), tensors=K25_TENSORS)
    fit = report.fit
    assert fit is not None and commands == []
    assert fit.gpu_bytes == 97887 * 1024**2 == 102_641_958_912  # "96 GB" RTX PRO 6000 as nvidia-smi reports it
    assert (fit.fraction, fit.fraction_from) == (0.94, "--mem-fraction-static")  # the profile's extra_server_args
    # 595.15 GB in the checkpoint; a rank holds its 1/8 of the experts and of the split layers, and whole
    # the replicated ones (norms, routers, MLA's q_a/kv_a, the vision MLP), plus MLA's w_kc/w_vc
    assert fit.weights_per_gpu == 77_002_374_656
    assert fit.overhead_bytes == 2 * 1024**3 and fit.mm_reserve_bytes == 100 * 1024**2
    assert round(fit.static_bytes) == round((102_641_958_912 - 2 * 1024**3) * 0.94)
    assert fit.per_token == 61 * (512 + 64) * 2 == 70272  # MLA: latent + rope per layer, bf16, on every rank
    assert fit.kv_tokens == int((fit.static_bytes - 77_002_374_656 - 100 * 1024**2) // 70272) == 247005
    assert fit.context == 262144
    summary = only(report.notes, "memory fit per GPU")
    assert summary.startswith("memory fit per GPU: weights ~77.00 GB (counted per tensor at TP 8: 77.00 GB of "
                              "595.15 GB (checkpoint -> one rank: experts 570.76 GB -> 71.35 GB, "), summary
    assert "(from the Hub's safetensors headers)); (102.64 GB - 2.15 GB CUDA context and NCCL, estimated) x " \
           "mem_fraction_static 0.94 (--mem-fraction-static) = 94.46 GB static - multimodal reserve " in summary
    assert summary.endswith("= ~247005 tokens (70272 bytes/token, MLA: 61 layers x (512 + 64) x 2 bytes "
                            "(bfloat16))"), summary
    warning = only(report.notes, "WARNING: the KV cache room")
    assert "holds ~247005 tokens, fewer than the context length 262144 (the model's config.json" in warning
    planned = [r.getMessage().split("plan: ", 1)[-1] for r in caplog.records if "plan: " in r.getMessage()]
    assert summary.replace("memory fit", "preflight: memory fit", 1) in planned and f"preflight: {warning}" in planned
    assert host.noop_description.startswith("preflight: 8 x NVIDIA RTX PRO 6000 Blackwell Server Edition "
                                            "(97887 MiB, SM 12.0), driver 580.95.05, P2P OK")


def test_without_tensor_headers_the_plan_says_it_estimates_bytes_over_tp():
    report, _commands, _host = run(ct200_spec(), facts(ct200_gpus()))
    assert report.fit.weights_per_gpu == 74_375_000_000  # 595 GB of safetensors (the Hub's sizes) / TP 8
    assert "weights ~74.38 GB (595.00 GB of safetensors / TP 8)" in only(report.notes, "memory fit per GPU")
    assert only(report.notes, "weights per GPU estimated") == (
        "weights per GPU estimated as the checkpoint's bytes over TP: tensor headers unreadable (the Hub: OSError)")


def test_the_hub_offline_the_profiles_size_is_used_and_the_disk_check_says_why():
    report, _commands, _host = run(ct200_spec(), facts(ct200_gpus()), hub=None)
    assert report.fit.weights_bytes == 595 * 10**9 and report.fit.weights_from == "(the profile's size_bytes)"
    assert report.problems == ["cannot check the disk: offline"]


def test_a_context_length_that_fits_gives_no_warning():
    spec = ct200_spec(extra_server_args=["--context-length", "131072"])
    report, commands, _host = run(spec, facts(ct200_gpus()))
    assert commands == [] and report.fit.context == 131072
    assert not [note for note in report.notes if "WARNING" in note]


def test_weights_that_do_not_fit_are_refused_before_anything_is_downloaded():
    spec = ct200_spec(gpu_ids=[0, 1, 2, 3, 4, 5], tp_size=6)  # 595 GB / 6 = 99 GB per 96 GB GPU
    report, commands, _host = run(spec, facts(ct200_gpus()))
    problem = only(report.problems, "the model does not fit")
    assert ("its weights need ~99.17 GB per GPU at TP 6 (595.00 GB / 6) but (102.64 GB - 2.15 GB) x "
            "mem_fraction_static 0.94 = 94.46 GB leaves no KV cache room (-4.70 GB)") in problem
    assert "allowed: more GPUs (gpu_ids, tp_size)" in problem
    assert commands[0].function.__name__ == "_fail" and "the model does not fit" in commands[0].args[0]


def test_without_mem_fraction_static_sglangs_default_is_estimated_and_said():
    profile_args = ["--tool-call-parser", "kimi_k2"]
    spec = ct200_spec()
    spec = spec.model_copy(update={"profile": spec.profile.model_copy(update={"extra_server_args": profile_args})})
    report, _commands, _host = run(spec, facts(ct200_gpus()))
    assert report.fit.fraction == round((97887 - 10240) / 97887, 3) == 0.895
    assert "SGLang's default, at most this" in report.fit.fraction_from


def test_unknown_config_says_the_tokens_are_unknown():
    report, commands, _host = run(ct200_spec(), facts(ct200_gpus(), config=None))  # not on the host, Hub offline
    assert commands == [] and report.fit.per_token is None
    note = only(report.notes, "KV cache room in tokens unknown")
    assert "config.json is not on the host yet and the Hub did not give it" in note
    assert "KV cache room 20.09 GB" in only(report.notes, "memory fit per GPU")


def test_mha_kv_per_token_counts_the_ranks_share_of_kv_heads():
    config = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
              "torch_dtype": "bfloat16", "max_position_embeddings": 131072}
    per_token, how = memory_fit.kv_bytes_per_token(config, tp=4, kv_cache_dtype=None)
    assert per_token == 32 * 2 * 2 * 128 * 2 and "2 KV head(s) per rank" in how
    assert memory_fit.kv_bytes_per_token(config, tp=4, kv_cache_dtype="fp8_e4m3")[0] == per_token / 2
    assert memory_fit.context_length(config) == 131072


# --- values nvidia-smi cannot report ([N/A] / [Not Supported]) ------------------------------

def test_unified_memory_gpu_memory_is_unknown_not_assumed():
    gb10 = [Gpu(0, "GPU-a8b3", "NVIDIA GB10", None, None, "12.1", "580.95.05", "00000000:01:00.0")]
    spec = ct200_spec(gpu_ids=[0], tp_size=1)
    report, commands, host = run(spec, facts(gb10))
    assert report.fit is None and commands == []
    warning = only(report.notes, "GPU memory unknown")
    assert "nvidia-smi reports memory.total [N/A] for GPU(s) [0] (NVIDIA GB10; unified memory?)" in warning
    assert "the model's memory fit is not checked" in warning
    assert "1 x NVIDIA GB10 (memory [N/A], SM 12.1)" in host.noop_description


def test_driver_version_unknown_with_a_minimum_required_is_a_problem():
    gpus = [Gpu(i, f"GPU-{i}", "NVIDIA RTX PRO 6000", 97887, 0, "12.0", None, f"0:{i}") for i in range(8)]
    report, _commands, _host = run(ct200_spec(min_driver_version="570.86"), facts(gpus))
    assert ("NVIDIA driver version unknown (nvidia-smi reports [N/A]): cannot check min_driver_version 570.86"
            in report.problems)
    assert only(report.notes, "does not report the driver version").startswith("WARNING: torch 2.14.1")


def test_compute_capability_unknown_leaves_the_spec_unresolved():
    gpus = [Gpu(0, "GPU-0", "NVIDIA GB10", None, None, None, "580.95.05", "0:0")]
    state = FakeState()
    with ctx_state.use(state), ctx_host.use(create_host(state, facts={"gpu.NvidiaGpus": gpus})):
        assert not checks.resolved_spec(ct200_unresolved()).resolved


# --- the pinned stack: Python, driver vs torch's CUDA, curl for get-pip.py ------------------

def test_python_below_requires_python_is_refused_naming_field_value_and_allowed():
    report, commands, _host = run(ct200_spec(), facts(ct200_gpus(), python=Interpreter((3, 10, 12), True)))
    problem = only(report.problems, "requires Python")
    assert problem == ("venv_python = '/usr/bin/python3' is Python 3.10.12, but sglang 0.5.23 requires Python >=3.11 "
                       "(its Requires-Python): allowed: venv_python = a python >=3.11")
    assert commands[0].function.__name__ == "_fail"


def test_python_ok_names_what_was_checked():
    report, _commands, _host = run(ct200_spec(), facts(ct200_gpus()))
    assert only(report.notes, "meets Requires-Python") == (
        "Python 3.11.2 (venv_python = '/usr/bin/python3') meets Requires-Python of sglang 0.5.23 (>=3.11)")


def test_an_existing_venv_is_judged_by_its_own_python():
    venv = Venv(exists=True, python_version="3.10.4", pip_version="24.0", has_ensurepip=True)
    spec = ct200_spec()
    report, _commands, _host = run(spec, facts(ct200_gpus(), venv=venv))
    problem = only(report.problems, "requires Python")
    assert problem.startswith(f"the venv's python {spec.python_bin} is Python 3.10.4")
    assert "(or remove the venv so that it is made again)" in problem


def test_no_python_at_venv_python():
    report, _commands, _host = run(ct200_spec(), facts(ct200_gpus(), python=None))
    assert "venv_python = '/usr/bin/python3': no python runs at that path on this host" in report.problems[0]


def test_driver_older_than_torchs_cuda_build_needs_is_refused():
    report, _commands, _host = run(ct200_spec(), facts(ct200_gpus(driver="570.86.15")))
    problem = only(report.problems, "too old for torch")
    assert problem == (
        "NVIDIA driver 570.86.15 is too old for torch 2.14.1 (required by sglang 0.5.23): its wheel depends on "
        "cuda-toolkit==13.0.3 (CUDA 13), which needs driver >= 580 (NVIDIA's CUDA compatibility table): allowed: "
        "a driver >= 580, or pins whose torch is built for the CUDA this driver runs")


def test_driver_new_enough_for_torchs_cuda_is_said():
    report, _commands, _host = run(ct200_spec(), facts(ct200_gpus()))
    assert only(report.notes, "CUDA 13 build") == (
        "torch 2.14.1 (required by sglang 0.5.23) is a CUDA 13 build (cuda-toolkit==13.0.3): driver 580.95.05 >= 580")


def test_a_torch_pin_not_in_the_table_is_named_not_guessed():
    report, _commands, _host = run(ct200_spec(packages=["sglang==0.5.23", "torch==2.13.0"]),
                                   facts(ct200_gpus(driver="470.1")))
    assert not [p for p in report.problems if "too old for torch" in p]
    assert "torch 2.13.0 (pinned in packages): its CUDA build is not in the table" in " ".join(report.notes)


def test_get_pip_path_needs_curl():
    no_ensurepip = Interpreter((3, 11, 2), False)
    report, _commands, _host = run(ct200_spec(), facts(ct200_gpus(), python=no_ensurepip, curl=None))
    problem = only(report.problems, "curl")
    assert problem.startswith("pip must come from get_pip_url = 'https://bootstrap.pypa.io/get-pip.py' "
                              "(venv_python = '/usr/bin/python3' has no ensurepip) but curl")
    assert "allowed: install curl, or python3-venv (ensurepip), or set pip_wheel" in problem
    # positive controls: curl there, ensurepip there, or a pip wheel to upload
    report, _c, _h = run(ct200_spec(), facts(ct200_gpus(), python=no_ensurepip))
    assert not report.problems and "curl is there" in " ".join(report.notes)
    assert not run(ct200_spec(), facts(ct200_gpus(), curl=None))[0].problems


# --- NCCL P2P env: from the P2P fact only ----------------------------------------------------

@pytest.mark.parametrize("p2p_ok, wanted, summary", [
    (True, {}, "P2P OK (NCCL picks the level)"),
    (False, {"NCCL_P2P_DISABLE": "1"}, "P2P off (NCCL_P2P_DISABLE=1)"),
    (None, {}, "P2P unknown (nothing set: NCCL decides)"),
])
def test_nccl_p2p_env_follows_the_fact(p2p_ok, wanted, summary):
    spec = ct200_spec(extra_env={}).resolve(compute_cap="12.0", p2p_ok=p2p_ok)
    assert spec.p2p_ok is p2p_ok
    env = spec.unit_env
    assert {k: v for k, v in env.items() if k.startswith("NCCL_P2P")} == wanted
    assert env["NCCL_IB_DISABLE"] == "1" and "NCCL_SHM_DISABLE" not in env
    assert preflight.p2p_summary(spec) == summary


def p2p(cells):
    return P2PMatrix(gpus=[0, 1, 2], status=cells)


@pytest.mark.parametrize("matrix, verdict", [
    (p2p([["X", "OK", "OK"], ["OK", "X", "OK"], ["OK", "OK", "X"]]), True),
    (p2p([["X", "OK", "NS"], ["OK", "X", "OK"], ["NS", "OK", "X"]]), False),
    (p2p([["X", "OK", "U"], ["OK", "X", "OK"], ["U", "OK", "X"]]), None),  # nvidia-smi: U = Unknown
    (P2PMatrix(gpus=[0, 1], status=[["X", "OK"], ["OK", "X"]]), None),  # GPU 2 missing from the matrix
    (None, None),  # no matrix at all
])
def test_p2p_verdict(matrix, verdict):
    assert checks.p2p_verdict(matrix, [0, 1, 2]) is verdict


def test_resolved_spec_keeps_unknown_p2p_unknown():
    state = FakeState()
    unknown = P2PMatrix(gpus=list(range(8)), status=[["X" if i == j else "U" for j in range(8)] for i in range(8)])
    facts_ = {**NO_FITNESS, "gpu.NvidiaGpus": ct200_gpus(), "gpu.GpuP2P": unknown}
    with ctx_state.use(state), ctx_host.use(create_host(state, facts=facts_)):
        spec = checks.resolved_spec(ct200_unresolved(extra_env={}))
    assert spec.resolved and spec.p2p_ok is None
    assert not [k for k in spec.unit_env if k.startswith("NCCL_P2P")]


def test_sandbox_group_data_pins_nvidia_ml_py_for_pynvml():
    data = runpy.run_path(str(ROOT / "group_data" / "sandbox.py"))
    assert "nvidia-ml-py==13.615.71" in data["packages"]
