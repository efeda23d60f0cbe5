"""The REAL SGLang server (sglang 0.5.23's own `python -m sglang.launch_server`) on one sandbox
host, through the production unit: group_data/sandbox_real.py, inventory/sandbox_real.py,
models/sandbox-real-llama.yaml. Only the GPU is simulated (the shim registers the real
scheduler process with the sandbox's GPU simulation). The host (sgc290) is converged once, with
an API key, and shared by these tests (tests/integration/helpers.shared_real_host); the venv
(~8 GB, the full lock of group_data/sandbox_real.py) is installed by that converge's own pip.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.helpers import grand_total, real_pyinfra, shared_real_host, unit_props, wait_until

pytestmark = pytest.mark.sandbox

API_KEY = "sk-real-server-7f3a9c2e41"
ENV = {"SGLANG_API_KEY": API_KEY}
TIMINGS: dict[str, float] = {}
AUTH = f"-H 'Authorization: Bearer {API_KEY}'"
CHAT = json.dumps({"model": "tiny-llama", "messages": [{"role": "user", "content": "Hello"}],
                   "max_tokens": 8, "temperature": 0})


@pytest.fixture(scope="module")
def real(request):
    host = shared_real_host(request, TIMINGS, env=ENV)
    yield host
    print("\nreal server timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in TIMINGS.items()))


def curl(host, path: str, data: str | None = None, auth: bool = True) -> tuple[int, str]:
    body = f"-H 'content-type: application/json' -d '{data}'" if data else ""
    out = host.run(f"curl -s -w '\\n%{{http_code}}' {AUTH if auth else ''} {body} http://127.0.0.1:30000{path}",
                   timeout=60, check=False).stdout
    text, _, code = out.rpartition("\n")
    return int(code or 0), text


def journal(host) -> str:
    return host.run("journalctl -u sglang.service --no-pager -o cat", timeout=60).stdout


def test_the_real_server_is_what_serves_and_it_answers_a_chat_request(real):
    out = real.converge_out
    assert "ready: sglang.service serves tiny-llama" in out, out[-4000:]
    assert "SIMULATED" in out  # the output says the GPU is simulated
    unit = real.run("cat /etc/systemd/system/sglang.service").stdout
    assert "server_launch.py sglang.launch_server --model-path /srv/models/tiny-llama" in unit, unit
    log = journal(real)
    assert "The server is fired up and ready to roll!" in log  # SGLang's own ready line
    assert "Load weight end. elapsed=" in log and "type=LlamaForCausalLM" in log, log[-3000:]
    code, info = curl(real, "/get_server_info")
    assert code == 200, info
    info = json.loads(info)
    assert (info["version"], info["device"], info["tp_size"], info["max_total_num_tokens"]) == \
        ("0.5.23", "cpu", 1, 8192), {k: info.get(k) for k in ("version", "device", "tp_size")}
    code, answer = curl(real, "/v1/chat/completions", CHAT)
    assert code == 200, answer
    answer = json.loads(answer)
    assert answer["model"] == "tiny-llama" and answer["usage"]["completion_tokens"] == 8, answer
    # greedy decoding of the pinned random weights: the same answer every time
    assert json.loads(curl(real, "/v1/chat/completions", CHAT)[1])["choices"] == answer["choices"]


def test_the_gpu_steps_see_the_real_scheduler_on_its_simulated_gpu(real):
    out = real.converge_out
    assert "GPUs [0] hold only sglang.service's memory" in out, out[-4000:]
    holdings = real.run("cat /run/sandbox-gpu/*.json").stdout
    pid = real.run("pgrep -f '^sglang::scheduler'").stdout.split()
    assert len(pid) == 1 and f'"pid": {pid[0]}' in holdings and '"0": 4096' in holdings, (pid, holdings)


def test_the_api_key_is_in_no_journal_line_while_the_server_logs_its_server_args(real):
    log = journal(real)
    logged = [line for line in log.splitlines() if "server_args=" in line]
    assert logged  # positive control: the real server logs its resolved arguments, the key among them
    assert "'api_key': '<redacted>'" in logged[-1], logged[-1]
    assert API_KEY not in log
    assert API_KEY not in real.run("cat /etc/systemd/system/sglang.service /proc/[0-9]*/cmdline 2>/dev/null "
                                   "| tr '\\0' ' '").stdout
    assert curl(real, "/v1/models", auth=False)[0] == 401  # the key is in force
    assert curl(real, "/v1/models")[0] == 200


def test_a_second_run_changes_nothing(real):
    before = unit_props(real, "sglang.service")
    proc = real_pyinfra("deploy.py", limit=real.name, env=ENV)
    assert proc.returncode == 0, proc.out[-4000:]
    assert grand_total(proc.out)[:2] == (0, 0), proc.out[-4000:]
    assert unit_props(real, "sglang.service") == before


def test_a_bad_flag_is_refused_by_the_real_parser_and_the_server_is_untouched(real, tmp_path):
    before = unit_props(real, "sglang.service")
    (tmp_path / "sandbox_real.py").write_text(
        'extra_server_args = ["--device", "cpu", "--max-total-tokens", "8192", "--tp-sise", "1"]\n')
    proc = real_pyinfra("deploy.py", "--group-data", str(tmp_path), limit=real.name, env=ENV)
    assert proc.returncode != 0, proc.out[-4000:]
    assert "SGLang's parser rejects the new command line" in proc.out, proc.out[-4000:]
    assert "unrecognized arguments: --tp-sise 1" in proc.out
    assert unit_props(real, "sglang.service") == before
    assert curl(real, "/v1/chat/completions", CHAT)[0] == 200


def test_a_config_the_real_server_dies_of_is_rolled_back_and_serves_again(real, tmp_path):
    """--context-length above the model's 4096 positions: the parser accepts it, the real
    server refuses it at start (sglang/srt/configs/model_config.py)."""
    good_unit = real.run("cat /etc/systemd/system/sglang.service").stdout
    before = unit_props(real, "sglang.service")
    (tmp_path / "sandbox_real.py").write_text(
        'extra_server_args = ["--device", "cpu", "--max-total-tokens", "8192", "--context-length", "100000"]\n')
    proc = real_pyinfra("deploy.py", "--group-data", str(tmp_path), limit=real.name, env=ENV)
    assert proc.returncode != 0, proc.out[-4000:]
    assert "restart sglang.service: unit file changed" in proc.out, proc.out[-4000:]
    assert "greater than the derived context_length (4096)" in proc.out, proc.out[-4000:]  # the real journal line
    assert "readiness: rolled back: sglang.service serves the last good configuration again" in proc.out
    assert real.run("cat /etc/systemd/system/sglang.service").stdout == good_unit
    after = unit_props(real, "sglang.service")
    assert after["MainPID"] != before["MainPID"] and after["ActiveState"] == "active"
    assert curl(real, "/v1/chat/completions", CHAT)[0] == 200
    again = real_pyinfra("deploy.py", limit=real.name, env=ENV)  # the good config: nothing to do
    assert again.returncode == 0 and grand_total(again.out)[:2] == (0, 0), again.out[-4000:]


DROP_IN = "/run/systemd/system/sglang.service.d/kill-mode.conf"
INFLIGHT = json.dumps({"text": "Hello", "sampling_params": {"max_new_tokens": 3500, "ignore_eos": True,
                                                             "temperature": 0}})


def _serves(host) -> bool:
    return curl(host, "/health", auth=False)[0] == 200


@pytest.mark.parametrize("kill_mode", ["control-group", "mixed"])
def test_sigterm_as_the_real_server_meets_it_under_each_kill_mode(real, kill_mode):
    """A generation is in flight when systemd stops the unit. Under KillMode=control-group every
    process gets SIGTERM: SGLang's schedulers have no handler and die, the main process's
    watchdog takes the tree down (SIGKILL, the unit "failed") and the request is lost. Under KillMode=mixed only the
    main process gets it: SGLang drains (tokenizer_manager.sigterm_watchdog: "Gracefully
    exiting...") and the request completes. The unit therefore uses KillMode=mixed."""
    assert "KillMode=mixed" in real.run("cat /etc/systemd/system/sglang.service").stdout
    real.run(f"mkdir -p {DROP_IN.rsplit('/', 1)[0]} && printf '[Service]\\nKillMode={kill_mode}\\n' > {DROP_IN}"
             " && systemctl daemon-reload")
    try:
        decoded = "journalctl -u sglang.service -o cat --no-pager | grep -c 'Decode batch' || true"
        before = int(real.run(decoded).stdout.strip() or 0)
        real.run(f"rm -f /tmp/inflight.*; (curl -s -o /tmp/inflight.json -w '%{{http_code}}' {AUTH} "
                 f"-H 'content-type: application/json' -d '{INFLIGHT}' http://127.0.0.1:30000/generate "
                 "> /tmp/inflight.code 2>&1 &)")
        wait_until(lambda: int(real.run(decoded).stdout.strip() or 0) > before, 60, "the generation to decode")
        real.run("systemctl stop sglang.service", timeout=200)
        wait_until(lambda: real.run("test -s /tmp/inflight.code", check=False).returncode == 0, 60,
                   "the client to finish")
        code = real.run("cat /tmp/inflight.code").stdout.strip()
        status = real.run("systemctl show sglang.service -p ExecMainStatus --value").stdout.strip()
        log = real.run("journalctl -u sglang.service -o cat --no-pager -n 60").stdout
        print(f"\nKillMode={kill_mode}: in-flight request HTTP {code}, main process exit status {status}")
        if kill_mode == "mixed":
            assert code == "200", (code, log[-3000:])
            body = json.loads(real.run("cat /tmp/inflight.json").stdout)
            assert body["meta_info"]["completion_tokens"] == 3500, body["meta_info"]
            assert "Gracefully exiting... Remaining number of requests 1" in log, log[-3000:]
            assert status == "0", status
        else:
            assert code != "200", (code, log[-3000:])  # the request was cut
            assert "Gracefully exiting" not in log
            # SGLang's kill_process_tree SIGKILLs its own tree, itself included: systemd records a
            # killed main process (status 9) and the unit as failed
            assert status in ("9", "137"), (status, log[-3000:])
            assert "sglang.service: Failed with result" in log, log[-3000:]
    finally:
        real.run(f"rm -f {DROP_IN} && systemctl daemon-reload && systemctl start sglang.service", timeout=120)
        wait_until(lambda: _serves(real), 240, "the real server to serve again")
