"""The sandbox's SGLang stand-in (sandbox/sglang_standin.py), run as a subprocess.

Every test uses its own simulated GPU state (SANDBOX_GPU_LAYOUT /
SANDBOX_GPU_REGISTRY in a tmp dir), a tiny model dir and free loopback ports.
The real-parser test needs a venv with sglang 0.5.23 at
.sandbox/sglang-venv (see sandbox/sglang_standin.py); it is skipped otherwise.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SANDBOX_DIR = ROOT / "sandbox"
SGLANG_VENV_PY = ROOT / ".sandbox" / "sglang-venv" / "bin" / "python"
CT081_VENV_PY = ROOT / ".sandbox" / "ct-venv" / "bin" / "python"  # torch + compressed-tensors==0.8.1

sys.path.insert(0, str(SANDBOX_DIR))
import gpusim  # noqa: E402

READY = "The server is fired up and ready to roll!"
BANNER = "SIMULATED SGLang server (sandbox stand-in): no GPU, no real model weights"


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body=None, key: str | None = None, timeout: float = 10):
    """(status, parsed body or text); no exception for HTTP errors."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
            ctype = resp.headers.get("content-type", "")
    except urllib.error.HTTPError as e:
        status, raw, ctype = e.code, e.read(), e.headers.get("content-type", "")
    if "json" in ctype and raw:
        return status, json.loads(raw)
    return status, raw.decode()


class Proc:
    def __init__(self, popen: subprocess.Popen, out: Path, err: Path):
        self.p, self.out_path, self.err_path = popen, out, err

    @property
    def pid(self) -> int:
        return self.p.pid

    def out(self) -> str:
        return self.out_path.read_text()

    def err(self) -> str:
        return self.err_path.read_text()

    def wait(self, timeout: float = 30) -> int:
        return self.p.wait(timeout=timeout)

    def wait_for(self, text: str, timeout: float = 30, stream: str = "out") -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if text in (self.out() if stream == "out" else self.err()):
                return
            if self.p.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(
            f"{text!r} not seen (rc={self.p.poll()})\n--- stdout\n{self.out()}\n--- stderr\n{self.err()}"
        )


class Bed:
    """Simulated GPU host state + a way to start stand-in processes."""

    def __init__(self, tmp: Path, gpu_count: int = 2):
        self.tmp = tmp
        self.layout_path = tmp / "layout.json"
        self.registry = tmp / "registry"
        self.layout = gpusim.make_layout(count=gpu_count)
        self.layout_path.write_text(json.dumps(self.layout))
        self.model = tmp / "model"
        self.model.mkdir()
        self.write_model({})
        self.procs: list[subprocess.Popen] = []
        self.n = 0

    def write_model(self, extra: dict) -> None:
        config = {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "kimi_k2",
            "max_position_embeddings": 8192,
            **extra,
        }
        (self.model / "config.json").write_text(json.dumps(config))

    def env(self, **extra) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SANDBOX_", "SGLANG_"))}
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env.update(
            {
                "PYTHONPATH": str(SANDBOX_DIR),
                "SANDBOX_GPU_LAYOUT": str(self.layout_path),
                "SANDBOX_GPU_REGISTRY": str(self.registry),
                "SANDBOX_LOAD_SECONDS": "1",
                "SANDBOX_GEN_DELAY_S": "0.05",
                "SANDBOX_SGLANG_PARSER": "fallback",
            }
        )
        for k, v in extra.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = str(v)
        return env

    def start(self, args: list[str], python: str = sys.executable, **env) -> Proc:
        self.n += 1
        out = self.tmp / f"p{self.n}.out"
        err = self.tmp / f"p{self.n}.err"
        with open(out, "wb") as fo, open(err, "wb") as fe:
            popen = subprocess.Popen(
                [python, "-m", "sglang_standin", *args],
                stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, env=self.env(**env), cwd=self.tmp,
            )
        self.procs.append(popen)
        return Proc(popen, out, err)

    def run(self, args: list[str], timeout: float = 60, python: str = sys.executable, **env) -> Proc:
        proc = self.start(args, python=python, **env)
        proc.wait(timeout)
        return proc

    def holder(self, gpus: dict[int, int]) -> subprocess.Popen:
        """A live helper process that holds simulated GPU memory."""
        code = textwrap.dedent(
            f"""
            import os, sys, time, gpusim
            gpusim.register(os.getpid(), {gpus!r}, name="stale-python")
            print("held", flush=True)
            time.sleep(120)
            """
        )
        popen = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=self.env(), text=True)
        self.procs.append(popen)
        assert popen.stdout.readline().strip() == "held"
        return popen

    def used(self) -> dict[int, int]:
        old = gpusim.REGISTRY_DIR
        gpusim.REGISTRY_DIR = self.registry
        try:
            return gpusim.used_mib_by_gpu(self.layout)
        finally:
            gpusim.REGISTRY_DIR = old

    def cleanup(self) -> None:
        for popen in self.procs:
            if popen.poll() is None:
                popen.kill()  # by PID: only processes this test started
            try:
                popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            if popen.stdout:
                popen.stdout.close()


