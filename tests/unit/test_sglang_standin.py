"""The sandbox's SGLang stand-in (sandbox/sglang_standin.py), run as a subprocess.

Every test uses its own simulated GPU state (SANDBOX_GPU_LAYOUT /
SANDBOX_GPU_REGISTRY in a tmp dir), a tiny model dir and free loopback ports.
Tests that run the stand-in under another python need the venvs that
`make test-venvs` builds (.sandbox/sglang-venv: sglang 0.5.23 --no-deps beside
CPU torch, compressed-tensors 0.18.0 and safetensors; .sandbox/ct-venv:
compressed-tensors 0.8.1): they fail, never skip, without them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
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
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
BANNER = "SIMULATED SGLang server (sandbox stand-in): no GPU, no real model weights"


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def venv_python(path: Path) -> str:
    """A test venv's python, or a failure that says how to make it (no skip in CI)."""
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make test-venvs` (it builds .sandbox/*-venv)")
    return str(path)


def safetensors_bytes(tensors: dict[str, int]) -> bytes:
    """A valid safetensors file: BF16 tensors of the given element counts."""
    header: dict = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, count in tensors.items():
        header[name] = {"dtype": "BF16", "shape": [count], "data_offsets": [off, off + 2 * count]}
        off += 2 * count
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"\x01" * off


def write_weights(model: Path) -> None:
    """Two shards and the model.safetensors.index.json that names them."""
    weight_map = {}
    for i, shard in enumerate(SHARDS):
        names = {f"model.layers.{i}.mlp.weight": 32, f"model.layers.{i}.attn.weight": 16}
        (model / shard).write_bytes(safetensors_bytes(names))
        weight_map.update(dict.fromkeys(names, shard))
    (model / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 192}, "weight_map": weight_map}))


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
        """Everything it wrote, stdout then stderr (SGLang logs on stderr; the journal takes both)."""
        return self.out_path.read_text() + self.err_path.read_text()

    def stdout(self) -> str:
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
        write_weights(self.model)
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

    def start(self, args: list[str], python: str = sys.executable, launcher: bool = False, **env) -> Proc:
        """The stand-in, or with launcher=True what the unit runs: the launcher, the
        server module as its first argument (args must then start with it)."""
        self.n += 1
        out = self.tmp / f"p{self.n}.out"
        err = self.tmp / f"p{self.n}.err"
        start = [str(ROOT / "remote" / "server_launch.py")] if launcher else ["-m", "sglang_standin"]
        with open(out, "wb") as fo, open(err, "wb") as fe:
            popen = subprocess.Popen(
                [python, *start, *args],
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
                popen.wait(timeout=60)
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


def error_lines(text: str, prefix: str) -> list[str]:
    """The lines that start with ``prefix`` (a traceback's last line, e.g. 'RuntimeError: ')."""
    return [line for line in text.splitlines() if line.startswith(prefix)]


def holders(bed: Bed) -> dict[int, dict]:
    """pid -> registration, of the live processes holding simulated GPU memory."""
    out = {}
    for path in bed.registry.glob("*.json"):
        reg = json.loads(path.read_text())
        if Path(f"/proc/{reg['pid']}").exists():
            out[reg["pid"]] = reg
    return out


def assert_failed_like_sglang(proc: Proc, error: str) -> None:
    """A rank failed during the start: it logged the traceback, the main process got
    SIGQUIT and killed the tree and itself (SIGKILL), as SGLang 0.5.23 does."""
    assert proc.p.returncode == -signal.SIGKILL, proc.out()
    out = proc.out()
    assert "Scheduler hit an exception: Traceback (most recent call last)" in out, out
    assert error_lines(out, error), out
    assert "Received sigquit from a child process. It usually means the child failed." in out
    assert "kill_process_tree called: parent_pid=" in out
    assert READY not in out


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
    # nothing answers while the ranks load: uvicorn starts after the engine, as in sglang 0.5.23
    assert seen[0] is None and "Load weight end" in proc.out(), seen
    proc.wait_for(READY)
    out = proc.out()
    assert proc.err().splitlines()[0].endswith(BANNER)
    assert "real parser was not available" in out
    # like SGLang 0.5.23 (engine.py): the arguments as a dict, the API key in clear (the
    # launcher, remote/server_launch.py, keeps it out of the journal on a host)
    assert "server_args={'model_path': " in out and "'tp_size': 2" in out
    assert f"'api_key': '{key}'" in out
    for tp in (0, 1):
        for marker in ("Load weight begin", "Load weight end", "Capture target decode CUDA graph end"):
            assert f" TP{tp}] {marker}" in out
    assert out.index("Load weight end") < out.index(READY)

    # one process per TP rank, each holding memory on its own GPU; the main process holds none
    used = bed.used()
    expect = int(0.85 * gpusim.CT200_GPU_MIB)
    assert used == {0: expect, 1: expect}
    held = holders(bed)
    assert sorted(tuple(reg["gpus"]) for reg in held.values()) == [("0",), ("1",)], held
    assert proc.pid not in held
    assert all(Path(f"/proc/{pid}/status").read_text().count(f"PPid:\t{proc.pid}\n") for pid in held)

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
    assert info["tp_size"] == 2 and info["api_key"] == key  # SGLang serves it too (behind the key)
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

    # in-flight requests show in /v1/loads (sglang 0.5.23 has no /get_load); SIGTERM lets them finish
    results: list = []
    t = threading.Thread(target=lambda: results.append(http(
        "POST", base + "/generate", key=key, body={"text": "slow", "sampling_params": {}})))
    t.start()
    deadline = time.time() + 5
    loads = None
    while time.time() < deadline:
        loads = http("GET", base + "/v1/loads", key=key)[1]["loads"][0]
        if loads["num_running_reqs"] >= 1:
            break
        time.sleep(0.02)
    assert loads["num_running_reqs"] == 1 and loads["num_waiting_reqs"] == 0 and "num_reqs" not in loads
    assert http("GET", base + "/get_load", key=key)[0] == 404
    os.kill(proc.pid, signal.SIGTERM)
    t.join(10)
    assert results and results[0][0] == 200  # the in-flight request completed
    assert proc.wait(60) == 0
    assert bed.used() == {0: 0, 1: 0}  # memory freed with the processes
    assert not holders(bed)
    out = proc.out()  # SGLang's own lines, in its order (sandbox/sglang_sigterm.py)
    assert out.index("SIGTERM received. signum=None frame=None.") < out.index("Gracefully exiting... Remaining") \
        < out.index("INFO:     Finished server process")


def test_a_killed_rank_fails_the_server(bed):
    """SGLang's SubprocessWatchdog: a scheduler that dies is noticed within about a
    second; SIGQUIT, the tree is killed, the main process too (SIGKILL)."""
    port = free_port()
    proc = bed.start(["--model-path", str(bed.model), "--tp-size", "2", "--port", str(port)])
    proc.wait_for(READY)
    held = holders(bed)
    assert len(held) == 2
    victim = min(held)
    os.kill(victim, signal.SIGKILL)  # one rank's process, by the PID it registered
    assert proc.wait(60) == -signal.SIGKILL
    out = proc.out()
    assert "crashed with exit code -9. Triggering SIGQUIT for cleanup..." in out
    assert "SIGQUIT received. signum=3" in out and "It usually means one child failed." in out
    deadline = time.time() + 5
    while holders(bed) and time.time() < deadline:  # the other rank goes with it
        time.sleep(0.1)
    assert not holders(bed) and bed.used() == {0: 0, 1: 0}


# --------------------------------------------------------------------------
# startup failures, like SGLang's
# --------------------------------------------------------------------------


def test_memory_imbalance_from_a_stale_holder(bed):
    bed.holder({1: 40000})
    args = ["--model-path", str(bed.model), "--tp-size", "2", "--port", str(free_port())]
    proc = bed.run(args)
    assert_failed_like_sglang(proc, "RuntimeError: The memory capacity is unbalanced. Some GPUs may be "
                                    "occupied by other processes. ")
    line = error_lines(proc.out(), "RuntimeError: The memory capacity is unbalanced")[0]
    # GB values, SGLang's f-string style
    assert f"pre_model_load_memory={(gpusim.CT200_GPU_MIB - 40000) / 1024}" in line
    assert f"local_gpu_memory={gpusim.CT200_GPU_MIB / 1024}" in line
    assert "local_gpu_memory * 0.9=" in line
    assert bed.used()[0] == 0  # the failed server holds nothing

    # the switch turns the check off; then the memory itself is short
    proc = bed.run(args, SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK="0")
    assert "The memory capacity is unbalanced" in proc.out()  # logged as a warning
    assert_failed_like_sglang(proc, "RuntimeError: Not enough memory. Please try to increase "
                                    "--mem-fraction-static. Current value: mem_fraction_static=0.85")

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


# --------------------------------------------------------------------------
# the fallback parser
# --------------------------------------------------------------------------


def test_fallback_parser_rejects_invalid_choice(bed):
    proc = bed.run(["--model-path", str(bed.model), "--attention-backend", "tritonn"])
    assert proc.p.returncode == 2
    err = proc.err()
    assert err.splitlines()[1].startswith("usage: sglang serve")  # after the banner
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
    assert "'tp_size': 2" in out and "'attention_backend': 'triton'" in out
    assert "'api_key': 'from-the-file'" in out  # in clear, as SGLang logs it
    assert http("GET", f"http://127.0.0.1:{port}/v1/models")[0] == 401
    status, body = http("GET", f"http://127.0.0.1:{port}/v1/models", key="from-the-file")
    assert status == 200 and body["data"][0]["id"] == "yaml-model"
    proc.p.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0

    bad = bed.tmp / "bad.yaml"
    bad.write_text("api_key: x\n")
    proc = bed.run(["--model-path", str(bed.model), "--config", str(bad)])
    assert proc.p.returncode == 2
    assert "unrecognized arguments: --api_key x" in proc.err()


# --------------------------------------------------------------------------
# multi-node
# --------------------------------------------------------------------------
