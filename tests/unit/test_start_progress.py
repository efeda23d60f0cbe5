"""remote/wait_ready.py's start progress: SGLang 0.5.23's own start lines, per rank, and the stall verdict."""

from __future__ import annotations

import json

import pytest

from tests.unit.test_multinode import load_wait_ready


# sglang 0.5.23 at TP 1 on the real-server sandbox host (journalctl -u sglang.service -o cat), main pid 351
REAL_TP1 = [
    ("351", "[2026-12-03 07:18:22] server_args={'model_path': '/srv/models/tiny-llama', 'api_key': '<redacted>'}"),
    ("431", "[2026-12-03 07:18:34] Init parallel begin."),
    ("431", "[2026-12-03 07:18:34] Init parallel ends. elapsed=0.04 s"),
    ("431", "[2026-12-03 07:18:38] Load weight begin. avail mem=21.00 GB"),
    ("431", list(b"\rLoading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]\r"
                 b"Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 96.1it/s]\n")),
    ("431", "[2026-12-03 07:18:38] Load weight end. elapsed=0.02 s, type=LlamaForCausalLM, avail mem=21.00 GB, "
            "mem usage=-0.00 GB."),
    ("431", "[2026-12-03 07:18:39] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 8192, K size: 0.00 GB, "
            "V size: 0.00 GB"),
    ("431", "[2026-12-03 07:18:39] Memory pool end. avail mem=20.98 GB"),
    ("431", "[2026-12-03 07:18:39] Disable prefill CUDA graph because cuda_graph_config resolved prefill.backend="
            "'disabled'"),
    ("431", "[2026-12-03 07:18:39] max_total_num_tokens=8192, chunked_prefill_size=4096, max_prefill_tokens=16384"),
    ("351", "[2026-12-03 07:18:39] Engine startup timings (s): load_weight=0.02, kv_cache_allocation=0.58"),
    ("351", "[2026-12-03 07:18:40] The server is fired up and ready to roll!"),
]


@pytest.fixture
def wr():
    return load_wait_ready()


def feed(progress, lines, at=100.0, wr=None):
    for pid, message in lines:
        progress.line(wr.message_text(message), pid, at)


def test_the_real_servers_start_lines_walk_its_rank_through_every_phase(wr):
    progress = wr.StartProgress(1, "351", 0.0)
    seen = []
    for pid, message in REAL_TP1:
        progress.line(wr.message_text(message), pid, 1.0)
        seen.append(progress.summary())
    assert seen[3] == "loading weights (TP0)"
    assert seen[4] == "loading weights 100% (TP0)"  # tqdm's bar, a journal blob of "\r"-separated updates
    assert seen[6] == "KV cache allocated (TP0)" and seen[7] == "memory pool ready (TP0)"
    assert seen[8] == "memory pool ready (TP0)"  # "Disable prefill CUDA graph" is no capture
    assert seen[9] == "scheduler started (TP0)"
    assert seen[-1] == "fired up (TP0)"  # the main process's line moves every rank


def tp8_lines(stuck: int | None):
    lines = []
    for rank in range(8):
        lines.append((str(500 + rank), f"[2026-12-03 08:00:00 TP{rank}] Load weight begin. avail mem=94.00 GB"))
    for rank in range(8):
        if rank != stuck:
            lines.append((str(500 + rank), f"[2026-12-03 08:04:10 TP{rank}] Load weight end. elapsed=250.1 s, "
                                            "type=DeepseekV3ForCausalLM, quant=compressed-tensors"))
    return lines


def test_a_rank_stuck_in_loading_is_named_with_its_last_line_once_nothing_moves(wr):
    progress = wr.StartProgress(8, "400", 0.0)
    feed(progress, tp8_lines(stuck=3), at=250.0, wr=wr)
    assert progress.summary() == "weights loaded (TP0-TP2, TP4-TP7); loading weights (TP3)"
    assert progress.stalled(250.0 + 899, 900) is None  # within start_stall_s: a slow load, not a stall
    lines = progress.stalled(250.0 + 901, 900)
    assert lines[0].startswith("FAILED: the start made no progress for 901 s (start_stall_s 900): "
                               "stuck in 'loading weights': TP3; "), lines
    assert lines[1] == "  TP3 last line: 901 s ago: [2026-12-03 08:00:00 TP3] Load weight begin. avail mem=94.00 GB"
    assert len(lines) == 2


def test_a_rank_that_never_logged_is_stuck_in_starting(wr):
    progress = wr.StartProgress(2, "400", 0.0)
    progress.line("[2026-12-03 08:00:00 TP0] Init parallel begin.", "500", 5.0)
    lines = progress.stalled(20.0, 10)
    assert "stuck in 'starting': TP1" in lines[0] and lines[1] == "  TP1 last line: no line yet"


