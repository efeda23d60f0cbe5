"""core/speed_gate.py's verdict and remote/decode_speed.py against a small HTTP server."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from core.speed_gate import compare

REPO = Path(__file__).resolve().parents[2]


def figure(c1: float, c4: float, tokens: int = 128) -> dict:
    return {"tokens": tokens, "c1": {"tok_s": c1}, "c4": {"tok_s": c4}}


def test_as_fast_as_last_time_passes_and_a_slowdown_names_both_figures():
    assert compare(figure(80, 300), figure(84, 310), 0.8, None) == []
    problems = compare(figure(27, 100), figure(84, 310), 0.8, None)
    assert problems == ["decode at concurrency 1 is 27 tok/s, 32% of this host's last good 84 tok/s (perf_tolerance 0.8)",
                        "decode at concurrency 4 is 100 tok/s, 32% of this host's last good 310 tok/s "
                        "(perf_tolerance 0.8)"]


def test_the_first_measurement_has_only_the_floor_and_another_length_is_not_compared():
    assert compare(figure(80, 300), None, 0.8, None) == []
    assert compare(figure(50, 300), None, 0.8, 73) == [
        "decode at concurrency 1 is 50 tok/s, below the profile's floor of 73 tok/s"]
    assert compare(figure(10, 30), figure(84, 310, tokens=64), 0.8, None) == []
    assert compare(figure(10, 30), figure(84, 310), 0, None) == []  # perf_tolerance 0: off


class Server(BaseHTTPRequestHandler):
    delay_per_token = 0.001
    seen_keys: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Server.seen_keys.append(self.headers.get("Authorization"))
        tokens = body["sampling_params"]["max_new_tokens"]
        time.sleep(tokens * self.delay_per_token)
        data = json.dumps({"text": "x", "meta_info": {"completion_tokens": tokens}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def load_script():
    spec = importlib.util.spec_from_file_location("decode_speed", REPO / "remote" / "decode_speed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_measurement_counts_tokens_over_time_at_each_concurrency_with_the_key(server, tmp_path, capsys):
    options = tmp_path / "sglang.yaml"
    options.write_text('api-key: "sk-speed"\n')
    out = tmp_path / "launch" / "sglang.speed.json"
    rc = load_script().main(["--url", server, "--options-file", str(options), "--tokens", "100",
                             "--concurrency", "1,4", "--out", str(out)])
    assert rc == 0
    measured = json.loads(out.read_text())
    assert capsys.readouterr().out.strip() == f"speed: {out.read_text()}"
    assert measured["tokens"] == 100 and set(measured) == {"tokens", "c1", "c4"}
    assert 20 < measured["c1"]["tok_s"] <= 1000  # 100 tokens in >= 0.1 s
    assert measured["c4"]["tok_s"] > 2 * measured["c1"]["tok_s"]  # four at once, each as fast
    assert set(Server.seen_keys) == {"Bearer sk-speed"} and len(Server.seen_keys) == 6  # warmup + 1 + 4
    assert oct(out.stat().st_mode & 0o777) == "0o600"


def test_a_failing_request_fails_the_measurement_with_its_answer(tmp_path, capsys):
    rc = load_script().main(["--url", "http://127.0.0.1:9", "--tokens", "8", "--max-s", "2"])
    assert rc == 1 and capsys.readouterr().out.startswith("FAILED: the speed gate's warmup request: ")
