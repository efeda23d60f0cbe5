"""A tiny, deterministic stand-in for a large quantized MoE checkpoint.

`generate(out_dir)` writes what a Hugging Face repo of a DeepSeek-V3 / Kimi-K2
style model holds - config.json with MLA fields and a compressed-tensors
quantization_config, generation_config.json, tokenizer files, a
model.safetensors.index.json and real safetensors shards - only small:
~`size_mb` MB. Same inputs -> identical bytes (and therefore identical sizes,
sha256 and commit sha), so tests and the sandbox can pin a revision.

The shards are written in the safetensors format by hand (stdlib only): an
8-byte little-endian header length, a JSON header
{name: {dtype, shape, data_offsets}, "__metadata__": {...}} padded with spaces
to a multiple of 8, then the tensor bytes back to back. Tensor names, dtypes
and shapes follow what a compressed-tensors checkpoint of the chosen format
holds, so the files look like the real thing to anything that reads headers
or the index: pack-quantized is Kimi K2.6's own quantization (INT4 W4A16,
symmetric groups of 32, routed experts only: weight_packed I32, weight_scale
BF16, weight_shape I64; attention, shared experts, the dense MLP and lm_head
BF16 and in `ignore`); nvfp4-pack-quantized (the default) quantizes every
Linear (weight_packed U8, weight_scale F8_E4M3, weight_global_scale /
input_global_scale F32).

`generate_draft(out_dir)` writes a tiny EAGLE3 draft model beside it (what
`--speculative-algorithm EAGLE3 --speculative-draft-model-path` reads, in the
layout of EAGLE3 drafts such as AQ-MedAI/Kimi-K26-eagle3): config.json with
"architectures": ["LlamaForCausalLMEagle3"], one decoder layer whose attention
takes 2 x hidden_size (the token's embedding and the target's hidden state), the
`fc` that folds three of the target's hidden states into one, a reduced draft
vocabulary (lm_head, d2t, t2d), and one real model.safetensors of a few MB.

Stdlib only: the sandbox may run this on a host without the project venv.

CLI (for manual use): python -m sandbox.tinymodel OUT_DIR [--size-mb 40] [--draft]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

__all__ = ["FileEntry", "ModelInfo", "generate", "generate_draft", "scan", "git_blob_sha1", "LFS_SUFFIXES"]

# Files that a Hub repo keeps in LFS (by .gitattributes); anything >= 10 MiB is LFS too.
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".model", ".msgpack", ".h5", ".gguf")
LFS_MIN_SIZE = 10 * 1024 * 1024

_CHUNK = 1 << 20


class FileEntry(NamedTuple):
    """One file of a generated (or scanned) repo: path relative to the repo root."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class ModelInfo:
    """What `generate` (or `scan`) produced: where, which files, which commit."""

    root: Path
    files: tuple[FileEntry, ...]
    commit: str  # 40 hex, the revision a deploy pins
    total_bytes: int
    config: dict = field(default_factory=dict, compare=False, repr=False)

    def file(self, path: str) -> FileEntry:
        for f in self.files:
            if f.path == path:
                return f
        raise KeyError(path)

    @property
    def shard_names(self) -> list[str]:
        return sorted(f.path for f in self.files if f.path.endswith(".safetensors"))


# ---------------------------------------------------------------------------
# hashing helpers


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob with this content (what the Hub calls a file's oid)."""
    h = hashlib.sha1(b"blob %d\0" % len(data))
    h.update(data)
    return h.hexdigest()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _commit_from(files: list[FileEntry]) -> str:
    """A deterministic 40-hex 'commit' for a set of files (a content hash, like a git tree)."""
    h = hashlib.sha1(b"sandbox-hub-commit\0")
    for f in sorted(files):
        h.update(f"{f.path}\0{f.size}\0{f.sha256}\n".encode())
    return h.hexdigest()


def scan(root: Path, commit: str | None = None) -> ModelInfo:
    """Describe an existing directory as a repo (every file except .git/ and .cache/)."""
    root = Path(root)
    files: list[FileEntry] = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if rel.parts[0] in (".git", ".cache") or not p.is_file():
            continue
        files.append(FileEntry(rel.as_posix(), p.stat().st_size, _sha256_file(p)))
    config: dict = {}
    if (root / "config.json").is_file():
        try:
            config = json.loads((root / "config.json").read_text())
        except ValueError:
            config = {}
    return ModelInfo(
        root=root,
        files=tuple(files),
        commit=commit or _commit_from(files),
        total_bytes=sum(f.size for f in files),
        config=config,
    )


# ---------------------------------------------------------------------------
# model layout

# safetensors dtype -> bytes per element
_DTYPE_SIZE = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "I32": 4, "U8": 1, "F8_E4M3": 1, "I8": 1, "BOOL": 1}

