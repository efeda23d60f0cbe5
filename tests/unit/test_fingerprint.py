"""core/fingerprint.py: what SGLang chose at start against what the deploy planned."""

from __future__ import annotations

import pytest

from core.fingerprint import LaunchPlan, compare, fingerprint_of, launch_plan, summary
from core.memory_fit import fit_for
from tests.unit.test_step_operations import sandbox_spec

GIB = 2**30
# what sglang 0.5.23 answered on the real-server sandbox host (a part of /server_info)
REAL_INFO = {"version": "0.5.23", "tp_size": 1, "max_total_num_tokens": 8192, "max_req_input_len": 4091,
             "context_length": None, "attention_backend": "torch_native", "quantization": None,
             "kv_cache_dtype": "auto", "speculative_algorithm": None, "cuda_graph_max_bs": 8,
             "api_key": "<redacted>", "model_path": "/srv/models/tiny-llama"}


def test_the_fingerprint_keeps_what_sglang_chose_and_nothing_else():
    kept = fingerprint_of(REAL_INFO)
    assert "api_key" not in kept and "model_path" not in kept
    assert kept["max_total_num_tokens"] == 8192 and kept["attention_backend"] == "torch_native"
    assert summary(kept) == "max_total_num_tokens=8192, attention_backend=torch_native, cuda_graph_max_bs=8"


def plan_for(**overrides) -> LaunchPlan:
    spec = sandbox_spec(**overrides)
    config = {"num_hidden_layers": 2, "kv_lora_rank": 64, "qk_rope_head_dim": 32, "torch_dtype": "bfloat16"}
    return launch_plan(spec, fit_for(spec, 96 * GIB, (40_000_000, "of safetensors"), config))


def test_the_plan_is_the_command_line_and_the_memory_fit():
    plan = plan_for()
    assert plan.equal == {"tp_size": 8, "attention_backend": "triton"}  # auto resolved on SM120 + MLA
    assert plan.kv_from == "the memory fit" and plan.kv_tokens > 200_000_000 and plan.kv_tolerance == 0.5
    capped = plan_for(extra_server_args=["--max-total-tokens", "8192", "--context-length", "2048"])
    assert (capped.kv_tokens, capped.kv_from) == (8192, "--max-total-tokens")
    assert capped.equal["context_length"] == 2048


def test_as_planned_passes_and_each_mismatch_names_both_values():
    plan = LaunchPlan(equal={"tp_size": 8, "attention_backend": "triton"}, kv_tokens=400_000, kv_from="the memory fit")
    good = {"tp_size": 8, "attention_backend": "triton", "max_total_num_tokens": 390_000}
    assert compare(plan, good) == ([], [])
    problems, _ = compare(plan, {**good, "attention_backend": "flashinfer", "max_total_num_tokens": 40_000})
    assert problems[0] == "attention_backend is 'flashinfer', the deploy asked for 'triton'"
    assert problems[1].startswith("the KV pool holds 40000 tokens (max_total_num_tokens), below 0.5 x the 400000 "
                                  "tokens the memory fit planned (10%)")
    assert compare(LaunchPlan(kv_tokens=400_000, kv_tolerance=0), {"max_total_num_tokens": 1}) == ([], [])


@pytest.mark.parametrize("on_mismatch", ["fail", "warn"])
def test_the_profiles_expectations_fail_or_warn_as_it_says(on_mismatch):
    plan = LaunchPlan(at_least={"max_total_num_tokens": 500_000, "context_length": 262_144},
                      expect_equal={"attention_backend": "triton"}, warn_only=on_mismatch == "warn")
    problems, warnings = compare(plan, {"max_total_num_tokens": 300_000, "context_length": 262_144,
                                        "attention_backend": "flashinfer"})
    found = problems if on_mismatch == "fail" else warnings
    assert found == ["max_total_num_tokens is 300000, the profile expects at least 500000",
                     "attention_backend is 'flashinfer', the profile expects 'triton'"]
    assert (warnings if on_mismatch == "fail" else problems) == []


def test_the_stand_ins_kv_pool_is_sized_like_the_memory_fit_counts_it(monkeypatch):
    """The stand-in's tokens per byte (sandbox/sglang_standin.py kv_cell_bytes, SGLang's pools) and the
    memory fit's (core/memory_fit.py) agree, for the sandbox's MLA and MHA models and at TP 1 and 8."""
    from pathlib import Path

    from core.memory_fit import kv_bytes_per_token
    from sandbox import tinyllama, tinymodel

    monkeypatch.syspath_prepend(str(Path(tinymodel.__file__).parent))  # as in a guest: beside its siblings
    import sglang_standin

    configs = [tinymodel._config("deepseek_v3", 2, 4, 1, "pack-quantized"), tinyllama.config()]
    for config in configs:
        for tp in (1, 8):
            assert sglang_standin.kv_cell_bytes(config, tp, None) == kv_bytes_per_token(config, tp, None)[0], (config, tp)
    # the pool: what the memory leaves after the weights at mem_fraction_static, SGLang's formula
    tokens, kv_gb = sglang_standin.kv_pool_tokens(configs[1], {"tp_size": 1, "mem_fraction_static": 0.5}, 10.0, 1.0)
    assert tokens == int(4.0 * GIB // sglang_standin.kv_cell_bytes(configs[1], 1, None)) and round(kv_gb, 3) == 4.0
    capped, _ = sglang_standin.kv_pool_tokens(configs[1], {"tp_size": 1, "mem_fraction_static": 0.5,
                                                           "max_total_tokens": 8192}, 10.0, 1.0)
    assert capped == 8192


def test_the_stand_in_holds_each_ranks_weights_as_the_memory_plan_places_them(monkeypatch, tmp_path):
    """The stand-in's weights per rank (sglang_standin.rank_weight_bytes) are the plan's (core/tensor_plan.py,
    the same file copied beside it in a guest): at TP 2 the tiny Llama's rank holds 123520 bytes, not its
    files' bytes / 2; without the rules beside it, the files' bytes / TP."""
    from pathlib import Path

    from sandbox import tinyllama

    monkeypatch.syspath_prepend(str(Path(tinyllama.__file__).parent))
    import sglang_standin

    tinyllama.generate(tmp_path)
    files = [str(tmp_path / "model.safetensors")]
    assert sglang_standin.rank_weight_bytes(files, tinyllama.config(), 2) == 123520
    assert sglang_standin.rank_weight_bytes(files, tinyllama.config(), 1) == 246400
    import sys

    import core

    monkeypatch.setitem(sys.modules, "tensor_plan", None)  # None in sys.modules: that import fails
    monkeypatch.setitem(sys.modules, "core.tensor_plan", None)
    monkeypatch.delattr(core, "tensor_plan", raising=False)
    assert sglang_standin.rank_weight_bytes(files, tinyllama.config(), 2) == (tmp_path / "model.safetensors").stat().st_size / 2
