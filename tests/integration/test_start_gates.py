"""What "ready" checks beyond /health, on a converged sandbox host (the shared sgc280), each fault
failing readiness like a crash (rolled back; the last good configuration serves again; a re-run
changes nothing):

- start progress: the wait follows SGLang's start lines per rank and shows them; a rank that hangs
  in loading without a line (the stand-in's SANDBOX_HANG_RANK) fails once nothing moved for
  start_stall_s, naming the phase, the rank and its last line, not at readiness_timeout_s;
- the launch fingerprint: a KV pool a fraction of the memory fit's (SANDBOX_KV_FRACTION) fails with
  both numbers;
- OOM at CUDA graph capture (SANDBOX_GRAPH_OOM_RANK): the scheduler dies with SGLang's message;
- gibberish with /health 200 (SANDBOX_GIBBERISH): the profile's smoke checks fail, naming each prompt;
- the speed gate: decode at a fifth of the host's last good tok/s (SANDBOX_GEN_DELAY_S) fails;
the converge's own start is each gate's positive control.
"""

from __future__ import annotations

import json
import re
import runpy
import time

import pytest

from tests.integration.helpers import SHARED_CONVERGED_GROUP, ROOT, grand_total, pyinfra, shared_converged_host, unit_props, wait_until

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group(SHARED_CONVERGED_GROUP)]

TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def host(request):
    return shared_converged_host(request, TIMINGS)


def faulty(tmp_path, perf_tolerance: float | None = None, stall_s: int = 120, **env) -> str:
    """A group_data override of the sandbox's extra_env (a restart) with the stand-in's fault env vars.
    ``stall_s`` bounds a start without progress: short only where the stall is the fault (a loaded
    2-core CI machine can take 15 s to start the stand-in's 8 ranks at all)."""
    extra = {**runpy.run_path(str(ROOT / "group_data" / "sandbox.py"))["extra_env"], **env}
    perf = "" if perf_tolerance is None else f"perf_tolerance = {perf_tolerance}\n"
    (tmp_path / "sandbox.py").write_text(f"extra_env = {extra!r}\nstart_stall_s = {stall_s}\n{perf}")
    return str(tmp_path)


def rolled_back_and_serving(host, proc, before, *args: str) -> None:
    assert "readiness: rolled back: sglang.service serves the last good configuration again" in proc.out, \
        proc.out[-4000:]
    after = unit_props(host, "sglang.service")
    assert after["ActiveState"] == "active" and after["MainPID"] != before["MainPID"]
    assert host.run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health").stdout == "200"
    since = int(time.time()) + 1  # a whole second after the rollback's own start lines (its warmup /generate)
    time.sleep(since - time.time())
    again = pyinfra("deploy.py", *args, limit=host.name)
    assert again.returncode == 0 and grand_total(again.out)[:2] == (0, 0), again.out[-4000:]
    # a run that restarts nothing measures nothing (the converge's own start ran the gates: the control)
    assert "readiness: gates passed in " in host.converge_out
    assert "readiness: gates passed in " not in again.out, again.out[-3000:]
    assert "POST /generate" not in host.run(f"journalctl -u sglang.service -o cat --no-pager --since @{since}").stdout


def test_a_rank_hung_in_loading_fails_within_start_stall_s_names_it_and_is_rolled_back(host, tmp_path):
    before = unit_props(host, "sglang.service")
    proc = pyinfra("deploy.py", "--group-data", faulty(tmp_path, stall_s=15, SANDBOX_HANG_RANK="5"), limit=host.name)
    assert proc.returncode != 0, proc.out[-4000:]
    stall = re.search(r"FAILED: the start made no progress for (\d+) s \(start_stall_s 15\): "
                      r"stuck in 'loading weights': TP5; (.*)", proc.out)
    assert stall, proc.out[-5000:]
    assert 15 <= int(stall.group(1)) <= 20  # within the bound plus a journal poll, not readiness_timeout_s (120)
    assert "loading weights (TP5)" in stall.group(2) and "scheduler started (TP0-TP4, TP6, TP7)" in stall.group(2)
    last = re.search(r"TP5 last line: \d+ s ago: (.*)", proc.out)
    assert last and "TP5] Load weight begin." in last.group(1), proc.out[-4000:]
    # the run showed the phases as it went
    assert re.search(r"waiting: \d+ s, .*; start: .*loading weights \(TP5\)", proc.out), proc.out[-4000:]
    rolled_back_and_serving(host, proc, before)