# Fixed small dimensions (MLA attention like DeepSeek-V3 / Kimi K2, scaled down).
_DIMS = dict(
    vocab_size=1024,
    hidden_size=512,
    intermediate_size=1024,  # the dense MLP of the first layer(s)
    moe_intermediate_size=256,
    num_attention_heads=4,
    q_lora_rank=128,
    kv_lora_rank=64,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
    v_head_dim=32,
    n_shared_experts=1,
)


@dataclass(frozen=True)
class _Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    fill: str = "random"  # random | ones | value:<float> | shape:<a>,<b>

    @property
    def nbytes(self) -> int:
        n = _DTYPE_SIZE[self.dtype]
        for d in self.shape:
            n *= d
        return n


# Kimi K2.6 (moonshotai/Kimi-K2.6): compressed-tensors INT4 W4A16 "pack-quantized",
# symmetric groups of 32, on the routed experts only; attention (MLA), the shared
# experts, the dense MLP of the first layer(s) and lm_head stay BF16 (its `ignore`).
KIMI_INT4_FORMAT = "pack-quantized"
KIMI_INT4_IGNORE = ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]
_INT_FORMATS = ("pack-quantized", "int-quantized", "marlin-24")
_FP8_FORMATS = ("float-quantized", "naive-quantized", "mxfp8-quantized")


def _args(bits: int, kind: str, strategy: str, group: int | None, dynamic: bool | str, **extra) -> dict:
    """One QuantizationArgs of a config group (weights or input_activations)."""
    return {"num_bits": bits, "type": kind, "symmetric": True, "strategy": strategy, "group_size": group,
            "dynamic": dynamic, **extra, "observer": "minmax" if dynamic is not True else None,
            "observer_kwargs": {}}


def _quant_scheme(quant_format: str) -> dict:
    """The compressed-tensors scheme (config_groups.group_0) for a format."""
    if quant_format == KIMI_INT4_FORMAT:  # Kimi K2.6's own: W4A16, the format named once, at the top
        weights = _args(4, "int", "group", 32, False, actorder=None, block_structure=None)
        return {"targets": ["Linear"], "weights": weights, "input_activations": None, "output_activations": None}
    if quant_format in _INT_FORMATS:
        weights, inputs = _args(4, "int", "group", 32, False, actorder=None), None
    elif quant_format in _FP8_FORMATS:
        weights, inputs = _args(8, "float", "channel", None, False), _args(8, "float", "token", None, True)
    else:  # nvfp4-pack-quantized (default) and anything else: FP4 weights and activations, groups of 16
        group = 32 if quant_format == "mxfp4-pack-quantized" else 16
        weights, inputs = _args(4, "float", "tensor_group", group, False), _args(4, "float", "tensor_group", group,
                                                                                 "local")
    return {"targets": ["Linear"], "weights": weights, "input_activations": inputs, "output_activations": None,
            "format": quant_format}


