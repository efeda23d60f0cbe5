"""The correctness gate: a profile's smoke checks (tasks/spec/smoke.py), the host-side script
(remote/smoke_check.py) against a fake server, the judgment (core/smoke_gate.py) and the stand-in's
simulated answers (sandbox/sglang_standin.py _answer, SANDBOX_GIBBERISH)."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pydantic import ValidationError

from core.smoke_gate import right_answers, smoke_command, wrong_answers
from tasks.spec.errors import format_errors
from tasks.spec.profile import ModelProfile, load_profile

REPO = Path(__file__).resolve().parents[2]


def with_smoke(checks) -> ModelProfile:
    return ModelProfile.model_validate({**load_profile("sandbox-tiny").model_dump(), "smoke": checks})


def test_a_check_needs_a_regex_that_compiles_and_an_api_that_exists():
    assert with_smoke([{"prompt": "2+2?", "expect": r"\b4\b"}]).smoke[0].api == "chat"  # the default
    for bad, line in (
        ({"prompt": "x", "expect": "(open"}, "smoke[0].expect = '(open': not a regular expression"),
        ({"prompt": "x", "expect": "a", "api": "generate"}, "smoke[0].api = 'generate': Input should be 'chat' or "
                                                            "'completions'"),
        ({"prompt": "", "expect": "a"}, "smoke[0].prompt = '': String should have at least 1 character"),
        ({"prompt": "x", "expect": "a", "max_tokens": 0}, "smoke[0].max_tokens = 0: Input should be greater"),
    ):
        with pytest.raises(ValidationError) as err:
            with_smoke([bad])
        assert any(found.startswith(line) for found in format_errors(err.value, ModelProfile)), \
            format_errors(err.value, ModelProfile)


def test_the_profiles_the_repo_ships_carry_checks():
    assert [c.expect for c in load_profile("sandbox-tiny").smoke] == [r"\b42\b", r"^\s*OK\b"]
    kimi = load_profile("kimi-k2.6").smoke
    assert len(kimi) == 4 and all(c.chat_template_kwargs == {"thinking": False} for c in kimi)
    assert [c.tool.name for c in kimi if c.tool] == ["get_weather"]  # kimi_k2's tool-call parser, round trip
    assert [c.tool.name for c in load_profile("sandbox-tiny-tools").smoke if c.tool] == ["get_weather"]


TOOL = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                              "required": ["city"]}}


def test_a_tool_check_needs_the_servers_tool_call_parser_and_an_object_schema():
    with pytest.raises(ValidationError) as err:
        with_smoke([{"prompt": "weather?", "tool": TOOL}])  # sandbox-tiny has no --tool-call-parser
    assert format_errors(err.value, ModelProfile) == [
        "smoke[0].tool = 'get_weather': the server parses no tool calls (no --tool-call-parser in "
        "extra_server_args): allowed: a tool check with --tool-call-parser, or none"]
    with pytest.raises(ValidationError) as err:
        with_smoke([{"prompt": "x"}])
    assert "a check needs expect (a regex) or tool" in format_errors(err.value, ModelProfile)[0]
    bad = {**TOOL, "parameters": {"type": "object", "properties": {}, "required": ["city"]}}
    with pytest.raises(ValidationError) as err:
        with_smoke([{"prompt": "x", "tool": bad}])
    assert "required ['city'] not among the properties" in format_errors(err.value, ModelProfile)[0]


def test_a_tool_call_passes_only_with_the_function_and_its_required_arguments():
    script = load(REPO / "remote" / "smoke_check.py", "smoke_check")
    check = {"prompt": "weather in Paris?", "tool": TOOL, "expect": "(?i)paris"}
    call = [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    assert script.judged(check, json.dumps(call))
    assert not script.judged(check, json.dumps([{"name": "get_time", "arguments": '{"city": "Paris"}'}]))
    assert not script.judged(check, json.dumps([{"name": "get_weather", "arguments": '{"town": "Paris"}'}]))
    assert not script.judged(check, json.dumps([{"name": "get_weather", "arguments": '{"city": "Paris"'}]))  # not JSON
    assert not script.judged(check, json.dumps([{"name": "get_weather", "arguments": '{"city": "Rome"}'}]))
    assert not script.judged(check, "[]") and not script.judged(check, None)
    assert wrong_answers({"checks": [{"prompt": "p", "tool": "get_weather", "expect": "(?i)paris", "got": "[]"}]}) == [
        "'p' wanted a call of get_weather with its required arguments matching /(?i)paris/, got '[]'"]


def test_a_wrong_answer_names_the_prompt_the_regex_and_what_came_back():
    results = {"checks": [{"prompt": "What is 17 + 25?", "expect": r"\b42\b", "got": "42", "ok": True},
                          {"prompt": "Reply OK", "expect": "^OK", "got": "!!!! ĠĠ !!!!", "ok": False},
                          {"prompt": "p", "expect": "x", "got": None, "ok": False}]}
    assert wrong_answers(results) == ["'Reply OK' wanted /^OK/, got '!!!! ĠĠ !!!!'", "'p' wanted /x/, got 'None'"]
    assert wrong_answers({"checks": results["checks"][:1]}) == []
    # a pass shows what the model said (the operator sees a real answer), the failures not among them
    assert right_answers(results) == ["'What is 17 + 25?' answered '42'"]
    assert right_answers({"checks": [{"prompt": "p", "got": "x" * 300, "ok": True}]}) == [f"'p' answered '{'x' * 120}'"]


class Server(BaseHTTPRequestHandler):
    answer = "The answer is 42."
    bodies: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Server.bodies.append((self.path, self.headers.get("Authorization"), body))
        choice = ({"message": {"role": "assistant", "content": Server.answer, "reasoning_content": "hm"}}
                  if self.path == "/v1/chat/completions" else {"text": Server.answer})
        data = json.dumps({"choices": [choice]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    Server.bodies = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_asks_at_temperature_0_with_the_key_and_keeps_what_came_back(server, tmp_path, capsys):
    script = load(REPO / "remote" / "smoke_check.py", "smoke_check")
    options = tmp_path / "sglang.yaml"
    options.write_text('api-key: "k-123"\n')
    checks = [{"prompt": "What is 17 + 25?", "expect": r"\b42\b", "chat_template_kwargs": {"thinking": False}},
              {"prompt": "Say OK", "expect": "^OK", "api": "completions", "max_tokens": 4}]
    out = tmp_path / "launch" / "sglang.smoke.json"
    assert script.main(["--url", server, "--served-name", "tiny", "--options-file", str(options),
                        "--checks", json.dumps(checks), "--out", str(out)]) == 0
    kept = json.loads(out.read_text())
    assert [(c["got"], c["ok"]) for c in kept["checks"]] == [("The answer is 42.", True), ("The answer is 42.", False)]
    assert kept["passed"] == 1 and out.stat().st_mode & 0o777 == 0o600
    (chat_path, key, chat), (completion_path, _, completion) = Server.bodies
    assert chat_path == "/v1/chat/completions" and key == "Bearer k-123" and "k-123" not in capsys.readouterr().out
    assert chat["temperature"] == 0 and chat["messages"] == [{"role": "user", "content": "What is 17 + 25?"}]
    assert chat["chat_template_kwargs"] == {"thinking": False} and chat["model"] == "tiny"
    assert completion_path == "/v1/completions" and completion["prompt"] == "Say OK" and completion["max_tokens"] == 4


def test_the_command_carries_the_checks_but_not_the_key():
    import runpy

    from tasks.spec import build_spec

    data = {}
    for group in ("all", "sandbox"):
        data.update({k: v for k, v in runpy.run_path(str(REPO / "group_data" / f"{group}.py")).items()
                     if not k.startswith("_")})
    spec = build_spec("sgc1", {**data, "hf_endpoint": "http://10.77.0.1:18080"},
                      environ={"SGLANG_API_KEY": "k-secret-123"}).resolve(compute_cap="12.0", p2p_ok=True)
    command = smoke_command(spec)
    assert "What is 17 + 25?" in command and "--served-name tiny" in command
    assert "--options-file /etc/sglang/sglang.yaml" in command  # the script reads the key there
    assert "k-secret-123" not in command


def test_without_a_key_in_the_settings_the_scripts_still_read_the_units_options_file():
    """A rollback restores the last good configuration's options file, key included, while this run's
    settings hold none (seen: `make demo REAL=1` after a keyed deploy, its speed gate failing): the
    readiness wait after it must ask with that key, else a healthy rollback answers 401 and is
    reported failed. The scripts send no key when the file holds none (test_wait_ready_*)."""
    import runpy

    from core.server import wait_command
    from core.speed_gate import speed_command
    from tasks.spec import build_spec

    data = {}
    for group in ("all", "sandbox"):
        data.update({k: v for k, v in runpy.run_path(str(REPO / "group_data" / f"{group}.py")).items()
                     if not k.startswith("_")})
    spec = build_spec("sgc1", {**data, "hf_endpoint": "http://10.77.0.1:18080"},
                      environ={}).resolve(compute_cap="12.0", p2p_ok=True)
    assert "api-key" not in json.dumps(spec.server_options)  # no key in this run's settings
    for command in (wait_command(spec, 60), smoke_command(spec), speed_command(spec, "http://127.0.0.1:30000")):
        assert command.endswith(" --options-file /etc/sglang/sglang.yaml"), command[-200:]


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "sandbox"))
    sys.modules.pop("sglang_standin", None)
    import sglang_standin

    return sglang_standin


def test_the_stand_in_answers_the_checks_kinds_of_prompt_and_junk_when_broken(standin, monkeypatch):
    assert standin._reply(16, "What is 17 + 25? Answer with the number only.") == (["42"], "stop")
    assert standin._reply(8, "Reply with exactly the word OK.") == (["OK"], "stop")
    assert standin._reply(8, "What is the capital of France?") == (["Paris."], "stop")
    assert standin._reply(64, "Tell me a story")[0][:3] == ["This", "is", "a"]  # anything else: the canned reply
    tools = [{"type": "function", "function": TOOL}, {"type": "function", "function": {**TOOL, "name": "other"}}]
    (call,) = standin._tool_call(tools, "What is the weather in Paris right now?", "kimi_k2")
    assert call["id"] == "functions.get_weather:0" and call["type"] == "function"  # SGLang's kimi_k2 id
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert standin._tool_call(None, "weather in Paris", "kimi_k2") is None  # no tools offered: no call
    monkeypatch.setenv("SANDBOX_GIBBERISH", "1")
    junk = " ".join(standin._reply(64, "What is 17 + 25?")[0])
    assert "42" not in junk and "!!!!" in junk
    assert standin._tool_call(tools, "What is the weather in Paris?", "kimi_k2") is None  # junk parses to no call
