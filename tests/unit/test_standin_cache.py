"""The stand-in's cache of its parser and compressed-tensors check children (sandbox/standin_cache.py):
with the guest's cache directory, a second start with the same inputs replays both outcomes (and says
so) instead of running them; a changed input, or a changed file a child imported, runs it again; a
refusal or a failed check is never kept; the key is never written in clear. Without the directory
(every other unit test) both always run."""

from __future__ import annotations

import json
import sys

import pytest

from tests.unit.test_sglang_standin import CT081_VENV_PY, READY, SGLANG_VENV_PY, Bed, assert_failed_like_sglang, \
    free_port, venv_python
from tests.unit.test_sglang_standin_checks import ct_model, sglang_src, start_args

PARSER_REPLAYED = "SGLang's parser not run again"
CHECK = "compressed-tensors config checked by sglang code"
CHECK_REPLAYED = "its outcome replayed from an earlier start in this guest"
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


def test_the_same_inputs_replay_the_parser_and_a_changed_input_runs_it_again(bed):
    bed.write_model(ct_model("nvfp4-pack-quantized"))
    first = start(bed, "--api-key", KEY)
    assert PARSER_REPLAYED not in first.out() and CHECK_REPLAYED not in first.out()  # positive controls below
    assert CHECK in first.out(), first.out()
    assert len(list(bed.cache.glob("*.json"))) == 2  # the parser's and the check's
    for record in bed.cache.glob("*.json"):  # SGLang logs the key in server_args: the cache holds a placeholder
        assert KEY not in record.read_text()
    assert oct(bed.cache.stat().st_mode & 0o777) == "0o700"

    again = start(bed, "--api-key", KEY)
    assert PARSER_REPLAYED in again.out(), again.out()
    assert CHECK in again.out() and CHECK_REPLAYED in again.out(), again.out()
    # what SGLang logged at the first start, the key in it as SGLang has it (the launcher's job to hide)
    assert server_args_line(again.out()) == server_args_line(first.out())
    assert KEY in server_args_line(again.out())

    bed.write_model({**ct_model("nvfp4-pack-quantized"), "max_position_embeddings": 4096})  # config.json changed
    changed = start(bed, "--api-key", KEY)
    assert PARSER_REPLAYED not in changed.out(), changed.out()
    assert CHECK_REPLAYED in changed.out()  # the same quantization_config: the check's outcome holds


def test_a_refused_flag_is_not_kept_and_is_refused_again(bed):
    bed.write_model({})
    first = start(bed, "--no-such-flag", wait=False)
    assert first.wait(180) == 2
    assert "unrecognized arguments: --no-such-flag" in first.err()
    assert not list(bed.cache.glob("*.json"))  # the child ran and said why; nothing kept
    again = start(bed, "--no-such-flag", wait=False)
    assert again.wait(180) == 2
    assert "unrecognized arguments: --no-such-flag" in again.err()


def test_a_record_whose_imported_files_changed_is_not_used(bed):
    """test_multinode moves a package's files away behind pip's back (msgspec, which SGLang's parser
    imports): a record that still listed them would start a server the real one could not. Likewise a
    changed compressed-tensors, or SGLang's source file the check runs."""
    bed.write_model(ct_model("nvfp4-pack-quantized"))
    start(bed)
    records = {p: json.loads(p.read_text()) for p in bed.cache.glob("*.json")}
    [parser] = [p for p, r in records.items() if "reply" in r]
    [check] = [p for p, r in records.items() if "source" in r]
    msgspec = [f for f in records[parser]["imported"] if "/msgspec/" in f]
    assert msgspec, sorted(records[parser]["imported"])[:20]  # the parser imported it, and the record says so
    records[parser]["imported"][msgspec[0]] = [1, 1]  # as if the file had changed since
    parser.write_text(json.dumps(records[parser]))
    upstream = [f for f in records[check]["imported"] if f.endswith("compressed_tensors/compressed_tensors.py")]
    ct_package = [f for f in records[check]["imported"] if "/compressed_tensors/" in f and "/sglang/" not in f]
    assert upstream and ct_package, sorted(records[check]["imported"])[:20]
    records[check]["imported"][upstream[0]] = [1, 1]
    check.write_text(json.dumps(records[check]))
    again = start(bed)
    assert PARSER_REPLAYED not in again.out() and CHECK in again.out(), again.out()
    assert CHECK_REPLAYED not in again.out(), again.out()


def test_a_failed_check_is_not_kept_and_fails_again(bed):
    """ct200's incident (INT4 pack-quantized under compressed-tensors 0.8.1): the check fails the rank with
    its traceback, at every start."""
    bed.write_model(ct_model("pack-quantized"))
    for _ in range(2):
        proc = bed.run(start_args(bed), python=venv_python(CT081_VENV_PY), timeout=120,
                       SANDBOX_SGLANG_SRC=sglang_src(), SANDBOX_STANDIN_CACHE=bed.cache)
        assert_failed_like_sglang(proc, "AttributeError: nvfp4_pack_quantized")
        assert CHECK in proc.out() and CHECK_REPLAYED not in proc.out(), proc.out()
        assert not [p for p in bed.cache.glob("*.json") if "source" in json.loads(p.read_text())]


def test_imported_files_see_a_package_moved_away(tmp_path, monkeypatch):
    from sandbox import standin_cache

    site = tmp_path / "site-packages"
    (site / "pkg_for_cache_test").mkdir(parents=True)
    (site / "pkg_for_cache_test" / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(site))
    import pkg_for_cache_test  # noqa: F401

    files = standin_cache.imported_files()
    assert str(site) in files and any("pkg_for_cache_test" in f for f in files)
    assert standin_cache.unchanged(json.loads(json.dumps(files)))  # as kept in a record, read back
    (site / "pkg_for_cache_test").rename(site / "pkg_for_cache_test.broken-by-test")
    assert not standin_cache.unchanged(files)
    monkeypatch.delitem(sys.modules, "pkg_for_cache_test")
