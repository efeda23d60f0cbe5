"""The SGLang stand-in's multi-node ranks (rendezvous, rank loss) and SGLang's real parser."""

from __future__ import annotations

import re
import signal
import time

import pytest

from tests.unit.test_sglang_standin_checks import torch_mapped
from tests.unit.test_sglang_standin import (
    READY,
    SGLANG_VENV_PY,
    Bed,
    free_port,
    gpusim,
    http,
    last_line,
    venv_python,
    wait_http,
)


@pytest.fixture
def bed(tmp_path):
    b = Bed(tmp_path)
    yield b
    b.cleanup()


def _two_ranks(bed, dist_port: int):
    http0, http1 = free_port(), free_port()
    common = ["--model-path", str(bed.model), "--tp-size", "2", "--nnodes", "2",
              "--dist-init-addr", f"127.0.0.1:{dist_port}", "--host", "127.0.0.1"]
    # rank 1 first: it retries until rank 0 listens
    r1 = bed.start([*common, "--node-rank", "1", "--port", str(http1)], CUDA_VISIBLE_DEVICES="1")
    time.sleep(0.3)
    r0 = bed.start([*common, "--node-rank", "0", "--port", str(http0)], CUDA_VISIBLE_DEVICES="0")
    return r0, r1, http0, http1


def test_multinode_rendezvous_and_rank_loss(bed):
    r0, r1, http0, http1 = _two_ranks(bed, free_port())
    r0.wait_for(READY)
    assert "Node rank 1 joined" in r0.out()
    assert "All 2 nodes joined." in r1.out()
    assert READY not in r1.out()
    # each rank holds memory on its own GPU
    assert bed.used() == {0: int(0.85 * gpusim.CT200_GPU_MIB), 1: int(0.85 * gpusim.CT200_GPU_MIB)}
    assert http("GET", f"http://127.0.0.1:{http0}/health")[0] == 200
    # rank 1 runs only SGLang's dummy health server
    wait_http(f"http://127.0.0.1:{http1}/health", 200, timeout=60)
    assert http("GET", f"http://127.0.0.1:{http1}/v1/models")[0] == 404

    r1.p.kill()  # a rank drops: rank 0 fails
    assert r0.wait(60) == 1
    assert "rank 1 disconnected" in r0.err()


def test_multinode_rank0_waits_for_all_and_others_follow_it(bed):
    dist = free_port()
    http0 = free_port()
    r0 = bed.start(["--model-path", str(bed.model), "--tp-size", "2", "--nnodes", "2",
                    "--node-rank", "0", "--dist-init-addr", f"127.0.0.1:{dist}",
                    "--port", str(http0)], CUDA_VISIBLE_DEVICES="0")
    r0.wait_for("Waiting for 1 other node(s)")
    time.sleep(1.5)  # longer than the load time: still not ready without rank 1
    with pytest.raises(OSError):  # no HTTP before the engine is up (sglang 0.5.23 starts uvicorn after it)
        http("GET", f"http://127.0.0.1:{http0}/health")
    assert READY not in r0.out()
    r1 = bed.start(["--model-path", str(bed.model), "--tp-size", "2", "--nnodes", "2",
                    "--node-rank", "1", "--dist-init-addr", f"127.0.0.1:{dist}",
                    "--port", str(free_port())], CUDA_VISIBLE_DEVICES="1")
    r0.wait_for(READY)
    r1.wait_for("is up")

    # SIGTERM on rank 1 is ignored (it waits for rank 0), like SGLang
    r1.p.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert r1.p.poll() is None
    # a graceful stop of rank 0 stops the group
    r0.p.send_signal(signal.SIGTERM)
    assert r0.wait(60) == 0
    assert r1.wait(60) == 0


