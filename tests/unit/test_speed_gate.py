"""core/speed_gate.py's verdict, core/draft_gate.py's (a draft's accept length) and remote/decode_speed.py
against a small HTTP server."""

from __future__ import annotations

import importlib.util
import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from core import speed_gate
from core.draft_gate import compare as draft_compare
from core.speed_gate import compare
from tests.unit.test_step_operations import sandbox_spec

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
    # 0.5 s per 100-token request: what a loaded CPU adds per request (a thread, an HTTP round trip; the
    # unit tests run niced beside the integration tests) stays small beside it
    delay_per_token = 0.005
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


# --- the draft's accept length (core/draft_gate.py, measured by the same script) ------------------


class SpecServer(Server):
    """A server with a draft: each answer reports its verify steps like sglang 0.5.23's meta_info."""

    accept_length = 2.5

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        tokens = body["sampling_params"]["max_new_tokens"]
        verify_ct = math.ceil(tokens / self.accept_length)
        data = json.dumps({"text": "x", "meta_info": {"completion_tokens": tokens, "spec_verify_ct": verify_ct,
                                                      "spec_accept_length": tokens / verify_ct}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def spec_server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), SpecServer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_with_a_draft_the_measurement_sums_the_verify_steps_into_the_accept_length(spec_server, tmp_path):
    out = tmp_path / "sglang.speed.json"
    assert load_script().main(["--url", spec_server, "--tokens", "100", "--concurrency", "1,4", "--out", str(out)]) == 0
    measured = json.loads(out.read_text())
    # 100 tokens in 40 verify steps per request; the warmup's 4 tokens are not counted
    assert (measured["c1"]["accept_length"], measured["c1"]["verify_ct"]) == (2.5, 40)
    assert (measured["c4"]["accept_length"], measured["c4"]["verify_ct"]) == (2.5, 160)
    assert (measured["accept_length"], measured["verify_ct"]) == (2.5, 200)


def test_without_speculative_metadata_the_speed_json_has_no_accept_length(server, tmp_path):
    out = tmp_path / "sglang.speed.json"
    assert load_script().main(["--url", server, "--tokens", "8", "--concurrency", "1", "--out", str(out)]) == 0
    measured = json.loads(out.read_text())
    assert "accept_length" not in measured and "verify_ct" not in measured and "accept_length" not in measured["c1"]


def test_the_draft_gate_passes_a_working_draft_and_names_one_that_accepts_nothing():
    assert draft_compare({"accept_length": 2.6, "verify_ct": 40}, 1.5) == []
    assert draft_compare({"accept_length": 1.5, "verify_ct": 40}, 1.5) == []  # at the minimum: passes
    assert draft_compare({"accept_length": 1.0, "verify_ct": 105}, 1.5) == [
        "the draft accepts nothing: accept length 1.00 over 105 verify steps, below min_accept_length 1.5"]
    assert draft_compare({"accept_length": 1.3, "verify_ct": 81}, 1.5) == [
        "the draft accepts too little: accept length 1.30 over 81 verify steps, below min_accept_length 1.5"]
    for measured in ({"tokens": 128, "c1": {"tok_s": 80}}, {"accept_length": 2.0, "verify_ct": 0}):
        assert draft_compare(measured, 1.5) == [
            "a draft is configured but the server reports no speculative decoding (no spec_verify_ct in "
            "/generate's meta_info)"]


def eagle3_spec(**overrides):
    return sandbox_spec(model="sandbox-tiny-eagle3", **overrides)


class GateHost:
    name = "sgc1"

    def __init__(self):
        self.lines: list[str] = []

    def log(self, message, log_func=None):
        self.lines.append(message)

    def log_styled(self, message, **_kwargs):
        self.lines.append(message)


def judged(monkeypatch, spec, measured: dict, last_good: dict | None = None) -> tuple[bool, GateHost, list[str]]:
    """decode_speed_as_expected with the host's measurement and last good figure given; the commands it ran."""
    ran: list[str] = []
    monkeypatch.setattr(speed_gate, "stream", lambda state, host, command, *a, **k: ran.append(command) or True)
    files = {speed_gate.speed_path(spec): measured, "/last-good/speed.json": last_good or {}}
    monkeypatch.setattr(speed_gate, "read_host_json", lambda host, path: files[path])
    host, state = GateHost(), SimpleNamespace()
    return speed_gate.decode_speed_as_expected(state, host, spec, "/last-good"), host, ran


def test_with_a_draft_the_measurement_runs_even_with_perf_tolerance_0_and_no_floor(monkeypatch):
    healthy = {"tokens": 128, "c1": {"tok_s": 80}, "c4": {"tok_s": 300}, "accept_length": 2.6, "verify_ct": 40}
    ok, host, ran = judged(monkeypatch, eagle3_spec(perf_tolerance=0), healthy)
    assert ok and len(ran) == 1 and speed_gate.speed_path(eagle3_spec()) in ran[0]
    assert host.lines == ["readiness: draft accepted: accept length 2.60 (min_accept_length 1.5)"]
    ok, host, ran = judged(monkeypatch, sandbox_spec(perf_tolerance=0), healthy)  # no draft: nothing measured
    assert ok and ran == [] and host.lines == []


def test_a_draft_that_accepts_nothing_fails_readiness_before_the_speed_is_judged(monkeypatch):
    broken = {"tokens": 128, "c1": {"tok_s": 20}, "c4": {"tok_s": 60}, "accept_length": 1.0, "verify_ct": 105}
    ok, host, _ = judged(monkeypatch, eagle3_spec(), broken, figure(80, 300))
    assert not ok
    assert host.lines == ["readiness: draft gate: the draft accepts nothing: accept length 1.00 over 105 verify "
                          "steps, below min_accept_length 1.5"]  # the cause, not the slowdown it brings
    ok, host, _ = judged(monkeypatch, eagle3_spec(), {"tokens": 128, "c1": {"tok_s": 80}, "c4": {"tok_s": 300}})
    assert not ok and host.lines == ["readiness: draft gate: a draft is configured but the server reports no "
                                     "speculative decoding (no spec_verify_ct in /generate's meta_info)"]


def test_the_profiles_min_accept_length_is_the_gates_minimum(monkeypatch):
    measured = {"tokens": 128, "c1": {"tok_s": 80}, "c4": {"tok_s": 300}, "accept_length": 2.6, "verify_ct": 40}
    strict = eagle3_spec(perf_tolerance=0)
    strict = strict.model_copy(update={"profile": strict.profile.model_copy(
        update={"expect": strict.profile.expect.model_copy(update={"min_accept_length": 3.0})})})
    ok, host, _ = judged(monkeypatch, strict, measured)
    assert not ok and host.lines[0].endswith("accept length 2.60 over 40 verify steps, below min_accept_length 3")


def test_the_measurement_is_bounded_by_speed_check_max_s():
    """30 s per concurrency by default (a GPU decodes 128 tokens in seconds); a slow host raises it."""
    from core.speed_gate import speed_command
    from tests.unit.test_step_operations import sandbox_spec

    assert "--max-s 30 " in speed_command(sandbox_spec(), "http://127.0.0.1:30000")
    assert "--max-s 240 " in speed_command(sandbox_spec(speed_check_max_s=240), "http://127.0.0.1:30000")


def test_each_request_decodes_speed_check_tokens():
    """128 tokens by default; a slow host (the real server on the sandbox's CPU) measures fewer. A figure
    counted at another token count is no last good one to compare with."""
    from core.speed_gate import speed_command
    from tests.unit.test_step_operations import sandbox_spec

    assert "--tokens 128 " in speed_command(sandbox_spec(), "http://127.0.0.1:30000")
    assert "--tokens 32 " in speed_command(sandbox_spec(speed_check_tokens=32), "http://127.0.0.1:30000")
    fast = {"tokens": 128, "c1": {"tok_s": 100.0}}
    assert compare({"tokens": 32, "c1": {"tok_s": 10.0}}, fast, 0.8, None) == []
    assert compare({"tokens": 128, "c1": {"tok_s": 10.0}}, fast, 0.8, None) != []
