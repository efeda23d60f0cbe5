"""plan.py, the planner without a host: a profile on described GPUs, the README's commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import plan

ROOT = Path(__file__).resolve().parents[2]
K25 = ROOT / "tests" / "fixtures" / "kimi-k2.5"
OFFLINE = {"HF_HUB_OFFLINE": "1"}


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "plan.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", **OFFLINE, **(env or {})})


def test_kimi_k26_on_ct200s_gpus_prints_every_term():
    """`python plan.py kimi-k2.6 --gpus 8 --gpu-mib 97887 --config-dir tests/fixtures/kimi-k2.5` (README)."""
    proc = run("kimi-k2.6", "--gpus", "8", "--gpu-mib", "97887", "--config-dir", str(K25))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "kimi-k2.6 (moonshotai/Kimi-K2.6) on 8 x 97887 MiB, TP 8:"
    fit = lines[1]
    for term in ("weights ~77.00 GB (counted per tensor at TP 8: 77.00 GB of 595.15 GB",
                 "experts 570.76 GB -> 71.35 GB", "(102.64 GB - 2.15 GB CUDA context and NCCL, estimated)",
                 "x mem_fraction_static 0.94 (--mem-fraction-static) = 94.46 GB static",
                 "multimodal reserve 0.105 GB", "KV cache room 17.36 GB = ~247005 tokens (70272 bytes/token"):
        assert term in fit, (term, fit)


def test_json_has_the_plans_terms_and_kimi_k25_at_094_against_the_published_range():
    """--json: one object. The K2.5 config at 0.94 (the operators' value): 247005 tokens, 6.5% above the
    top of the published 170k-232k (rtx6kpro inference-engines/sglang.md): SGLang's own formula with an
    estimated 2 GiB of CUDA/NCCL; the gap is not explained yet (docs/memory-plan.md)."""
    proc = run("kimi-k2.6", "--gpus", "8", "--gpu-mib", "97887", "--config-dir", str(K25), "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["weights_bytes_per_gpu"] == 77_002_374_656
    assert result["overhead_bytes_per_gpu"] == 2 * 1024**3
    assert result["kv_bytes_per_token"] == 70272
    assert result["kv_tokens"] == 247005
    assert round(result["kv_tokens"] / 232_000 - 1, 3) == 0.065  # the gap docs/memory-plan.md states
    lower = json.loads(run("kimi-k2.6", "--gpus", "8", "--gpu-mib", "97887", "--config-dir", str(K25), "--json",
                           "--mem-fraction-static", "0.9").stdout)
    assert lower["mem_fraction_static"] == 0.9 and lower["kv_tokens"] < result["kv_tokens"]


def test_offline_it_estimates_and_says_so():
    proc = run("kimi-k2.6", "--gpus", "8", "--gpu-mib", "97887")
    assert proc.returncode == 0, proc.stderr
    assert "weights ~74.38 GB (595.00 GB (the profile's size_bytes) / TP 8)" in proc.stdout
    assert "weights per GPU estimated as the profile's size_bytes over TP: tensor headers not read from the Hub" \
        in proc.stdout
    assert "KV bytes per token unknown (--config-dir gives it)" in proc.stdout


def test_a_model_that_does_not_fit_exits_1():
    proc = run("kimi-k2.6", "--gpus", "4", "--gpu-mib", "97887", "--config-dir", str(K25))
    assert proc.returncode == 1
    assert "the model does not fit: its weights need ~" in proc.stdout and "at TP 4" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["kimi-k2.6", "--gpus", "0", "--gpu-mib", "97887"], "--gpus 0: allowed: an integer >= 1"),
    (["kimi-k2.6", "--gpus", "8", "--gpu-mib", "97887", "--tp", "16"], "--tp 16: allowed: 1 to --gpus (8)"),
    (["kimi-k2.6", "--gpus", "8", "--gpu-mib", "97887", "--mem-fraction-static", "1.5"],
     "--mem-fraction-static 1.5: allowed: a number between 0 and 1"),
    (["kimi-k9", "--gpus", "8", "--gpu-mib", "97887"], "model = 'kimi-k9' is not a model profile in"),
])  # fmt: skip
def test_bad_arguments_are_refused_naming_the_value_and_what_is_allowed(args, message, capsys):
    assert plan.main(args) == 2
    assert message in capsys.readouterr().err