def test_a_kv_pool_a_fraction_of_the_plan_fails_readiness_with_both_numbers(host, tmp_path):
    planned = re.search(r"readiness: launch fingerprint as planned: max_total_num_tokens=(\d+), .*attention_backend="
                        r"triton", host.converge_out)
    assert planned, host.converge_out[-4000:]  # the positive control: the converge's own start
    kept = host.run("cat /var/lib/sglang-converge/last-good/sglang/fingerprint.json").stdout
    assert json.loads(kept)["max_total_num_tokens"] > 0  # kept with the last good configuration
    before = unit_props(host, "sglang.service")
    proc = pyinfra("deploy.py", "--group-data", faulty(tmp_path, SANDBOX_KV_FRACTION="0.1"), limit=host.name)
    assert proc.returncode != 0, proc.out[-4000:]
    found = re.search(r"readiness: launch fingerprint: the KV pool holds (\d+) tokens \(max_total_num_tokens\), "
                      r"below 0.5 x the (\d+) tokens the memory fit planned \((\d+)%\)", proc.out)
    assert found, proc.out[-4000:]
    assert 8 <= int(found.group(3)) <= 11  # a tenth of what the memory leaves, and the plan near that
    rolled_back_and_serving(host, proc, before)
    assert host.run("cat /var/lib/sglang-converge/last-good/sglang/fingerprint.json").stdout == kept


def test_oom_at_cuda_graph_capture_fails_with_sglangs_message_and_is_rolled_back(host, tmp_path):
    """One rank out of GPU memory while capturing its CUDA graphs (memory sized too tight: Kimi's
    graphs take ~20 GB per rank, sglang#24453): the scheduler dies with SGLang's own message, the
    wait names it at once (not at start_stall_s or the timeout), and the last good configuration serves."""
    before = unit_props(host, "sglang.service")
    proc = pyinfra("deploy.py", "--group-data", faulty(tmp_path, SANDBOX_GRAPH_OOM_RANK="3"), limit=host.name)
    assert proc.returncode != 0, proc.out[-4000:]
    assert re.search(r"cause: .*Exception: Capture cuda graph failed: CUDA out of memory\. Tried to allocate "
                     r"[\d.]+ GiB\. GPU 3 has a total capacity of", proc.out), proc.out[-5000:]
    assert "1. set --mem-fraction-static to a smaller value" in proc.out  # SGLang's advice, from the journal
    failed = re.search(r"FAILED: sglang.service is .* after ([\d.]+) s", proc.out)
    assert failed and float(failed.group(1)) < 60, proc.out[-4000:]  # start_stall_s is 120: it ended on the failure
    assert "no progress for" not in proc.out  # (the stall's line, which test_a_rank_hung_... shows)
    rolled_back_and_serving(host, proc, before)


