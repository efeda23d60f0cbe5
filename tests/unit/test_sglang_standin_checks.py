"""The SGLang stand-in's start checks, run end to end: the compressed-tensors
config (SGLang's own code from the venv's sglang sources, or the model of it)
and the weight shards (index, safetensors headers). A failing check fails the
start the way SGLang 0.5.23 does: the rank logs the traceback, SIGQUIT, the
main process kills the tree and itself. tests/unit/test_conformance.py
compares the functions themselves with the real ones."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.tinymodel import _quant_scheme
from tests.unit.test_sglang_standin import (
    CT081_VENV_PY,
    READY,
    SGLANG_VENV_PY,
    SHARDS,
    Bed,
    assert_failed_like_sglang,
    error_lines,
    free_port,
    venv_python,
)

SGLANG_SRC = next((SGLANG_VENV_PY.parent.parent / "lib").glob("python3*/site-packages/sglang"), None)


@pytest.fixture
def bed(tmp_path):
    b = Bed(tmp_path, gpu_count=1)
    yield b
    b.cleanup()


def ct_model(fmt: str) -> dict:
    """A compressed-tensors quantization_config like the checkpoints' (sandbox/tinymodel.py)."""
    return {"quantization_config": {"quant_method": "compressed-tensors", "format": fmt,
                                    "config_groups": {"group_0": _quant_scheme(fmt)},
                                    "ignore": ["lm_head"], "quantization_status": "compressed"}}


def start_args(bed: Bed) -> list[str]:
    return ["--model-path", str(bed.model), "--tp-size", "1", "--port", str(free_port())]


def sglang_src() -> str:
    venv_python(SGLANG_VENV_PY)
    assert SGLANG_SRC is not None and (SGLANG_SRC / "srt").is_dir(), f"no sglang package in {SGLANG_VENV_PY}"
    return str(SGLANG_SRC)


# --------------------------------------------------------------------------
# compressed-tensors
# --------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["sglang", "model"])
def test_int4_pack_quantized_under_compressed_tensors_0_8_1_fails(bed, source):
    """ct200's incident: Kimi K2.6 is INT4 pack-quantized, yet SGLang 0.5.23 needs
    CompressionFormat.nvfp4_pack_quantized for every config group."""
    bed.write_model(ct_model("pack-quantized"))
    env = {"SANDBOX_SGLANG_SRC": sglang_src() if source == "sglang" else None}
    proc = bed.run(start_args(bed), python=venv_python(CT081_VENV_PY), timeout=120, **env)
    assert_failed_like_sglang(proc, "AttributeError: nvfp4_pack_quantized")
    assert f"compressed-tensors config checked by {source} code" in proc.out()
    assert "Load weight end" not in proc.out()


def test_nvfp4_under_compressed_tensors_0_18_starts_with_sglangs_own_code(bed):
    bed.write_model(ct_model("nvfp4-pack-quantized"))
    proc = bed.start(start_args(bed), python=venv_python(SGLANG_VENV_PY))
    proc.wait_for(READY, timeout=120)
    out = proc.out()
    assert "compressed-tensors config checked by sglang code" in out
    assert "quant=compressed-tensors" in out and "index filter: sglang" in out
    # the compressed-tensors check (it imports torch) ran in a child of the rank that exited: neither
    # the server process nor its rank holds torch (~350 MB) while it serves
    serving = [proc.pid, *child_pids(proc.pid)]
    assert len(serving) == 2, serving  # the server and its one rank; the children that imported torch are gone
    assert [pid for pid in serving if torch_mapped(pid)] == []
    proc.p.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0


def child_pids(pid: int) -> list[int]:
    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()
            if Path(f"/proc/{c}/cmdline").read_bytes().find(b"resource_tracker") < 0]


def torch_mapped(pid: int) -> bool:
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def test_torch_mapped_sees_a_process_that_imported_torch():
    """The positive control of the check above."""
    proc = subprocess.Popen([venv_python(SGLANG_VENV_PY), "-c", "import sys, torch; print('in', flush=True); "
                             "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "in"
        assert torch_mapped(proc.pid)
        assert not torch_mapped(os.getpid())
    finally:
        proc.kill()
        proc.wait()


def test_compressed_tensors_not_installed(bed):
    bed.write_model(ct_model("pack-quantized"))
    proc = bed.run(start_args(bed), python=sys.executable)  # the project's venv has no compressed-tensors
    assert_failed_like_sglang(proc, "ModuleNotFoundError: No module named 'compressed_tensors'")


# --------------------------------------------------------------------------
# weights
# --------------------------------------------------------------------------


def test_weights_are_read_from_every_shard_the_index_names(bed):
    port = free_port()
    proc = bed.start(["--model-path", str(bed.model), "--port", str(port)])
    proc.wait_for(READY)
    assert "(2 weight file(s), 4 tensors; index filter: model)" in proc.out()


def test_a_missing_shard_fails_the_start(bed):
    (bed.model / SHARDS[1]).unlink()
    proc = bed.run(start_args(bed))
    assert_failed_like_sglang(
        proc, f"RuntimeError: model.safetensors.index.json references 1 shard file(s) missing from "
              f"{bed.model} (incomplete download?): ['{SHARDS[1]}']")


@pytest.mark.parametrize("python", ["model", "real safetensors"])
def test_a_truncated_shard_fails_the_start(bed, python):
    shard = bed.model / SHARDS[0]
    shard.write_bytes(shard.read_bytes()[:-10])  # a download cut short
    py = sys.executable if python == "model" else venv_python(SGLANG_VENV_PY)
    proc = bed.run(start_args(bed), python=py, timeout=120)
    assert_failed_like_sglang(proc, "safetensors._safetensors_rust.SafetensorError: Error while deserializing "
                                    "header: incomplete metadata, file not fully covered")


def test_a_model_dir_without_weights_never_becomes_ready(bed):
    for shard in SHARDS:
        (bed.model / shard).unlink()
    (bed.model / "model.safetensors.index.json").unlink()
    proc = bed.run(start_args(bed))
    assert_failed_like_sglang(proc, f"RuntimeError: Cannot find any model weights with `{bed.model}`")
    # positive control: the same dir with one shard and no index starts
    (bed.model / "model.safetensors").write_bytes(
        b"\x10\x00\x00\x00\x00\x00\x00\x00" + json.dumps({}).encode().ljust(16))
    port = free_port()
    ok = bed.start(["--model-path", str(bed.model), "--port", str(port)])
    ok.wait_for(READY)
    assert not error_lines(ok.out(), "RuntimeError")