def test_multinode_rank0_serves_only_once_every_nodes_ranks_loaded_with_the_smallest_pool(bed):
    """sglang 0.5.23's ranks meet after the load (the TP barrier, then the KV pool sized on the minimum free
    memory over the world): rank 0 is not ready while node 1's ranks still load, and its pool is node 1's
    smaller one. (test_multinode's group restart once met rank 0 ready and node 1's GPU 0 empty.)"""
    dist, http0 = free_port(), free_port()
    common = ["--model-path", str(bed.model), "--tp-size", "2", "--nnodes", "2",
              "--dist-init-addr", f"127.0.0.1:{dist}", "--host", "127.0.0.1"]
    r0 = bed.start([*common, "--node-rank", "0", "--port", str(http0)], CUDA_VISIBLE_DEVICES="0")
    started = time.monotonic()
    r1 = bed.start([*common, "--node-rank", "1", "--port", str(free_port()), "--mem-fraction-static", "0.5"],
                   CUDA_VISIBLE_DEVICES="1", SANDBOX_LOAD_SECONDS="4")
    r0.wait_for(READY)
    assert time.monotonic() - started >= 0.9 * 4  # node 1's rank sleeps 0.9 of its load time before it is up
    node1_tokens = int(re.search(r"max_total_num_tokens=(\d+)", r1.out()).group(1))
    node0_tokens = int(re.search(r"max_total_num_tokens=(\d+)", r0.out()).group(1))
    assert node1_tokens < node0_tokens  # positive control: the pools differ
    code, body = http("GET", f"http://127.0.0.1:{http0}/server_info")
    assert code == 200 and body["max_total_num_tokens"] == node1_tokens, body
    r0.p.send_signal(signal.SIGTERM)
    assert r0.wait(60) == 0 and r1.wait(60) == 0


def test_multinode_rank0_killed(bed):
    r0, r1, _, _ = _two_ranks(bed, free_port())
    r0.wait_for(READY)
    r0.p.kill()
    assert r1.wait(60) == 1
    assert "went away" in r1.err()


def test_multinode_rank_gives_up_without_rank0(bed):
    proc = bed.run(["--model-path", str(bed.model), "--tp-size", "2", "--nnodes", "2",
                    "--node-rank", "1", "--dist-init-addr", f"127.0.0.1:{free_port()}",
                    "--dist-timeout", "1"], CUDA_VISIBLE_DEVICES="1")
    assert proc.p.returncode == 1
    assert "Timed out" in last_line(proc.err())


# --------------------------------------------------------------------------
# SGLang's real parser (needs .sandbox/sglang-venv with sglang 0.5.23)
# --------------------------------------------------------------------------


def test_real_sglang_parser(tmp_path):
    bed = Bed(tmp_path, gpu_count=8)
    try:
        opts = tmp_path / "server.yaml"
        opts.write_text("tp-size: 8\nattention-backend: triton\napi-key: real-parser-key\n"
                        "served-model-name: kimi-sim\n")
        port = free_port()
        py = venv_python(SGLANG_VENV_PY)
        proc = bed.start(["--model-path", str(bed.model), "--config", str(opts),
                          "--host", "127.0.0.1", "--port", str(port)],
                         python=py, SANDBOX_SGLANG_PARSER=None, SANDBOX_LOAD_SECONDS="0.5")
        proc.wait_for(READY, timeout=120)
        out = proc.out()
        assert "real parser was not available" not in out
        # SGLang's own resolved_dict(), through SGLang's own logger format: the key in clear
        assert "'tp_size': 8" in out and "'attention_backend': 'triton'" in out
        assert "'api_key': 'real-parser-key'" in out
        # SGLang's parser (it imports torch) ran in a child that exited: the serving process holds no torch
        assert not torch_mapped(proc.pid)
        status, body = http("GET", f"http://127.0.0.1:{port}/v1/models", key="real-parser-key")
        assert status == 200 and body["data"][0]["id"] == "kimi-sim"
        assert http("GET", f"http://127.0.0.1:{port}/v1/models")[0] == 401
        proc.p.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0

        bad = bed.run(["--model-path", str(bed.model), "--tp-sise", "8"], python=py,
                      SANDBOX_SGLANG_PARSER=None, timeout=120)
        assert bad.p.returncode == 2
        assert last_line(bad.err()) == "sglang serve: error: unrecognized arguments: --tp-sise 8"

        bad = bed.run(["--model-path", str(bed.model), "--attention-backend", "tritonn"], python=py,
                      SANDBOX_SGLANG_PARSER=None, timeout=120)
        assert bad.p.returncode == 2
        assert "argument --attention-backend: invalid choice: 'tritonn' (choose from 'triton'" in bad.err()
    finally:
        bed.cleanup()
