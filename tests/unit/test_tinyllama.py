"""The real-server sandbox pieces that run without a host: the tiny Llama (sandbox/tinyllama.py),
the Hub serving every sandbox profile (sandbox/hubd.py), the GPU shim's title parsing
(sandbox/realshim/sitecustomize.py) and the libcuda.so.1 stub (sandbox/nvml/libcuda_stub.c)."""

from __future__ import annotations

import ctypes
import importlib.util
import json
import struct
import sys
from pathlib import Path

import pytest

from sandbox import hubd, smollm2, tinyllama

ROOT = Path(__file__).resolve().parents[2]


def _header(path: Path) -> dict:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + length])


def test_the_tiny_llama_is_deterministic_and_well_formed(tmp_path):
    first, second = tinyllama.generate(tmp_path / "a"), tinyllama.generate(tmp_path / "b")
    assert first.commit == second.commit and first.files == second.files
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    header = _header(tmp_path / "a" / "model.safetensors")
    h, v = tinyllama.DIMS["hidden_size"], tinyllama.DIMS["vocab_size"]
    embed = header["model.embed_tokens.weight"]
    assert (embed["dtype"], embed["shape"], embed["data_offsets"][1] - embed["data_offsets"][0]) == \
        ("BF16", [v, h], v * h * 2)
    assert header["model.layers.1.self_attn.k_proj.weight"]["shape"] == [32, h]  # 2 KV heads x head_dim 16
    size = (tmp_path / "a" / "model.safetensors").stat().st_size
    assert size == 8 + struct.unpack("<Q", (tmp_path / "a" / "model.safetensors").read_bytes()[:8])[0] + max(
        t["data_offsets"][1] for k, t in header.items() if k != "__metadata__")


def test_the_tokenizer_is_trained_here_and_round_trips(tmp_path):
    from tokenizers import Tokenizer

    tinyllama.generate(tmp_path)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.get_vocab_size() == tinyllama.DIMS["vocab_size"]
    ids = tok.encode("Hello world, the server is ready").ids
    assert tok.decode(ids) == "Hello world, the server is ready"
    assert tok.token_to_id("<|eos|>") == 2  # eos_token_id in config.json


def test_the_incident_checkpoint_says_compressed_tensors(tmp_path):
    qconfig = tinyllama.compressed_tensors_config("pack-quantized")
    info = tinyllama.generate(tmp_path, quantization_config=qconfig)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "compressed-tensors"
    assert config["quantization_config"]["format"] == "pack-quantized"
    assert info.commit != tinyllama.generate(tmp_path / "plain").commit


def test_the_hub_serves_every_sandbox_profile():
    repos = {p["repo"] for p in hubd.other_profiles()} | {hubd.profile()["repo"], hubd.draft()["repo"]}
    import yaml

    for path in sorted((ROOT / "models").glob("sandbox-*.yaml")):
        assert yaml.safe_load(path.read_text())["repo"] in repos, path.name
    assert {"sandbox/smollm2-135m-instruct", "sandbox/tiny-llama-ct", "sandbox/tiny-kimi-nvfp4"} <= repos
    # every revision the sandbox makes of the real model has its profile (and no profile pins another)
    served = {p["revision"] for p in hubd.other_profiles() if p["repo"] == smollm2.REPO}
    assert served == set(smollm2.REVISIONS.values())


def test_the_hub_refuses_a_smollm2_revision_it_does_not_make():
    with pytest.raises(RuntimeError, match="not a revision the sandbox makes"):
        hubd._smollm2_revision("0" * 40)


