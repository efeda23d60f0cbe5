"""Weights per GPU from the checkpoint's tensors, placed on the TP ranks by SGLang 0.5.23's rules.

The checkpoint's bytes over TP (the old count) is not what a rank holds: SGLang keeps some tensors
whole on every rank (norms, MLA's fused q_a/kv_a projection, the MoE router), pads the vocabulary
before it splits it, repeats KV heads when there are fewer than ranks, and skips what it does not
load (the MTP layer, rotary caches). Each tensor (name, dtype, shape) is placed by its name; the
rules and where SGLang sets them (paths under sglang/, sglang 0.5.23):

- column-parallel (split the output dim, dim 0; a column bias too): srt/layers/linear.py:482-488,
  511-513 - q_proj (no q_lora), q_b_proj, kv_b_proj (MLA), gate/up_proj (dense, shared experts);
- row-parallel (split the input dim, dim 1; the bias stays whole): linear.py:1611, 1634 - o_proj,
  down_proj;
- QKV KV heads: ``max(1, kv_heads // tp)`` heads per rank (linear.py:1136-1164): fewer KV heads
  than ranks are repeated, each rank holding one;
- vocab-parallel (embed_tokens, lm_head): the rows padded to 64 (64 x tp when that does not divide),
  then split (srt/layers/vocab_parallel_embedding.py:48, 57-59, 272-289, 327-350); a tied lm_head is
  the embedding itself (models/llama.py:570-579, models/qwen2.py:535-547);
- replicated (whole on every rank): RMSNorm weights (llama.py:366-369), the MoE router gate and its
  bias, MLA's fused q_a_proj + kv_a_proj_with_mqa (a ReplicatedLinear);
- routed experts under TP (FusedMoE, no expert parallelism): every rank holds every expert with
  the intermediate dim split: gate/up split like column, down like row;
- skipped: rotary_emb.inv_freq and caches (llama.py:726-745), layers at or past
  num_hidden_layers (DeepseekV3's MTP layer: loaded only for speculative decoding);
- quantized layouts follow their weight: compressed-tensors' weight_packed (int32, 8 INT4 per
  element along the input dim) and weight_scale (one per group along the input dim) split on the
  weight's dim; ModelOpt NVFP4's weight (uint8, 2 FP4 each) and weight_scale (FP8 per 16) likewise;
  per-tensor scalars (weight_scale_2, input_scale, weight_global_scale) and compressed-tensors'
  weight_shape stay whole.

A name no rule knows is counted whole on every rank (an upper bound) and named in the plan's notes.
Standard library only (but WeightPlan.text): the sandbox's SGLang stand-in places its ranks' weights
with this same file (copied into its guests: sandbox/hosts.py GUEST_FILES).

    plan = place(summarize(tensors), config, tp=8)   # WeightPlan: per_rank_bytes, notes, by_kind
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

# safetensors dtypes (huggingface/safetensors: Dtype); FP4 checkpoints store U8 (two values a byte)
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
               "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}  # fmt: skip
VOCAB_PADDING = 64  # DEFAULT_VOCAB_PADDING_SIZE, srt/layers/vocab_parallel_embedding.py:48
_EXPERT_INDEX = re.compile(r"\.experts\.\d+\.")
# prefixes of the language model's tensors in multimodal checkpoints (Kimi K2.5/K2.6: language_model.)
_PREFIXES = ("language_model.", "model.language_model.", "model.")
_SCALAR_SUFFIXES = ("weight_shape", "weight_scale_2", "input_scale", "weight_global_scale", "input_global_scale",
                    "k_scale", "v_scale")  # fmt: skip


@dataclass(frozen=True)
class TensorGroup:
    """Tensors that share a name pattern (expert indices as ``*``), a dtype and a shape."""

    pattern: str
    dtype: str
    shape: tuple[int, ...]
    count: int = 1

    @property
    def nbytes(self) -> int:
        return DTYPE_BYTES.get(self.dtype, 2) * math.prod(self.shape) * self.count

    def as_row(self) -> list[Any]:
        return [self.pattern, self.dtype, list(self.shape), self.count]


def summarize(tensors: Iterable[tuple[str, str, Sequence[int]]]) -> list[TensorGroup]:
    """Group (name, dtype, shape) by pattern: a 595 GB checkpoint's ~200k tensors become a few thousand rows."""
    counts: Counter[tuple[str, str, tuple[int, ...]]] = Counter()
    for name, dtype, shape in tensors:
        counts[(_EXPERT_INDEX.sub(".experts.*.", name), dtype.upper(), tuple(int(d) for d in shape))] += 1
    return [TensorGroup(p, d, s, n) for (p, d, s), n in sorted(counts.items())]