@pytest.fixture
def bed(tmp_path):
    b = Bed(tmp_path)
    yield b
    b.cleanup()


def wait_http(url: str, want: int, timeout: float = 30, key: str | None = None) -> list[int]:
    """Poll until `url` answers `want`; returns the statuses seen (None = refused)."""
    seen: list = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            status, _ = http("GET", url, key=key, timeout=2)
        except (urllib.error.URLError, ConnectionError, OSError):
            status = None
        if not seen or seen[-1] != status:
            seen.append(status)
        if status == want:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"{url} never answered {want}; saw {seen}")


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


# --------------------------------------------------------------------------
# the ready flow
# --------------------------------------------------------------------------


def test_ready_flow_endpoints_api_key_and_graceful_sigterm(bed):
    port = free_port()
    key = "sk-test-123456"
    base = f"http://127.0.0.1:{port}"
    proc = bed.start(
        ["--model-path", str(bed.model), "--tp-size", "2", "--attention-backend", "triton",
         "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "sim-model",
         "--api-key", key, "--enable-metrics"],
        SANDBOX_LOAD_SECONDS="2", SANDBOX_GEN_DELAY_S="0.6",
    )
    seen = wait_http(base + "/health", 200)
    assert 503 in seen, seen  # loading first
    proc.wait_for(READY)
    out = proc.out()
    assert out.splitlines()[0].endswith(BANNER)
    assert "real parser was not available" in out
    assert "server_args=ServerArgs(" in out and "tp_size=2" in out
    for marker in ("Load weight begin", "Load weight end", "Capture cuda graph end"):
        assert marker in out
    assert key not in out + proc.err()  # the key is masked in the logs
    assert out.index("Load weight end") < out.index(READY)

    # memory held on both GPUs by the server's PID
    used = bed.used()
    expect = int(0.85 * gpusim.CT200_GPU_MIB)
    assert used == {0: expect, 1: expect}
    assert (bed.registry / f"{proc.pid}.json").exists()

    # API key: everything but /health* and /metrics needs it
    assert http("GET", base + "/health")[0] == 200
    assert http("GET", base + "/health_generate")[0] == 200
    assert http("GET", base + "/metrics")[0] == 200
    status, body = http("GET", base + "/v1/models")
    assert (status, body) == (401, {"error": "Unauthorized"})
    assert http("GET", base + "/v1/models", key="wrong")[0] == 401
    status, body = http("GET", base + "/v1/models", key=key)
    assert status == 200
    assert body["object"] == "list"
    assert [(m["id"], m["owned_by"]) for m in body["data"]] == [("sim-model", "sglang")]

    for path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info", "/version"):
        status, body = http("GET", base + path, key=key)
        assert status == 200, path
    status, info = http("GET", base + "/server_info", key=key)
    assert info["tp_size"] == 2 and info["api_key"] == "***"
    assert http("GET", base + "/model_info", key=key)[1]["model_path"] == str(bed.model)

    # chat completion, plain
    status, body = http("POST", base + "/v1/chat/completions", key=key,
                        body={"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200, body
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["choices"][0]["message"]["content"]
    assert body["usage"]["completion_tokens"] > 0
    assert http("POST", base + "/v1/chat/completions",
                body={"messages": [{"role": "user", "content": "hi"}]})[0] == 401

    # streamed chat completion (SSE)
    status, text = http("POST", base + "/v1/chat/completions", key=key,
                        body={"messages": [{"role": "user", "content": "hi"}], "stream": True,
                              "max_tokens": 4})
    assert status == 200
    events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert len(content.split()) == 4
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"

    # /generate and /v1/completions
    status, body = http("POST", base + "/generate", key=key,
                        body={"text": "Hello", "sampling_params": {"max_new_tokens": 3}})
    assert status == 200 and len(body["text"].split()) == 3
    assert body["meta_info"]["finish_reason"]["type"] == "length"
    status, body = http("POST", base + "/v1/completions", key=key, body={"prompt": "Hello", "max_tokens": 2})
    assert status == 200 and body["object"] == "text_completion"

    # in-flight requests show in /v1/loads and /get_load; SIGTERM lets them finish
    results: list = []
    t = threading.Thread(target=lambda: results.append(http(
        "POST", base + "/generate", key=key, body={"text": "slow", "sampling_params": {}})))
    t.start()
    deadline = time.time() + 5
    loads = None
    while time.time() < deadline:
        loads = http("GET", base + "/v1/loads", key=key)[1]["loads"][0]
        if loads["num_reqs"] >= 1:
            break
        time.sleep(0.02)
    assert loads["num_reqs"] == 1 and loads["num_waiting_reqs"] == 0
    assert http("GET", base + "/get_load", key=key)[1][0]["num_reqs"] == 1
    os.kill(proc.pid, signal.SIGTERM)
    t.join(10)
    assert results and results[0][0] == 200  # the in-flight request completed
    assert proc.wait(10) == 0
    assert bed.used() == {0: 0, 1: 0}  # memory freed with the process
    assert "Graceful shutdown complete" in proc.out()


# --------------------------------------------------------------------------
# startup failures, like SGLang's
# --------------------------------------------------------------------------


def test_memory_imbalance_from_a_stale_holder(bed):
    bed.holder({1: 40000})
    args = ["--model-path", str(bed.model), "--tp-size", "2", "--port", str(free_port())]
    proc = bed.run(args)
    assert proc.p.returncode == 1
    err = proc.err()
    assert "Traceback (most recent call last)" in err
    line = last_line(err)
    assert line.startswith(
        "RuntimeError: The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
    ), err
    # GB values, SGLang's f-string style
    assert f"pre_model_load_memory={(gpusim.CT200_GPU_MIB - 40000) / 1024}" in line
    assert f"local_gpu_memory={gpusim.CT200_GPU_MIB / 1024}" in line
    assert "local_gpu_memory * 0.9=" in line
    assert bed.used()[0] == 0  # the failed server holds nothing

    # the switch turns the check off; then the memory itself is short
    proc = bed.run(args, SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK="0")
    assert proc.p.returncode == 1
    assert "The memory capacity is unbalanced" in proc.err()  # logged as a warning
    assert last_line(proc.err()).startswith("RuntimeError: Not enough memory. Please try to increase "
                                            "--mem-fraction-static."), proc.err()

    # GPUs outside the server's CUDA_VISIBLE_DEVICES do not count
    port = free_port()
    proc = bed.start(["--model-path", str(bed.model), "--tp-size", "1", "--port", str(port)],
                     CUDA_VISIBLE_DEVICES="0")
    proc.wait_for(READY)
    assert bed.used()[0] == int(0.85 * gpusim.CT200_GPU_MIB)


def test_port_in_use(bed):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        proc = bed.run(["--model-path", str(bed.model), "--port", str(port)])
    assert proc.p.returncode == 1
    assert "Port is already in use" in last_line(proc.err())


FAKE_CT = """
from enum import Enum

class CompressionFormat(Enum):
    dense = "dense"
    sparse_bitmask = "sparse-bitmask"
    int_quantized = "int-quantized"
    float_quantized = "float-quantized"
    naive_quantized = "naive-quantized"
    pack_quantized = "pack-quantized"
    marlin_24 = "marlin-24"
{extra}
"""


def _fake_compressed_tensors(root: Path, with_nvfp4: bool) -> Path:
    pkg = root / "compressed_tensors"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from compressed_tensors.config import CompressionFormat\n")
    extra = '    nvfp4_pack_quantized = "nvfp4-pack-quantized"\n' if with_nvfp4 else ""
    (pkg / "config.py").write_text(FAKE_CT.format(extra=extra))
    return root


def _ct_model(fmt: str) -> dict:
    return {
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": fmt,
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                "strategy": "group", "group_size": 32},
                }
            },
            "ignore": ["lm_head"],
            "quantization_status": "compressed",
        }
    }


