"""rollout/: batches, host selection, the summary, the fleet inventory, the
router client script (against a fake router), and the recorded time to ready."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from types import SimpleNamespace

import pytest
from pyinfra.api import State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory_from_files
from rich.console import Console

from core.checks import driver_problems
from core.ops import explaining_line
from core.runstate import run_state
from rollout import driver
from rollout.__main__ import parse_args
from rollout.driver import HostResult, RolloutReport, plan_batches, select_hosts
from rollout.summary import summary_table

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "routers, servers, size, canary, expected",
    [
        ([], ["a", "b", "c", "d"], 2, 1, [("canary", ["a"]), ("1", ["b", "c"]), ("2", ["d"])]),
        (["r"], ["a", "b", "c", "d"], 2, 0, [("router", ["r"]), ("1", ["a", "b"]), ("2", ["c", "d"])]),
        (["r1", "r2"], ["a"], 3, 1, [("router 1", ["r1"]), ("router 2", ["r2"]), ("canary", ["a"])]),
        ([], ["a", "b", "c"], 1, 2, [("canary", ["a", "b"]), ("1", ["c"])]),
        ([], ["a", "b"], 5, 5, [("canary", ["a", "b"])]),
        ([], ["d", "a", "c"], 10, 0, [("1", ["d", "a", "c"])]),  # the given order, never sorted
    ],
)
def test_plan_batches(routers, servers, size, canary, expected):
    assert [(b.label, b.hosts) for b in plan_batches(routers, servers, size, canary)] == expected


def test_plan_batches_keeps_a_tp_group_together():
    groups = {"g0": "tp16", "g1": "tp16"}
    batches = plan_batches([], ["a", "g0", "b", "g1", "c"], 2, 1, groups)
    assert [(b.label, b.hosts) for b in batches] == [("canary", ["a"]), ("1", ["g0", "g1", "b"]), ("2", ["c"])]


@pytest.mark.parametrize("size, canary, message", [(0, 0, "batch size must be >= 1, got 0"),
                                                    (-1, 1, "batch size must be >= 1, got -1"),
                                                    (2, -1, "canary must be >= 0, got -1")])
def test_plan_batches_refuses_bad_sizes(size, canary, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        plan_batches([], ["a"], size, canary)


def load_inventory(tmp_path: Path, text: str):
    path = tmp_path / "fleet.py"
    path.write_text(textwrap.dedent(text))
    with ctx_state.use(State()):
        return make_inventory_from_files(str(path), cwd=str(REPO))


def test_select_hosts_keeps_inventory_order_and_limits(tmp_path):
    inventory = load_inventory(tmp_path, """
        routers = [("r1", {"ssh_hostname": "10.0.0.1"})]
        sandbox = [("s3", {"ssh_hostname": "10.0.0.3"}), ("s1", {"ssh_hostname": "10.0.0.4"}),
                   ("s2", {"ssh_hostname": "10.0.0.5"})]
    """)
    assert [h.name for h in select_hosts(inventory, [])] == ["r1", "s3", "s1", "s2"]
    assert [h.name for h in select_hosts(inventory, ["s*"])] == ["s3", "s1", "s2"]
    assert [h.name for h in select_hosts(inventory, ["routers", "s2"])] == ["r1", "s2"]
    assert select_hosts(inventory, ["nope"]) == []


def render(report: RolloutReport) -> str:
    console = Console(width=160, record=True, file=open(os.devnull, "w"))
    console.print(summary_table(report))
    return console.export_text()


def test_summary_table():
    results = {
        "r": HostResult("r", "router", "ok", False, False),
        "a": HostResult("a", "canary", "ok", True, True, 4.25, out_of_router_s=12.5),
        "b": HostResult("b", "1", "failed", True, False, None, "sglang.service ready: cause: RuntimeError: boom",
                        staged_s=31.0),
        "c": HostResult("c", "2"),
    }
    text = render(RolloutReport(results=results, batches=[], exit_code=1))
    header = next(line for line in text.splitlines() if "host" in line)
    assert [c.strip() for c in header.split("┃")[1:-1]] == [
        "host", "batch", "result", "changed", "restarted", "staged", "time to ready", "out of router", "error"]
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[1:-1]]
            for line in text.splitlines() if line.startswith("│")}
    assert rows["r"] == ["r", "router", "ok", "no", "no", "-", "-", "-", ""]
    assert rows["a"] == ["a", "canary", "ok", "yes", "yes", "-", "4.2 s", "12.5 s", ""]
    assert rows["b"][2] == "failed" and rows["b"][8] == "sglang.service ready: cause: RuntimeError: boom"
    assert rows["b"][5] == "31.0 s"
    assert rows["c"] == ["c", "2", "not run", "-", "-", "-", "-", "-", ""]


def test_the_explaining_line_is_the_cause():
    lines = ["Error: executed 0/1 commands", "waiting: 5 s", "FAILED: sglang.service is failed/failed",
             "cause: RuntimeError: CUDA error: invalid device ordinal", "journal:"]
    assert explaining_line(lines) == "cause: RuntimeError: CUDA error: invalid device ordinal"
    assert explaining_line(["Error", "something broke"]) == "something broke"
    assert explaining_line([]) == ""


def test_the_rollout_reads_the_reason_the_step_recorded_not_log_text():
    state, host = SimpleNamespace(get_op_order=lambda: []), SimpleNamespace(name="sgc11")
    assert driver.failure_reason(state, host, None) == "failed"  # positive control: nothing recorded
    run_state(state).fail("sgc11", "readiness", "cause: RuntimeError: boom", ["journal line"])
    run_state(state).fail("sgc11", "router", "a later, consequential failure")
    assert driver.failure_reason(state, host, "sglang.service ready") == "cause: RuntimeError: boom"
    assert run_state(state).first_failure("sgc11").detail == ("journal line",)


class _Gpu:
    driver_version = "580.95.05"


@pytest.mark.parametrize("wanted, problems", [(None, 0), ("570.86", 0), ("580.95.05", 0), ("580.95.6", 1), ("999.1", 1)])
def test_driver_problems(wanted, problems):
    class Spec:
        min_driver_version = wanted

    assert len(driver_problems(Spec(), [_Gpu()])) == problems


def test_cli_arguments():
    args = parse_args(["inventory/x.py", "--batch-size", "2", "--canary", "1", "--limit", "sgc1*", "--dry",
                       "--data", "a=1", "--group-data", "/tmp/g"])
    assert (args.batch_size, args.canary, args.max_failed, args.dry) == (2, 1, 0, True)
    assert args.limit == ["sgc1*"] and args.data == ["a=1"] and args.group_data == ["/tmp/g"]


def test_cli_refuses_bad_batch_size():
    proc = subprocess.run([sys.executable, "-m", "rollout", "inventory/sandbox_fleet.py", "--batch-size", "0"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and "--batch-size must be >= 1" in proc.stderr


@pytest.mark.parametrize("other", [["--dry"], ["--status"], ["--rollback"], ["--deploy", "other.py"]])
def test_verify_changes_nothing_so_it_refuses_what_would(other):
    assert parse_args(["inventory/x.py", "--verify"]).verify
    proc = subprocess.run([sys.executable, "-m", "rollout", "inventory/sandbox_fleet.py", "--verify", *other],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "--verify runs verify.py: not with --deploy, --status, --rollback or --dry" in proc.stderr


# ------------------------------------------------------------------ the fleet inventory


def fleet_inventory(tmp_path: Path, indexes: list[int], **env) -> dict:
    state = {"hosts": {f"sgc{i}": {"name": f"sgc{i}", "index": i, "address": f"10.77.{i}.2", "ssh_key": "/k"}
                       for i in indexes}}
    (tmp_path / "hosts.json").write_text(json.dumps(state))
    code = ("import json, runpy; ns = runpy.run_path('inventory/sandbox_fleet.py');"
            "print(json.dumps({'routers': ns['routers'], 'sandbox': ns['sandbox']}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "SGC_STATE_DIR": str(tmp_path), **env})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_fleet_inventory_router_first_servers_registered(tmp_path):
    out = fleet_inventory(tmp_path, [3, 12, 10, 11, 25], SGC_FLEET_INDEXES="10-19")
    assert [name for name, _ in out["routers"]] == ["sgc10"]
    assert out["routers"][0][1]["router_url"] == "http://10.77.10.2:30000"
    assert [name for name, _ in out["sandbox"]] == ["sgc11", "sgc12"]
    data = dict(out["sandbox"])["sgc12"]
    assert (data["router_url"], data["worker_url"]) == ("http://10.77.10.2:30000", "http://10.77.12.2:30000")


def test_fleet_inventory_without_router(tmp_path):
    out = fleet_inventory(tmp_path, [10, 11], SGC_FLEET_ROUTER="")
    assert out["routers"] == []
    assert [name for name, _ in out["sandbox"]] == ["sgc10", "sgc11"]
    data = dict(out["sandbox"])["sgc10"]
    assert data["ssh_hostname"] == "10.77.10.2"  # positive control: the host's data is there...
    assert "router_url" not in data and "worker_url" not in data  # ...without a router


# ------------------------------------------------------------------ remote/router_client.py


class FakeRouter:
    """The router's runtime API (POST/GET/DELETE /workers) and a worker's /v1/loads."""

    def __init__(self):
        self.workers: dict[str, dict] = {}
        self.in_flight = [2, 1, 0]  # what /v1/loads answers, one value per call (the last repeats)
        self.log: list[str] = []
        self.key: str | None = None  # the key the fake router (and worker) demand, like sglang-router --api-key
        self.registered_keys: list[str | None] = []  # api_key of each POST /workers body
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def refuse(self) -> bool:
                if fake.key and self.path != "/health" and self.headers.get("Authorization") != f"Bearer {fake.key}":
                    self.reply(401, {"error": "Unauthorized"})
                    return True
                return False

            def do_GET(self):  # noqa: N802
                fake.log.append(f"GET {self.path}")
                if self.refuse():
                    return None
                if self.path == "/workers":
                    return self.reply(200, {"workers": list(fake.workers.values()), "total": len(fake.workers)})
                if self.path == "/v1/loads":
                    n = fake.in_flight.pop(0) if len(fake.in_flight) > 1 else fake.in_flight[0]
                    # sglang 0.5.23's shape (LoadSnapshot): num_running_reqs, no num_reqs
                    return self.reply(200, {"loads": [{"num_running_reqs": n, "num_waiting_reqs": 0}]})
                if self.path == "/health":
                    return self.reply(200, {})
                return self.reply(404, {})

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.log.append(f"POST {self.path} {body['url']}")
                if self.refuse():
                    return None
                fake.registered_keys.append(body.get("api_key"))
                wid = f"id{len(fake.log)}"
                fake.workers[wid] = {"id": wid, "url": body["url"], "is_healthy": True}
                return self.reply(202, {"status": "accepted", "worker_id": wid})

            def do_DELETE(self):  # noqa: N802
                fake.log.append(f"DELETE {self.path}")
                if self.refuse():
                    return None
                fake.workers.pop(self.path.rsplit("/", 1)[1], None)
                return self.reply(202, {"status": "accepted"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.fixture
def fake_router():
    fake = FakeRouter()
    yield fake
    fake.close()


def client(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "remote" / "router_client.py"), *args],
                          capture_output=True, text=True, timeout=30)


def test_router_client_register_then_drain(fake_router):
    url = fake_router.url
    proc = client("register", "--router", url, "--worker", url + "/")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "registered: " in proc.stdout and list(fake_router.workers.values())[0]["url"] == url
    again = client("register", "--router", url, "--worker", url)
    assert again.returncode == 0 and "already in the router" in again.stdout
    assert sum(line.startswith("POST") for line in fake_router.log) == 1
    proc = client("drain", "--router", url, "--worker", url, "--local", url, "--timeout", "10")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert fake_router.workers == {}
    assert "idle after" in proc.stdout and "(2 request(s) were still running)" in proc.stdout
    # removed from the router before waiting for the server to become idle
    delete = next(i for i, line in enumerate(fake_router.log) if line.startswith("DELETE"))
    assert any(line.startswith("GET /v1/loads") for line in fake_router.log[delete:]), fake_router.log
    assert all(not line.startswith("GET /v1/loads") for line in fake_router.log[:delete]), fake_router.log


def test_router_client_drain_times_out_on_a_busy_server(fake_router):
    fake_router.in_flight = [3]
    fake_router.workers["w"] = {"id": "w", "url": fake_router.url, "is_healthy": True}
    proc = client("drain", "--router", fake_router.url, "--worker", fake_router.url, "--local", fake_router.url,
                  "--timeout", "0.5")
    assert proc.returncode == 1
    assert "still has 3 request(s) after 0 s" in proc.stdout


def auth_file(tmp_path, key: str) -> str:
    path = tmp_path / "sglang.auth"
    path.write_text(f"Authorization: Bearer {key}\n")
    return str(path)


def test_router_client_keyed_register_and_drain(fake_router, tmp_path):
    fake_router.key = "sk-fleet"
    url, auth = fake_router.url, auth_file(tmp_path, "sk-fleet")
    proc = client("register", "--router", url, "--worker", url, "--auth-file", auth)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert fake_router.registered_keys == ["sk-fleet"]  # the router gives it to the server with each request
    proc = client("drain", "--router", url, "--worker", url, "--local", url, "--auth-file", auth, "--timeout", "10")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert fake_router.workers == {}
    assert "drained: " in proc.stdout, proc.stdout  # positive control: what the client prints...
    assert "sk-fleet" not in proc.stdout + proc.stderr  # ...holds no key


def test_router_client_wrong_key_is_refused_by_name(fake_router, tmp_path):
    fake_router.key = "sk-router"
    proc = client("register", "--router", fake_router.url, "--worker", fake_router.url,
                  "--auth-file", auth_file(tmp_path, "sk-server"))
    assert proc.returncode == 1
    assert f"the router at {fake_router.url} refused the API key (401)" in proc.stdout
    assert "sk-server" not in proc.stdout and "sk-router" not in proc.stdout
    proc = client("register", "--router", fake_router.url, "--worker", fake_router.url)
    assert proc.returncode == 1 and "it demands a key and this host has none" in proc.stdout


def test_router_client_never_puts_a_keyed_server_behind_an_open_router(fake_router, tmp_path):
    proc = client("register", "--router", fake_router.url, "--worker", fake_router.url,
                  "--auth-file", auth_file(tmp_path, "sk-fleet"))
    assert proc.returncode == 1
    assert "answers without an API key, and this server demands one" in proc.stdout
    assert "GET /workers" in fake_router.log, fake_router.log  # it asked the router (positive control)...
    assert fake_router.workers == {} and not any(line.startswith("POST") for line in fake_router.log)  # ...only


def test_router_client_router_down():
    proc = client("register", "--router", "http://127.0.0.1:9", "--worker", "http://127.0.0.1:10")
    assert proc.returncode == 1 and "does not answer GET /workers" in proc.stdout


def test_router_client_skips_unready_workers(fake_router):
    proc = client("register", "--router", fake_router.url, "--worker", "http://127.0.0.1:9", "--skip-unready")
    assert proc.returncode == 0 and "skipped: http://127.0.0.1:9 is not ready" in proc.stdout
    assert fake_router.workers == {}


# ------------------------------------------------------------------ the router spec and unit


def test_router_unit_and_argv():
    from core.render import render_router_unit
    from tasks.spec import build_spec

    spec = build_spec("r1", {"role": "router", "router_url": "http://10.0.0.9:30000", "model": "ignored",
                             "router_extra_args": ["--log-level", "warn"], "api_key_env": None})
    assert spec.router_argv[:3] == ["/opt/sglang-router/venv/bin/python", "-m", "sglang_router.launch_router"]
    assert spec.router_argv[3:] == ["--host", "0.0.0.0", "--port", "30000", "--policy", "round_robin",
                                    "--prometheus-host", "127.0.0.1", "--prometheus-port", "29000",
                                    "--log-level", "warn"]
    unit = render_router_unit(spec)
    assert "ExecStart=/opt/sglang-router/venv/bin/python -m sglang_router.launch_router --host 0.0.0.0" in unit
    assert "KillMode=control-group" in unit and "WantedBy=multi-user.target" in unit
    assert spec.local_url == "http://127.0.0.1:30000" and spec.unit_path.endswith("/sglang-router.service")


def test_keyed_router_unit_runs_the_launcher_and_holds_no_key():
    from core.render import render_router_unit
    from tasks.spec import ROUTER_LAUNCHER, build_spec

    spec = build_spec("r1", {"role": "router", "router_url": "http://10.0.0.9:30000"},
                      environ={"SGLANG_API_KEY": "sk-unit-file-test"})
    unit = render_router_unit(spec)
    assert (f"ExecStart=/opt/sglang-router/venv/bin/python {ROUTER_LAUNCHER} "
            "--auth-file /etc/sglang/sglang-router.auth -- --host 0.0.0.0") in unit
    assert f"# The API key is read by {ROUTER_LAUNCHER} (sha256 " in unit
    assert "sk-unit-file-test" not in unit


def test_router_launcher_reads_the_key_line(tmp_path):
    import importlib.util

    loader = importlib.util.spec_from_file_location("router_launch", REPO / "remote" / "router_launch.py")
    launch = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(launch)
    path = tmp_path / "r.auth"
    path.write_text("Authorization: Bearer sk-a:b/c=\n")
    assert launch.read_key(str(path)) == "sk-a:b/c="
    path.write_text("X-Other: 1\n")
    with pytest.raises(SystemExit, match="no 'Authorization: Bearer KEY' line"):
        launch.read_key(str(path))