def file_tensors(paths: Iterable[str | os.PathLike[str]]) -> list[tuple[str, str, list[int]]]:
    """(name, dtype, shape) of every tensor in these *.safetensors files, from their headers (8 bytes of
    length, then JSON); no tensor data is read."""
    found = []
    for path in paths:
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        found += [(n, t["dtype"], t["shape"]) for n, t in header.items() if n != "__metadata__"]
    return found


def from_rows(rows: Iterable[Sequence[Any]]) -> list[TensorGroup]:
    """TensorGroups from their JSON rows ([pattern, dtype, shape, count])."""
    return [TensorGroup(str(p), str(d), tuple(int(x) for x in s), int(n)) for p, d, s, n in rows]


@dataclass(frozen=True)
class Placement:
    kind: str  # replicated | column | row | kv-heads | vocab | tied | experts | skipped
    dim: int | None = None  # the dim split over the ranks


REPLICATED, SKIPPED = Placement("replicated"), Placement("skipped")


def _text(config: dict[str, Any]) -> dict[str, Any]:
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) and "num_hidden_layers" in nested else config


def _language_name(name: str) -> str | None:
    """The name inside the language model ('layers.3.self_attn.o_proj.weight', 'lm_head.weight'),
    None for a multimodal part (vision tower, projector)."""
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    if name.startswith(("vision_tower.", "mm_projector.", "multi_modal_projector.", "visual.")):
        return None
    return name.removeprefix("model.")


def placement(name: str, config: dict[str, Any]) -> Placement:
    """Where SGLang puts one checkpoint tensor (the module docstring's rules)."""
    text = _text(config)
    inner = _language_name(name)
    if inner is None:  # Kimi K2.5/K2.6's MoonViT: attention over TP, the rest whole (docstring)
        if name.startswith("vision_tower.") and ".wqkv." in name:
            return Placement("column", 0)
        if name.startswith("vision_tower.") and ".wo." in name:
            return Placement("row", 1)
        return REPLICATED
    leaf = inner.rsplit(".", 1)[-1]
    if "rotary_emb." in inner:
        return SKIPPED
    layer = re.match(r"layers\.(\d+)\.", inner)
    if layer and int(layer.group(1)) >= int(text.get("num_hidden_layers") or 10**9):
        return SKIPPED  # DeepseekV3's MTP (nextn) layer: the target model does not load it
    if leaf in _SCALAR_SUFFIXES:
        return REPLICATED
    if inner.startswith("embed_tokens."):
        return Placement("vocab", 0)
    if inner.startswith("lm_head."):
        return Placement("tied") if text.get("tie_word_embeddings", config.get("tie_word_embeddings")) else Placement("vocab", 0)
    if "norm" in inner.rsplit(".", 2)[-2] or leaf == "e_score_correction_bias" or ".mlp.gate." in inner:
        return REPLICATED
    if re.search(r"\.self_attn\.(q_a_proj|kv_a_proj_with_mqa|fused_qkv_a_proj_with_mqa)\.", inner):
        return REPLICATED
    if re.search(r"\.self_attn\.(k_proj|v_proj)\.", inner):
        return Placement("kv-heads", 0)
    if re.search(r"\.mlp\.experts\.[^.]+\.(gate_proj|up_proj|w1|w3)\.", inner):
        return Placement("experts", 0)
    if re.search(r"\.mlp\.experts\.[^.]+\.(down_proj|w2)\.", inner):
        return Placement("experts", 1)
    if re.search(r"\.(q_proj|q_b_proj|kv_b_proj|qkv_proj|gate_proj|up_proj|gate_up_proj)\.", inner):
        return Placement("column", 0)
    if re.search(r"\.(o_proj|down_proj)\.", inner):
        return Placement("row", 1)
    return Placement("unknown")


def _split(shape: tuple[int, ...], dim: int, parts: float) -> int:
    """Elements on one rank when ``dim`` is split ``parts`` ways (a dim of 1, a scalar: whole)."""
    if len(shape) <= dim or shape[dim] <= 1:
        return math.prod(shape)
    return math.ceil(shape[dim] / parts) * math.prod(shape) // shape[dim]