@pytest.mark.parametrize("fmt", ["pack-quantized", "nvfp4-pack-quantized"])
def test_compressed_tensors_missing_member_raises_attribute_error(bed, fmt):
    bed.write_model(_ct_model(fmt))
    old = _fake_compressed_tensors(bed.tmp / "ct-old", with_nvfp4=False)
    proc = bed.run(["--model-path", str(bed.model), "--port", str(free_port())],
                   PYTHONPATH=f"{SANDBOX_DIR}{os.pathsep}{old}")
    assert proc.p.returncode == 1
    err = proc.err()
    assert "Traceback (most recent call last)" in err
    assert last_line(err).startswith("AttributeError") and "nvfp4_pack_quantized" in last_line(err), err
    assert "Load weight begin" not in proc.out()


@pytest.mark.skipif(not CT081_VENV_PY.exists(), reason=f"no compressed-tensors 0.8.1 venv at {CT081_VENV_PY}")
def test_real_compressed_tensors_0_8_1(bed):
    """The real library, as on ct200: an INT4 pack-quantized model fails too,
    because SGLang 0.5.23 touches CompressionFormat.nvfp4_pack_quantized for
    every config group."""
    bed.write_model(_ct_model("pack-quantized"))
    proc = bed.run(["--model-path", str(bed.model), "--port", str(free_port())],
                   python=str(CT081_VENV_PY), timeout=120)
    assert proc.p.returncode == 1
    assert last_line(proc.err()) == "AttributeError: nvfp4_pack_quantized. Did you mean: 'pack_quantized'?"


