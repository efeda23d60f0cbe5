"""A tiny Llama that the real SGLang server (sglang 0.5.23) serves on a CPU.

`generate(out_dir)` writes a Hugging Face repo of a LlamaForCausalLM:
config.json (hidden 64, 2 layers, GQA 4/2 heads, head_dim 16), a byte-level
BPE tokenizer trained here with the `tokenizers` package on a fixed corpus
(tokenizer.json, tokenizer_config.json with a chat template), a
generation_config.json and one bf16 model.safetensors of pseudo-random
weights (~0.2 MB). Nothing comes from the Hub. Same arguments -> identical
bytes, so the sandbox pins a revision (the commit derives from the content).

`quantization_config` (optional) is written into config.json as is: the
incident checkpoint (models/sandbox-real-llama-ct.yaml) carries a
compressed-tensors one, which makes SGLang import compressed-tensors for it.

The weights are random: the server answers, but with arbitrary tokens
(greedy decoding makes them repeatable, which the conformance tests use).

CLI: python -m sandbox.tinyllama OUT_DIR [--compressed-tensors]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import struct
import sys
from pathlib import Path

from .tinymodel import FileEntry, ModelInfo, _commit_from, _safetensors_header, _Tensor

DIMS = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=384, max_position_embeddings=4096)
SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|user|>", "<|assistant|>", "<|system|>"]
CHAT_TEMPLATE = (
    "{{ '<|bos|>' }}{% for m in messages %}{{ '<|' + m['role'] + '|>' }}{{ m['content'] }}{{ '<|eos|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
# the corpus the tokenizer is trained on: fixed, so the merges (and the file) are the same every time
CORPUS = [
    "The server is fired up and ready to roll.",
    "Hello world, this is a tiny model served by SGLang on a CPU in the sandbox.",
    "What is the capital of France? Paris is the capital of France.",
    "One two three four five six seven eight nine ten.",
    "Deploy the model, check the health endpoint, then send a chat request.",
    "GPU memory, tensor parallel ranks, the KV cache and the router.",
] * 4


def _bf16(value: float) -> bytes:
    """value as bfloat16 (float32's top 16 bits, rounded to nearest even), little-endian."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    bits += 0x7FFF + ((bits >> 16) & 1)
    return struct.pack("<H", (bits >> 16) & 0xFFFF)


def _tensors() -> list[_Tensor]:
    h, i, v = DIMS["hidden_size"], DIMS["intermediate_size"], DIMS["vocab_size"]
    q = DIMS["num_attention_heads"] * DIMS["head_dim"]
    kv = DIMS["num_key_value_heads"] * DIMS["head_dim"]
    out = [_Tensor("model.embed_tokens.weight", "BF16", (v, h))]
    for n in range(DIMS["num_hidden_layers"]):
        p = f"model.layers.{n}"
        out += [
            _Tensor(f"{p}.input_layernorm.weight", "BF16", (h,)),
            _Tensor(f"{p}.self_attn.q_proj.weight", "BF16", (q, h)),
            _Tensor(f"{p}.self_attn.k_proj.weight", "BF16", (kv, h)),
            _Tensor(f"{p}.self_attn.v_proj.weight", "BF16", (kv, h)),
            _Tensor(f"{p}.self_attn.o_proj.weight", "BF16", (h, q)),
            _Tensor(f"{p}.post_attention_layernorm.weight", "BF16", (h,)),
            _Tensor(f"{p}.mlp.gate_proj.weight", "BF16", (i, h)),
            _Tensor(f"{p}.mlp.up_proj.weight", "BF16", (i, h)),
            _Tensor(f"{p}.mlp.down_proj.weight", "BF16", (h, i)),
        ]
    out += [_Tensor("model.norm.weight", "BF16", (h,)), _Tensor("lm_head.weight", "BF16", (v, h))]
    return sorted(out, key=lambda t: t.name)


def _tensor_bytes(tensor: _Tensor, rng: random.Random) -> bytes:
    count = 1
    for dim in tensor.shape:
        count *= dim
    if tensor.name.endswith("norm.weight"):
        return _bf16(1.0) * count
    return b"".join(_bf16(rng.gauss(0.0, 0.5)) for _ in range(count))


def config(quantization_config: dict | None = None) -> dict:
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", **DIMS,
        "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None,
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False, "initializer_range": 0.02,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "torch_dtype": "bfloat16",
        "use_cache": True, "transformers_version": "5.19.0",
    }
    if quantization_config is not None:
        cfg["quantization_config"] = quantization_config
    return cfg


def compressed_tensors_config(quant_format: str) -> dict:
    """A compressed-tensors quantization_config as llm-compressor writes it (W4A16, groups of 32 on
    every Linear but lm_head). The weights stay bf16: the file says compressed-tensors, which is what
    makes SGLang reach for the package (the incident), not a loadable quantized checkpoint."""
    return {
        "quant_method": "compressed-tensors", "format": quant_format, "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "output_activations": None,
                                      "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                  "strategy": "group", "group_size": 32, "dynamic": False,
                                                  "actorder": None, "observer": "minmax"}}},
        "ignore": ["lm_head"], "kv_cache_scheme": None, "global_compression_ratio": None,
    }


def tokenizer_json() -> str:
    """A byte-level BPE tokenizer trained on CORPUS (the `tokenizers` package), as tokenizer.json text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=DIMS["vocab_size"], special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok.to_str(pretty=True) + "\n"


def tokenizer_config() -> dict:
    return {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>", "unk_token": None,
            "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
            "model_max_length": DIMS["max_position_embeddings"], "tokenizer_class": "PreTrainedTokenizerFast",
            "chat_template": CHAT_TEMPLATE}


def _dump(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()


def generate(out_dir: Path, *, quantization_config: dict | None = None, seed: int = 0,
             commit: str | None = None, repo_name: str = "sandbox/tiny-llama") -> ModelInfo:
    """Write the tiny Llama repo into out_dir and describe it (deterministic)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = config(quantization_config)
    files: list[FileEntry] = []

    def put(name: str, data: bytes) -> None:
        (out_dir / name).write_bytes(data)
        files.append(FileEntry(name, len(data), hashlib.sha256(data).hexdigest()))

    put(".gitattributes", b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    put("README.md", f"# {repo_name}\n\nA tiny random Llama for the sandbox's real SGLang server.\n".encode())
    put("config.json", _dump(cfg))
    put("generation_config.json", _dump({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
                                         "transformers_version": "5.19.0"}))
    put("tokenizer.json", tokenizer_json().encode())
    put("tokenizer_config.json", _dump(tokenizer_config()))
    put("special_tokens_map.json", _dump({"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}))
    tensors = _tensors()
    head, _ = _safetensors_header(tensors)
    rng = random.Random(f"sandbox-tinyllama:{seed}")
    put("model.safetensors", head + b"".join(_tensor_bytes(t, rng) for t in tensors))
    files.sort()
    return ModelInfo(root=out_dir, files=tuple(files), commit=commit or _commit_from(files),
                     total_bytes=sum(f.size for f in files), config=cfg)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sandbox.tinyllama", description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    args = ap.parse_args(argv)
    info = generate(args.out_dir)
    print(f"{info.root}: {len(info.files)} files, {info.total_bytes} bytes, commit {info.commit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