SMOLLM2_TEMPLATE = (  # the shape of SmolLM2-135M-Instruct's ChatML template (its GGUF's tokenizer.chat_template)
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def test_the_fault_template_renders_every_turn_but_the_users():
    import jinja2

    messages = [{"role": "user", "content": "What is 2+2?"}]
    good = jinja2.Template(SMOLLM2_TEMPLATE).render(messages=messages, add_generation_prompt=True)
    bad = jinja2.Template(smollm2.without_user_turn(SMOLLM2_TEMPLATE)).render(messages=messages,
                                                                                add_generation_prompt=True)
    assert "What is 2+2?" in good and "<|im_start|>user" in good  # positive control
    assert "What is 2+2?" not in bad and "<|im_start|>user" not in bad
    assert bad == "<|im_start|>assistant\n"  # the generation prompt only
    system = [{"role": "system", "content": "Be brief."}, *messages]
    assert jinja2.Template(smollm2.without_user_turn(SMOLLM2_TEMPLATE)).render(messages=system) == \
        "<|im_start|>system\nBe brief.<|im_end|>\n"  # the other turns stay
    with pytest.raises(ValueError):
        smollm2.without_user_turn("{{ messages }}")


def test_gguf_names_map_to_the_hf_llamas():
    assert smollm2.hf_name("blk.29.ffn_down.weight") == "model.layers.29.mlp.down_proj.weight"
    assert smollm2.hf_name("blk.0.attn_norm.weight") == "model.layers.0.input_layernorm.weight"
    assert smollm2.hf_name("output.weight") == "lm_head.weight"


def _shim():
    spec = importlib.util.spec_from_file_location("realshim", ROOT / "sandbox" / "realshim" / "sitecustomize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # inactive: SANDBOX_GPU_SHIM_MIB unset
    return module


def test_the_gpu_shim_knows_sglangs_scheduler_titles():
    rank = _shim().scheduler_rank
    assert rank(b"sglang::scheduler\0") == 0  # TP 1: no TP part (scheduler.py adds " TP<n>" for tp > 1)
    assert rank(b"sglang::scheduler_TP3\0") == 3
    assert rank(b"sglang::scheduler_DP1_TP6_EP6\0") == 6
    assert rank(b"sglang::detokenizer\0") is None
    assert rank(b"/opt/sglang/venv/bin/python\0-m\0sglang::scheduler_TP1\0") is None  # argv[0] only


def test_the_libcuda_stub_answers_no_device():
    from sandbox.nvml import build

    lib = ctypes.CDLL(str(build.build(src=build.CUDA_STUB_SRC, soname=build.CUDA_STUB_SONAME)))
    assert lib.cuInit(0) == 100  # CUDA_ERROR_NO_DEVICE
    assert lib.cuPointerGetAttribute(None, 0, ctypes.c_ulonglong(0)) == 100
    count = ctypes.c_int(7)
    assert lib.cuDeviceGetCount(ctypes.byref(count)) == 100 and count.value == 0


def test_the_gpu_shim_counts_what_a_rank_loaded(tmp_path, monkeypatch, capfd):
    """The import hook wraps ModelRunner.load_model of the module SGLang's scheduler imports, and
    logs the model's parameter bytes (a shared parameter once) and buffer bytes; a draft runner is
    not counted. A fake sglang package stands in for the real one here (its test is the real
    server's: tests/integration/test_real_server.py)."""
    pkg = tmp_path / "sglang" / "srt" / "model_executor"
    pkg.mkdir(parents=True)
    for init in (tmp_path / "sglang", tmp_path / "sglang" / "srt", pkg):
        (init / "__init__.py").write_text("")
    (pkg / "model_runner.py").write_text(
        "class T:\n"
        "    def __init__(self, n, size): self.n, self.size = n, size\n"
        "    def numel(self): return self.n\n"
        "    def element_size(self): return self.size\n"
        "class Model:\n"
        "    def parameters(self): return [T(10, 2), T(6, 4)]\n"
        "    def buffers(self): return [T(3, 4)]\n"
        "class Args:\n    tp_size = 2\n"
        "class ModelRunner:\n"
        "    def __init__(self, draft=False): self.is_draft_worker, self.server_args = draft, Args()\n"
        "    def load_model(self):\n        self.model = Model()\n        return 'loaded'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    shim = _shim()
    finder = shim._WrapLoadModel()
    monkeypatch.setattr("sys.meta_path", [finder, *sys.meta_path])
    monkeypatch.delitem(sys.modules, "sglang", raising=False)
    import sglang.srt.model_executor.model_runner as runner_module

    assert finder not in sys.meta_path  # it wraps once, then leaves
    assert runner_module.ModelRunner().load_model() == "loaded"
    assert runner_module.ModelRunner(draft=True).load_model() == "loaded"
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("sandbox shim")]
    assert lines == ["sandbox shim (simulated GPU): TP0 of 2 loaded Model: 44 parameter bytes (2 tensors), "
                     "12 buffer bytes"], lines
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