def test_compressed_tensors_with_member_starts(bed):
    bed.write_model(_ct_model("nvfp4-pack-quantized"))
    new = _fake_compressed_tensors(bed.tmp / "ct-new", with_nvfp4=True)
    port = free_port()
    proc = bed.start(["--model-path", str(bed.model), "--port", str(port)],
                     PYTHONPATH=f"{SANDBOX_DIR}{os.pathsep}{new}")
    proc.wait_for(READY)
    assert "quant=compressed-tensors" in proc.out()
    proc.p.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0


def test_compressed_tensors_not_installed(bed):
    bed.write_model(_ct_model("pack-quantized"))
    proc = bed.run(["--model-path", str(bed.model), "--port", str(free_port())])
    assert proc.p.returncode == 1
    assert last_line(proc.err()).startswith("ModuleNotFoundError: No module named 'compressed_tensors'")


# --------------------------------------------------------------------------
# the fallback parser
# --------------------------------------------------------------------------


def test_fallback_parser_rejects_invalid_choice(bed):
    proc = bed.run(["--model-path", str(bed.model), "--attention-backend", "tritonn"])
    assert proc.p.returncode == 2
    err = proc.err()
    assert err.startswith("usage: sglang serve")
    assert ("sglang serve: error: argument --attention-backend: invalid choice: 'tritonn' "
            "(choose from 'triton', 'torch_native'") in err


def test_fallback_parser_unrecognized_argument(bed):
    proc = bed.run(["--model-path", str(bed.model), "--tp-sise", "8"])
    assert proc.p.returncode == 2
    assert last_line(proc.err()) == "sglang serve: error: unrecognized arguments: --tp-sise 8"


def test_fallback_parser_config_yaml(bed):
    good = bed.tmp / "opts.yaml"
    good.write_text("tp-size: 2\napi-key: from-the-file\nattention-backend: triton\n"
                    "served-model-name: yaml-model\nenable-metrics: true\n")
    port = free_port()
    proc = bed.start(["--model-path", str(bed.model), "--config", str(good), "--port", str(port)])
    proc.wait_for(READY)
    out = proc.out()
    assert "tp_size=2" in out and "attention_backend='triton'" in out and "api_key='***'" in out
    assert "from-the-file" not in out + proc.err()
    assert http("GET", f"http://127.0.0.1:{port}/v1/models")[0] == 401
    status, body = http("GET", f"http://127.0.0.1:{port}/v1/models", key="from-the-file")
    assert status == 200 and body["data"][0]["id"] == "yaml-model"
    proc.p.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0

    bad = bed.tmp / "bad.yaml"
    bad.write_text("api_key: x\n")
    proc = bed.run(["--model-path", str(bed.model), "--config", str(bad)])
    assert proc.p.returncode == 2
    assert "unrecognized arguments: --api_key x" in proc.err()


# --------------------------------------------------------------------------
# multi-node
# --------------------------------------------------------------------------
