"""The SGLang stand-in (sandbox/sglang_standin.py) against the real packages:
the same inputs to the real upstream function and to the stand-in's model of
it, the same outcome - return value, or error type and message.

- compressed-tensors: sglang 0.5.23's is_activation_quantization_format and
  CompressedTensorsConfig._quantization_scheme_map_from_config (compiled by
  this test from sglang's own source files) under compressed-tensors 0.8.1
  (.sandbox/ct-venv) and 0.18.0 (.sandbox/sglang-venv), for pack-quantized,
  nvfp4 and float configs;
- the server_args log line: SGLang's own configure_logger, prepare_server_args
  and engine.py's _server_args_for_logging vs the line the stand-in logs, API
  key present (in clear) in both;
- the weights: the real safetensors package's safe_open vs the stand-in's
  header model (truncated, empty, cut header, bad offset, extra bytes), and
  sglang's filter_duplicate_safetensors_files vs the stand-in's model (a
  missing shard).

Every case runs in the venvs `make test-venvs` builds; a missing venv fails.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.unit.test_sglang_standin import (
    CT081_VENV_PY,
    READY,
    SANDBOX_DIR,
    SGLANG_VENV_PY,
    Bed,
    free_port,
    safetensors_bytes,
    venv_python,
)
from tests.unit.test_sglang_standin_checks import ct_model, sglang_src

ROOT = SANDBOX_DIR.parent

# Run inside a venv: real (upstream) and stand-in outcomes as JSON.
_PRELUDE = textwrap.dedent(
    """
    import __future__, ast, json, os, sys, traceback, typing
    from pathlib import Path
    sys.path.insert(0, {sandbox!r})
    import sglang_standin as standin
    SRC = Path({src!r})

    def upstream(rel, qualname, namespace):
        '''One function compiled from sglang's own source file (its package imports CUDA code).'''
        path = SRC / rel
        body = ast.parse(path.read_text()).body
        for part in qualname.split("."):
            node = next(n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part)
            body = node.body
        node.decorator_list = []
        scope = dict(namespace)
        exec(compile(ast.Module([node], []), str(path), "exec",
                     flags=__future__.annotations.compiler_flag, dont_inherit=True), scope)
        return scope[node.name]

    def outcome(fn, *args):
        try:
            value = fn(*args)
        except BaseException as e:
            return {{"error": type(e).__module__ + "." + type(e).__qualname__, "message": str(e),
                     "shown": traceback.format_exception_only(e)[-1].rstrip("\\n")}}
        return {{"value": value}}
    """
)


def run_in(python: str, body: str) -> dict:
    script = _PRELUDE.format(sandbox=str(SANDBOX_DIR), src=sglang_src()) + textwrap.dedent(body)
    proc = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------
# compressed-tensors
# --------------------------------------------------------------------------

FORMATS = ["pack-quantized", "nvfp4-pack-quantized", "float-quantized", "dense", "mixed-precision", None]
CONFIGS = {fmt: ct_model(fmt)["quantization_config"]
           for fmt in ("pack-quantized", "nvfp4-pack-quantized", "float-quantized")}

_CT_BODY = """
import importlib.util
from compressed_tensors.quantization import QuantizationArgs, QuantizationType
spec = importlib.util.spec_from_file_location("real_ct_utils", SRC / standin.CT_UTILS_FILE)
utils = importlib.util.module_from_spec(spec); spec.loader.exec_module(utils)
real_map = upstream(standin.CT_CONFIG_FILE, "CompressedTensorsConfig._quantization_scheme_map_from_config",
                    {"cast": typing.cast, "QuantizationArgs": QuantizationArgs,
                     "QuantizationType": QuantizationType,
                     "is_activation_quantization_format": utils.is_activation_quantization_format})
summary = lambda m: sorted((t, v["format"], v["input_activations"] is not None) for t, v in m.items())
out = {"formats": {}, "configs": {}}
for fmt in FORMATS:
    out["formats"][str(fmt)] = [outcome(utils.is_activation_quantization_format, fmt),
                                outcome(standin.is_activation_quantization_format_model, fmt)]
for name, config in CONFIGS.items():
    out["configs"][name] = [outcome(lambda c: summary(real_map(None, c)), config),
                            outcome(lambda c: summary(standin.quant_scheme_map_model(None, c)), config)]
