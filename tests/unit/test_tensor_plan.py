"""Weights per GPU tensor by tensor (core/tensor_plan.py): SGLang 0.5.23's placement rules on small
hand-counted layouts, the quantized layouts, and Kimi K2.5's published tensor layout
(tests/fixtures/kimi-k2.5/: its sources there)."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from core.tensor_plan import from_rows, padded_vocab_rows, place, placement, summarize
from sandbox import tinyllama

K25 = Path(__file__).resolve().parents[1] / "fixtures" / "kimi-k2.5"
K25_CONFIG = json.loads((K25 / "config.json").read_text())
LLAMA = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": False}


def plan(tensors, config=LLAMA, tp=1):
    return place(summarize(tensors), config, tp)


def test_the_tiny_llama_the_real_server_loads_at_tp_1_and_2():
    """hidden 64, 2 layers, 4 heads / 2 KV heads of 16, vocab 384, untied lm_head: counted by hand."""
    groups = summarize((t.name, t.dtype, t.shape) for t in tinyllama._tensors())
    config = tinyllama.config()
    whole = 2 * (384 * 64 * 2) + 2 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 128 * 64 + 2 * 64) * 2 + 64 * 2
    assert place(groups, config, 1).per_rank_bytes == place(groups, config, 1).checkpoint_bytes == whole == 246400
    # TP 2: embed and lm_head 192 rows each, q 32 and o 32 of 64, k/v one KV head each, MLP half; norms whole
    half = 2 * (192 * 64 * 2) + 2 * (2 * 32 * 64 + 2 * 16 * 64 + 3 * 64 * 64 + 2 * 64) * 2 + 64 * 2
    assert place(groups, config, 2).per_rank_bytes == half == 123520


def test_fewer_kv_heads_than_ranks_are_repeated_and_the_vocab_is_padded():
    layer = [("model.layers.0.self_attn.k_proj.weight", "BF16", (2 * 128, 4096)),
             ("model.layers.0.self_attn.q_proj.weight", "BF16", (32 * 128, 4096))]  # fmt: skip
    config = {**LLAMA, "num_attention_heads": 32, "num_key_value_heads": 2}
    assert plan(layer, config, tp=8).per_rank_bytes == (128 + 4 * 128) * 4096 * 2  # one whole KV head, 4 q heads
    assert padded_vocab_rows(163840, 8) == 20480 and padded_vocab_rows(151936, 8) == 18992
    assert padded_vocab_rows(32001, 8) == 32064 // 8 and padded_vocab_rows(100, 3) == 192 // 3  # 64 x tp
    assert plan([("model.embed_tokens.weight", "BF16", (32001, 16))], tp=8).per_rank_bytes == 4008 * 16 * 2


def test_a_tied_lm_head_is_the_embedding_and_skipped_tensors_cost_nothing():
    tied = [("model.embed_tokens.weight", "BF16", (1024, 64)), ("lm_head.weight", "BF16", (1024, 64)),
            ("model.layers.0.self_attn.rotary_emb.inv_freq", "F32", (32,))]  # fmt: skip
    assert plan(tied, {**LLAMA, "tie_word_embeddings": True}).per_rank_bytes == 1024 * 64 * 2
    assert plan(tied, LLAMA).per_rank_bytes == 2 * 1024 * 64 * 2
    mtp = [("model.layers.61.mlp.experts.0.down_proj.weight", "BF16", (7168, 2048))]  # the MTP layer
    assert plan(mtp, {"num_hidden_layers": 61}).per_rank_bytes == 0
    assert placement("model.layers.60.mlp.experts.0.down_proj.weight", {"num_hidden_layers": 61}).kind == "experts"


@pytest.mark.parametrize("name, kind, dim", [
    ("model.layers.3.self_attn.kv_a_proj_with_mqa.weight", "replicated", None),
    ("model.layers.3.self_attn.q_a_proj.weight_packed", "replicated", None),
    ("model.layers.3.self_attn.q_a_layernorm.weight", "replicated", None),
    ("model.layers.3.mlp.gate.weight", "replicated", None),
    ("model.layers.3.mlp.gate.e_score_correction_bias", "replicated", None),
    ("model.layers.3.self_attn.kv_b_proj.weight", "column", 0),
    ("model.layers.3.self_attn.o_proj.weight", "row", 1),
    ("model.layers.3.mlp.shared_experts.up_proj.weight", "column", 0),
    ("model.layers.3.mlp.experts.17.gate_proj.weight_scale", "experts", 0),
    ("model.layers.3.mlp.experts.17.down_proj.weight_packed", "experts", 1),
    ("model.layers.3.mlp.experts.17.down_proj.weight_shape", "replicated", None),
    ("model.layers.3.mlp.experts.17.down_proj.weight_scale_2", "replicated", None),
    ("language_model.model.norm.weight", "replicated", None),
    ("vision_tower.encoder.blocks.0.wqkv.weight", "column", 0),
    ("vision_tower.encoder.blocks.0.mlp.fc0.weight", "replicated", None),
    ("mm_projector.proj.0.weight", "replicated", None),
    ("model.layers.3.some_new_thing.weight", "unknown", None),
])  # fmt: skip
def test_deepseek_v3_names_are_placed_as_sglang_holds_them(name, kind, dim):
    where = placement(name, {"num_hidden_layers": 61})
    assert (where.kind, where.dim) == (kind, dim)


def test_quantized_layouts_split_with_their_weight_and_keep_their_scalars_whole():
    int4 = [("model.layers.1.mlp.experts.0.down_proj.weight_packed", "I32", (7168, 256)),  # 2048 / 8 per int32
            ("model.layers.1.mlp.experts.0.down_proj.weight_scale", "BF16", (7168, 64)),  # one per 32
            ("model.layers.1.mlp.experts.0.down_proj.weight_shape", "I32", (2,))]  # fmt: skip
    assert plan(int4, tp=8).per_rank_bytes == 7168 * 32 * 4 + 7168 * 8 * 2 + 2 * 4
    nvfp4 = [("model.layers.0.mlp.gate_proj.weight", "U8", (2048, 3584)),  # two FP4 a byte
             ("model.layers.0.mlp.gate_proj.weight_scale", "F8_E4M3", (2048, 448)),  # one per 16
             ("model.layers.0.mlp.gate_proj.weight_scale_2", "F32", ()),
             ("model.layers.0.mlp.gate_proj.input_scale", "F32", ())]  # fmt: skip
    assert plan(nvfp4, tp=8).per_rank_bytes == 256 * 3584 + 256 * 448 + 4 + 4
    bias = [("model.layers.0.self_attn.o_proj.bias", "BF16", (4096,)), ("model.layers.0.self_attn.q_proj.bias", "BF16", (4096,))]
    assert plan(bias, {**LLAMA, "num_attention_heads": 32}, tp=8).per_rank_bytes == 4096 * 2 + 512 * 2  # row bias whole


def test_mla_keeps_w_kc_and_w_vc_beside_kv_b_proj():
    kv_b = [("model.layers.0.self_attn.kv_b_proj.weight", "BF16", (64 * 256, 512))]
    result = plan(kv_b, {"num_hidden_layers": 1}, tp=8)
    assert result.per_rank_bytes == 2 * (8 * 256 * 512 * 2)  # the rank's kv_b_proj and its bf16 split copy
    assert result.by_kind["created at load (MLA w_kc, w_vc)"] == (0, 8 * 256 * 512 * 2)


def test_a_name_no_rule_knows_is_counted_whole_and_said():
    result = plan([("model.layers.0.mystery.weight", "BF16", (1024, 1024))], tp=8)
    assert result.per_rank_bytes == 1024 * 1024 * 2
    assert result.notes == ("1 tensor name(s) no rule knows, counted whole on every rank (e.g. "
                            "model.layers.0.mystery.weight)",)
    assert "no rule knows" in result.text()


def test_kimi_k25s_published_layout_placed_on_8_ranks():
    """The published listing: 208,550 tensors, 554.30 GiB in 64 files (the headers included); a rank
    holds 77.0 GB of it, not the 74.4 GB of bytes / 8."""
    tensors = runpy.run_path(str(K25 / "layout.py"))["tensors"]()
    assert len(tensors) == 208_550
    groups = summarize(tensors)
    assert [g.as_row() for g in groups] == json.loads((K25 / "tensors.json").read_text())  # the committed rows
    assert from_rows(json.loads((K25 / "tensors.json").read_text())) == groups
    result = place(groups, K25_CONFIG, 8)
    assert result.checkpoint_bytes == 595_148_192_736 and round(result.checkpoint_bytes / 2**30, 2) == 554.27
    assert result.per_rank_bytes == 77_002_374_656
    experts = result.by_kind["experts"]
    # 60 x 384 experts of gate, up ([2048, 896] int32 + [2048, 224] bf16) and down ([7168, 256] + [7168, 64]),
    # each split 8 ways along the intermediate dim (their weight_shape, 2 int32, is counted replicated)
    per_expert = (2048 * 896 * 4 + 2048 * 224 * 2) * 2 + 7168 * 256 * 4 + 7168 * 64 * 2
    assert experts == (60 * 384 * per_expert, 60 * 384 * per_expert // 8) == (570_760_888_320, 71_345_111_040)
    assert result.by_kind["replicated"][0] == result.by_kind["replicated"][1] > 2.8e9  # q_a/kv_a, routers, vision MLP
    assert result.notes == ()


def test_the_hosts_header_reader_reads_real_safetensors_files(tmp_path):
    """facts.model_dir.CheckpointTensors' command, run by bash on a real model dir (the tiny Llama's
    generated files): every tensor back, as the generator wrote it; no dir, no tensors."""
    import subprocess

    from facts.model_dir import CheckpointTensors

    tinyllama.generate(tmp_path / "m")
    fact = CheckpointTensors()
    out = subprocess.run(["bash", "-c", fact.command(str(tmp_path / "m")).get_raw_value()], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    rows = fact.process(out.splitlines())
    assert summarize(rows) == summarize((t.name, t.dtype, t.shape) for t in tinyllama._tensors())
    empty = subprocess.run(["bash", "-c", fact.command(str(tmp_path / "none")).get_raw_value()], capture_output=True,
                           text=True, timeout=60, check=True).stdout
    assert fact.process(empty.splitlines()) is None