def test_gpu_memory_that_moves_is_progress_and_health_polls_are_not(wr):
    progress = wr.StartProgress(8, "400", 0.0)
    progress.memory_seen("GPU MiB used: 100 100", 1.0)  # the first reading is the baseline
    assert progress.moved_at == 0.0
    progress.memory_seen("GPU MiB used: 900 870", 50.0)  # weights streaming in
    progress.line('[2026-12-03 08:00:00] INFO:     127.0.0.1:5 - "GET /health HTTP/1.1" 503', "400", 80.0)
    assert progress.moved_at == 50.0
    assert progress.stalled(50.0 + 899, 900) is None and progress.stalled(50.0 + 900, 900)


def test_all_ranks_in_one_phase_read_as_a_range_and_no_stall_setting_never_stalls(wr):
    progress = wr.StartProgress(8, "400", 0.0, first_rank=8)  # node 1 of a TP 16 group
    for rank in range(8, 16):
        progress.line(f"[2026-12-03 08:00:00 DP0 TP{rank} EP{rank}] Memory pool end. avail mem=9.1 GB", "9", 1.0)
    assert progress.summary() == "memory pool ready (TP8-TP15)"
    assert progress.stalled(10_000.0, None) is None


def test_the_wait_fails_on_a_stall_naming_the_phase_instead_of_waiting_for_the_timeout(wr, monkeypatch, capsys):
    monkeypatch.setattr(wr, "POLL_S", 0.01)
    monkeypatch.setattr(wr, "JOURNAL_POLL_S", 0.01)
    monkeypatch.setattr(wr, "gpu_memory", lambda: "GPU MiB used: 4000 4000")
    monkeypatch.setattr(wr, "unit_state", lambda unit: {"ActiveState": "active", "SubState": "running",
                                                        "NRestarts": "0", "InvocationID": "inv", "MainPID": "400"})
    monkeypatch.setattr(wr, "get", lambda url, key: (0, b""))
    monkeypatch.setattr(wr, "journal_lines", lambda unit, invocation, count=25: ["Load weight begin."])
    lines = iter([[("500", "[2026-12-03 08:00:00 TP0] Load weight begin. avail mem=94.00 GB")]])

    def journal(progress, unit, invocation):
        for pid, text in next(lines, []):
            progress.line(text, pid, wr.time.time())

    monkeypatch.setattr(wr, "read_journal", journal)
    rc = wr.main(["--unit", "sglang.service", "--url", "http://x", "--served-name", "tiny", "--timeout", "60",
                  "--stall", "0.3", "--ranks", "2"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 1  # on the stall (the first line below), not "not ready after 60 s"
    assert out[0].startswith("FAILED: the start made no progress for 0 s (start_stall_s 0): stuck in 'starting': TP1")
    assert not any(line.startswith("cause:") for line in out)  # the stall line is the cause


def test_slices_keep_the_progress_between_them(wr, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(wr, "STATE_DIR", str(tmp_path))
    monkeypatch.setattr(wr, "POLL_S", 0.01)
    monkeypatch.setattr(wr, "gpu_memory", lambda: "")
    monkeypatch.setattr(wr, "unit_state", lambda unit: {"ActiveState": "active", "SubState": "running",
                                                        "NRestarts": "0", "InvocationID": "inv", "MainPID": "400"})
    monkeypatch.setattr(wr, "read_journal", lambda progress, unit, invocation: progress.line(
        "[2026-12-03 08:00:00 TP1] Load weight end. elapsed=1 s", "501", 7.0) if not progress.cursor else None)
    argv = ["--unit", "sglang.service", "--watch", "--slice", "0.05", "--baseline", "inv:0", "--ranks", "2",
            "--progress"]
    assert wr.main(argv) == wr.PENDING
    kept = json.loads((tmp_path / "start-sglang.service-inv.json").read_text())
    assert kept["ranks"]["TP1"]["phase"] == 3 and kept["ranks"]["TP0"]["phase"] == 0
    assert "start: starting (TP0); weights loaded (TP1)" in capsys.readouterr().out


def test_the_cause_of_a_failed_start_is_the_tracebacks_last_line_even_a_bare_exception(wr):
    # one rank died capturing its CUDA graphs; the other ranks logged on after it (the journal's order)
    lines = ["[2026-12-03 12:56:55 TP3] Scheduler hit an exception: Traceback (most recent call last):",
             '  File "scheduler.py", line 1, in run_scheduler_process',
             "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB.",
             "Possible solutions:",
             "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
             "[2026-12-03 12:56:55] Received sigquit from a child process. It usually means the child failed.",
             "[2026-12-03 12:56:55 TP4] max_total_num_tokens=32073800, chunked_prefill_size=8192"]
    assert wr.explain(lines)[0] == "cause: Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB."
    assert wr.explain(["[x TP0] ValueError: bad", "later line"])[0] == "cause: [x TP0] ValueError: bad"
    assert wr.explain(["torch.OutOfMemoryError: CUDA out of memory."])[0] == "cause: torch.OutOfMemoryError: CUDA out of memory."
    assert wr.explain(["ExceptionalLine without colon", "plain last"])[0] == "cause: plain last"