def _linear(prefix: str, out_f: int, in_f: int, quant_format: str | None) -> list[_Tensor]:
    """The tensors a compressed-tensors checkpoint stores for one Linear (None: not quantized, BF16)."""
    if quant_format is None:
        return [_Tensor(f"{prefix}.weight", "BF16", (out_f, in_f))]
    if quant_format in _INT_FORMATS:
        return [
            _Tensor(f"{prefix}.weight_packed", "I32", (out_f, in_f // 8)),
            _Tensor(f"{prefix}.weight_scale", "BF16", (out_f, in_f // 32)),
            _Tensor(f"{prefix}.weight_shape", "I64", (2,), f"shape:{out_f},{in_f}"),
        ]
    if quant_format in _FP8_FORMATS:
        return [_Tensor(f"{prefix}.weight", "F8_E4M3", (out_f, in_f)),
                _Tensor(f"{prefix}.weight_scale", "BF16", (out_f, 1))]
    group = 32 if quant_format == "mxfp4-pack-quantized" else 16
    return [
        _Tensor(f"{prefix}.weight_packed", "U8", (out_f, in_f // 2)),
        _Tensor(f"{prefix}.weight_scale", "F8_E4M3", (out_f, in_f // group)),
        _Tensor(f"{prefix}.weight_global_scale", "F32", (1,), "value:448.0"),
        _Tensor(f"{prefix}.input_global_scale", "F32", (1,), "value:448.0"),
    ]


def _attention(a: str, quant: str | None) -> list[_Tensor]:
    d = _DIMS
    h, heads = d["hidden_size"], d["num_attention_heads"]
    qk_head = d["qk_nope_head_dim"] + d["qk_rope_head_dim"]
    return [
        *_linear(f"{a}.q_a_proj", d["q_lora_rank"], h, quant),
        _Tensor(f"{a}.q_a_layernorm.weight", "BF16", (d["q_lora_rank"],), "ones"),
        *_linear(f"{a}.q_b_proj", heads * qk_head, d["q_lora_rank"], quant),
        *_linear(f"{a}.kv_a_proj_with_mqa", d["kv_lora_rank"] + d["qk_rope_head_dim"], h, quant),
        _Tensor(f"{a}.kv_a_layernorm.weight", "BF16", (d["kv_lora_rank"],), "ones"),
        *_linear(f"{a}.kv_b_proj", heads * (d["qk_nope_head_dim"] + d["v_head_dim"]), d["kv_lora_rank"], quant),
        *_linear(f"{a}.o_proj", h, heads * d["v_head_dim"], quant),
    ]


def _mlp(m: str, inter: int, quant: str | None) -> list[_Tensor]:
    h = _DIMS["hidden_size"]
    return [*_linear(f"{m}.gate_proj", inter, h, quant), *_linear(f"{m}.up_proj", inter, h, quant),
            *_linear(f"{m}.down_proj", h, inter, quant)]


def _tensors(layers: int, experts: int, first_dense: int, quant_format: str) -> list[_Tensor]:
    d = _DIMS
    h = d["hidden_size"]
    # Kimi's INT4 quantizes the routed experts only; the other formats here quantize every Linear
    rest = None if quant_format == KIMI_INT4_FORMAT else quant_format
    out: list[_Tensor] = [_Tensor("model.embed_tokens.weight", "BF16", (d["vocab_size"], h))]
    for i in range(layers):
        p = f"model.layers.{i}"
        out.append(_Tensor(f"{p}.input_layernorm.weight", "BF16", (h,), "ones"))
        out.append(_Tensor(f"{p}.post_attention_layernorm.weight", "BF16", (h,), "ones"))
        out += _attention(f"{p}.self_attn", rest)
        m = f"{p}.mlp"
        if i < first_dense:
            out += _mlp(m, d["intermediate_size"], rest)
            continue
        inter = d["moe_intermediate_size"]
        out.append(_Tensor(f"{m}.gate.weight", "BF16", (experts, h)))
        out.append(_Tensor(f"{m}.gate.e_score_correction_bias", "F32", (experts,), "value:0.0"))
        for e in range(experts):
            out += _mlp(f"{m}.experts.{e}", inter, quant_format)
        out += _mlp(f"{m}.shared_experts", inter * d["n_shared_experts"], rest)
    out.append(_Tensor("model.norm.weight", "BF16", (h,), "ones"))
    out.append(_Tensor("lm_head.weight", "BF16", (d["vocab_size"], h)))  # in `ignore`: not quantized
    return out


_EXPERT_CHOICES = (4, 8, 16, 32, 64, 128, 256)


def _choose_layout(size_bytes: int, quant_format: str) -> tuple[int, int, int]:
    """(layers, experts, first_dense) whose weights come close to size_bytes.

    Among the layouts within 5% of the target, the one with the fewest tensors
    (a small index, fast to write); otherwise the closest one.
    """
    scored: list[tuple[float, int, int, int, int]] = []  # (rel_err, n_tensors, layers, experts, first_dense)
    for experts in _EXPERT_CHOICES:
        for layers in range(1, 62):
            first_dense = 1 if layers >= 2 else 0
            ts = _tensors(layers, experts, first_dense, quant_format)
            total = sum(t.nbytes for t in ts)
            scored.append((abs(total - size_bytes) / max(size_bytes, 1), len(ts), layers, experts, first_dense))
            if total > size_bytes:
                break
    close = [s for s in scored if s[0] <= 0.05]
    best = min(close, key=lambda s: (s[1], s[0])) if close else min(scored)
    return best[2], best[3], best[4]


# ---------------------------------------------------------------------------
# tensor content (deterministic)

# Keep random BF16 values finite and small: the high byte (sign + top exponent bits)
# of each little-endian bf16 is forced into 0x3B/0xBB -> |x| in [2^-9, 2^-7).
_BF16_HI = bytes(((b & 0x80) | 0x3B) for b in range(256))
# Keep random F8_E4M3 scales positive and finite: exponent 6..7 -> [0.5, 1.875].
_F8_POS = bytes((0x30 | (b & 0x0F)) for b in range(256))


def _tensor_bytes(t: _Tensor, rng: random.Random) -> bytes:
    n = t.nbytes
    if t.fill == "ones":
        return struct.pack("<H", 0x3F80) * (n // 2) if t.dtype == "BF16" else b"\x00" * n
    if t.fill.startswith("value:"):
        v = float(t.fill.split(":", 1)[1])
        if t.dtype != "F32":
            raise ValueError(f"value fill needs F32, got {t.dtype}")
        return struct.pack("<f", v) * (n // 4)
    if t.fill.startswith("shape:"):
        dims = [int(x) for x in t.fill.split(":", 1)[1].split(",")]
        return struct.pack(f"<{len(dims)}q", *dims)
    data = bytearray(rng.randbytes(n))
    if t.dtype == "BF16":
        data[1::2] = bytes(data[1::2]).translate(_BF16_HI)
    elif t.dtype == "F8_E4M3":
        data = bytearray(bytes(data).translate(_F8_POS))
    elif t.dtype == "F32":
        # finite small floats: set exponent byte
        data[3::4] = bytes(data[3::4]).translate(_BF16_HI)
    return bytes(data)


def _safetensors_header(tensors: list[_Tensor]) -> tuple[bytes, int]:
    header: dict = {"__metadata__": {"format": "pt"}}
    off = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [off, off + t.nbytes]}
        off += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw, off


def _split(tensors: list[_Tensor], shards: int) -> list[list[_Tensor]]:
    """Split in order into `shards` groups of roughly equal bytes (none empty)."""
    shards = max(1, min(shards, len(tensors)))
    total = sum(t.nbytes for t in tensors)
    groups: list[list[_Tensor]] = [[] for _ in range(shards)]
    acc = 0
    for idx, t in enumerate(tensors):
        g = min(shards - 1, acc * shards // max(total, 1))
        # leave at least one tensor for each remaining shard
        g = max(g, shards - (len(tensors) - idx))
        groups[g].append(t)
        acc += t.nbytes
    for i in range(len(groups)):  # fill any gap from the next group (tiny models)
        if not groups[i]:
            for j in range(i + 1, len(groups)):
                if len(groups[j]) > 1:
                    groups[i].append(groups[j].pop(0))
                    break
    return [g for g in groups if g] or [[]]


# ---------------------------------------------------------------------------
# the small JSON files


def _config(model_type: str, layers: int, experts: int, first_dense: int, quant_format: str) -> dict:
    d = _DIMS
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": model_type,
        "vocab_size": d["vocab_size"],
        "hidden_size": d["hidden_size"],
        "intermediate_size": d["intermediate_size"],
        "moe_intermediate_size": d["moe_intermediate_size"],
        "num_hidden_layers": layers,
        "num_nextn_predict_layers": 0,
        "num_attention_heads": d["num_attention_heads"],
        "num_key_value_heads": d["num_attention_heads"],
        "n_shared_experts": d["n_shared_experts"],
        "n_routed_experts": experts,
        "routed_scaling_factor": 2.827,
        "kv_lora_rank": d["kv_lora_rank"],
        "q_lora_rank": d["q_lora_rank"],
        "qk_rope_head_dim": d["qk_rope_head_dim"],
        "v_head_dim": d["v_head_dim"],
        "qk_nope_head_dim": d["qk_nope_head_dim"],
        "topk_method": "noaux_tc",
        "n_group": 1,
        "topk_group": 1,
        "num_experts_per_tok": min(8, experts),
        "moe_layer_freq": 1,
        "first_k_dense_replace": first_dense,
        "norm_topk_prob": True,
        "scoring_func": "sigmoid",
        "aux_loss_alpha": 0.001,
        "seq_aux": True,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-06,
        "use_cache": True,
        "pretraining_tp": 1,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "tie_word_embeddings": False,
        "rope_theta": 50000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 1024,
            "beta_fast": 1.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        "attention_bias": False,
        "attention_dropout": 0.0,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.48.3",
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": quant_format,
            "config_groups": {"group_0": _quant_scheme(quant_format)},
            "ignore": list(KIMI_INT4_IGNORE) if quant_format == KIMI_INT4_FORMAT else ["lm_head"],
            "kv_cache_scheme": None,
            "quantization_status": "compressed",
            "sparsity_config": {},
            "transform_config": {},
            "global_compression_ratio": None,
            "version": "0.10.2",
        },
    }
    if model_type == "kimi_k2":
        cfg["auto_map"] = {
            "AutoConfig": "configuration_deepseek.DeepseekV3Config",
            "AutoModel": "modeling_deepseek.DeepseekV3Model",
            "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM",
        }
    return cfg


_SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_end|>"]
_WORDS = (
    "the a an is are was be to of and in on for with that this it you i we they he she what how why "
    "hello hi world model server gpu ready deploy sglang test sandbox yes no ok"
).split()


def _tokenizer_json() -> dict:
    vocab: dict[str, int] = {}
    for tok in _SPECIALS + _WORDS + [f"<0x{b:02X}>" for b in range(256)]:
        vocab.setdefault(tok, len(vocab))
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
             "special": True}
            for i, tok in enumerate(_SPECIALS)
        ],
        "normalizer": {"type": "Lowercase"},
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }


def _tokenizer_config() -> dict:
    return {
        "add_bos_token": False, "add_eos_token": False, "bos_token": "<s>", "eos_token": "<|im_end|>",
        "pad_token": "<pad>", "unk_token": "<unk>", "clean_up_tokenization_spaces": False,
        "model_max_length": 4096, "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": (
            "{% for m in messages %}<|im_{{ m['role'] }}|>{{ m['content'] }}<|im_end|>{% endfor %}"
            "{% if add_generation_prompt %}<|im_assistant|>{% endif %}"
        ),
    }


def _generation_config() -> dict:
    return {"_from_model_config": True, "bos_token_id": 1, "eos_token_id": [2, 7], "do_sample": True,
            "temperature": 0.6, "top_p": 0.95, "max_new_tokens": 256, "transformers_version": "4.48.3"}


_GITATTRIBUTES = "".join(f"*{suf} filter=lfs diff=lfs merge=lfs -text\n" for suf in LFS_SUFFIXES)

_README = """---
license: other
library_name: transformers
tags: [sandbox, compressed-tensors]
---
# {repo}

A tiny generated stand-in for a large quantized MoE model ({model_type}, {quant_format}).
Test bed only: the weights are pseudo-random.
"""


def _dump(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()


# ---------------------------------------------------------------------------


def generate(
    out_dir: Path,
    size_mb: int = 40,
    shards: int = 3,
    quant_format: str = "nvfp4-pack-quantized",
    *,
    model_type: str = "deepseek_v3",
    seed: int = 0,
    commit: str | None = None,
    repo_name: str = "sandbox/tiny-moe",
) -> ModelInfo:
    """Write a tiny model repo into out_dir and describe it.

    size_mb: target size of the weights (MB = 10^6 bytes); the layout (layers x experts)
    closest to it is chosen, so the total is approximate (a few %).
    commit: the 40-hex revision to report; by default derived from the content.
    Deterministic: the same arguments give byte-identical files.
    """
    if commit is not None and (len(commit) != 40 or any(c not in "0123456789abcdef" for c in commit)):
        raise ValueError(f"commit must be 40 lowercase hex characters, got {commit!r}")
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    layers, experts, first_dense = _choose_layout(int(size_mb * 1_000_000), quant_format)
    tensors = _tensors(layers, experts, first_dense, quant_format)
    groups = _split(tensors, shards)
    n = len(groups)
    config = _config(model_type, layers, experts, first_dense, quant_format)

    files: list[FileEntry] = []

    def put(name: str, data: bytes) -> None:
        p = out_dir / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        files.append(FileEntry(name, len(data), hashlib.sha256(data).hexdigest()))

    put(".gitattributes", _GITATTRIBUTES.encode())
    put("README.md", _README.format(repo=repo_name, model_type=model_type, quant_format=quant_format).encode())
    put("config.json", _dump(config))
    put("generation_config.json", _dump(_generation_config()))
    put("tokenizer_config.json", _dump(_tokenizer_config()))
    put("tokenizer.json", _dump(_tokenizer_json()))

    rng = random.Random(f"sandbox-tinymodel:{seed}:{quant_format}")
    weight_map: dict[str, str] = {}
    total_size = 0
    for i, group in enumerate(groups, start=1):
        name = f"model-{i:05d}-of-{n:05d}.safetensors"
        head, data_len = _safetensors_header(group)
        h = hashlib.sha256(head)
        path = out_dir / name
        with open(path, "wb") as f:
            f.write(head)
            for t in group:
                b = _tensor_bytes(t, rng)
                f.write(b)
                h.update(b)
                weight_map[t.name] = name
        files.append(FileEntry(name, len(head) + data_len, h.hexdigest()))
        total_size += data_len
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    put("model.safetensors.index.json", _dump(index))

    files.sort()
    return ModelInfo(
        root=out_dir,
        files=tuple(files),
        commit=commit or _commit_from(files),
        total_bytes=sum(f.size for f in files),
        config=config,
    )


# ---------------------------------------------------------------------------
# an EAGLE3 draft model

# The draft's own sizes (EAGLE3 drafts are one Llama decoder layer on the target's hidden size).
_DRAFT_DIMS = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=128, intermediate_size=1024,
                   draft_vocab_size=512)
EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"


def _draft_tensors() -> list[_Tensor]:
    """An EAGLE3 draft's tensors as SpecForge/SGLang lay them out (`midlayer.*`, fc, norm, lm_head, d2t, t2d)."""
    d, h, vocab = _DRAFT_DIMS, _DIMS["hidden_size"], _DIMS["vocab_size"]
    heads, kv, head_dim = d["num_attention_heads"], d["num_key_value_heads"], d["head_dim"]
    a = "midlayer.self_attn"
    return [
        _Tensor("fc.weight", "BF16", (h, 3 * h)),  # three of the target's hidden states -> one
        _Tensor("midlayer.hidden_norm.weight", "BF16", (h,), "ones"),
        _Tensor("midlayer.input_layernorm.weight", "BF16", (h,), "ones"),
        _Tensor(f"{a}.q_proj.weight", "BF16", (heads * head_dim, 2 * h)),  # embedding + hidden state in
        _Tensor(f"{a}.k_proj.weight", "BF16", (kv * head_dim, 2 * h)),
        _Tensor(f"{a}.v_proj.weight", "BF16", (kv * head_dim, 2 * h)),
        _Tensor(f"{a}.o_proj.weight", "BF16", (h, heads * head_dim)),
        _Tensor("midlayer.post_attention_layernorm.weight", "BF16", (h,), "ones"),
        *[_Tensor(f"midlayer.mlp.{n}.weight", "BF16", shape) for n, shape in (
            ("gate_proj", (d["intermediate_size"], h)), ("up_proj", (d["intermediate_size"], h)),
            ("down_proj", (h, d["intermediate_size"])))],
        _Tensor("norm.weight", "BF16", (h,), "ones"),
        _Tensor("lm_head.weight", "BF16", (d["draft_vocab_size"], h)),
        _Tensor("d2t", "I64", (d["draft_vocab_size"],), "ones"),  # zero offsets: draft token i is target token i
        _Tensor("t2d", "BOOL", (vocab,), "ones"),
    ]


def _draft_config() -> dict:
    d, h = _DRAFT_DIMS, _DIMS["hidden_size"]
    return {
        "architectures": [EAGLE3_ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": h,
        "intermediate_size": d["intermediate_size"],
        "num_hidden_layers": 1,
        "num_attention_heads": d["num_attention_heads"],
        "num_key_value_heads": d["num_key_value_heads"],
        "head_dim": d["head_dim"],
        "vocab_size": _DIMS["vocab_size"],
        "draft_vocab_size": d["draft_vocab_size"],
        "target_hidden_size": h,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-05,
        "rope_theta": 50000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True},
        "transformers_version": "4.48.3",
    }


def generate_draft(out_dir: Path, *, commit: str | None = None, repo_name: str = "sandbox/tiny-eagle3",
                   seed: int = 0) -> ModelInfo:
    """Write a tiny EAGLE3 draft model repo (a few MB) into out_dir and describe it; deterministic like generate.

    .. code:: python

        draft = generate_draft(Path("/tmp/draft"), commit="e3a6" * 10)   # draft.config["architectures"]
    """
    if commit is not None and (len(commit) != 40 or any(c not in "0123456789abcdef" for c in commit)):
        raise ValueError(f"commit must be 40 lowercase hex characters, got {commit!r}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = _draft_config()
    tensors = _draft_tensors()
    head, data_len = _safetensors_header(tensors)
    rng = random.Random(f"sandbox-tinymodel-draft:{seed}")
    weights = head + b"".join(_tensor_bytes(t, rng) for t in tensors)
    readme = (f"---\nlicense: other\ntags: [sandbox, eagle3]\n---\n# {repo_name}\n\nA tiny generated EAGLE3 "
              "draft model (speculative decoding). Test bed only: the weights are pseudo-random.\n")
    files = []
    for name, data in ((".gitattributes", _GITATTRIBUTES.encode()), ("README.md", readme.encode()),
                       ("config.json", _dump(config)), ("model.safetensors", weights)):
        (out_dir / name).write_bytes(data)
        files.append(FileEntry(name, len(data), hashlib.sha256(data).hexdigest()))
    files.sort()
    return ModelInfo(root=out_dir, files=tuple(files), commit=commit or _commit_from(files),
                     total_bytes=sum(f.size for f in files), config=config)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sandbox.tinymodel", description=__doc__.split("\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--size-mb", type=int, default=40)
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--format", dest="quant_format", default="nvfp4-pack-quantized")
    ap.add_argument("--model-type", default="deepseek_v3", choices=["deepseek_v3", "kimi_k2"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--draft", action="store_true", help="an EAGLE3 draft model (a few MB) instead")
    args = ap.parse_args(argv)
    if args.draft:
        info = generate_draft(args.out_dir, seed=args.seed)
    else:
        info = generate(
            args.out_dir, args.size_mb, args.shards, args.quant_format, model_type=args.model_type, seed=args.seed
        )
    print(f"commit {info.commit}  total {info.total_bytes} bytes  in {info.root}")
    for f in info.files:
        print(f"  {f.size:>12}  {f.sha256}  {f.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