def padded_vocab_rows(vocab: int, tp: int) -> int:
    """Rows of embed_tokens / lm_head on one rank (vocab_parallel_embedding.py:57-59, 272-289, 327-350)."""
    pad = VOCAB_PADDING if math.ceil(vocab / VOCAB_PADDING) * VOCAB_PADDING % tp == 0 else VOCAB_PADDING * tp
    return math.ceil(vocab / pad) * pad // tp


def rank_bytes(group: TensorGroup, where: Placement, config: dict[str, Any], tp: int) -> int:
    """Bytes of one group on one rank."""
    size = DTYPE_BYTES.get(group.dtype, 2) * group.count
    shape = group.shape
    if where.kind in ("skipped", "tied", "multimodal"):
        return 0
    if where.kind in ("replicated", "unknown") or tp == 1:
        return size * math.prod(shape)
    if where.kind == "vocab":
        return size * padded_vocab_rows(shape[0], tp) * math.prod(shape[1:])
    if where.kind == "kv-heads":
        text = _text(config)
        kv_heads = int(text.get("num_key_value_heads") or text.get("num_attention_heads") or tp)
        return size * _split(shape, 0, kv_heads / max(1, kv_heads // tp))
    if where.kind in ("column", "row") and len(shape) == 1:  # a bias: split with a column, whole with a row
        return size * (_split(shape, 0, tp) if where.kind == "column" else shape[0])
    return size * _split(shape, where.dim or 0, tp)


def mla_absorbed_bytes(kv_b_proj: TensorGroup, on_rank: int) -> int:
    """MLA's w_kc and w_vc, made from the rank's kv_b_proj after loading: new storage (``.contiguous()``
    of its split) of the same elements, in bf16 (an FP8 kv_b_proj is dequantized to bf16), while
    kv_b_proj itself stays (the MHA prefill path uses it): srt/models/deepseek_common/
    deepseek_weight_loader.py:704-719, 762-786."""
    return on_rank * 2 // DTYPE_BYTES.get(kv_b_proj.dtype, 2)


@dataclass(frozen=True)
class WeightPlan:
    per_rank_bytes: int
    checkpoint_bytes: int
    tp: int
    by_kind: dict[str, tuple[int, int]] = field(default_factory=dict)  # kind -> (checkpoint bytes, one rank's)
    notes: tuple[str, ...] = ()

    def text(self) -> str:
        """How it was counted, e.g. 'experts 570.76 GB -> 71.35 GB, ..., replicated 2.84 GB'."""
        from core.ops import gb  # here: the sandbox's stand-in imports this module alone (stdlib only)

        parts = []
        for kind, (whole, rank) in sorted(self.by_kind.items(), key=lambda kv: -max(kv[1])):
            parts.append(gb(rank) if whole == rank else f"+{gb(rank)}" if not whole else f"{gb(whole)} -> {gb(rank)}")
            parts[-1] = f"{kind} {parts[-1]}"
        notes = "; " + "; ".join(self.notes) if self.notes else ""
        return f"{gb(self.per_rank_bytes)} of {gb(self.checkpoint_bytes)} (checkpoint -> one rank: {', '.join(parts)}){notes}"


def place(groups: Iterable[TensorGroup], config: dict[str, Any], tp: int) -> WeightPlan:
    """One rank's weight bytes under TP ``tp`` (the module docstring's rules), with what SGLang
    creates at load beside them (MLA's w_kc/w_vc)."""
    tp = max(1, tp)
    by_kind: dict[str, list[int]] = {}
    unknown: list[str] = []
    total = rank_total = 0
    for group in groups:
        where = placement(group.pattern, config)
        if where.kind == "unknown":
            unknown.append(group.pattern)
        on_rank = rank_bytes(group, where, config, tp)
        entry = by_kind.setdefault(where.kind, [0, 0])
        entry[0] += group.nbytes
        entry[1] += on_rank
        total += group.nbytes
        rank_total += on_rank
        if re.search(r"\.self_attn\.kv_b_proj\.weight$", group.pattern) and where.kind != "skipped":
            absorbed = mla_absorbed_bytes(group, on_rank)
            by_kind.setdefault("created at load (MLA w_kc, w_vc)", [0, 0])[1] += absorbed
            rank_total += absorbed
    notes = []
    if unknown:
        notes.append(f"{len(unknown)} tensor name(s) no rule knows, counted whole on every rank (e.g. {unknown[0]})")
    return WeightPlan(per_rank_bytes=rank_total, checkpoint_bytes=total, tp=tp,
                      by_kind={k: (v[0], v[1]) for k, v in by_kind.items()}, notes=tuple(notes))
