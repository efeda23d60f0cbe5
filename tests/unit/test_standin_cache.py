"""The stand-in's cache of its two costly children (sandbox/standin_cache.py): with the guest's cache
directory, a second start with the same inputs replays the parser's and the compressed-tensors check's
outcome (and says so) instead of running them; a changed input runs them again; a refusal is replayed
as a refusal; the key is never written in clear. Without the directory (every other unit test) the
children always run."""

from __future__ import annotations

import json

import pytest

from tests.unit.test_sglang_standin import READY, SGLANG_VENV_PY, Bed, free_port, venv_python
from tests.unit.test_sglang_standin_checks import ct_model, sglang_src

PARSER_REPLAYED = "SGLang's parser not run again"
CHECK_REPLAYED = "its outcome replayed from an earlier start"
KEY = "sk-standin-cache-test-0123456789"


@pytest.fixture
def bed(tmp_path):
    b = Bed(tmp_path, gpu_count=1)
    b.cache = tmp_path / "cache"
    b.cache.mkdir()
    b.port = free_port()  # a unit's restarts keep their port: the same argv
    yield b
    b.cleanup()


def start(bed: Bed, *extra: str, wait: bool = True):
    argv = ["--model-path", str(bed.model), "--tp-size", "1", "--port", str(bed.port), *extra]
    proc = bed.start(argv, python=venv_python(SGLANG_VENV_PY), SANDBOX_STANDIN_CACHE=bed.cache,
                     SANDBOX_SGLANG_PARSER="real", SANDBOX_SGLANG_SRC=sglang_src())
    if wait:
        proc.wait_for(READY, timeout=180)
        proc.p.terminate()
        proc.wait(60)
    return proc


def server_args_line(text: str) -> str:
    return next(line.split("server_args=", 1)[1] for line in text.splitlines() if "server_args=" in line)


def test_the_same_inputs_replay_both_children_and_a_changed_input_runs_them_again(bed):
    bed.write_model(ct_model("nvfp4-pack-quantized"))
    first = start(bed, "--api-key", KEY)
    assert PARSER_REPLAYED not in first.out() and CHECK_REPLAYED not in first.out()  # positive control below
    assert "compressed-tensors config checked by sglang code" in first.out(), first.out()
    assert len(list(bed.cache.glob("*.json"))) == 2
    for record in bed.cache.glob("*.json"):  # SGLang logs the key in server_args: the cache holds a placeholder
        assert KEY not in record.read_text()
    assert oct(bed.cache.stat().st_mode & 0o777) == "0o700"

    again = start(bed, "--api-key", KEY)
    assert PARSER_REPLAYED in again.out() and CHECK_REPLAYED in again.out(), again.out()
    assert "compressed-tensors config checked by sglang code" in again.out()
    # what SGLang logged at the first start, the key in it as SGLang has it (the launcher's job to hide)
    assert server_args_line(again.out()) == server_args_line(first.out())
    assert KEY in server_args_line(again.out())

    bed.write_model({**ct_model("nvfp4-pack-quantized"), "max_position_embeddings": 4096})  # config.json changed
    changed = start(bed, "--api-key", KEY)
    assert PARSER_REPLAYED not in changed.out(), changed.out()
    assert CHECK_REPLAYED in changed.out()  # the quantization config itself did not change


def test_a_refused_flag_is_refused_again_with_argparses_own_words(bed):
    bed.write_model({})
    first = start(bed, "--no-such-flag", wait=False)
    assert first.wait(180) == 2
    records = [json.loads(p.read_text()) for p in bed.cache.glob("*.json")]
    assert [r["exitcode"] for r in records] == [2], records  # kept: the same argv is refused the same way
    assert "unrecognized arguments: --no-such-flag" in records[0]["stderr"]
    again = start(bed, "--no-such-flag", wait=False)
    assert again.wait(180) == 2

    def refusal(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.startswith(("usage:", "launch_server.py: error"))
                or "error: unrecognized" in line]
    assert refusal(first.err()) and refusal(again.err()) == refusal(first.err()), again.err()[-2000:]