import compressed_tensors
out["version"] = compressed_tensors.__version__
print(json.dumps(out))
"""


@pytest.mark.parametrize("venv, version", [(CT081_VENV_PY, "0.8.1"), (SGLANG_VENV_PY, "0.18.0")])
def test_compressed_tensors_checks_match_sglangs_own(venv, version):
    body = f"FORMATS = {FORMATS!r}\nCONFIGS = json.loads({json.dumps(CONFIGS)!r})\n" + _CT_BODY
    found = run_in(venv_python(venv), body)
    assert found["version"].startswith(version)
    for fmt, (real, model) in found["formats"].items():
        assert model == real, (version, fmt)
    for name, (real, model) in found["configs"].items():
        assert model == real, (version, name)
    if version == "0.8.1":
        # any format: the list needs a member 0.8.1 lacks (traceback.format_exception's text on
        # this Python, which is what SGLang's scheduler logs)
        for real, _ in found["formats"].values():
            assert real["error"] == "builtins.AttributeError" and real["message"] == "nvfp4_pack_quantized"
        assert found["configs"]["pack-quantized"][0]["error"] == "builtins.AttributeError"
        # an NVFP4 checkpoint fails one step earlier: 0.8.1's QuantizationArgs has no tensor_group
        assert found["configs"]["nvfp4-pack-quantized"][0]["error"] == "pydantic_core._pydantic_core.ValidationError"
        assert "'tensor_group' is not a valid QuantizationStrategy" in found["configs"][
            "nvfp4-pack-quantized"][0]["message"]
    else:
        assert found["formats"]["pack-quantized"][0] == {"value": True}
        assert found["formats"]["dense"][0] == {"value": False}
        assert all("value" in real for real, _ in found["configs"].values())


# --------------------------------------------------------------------------
# the server_args line
# --------------------------------------------------------------------------

_LOG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] server_args=(\{.*\})$")


def test_server_args_line_is_sglangs_with_the_key_in_clear(tmp_path):
    py = venv_python(SGLANG_VENV_PY)
    bed = Bed(tmp_path, gpu_count=2)
    try:
        key = "sk-conformance-0123"
        opts = tmp_path / "opts.yaml"
        opts.write_text(f'api-key: "{key}"\nattention-backend: triton\n')
        argv = ["--model-path", str(bed.model), "--tp-size", "2", "--host", "127.0.0.1",
                "--port", str(free_port()), "--config", str(opts)]
        proc = bed.start(argv, python=py, SANDBOX_SGLANG_PARSER=None, SANDBOX_LOAD_SECONDS="0.2")
        proc.wait_for(READY, timeout=120)
        standin = [line for line in proc.err().splitlines() if "server_args=" in line]
        # SGLang's own: its parser, its logger format, engine.py's function for the dict
        body = f"""
        import io, logging
        from sglang.srt.server_args import prepare_server_args
        from sglang.srt.utils.common import configure_logger
        from sglang.srt.sampling.watermarking.core import redact_watermark_secrets
        server_args = prepare_server_args({argv!r})
        configure_logger(server_args)
        captured = io.StringIO()
        logging.getLogger().handlers[0].setStream(captured)
        for_logging = upstream("srt/entrypoints/engine.py", "_server_args_for_logging",
                               {{"redact_watermark_secrets": redact_watermark_secrets}})
        logging.getLogger("sglang.srt.entrypoints.engine").info(f"server_args={{for_logging(server_args)}}")
        print(json.dumps(captured.getvalue().splitlines()))
        """
        real = subprocess.run([py, "-c", _PRELUDE.format(sandbox=str(SANDBOX_DIR), src=sglang_src())
                               + textwrap.dedent(body)], capture_output=True, text=True, timeout=240,
                              cwd=tmp_path, env=bed.env(SANDBOX_SGLANG_PARSER=None))
        assert real.returncode == 0, real.stderr
        real_lines = json.loads(real.stdout.strip().splitlines()[-1])
    finally:
        bed.cleanup()
    assert len(standin) == 1 and len(real_lines) == 1, (standin, real_lines)
    got, want = _LOG_LINE.match(standin[0]), _LOG_LINE.match(real_lines[0])
    assert got and want, (standin, real_lines)
    assert ast.literal_eval(got.group(1)) == ast.literal_eval(want.group(1))
    assert f"'api_key': '{key}'" in standin[0] and f"'api_key': '{key}'" in real_lines[0]


# --------------------------------------------------------------------------
# weights
# --------------------------------------------------------------------------


def _shard_cases(tmp: Path) -> dict[str, str]:
    good = safetensors_bytes({"a": 8, "b": 4})
    cases = {
        "ok": good,
        "truncated": good[:-10],
        "truncated into the header": good[:20],
        "empty": b"",
        "seven bytes": good[:7],
        "extra bytes": good + b"zz",
        "header too large": (10**12).to_bytes(8, "little") + b"{}",
        "offset gap": safetensors_bytes({"a": 8})[:8] + json.dumps(
            {"a": {"dtype": "BF16", "shape": [8], "data_offsets": [2, 18]}}).encode().ljust(72) + b"\0" * 18,
        "shape mismatch": safetensors_bytes({"a": 8})[:8] + json.dumps(
            {"a": {"dtype": "BF16", "shape": [7], "data_offsets": [0, 16]}}).encode().ljust(72) + b"\0" * 16,
    }
    out = {}
    for name, data in cases.items():
        if name in ("offset gap", "shape mismatch"):  # fix the length prefix of the hand-made header
            data = (72).to_bytes(8, "little") + data[8:]
        path = tmp / (name.replace(" ", "_") + ".safetensors")
        path.write_bytes(data)
        out[name] = str(path)
    return out


def test_safetensors_header_checks_match_the_real_package(tmp_path):
    cases = _shard_cases(tmp_path)
    body = f"""
    from safetensors import safe_open
    def real(path):
        with safe_open(path, framework="numpy") as f:
            return sorted(f.keys())
    model = lambda path: sorted(standin.safetensors_header_model(path))
    cases = {cases!r}
    print(json.dumps({{name: [outcome(real, p), outcome(model, p), outcome(standin.open_safetensors, p)]
                      for name, p in cases.items()}}))
    """
    found = run_in(venv_python(SGLANG_VENV_PY), body)
    for name, (real, model, used) in found.items():
        assert model == real, name
        assert used == real, name  # with safetensors installed the stand-in uses it
    assert found["ok"][0] == {"value": ["a", "b"]}
    assert found["truncated"][0]["shown"] == ("safetensors._safetensors_rust.SafetensorError: Error while "
                                              "deserializing header: incomplete metadata, file not fully covered")


def test_missing_shard_matches_sglangs_filter(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model-00001-of-00002.safetensors").write_bytes(safetensors_bytes({"a": 4}))
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    (model / "stray.safetensors").write_bytes(safetensors_bytes({"c": 4}))
    body = f"""
    import fnmatch, glob
    real = upstream(standin.WEIGHT_UTILS_FILE, "filter_duplicate_safetensors_files",
                    {{"os": os, "json": json, "fnmatch": fnmatch}})
    files = sorted(glob.glob(os.path.join({str(model)!r}, "*.safetensors")))
    index = standin.SAFE_WEIGHTS_INDEX_NAME
    results = [outcome(real, list(files), {str(model)!r}, index),
               outcome(standin.filter_duplicate_safetensors_files_model, list(files), {str(model)!r}, index)]
    open(os.path.join({str(model)!r}, "model-00002-of-00002.safetensors"), "wb").close()
    files = sorted(glob.glob(os.path.join({str(model)!r}, "*.safetensors")))
    results += [outcome(real, list(files), {str(model)!r}, index),
                outcome(standin.filter_duplicate_safetensors_files_model, list(files), {str(model)!r}, index)]
    print(json.dumps({{"missing": results, "source": standin.weight_files_filter()[1]}}))
    """
    found = run_in(venv_python(SGLANG_VENV_PY), body)
    real, model_out, real_complete, model_complete = found["missing"]
    assert model_out == real and model_complete == real_complete
    # positive control: with both shards the index keeps them and drops the stray file
    assert [Path(f).name for f in real_complete["value"]] == ["model-00001-of-00002.safetensors",
                                                                "model-00002-of-00002.safetensors"]
    assert real["error"] == "builtins.RuntimeError"
    assert real["message"] == (f"model.safetensors.index.json references 1 shard file(s) missing from {model} "
                               "(incomplete download?): ['model-00002-of-00002.safetensors']")
    assert found["source"] == "sglang"  # where sglang is installed the stand-in runs the real one
