"""What the real-server modules share (test_real_server.py, test_real_model.py): the API key the shared
real host (sgc290, tests/integration/helpers.shared_real_host) is converged with, the model it serves,
and small probes run on the host."""

from __future__ import annotations

import json

API_KEY = "sk-real-server-7f3a9c2e41"
ENV = {"SGLANG_API_KEY": API_KEY}
AUTH = f"-H 'Authorization: Bearer {API_KEY}'"
MODEL = "smollm2"  # models/sandbox-real-smollm2.yaml's served_model_name
CHAT = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}],
                   "max_tokens": 16, "temperature": 0})
PROBE_UNIT, PROBE_PORT = "sglang-standin-probe.service", 30100


def curl(host, path: str, data: str | None = None, auth: bool = True, port: int = 30000) -> tuple[int, str]:
    body = f"-H 'content-type: application/json' -d '{data}'" if data else ""
    out = host.run(f"curl -s -w '\\n%{{http_code}}' {AUTH if auth else ''} {body} http://127.0.0.1:{port}{path}",
                   timeout=60, check=False).stdout
    text, _, code = out.rpartition("\n")
    return int(code or 0), text


def journal(host) -> str:
    return host.run("journalctl -u sglang.service --no-pager -o cat", timeout=60).stdout


def unit_argv(host, module: str | None = None, port: int = PROBE_PORT) -> list[str]:
    """The production unit's command line, the server module (sglang.launch_server) and port swapped."""
    exec_start = host.run("systemctl show sglang.service -p ExecStart --value").stdout
    argv = exec_start.split("argv[]=", 1)[1].split(" ;", 1)[0].split()
    if module:
        argv[argv.index("sglang.launch_server")] = module
    argv[argv.index("--port") + 1] = str(port)
    return argv