def test_gibberish_with_health_200_fails_the_smoke_checks_and_the_tool_call_and_is_rolled_back(host, tmp_path):
    """Up but broken (sglang#8120, #13011: a bad kernel or quantization): /health 200, the model listed, the
    KV pool and the speed as planned, every answer junk and no tool call. On the profile with a tool-call
    parser (models/sandbox-tiny-tools.yaml: the same model, no download), whose start is the positive
    control of the tool-call round trip; the host goes back to the default profile at the end."""
    assert "readiness: smoke checks passed: 2 of 2 (temperature 0)" in host.converge_out  # the default profile's
    tools = ("--data", "model=sandbox-tiny-tools")
    good = pyinfra("deploy.py", *tools, limit=host.name)
    assert good.returncode == 0, good.out[-4000:]
    assert "readiness: smoke checks passed: 3 of 3 (temperature 0; 1 tool call(s) parsed)" in good.out, good.out[-4000:]
    kept = json.loads(host.run("cat /var/lib/sglang-converge/launch/sglang.smoke.json").stdout)
    assert json.loads(kept["checks"][2]["got"]) == [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    try:
        before = unit_props(host, "sglang.service")
        proc = pyinfra("deploy.py", *tools, "--group-data", faulty(tmp_path, SANDBOX_GIBBERISH="1"), limit=host.name)
        assert proc.returncode != 0, proc.out[-4000:]
        assert "readiness: launch fingerprint as planned" in proc.out and "readiness: decode speed as expected" in proc.out
        wrong = re.findall(r"readiness: smoke: ('.*?') wanted (.*?), got '(.*)'", proc.out)
        assert [(prompt, wanted) for prompt, wanted, _ in wrong][:3] == [
            ("'What is 17 + 25? Answer with the number only.'", r"/\b42\b/"),
            ("'Reply with exactly the word OK.'", r"/^\s*OK\b/"),
            ("'What is the weather in Paris right now? Use the tool.'",
             "a call of get_weather with its required arguments matching /(?i)paris/"),
        ], proc.out[-4000:]
        assert "!!!!" in wrong[0][2] and wrong[2][2] == "[]"  # what came back: junk, and no call
        rolled_back_and_serving(host, proc, before, *tools)
    finally:
        back = pyinfra("deploy.py", limit=host.name)  # the shared host's later users expect the default profile
        assert back.returncode == 0 and "ready: sglang.service serves tiny at " in back.out, back.out[-4000:]


def test_decode_far_slower_than_the_hosts_last_good_fails_the_speed_gate(host, tmp_path):
    measured = re.search(r"readiness: decode speed as expected: concurrency 1 ([\d.]+) tok/s, concurrency 4 "
                         r"([\d.]+) tok/s \(no last good figure yet on this host\)", host.converge_out)
    assert measured, host.converge_out[-4000:]  # the positive control: the converge's own start, measured
    kept = json.loads(host.run("cat /var/lib/sglang-converge/last-good/sglang/speed.json").stdout)
    assert kept["tokens"] == 128 and kept["c1"]["tok_s"] > 0  # kept with the last good configuration
    before = unit_props(host, "sglang.service")
    # each generation 5x longer than the stand-in's default 0.05 s: decode at a fifth of the speed
    # the default perf_tolerance (the sandbox's group data lowers it for its noisy stand-in: see there)
    proc = pyinfra("deploy.py", "--group-data", faulty(tmp_path, 0.8, SANDBOX_GEN_DELAY_S="0.25"), limit=host.name)
    assert proc.returncode != 0, proc.out[-4000:]
    slow = re.search(r"readiness: speed gate: decode at concurrency 1 is ([\d.]+) tok/s, (\d+)% of this host's last "
                     r"good ([\d.]+) tok/s \(perf_tolerance 0.8\)", proc.out)
    assert slow and int(slow.group(2)) < 40 and float(slow.group(3)) == kept["c1"]["tok_s"], proc.out[-4000:]
    rolled_back_and_serving(host, proc, before)
    assert json.loads(host.run("cat /var/lib/sglang-converge/last-good/sglang/speed.json").stdout) == kept


def test_verify_runs_every_gate_on_the_server_as_it_serves_and_a_stopped_one_fails_untouched(host):
    """`pyinfra ... verify.py` (what `rollout --verify` runs): every gate on the serving server, nothing
    restarted; a server that does not serve fails at once and verify starts nothing."""
    before = unit_props(host, "sglang.service")
    ok = pyinfra("verify.py", limit=host.name)
    assert ok.returncode == 0, ok.out[-4000:]
    assert re.search(r"verify: every gate passed in [\d.]+ s \(fingerprint [\d.]+ s, speed [\d.]+ s, smoke [\d.]+ s\)",
                     ok.out), ok.out[-4000:]
    assert unit_props(host, "sglang.service")["MainPID"] == before["MainPID"]
    host.run("systemctl stop sglang.service")
    try:
        bad = pyinfra("verify.py", limit=host.name)
        assert bad.returncode != 0, bad.out[-4000:]
        assert "FAILED: " in bad.out and "verify: every gate passed" not in bad.out, bad.out[-4000:]
        # the wait ends on the inactive unit at once, not at its 60 s bound
        assert "FAILED: sglang.service is inactive/dead" in bad.out, bad.out[-4000:]
        assert "not ready after" not in bad.out, bad.out[-4000:]
        assert unit_props(host, "sglang.service")["ActiveState"] == "inactive"  # verify started nothing
    finally:
        host.run("systemctl start sglang.service")
        wait_until(lambda: host.run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health",
                                    check=False).stdout == "200", 120, "sglang.service to serve again")
