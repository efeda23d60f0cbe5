"""A real pretrained model's answers through the real SGLang server, on the shared real host (sgc290,
converged once: tests/integration/helpers.shared_real_host; test_real_server.py, in the same xdist
group, runs after this module and removes it). The model is SmolLM2-135M-Instruct
(models/sandbox-real-smollm2.yaml, converted from its PyPI wheel and checked by sandbox/smollm2.py):

- the smoke gate passes on its own answers (the positive control), shown in the output;
- a corrupted revision and a chat template without the user's turn (the repo's fault revisions):
  real SGLang loads each and serves /health 200; the smoke gate fails on the real wrong answers;
  rolled back to the good revision, which serves again; a re-run changes nothing;
- the memory plan's weights per rank against what the real schedulers hold, at TP 1 and TP 3.
Only the GPU is simulated.
"""

from __future__ import annotations

import json
import re
import shlex

import pytest

from tests.integration.helpers import REAL_GROUP, grand_total, real_pyinfra, shared_real_host, unit_props, wait_until
from tests.integration.real_helpers import CHAT, ENV, MODEL, curl, journal, unit_argv

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group(REAL_GROUP)]

TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def real(request):
    return shared_real_host(request, TIMINGS, env=ENV)


def test_the_smoke_gate_passed_on_the_models_own_answers_and_showed_them(real):
    """The positive control of the faults below: the good revision's start passed every gate, the smoke
    checks (models/sandbox-real-smollm2.yaml: chat, chat with chat_template_kwargs, completions) among
    them, and the output shows what the model answered."""
    out = real.converge_out
    assert "readiness: smoke checks passed: 3 of 3 (temperature 0)" in out, out[-4000:]
    assert re.search(r"readiness: smoke: 'What is the capital of France\?' answered '.*\bParis\b", out), out[-3000:]
    assert re.search(r"readiness: smoke: 'What is 2\+2\?' answered '.*\b4\b", out), out[-3000:]
    assert re.search(r"readiness: smoke: '1, 2, 3, 4, 5,' answered ' ?6, ?7, ?8", out), out[-3000:]
    kept = json.loads(real.run("cat /var/lib/sglang-converge/launch/sglang.smoke.json").stdout)
    print("\nsmoke answers on the real server: " + "; ".join(f"{c['prompt']!r} -> {c['got']!r}" for c in kept["checks"]))


# --------------------------------------------------------------------------- a real model's wrong answers

WRONG = re.compile(r"readiness: smoke: ('[^']*') wanted (/.*?/), got (.*)")
SPEED = re.compile(r"readiness: decode speed as expected: concurrency 1 ([\d.]+) tok/s, concurrency 4 ([\d.]+) tok/s"
                   r" \(([^)]*)\)")


def a_bad_revision_is_rolled_back(real, profile: str) -> tuple[str, dict[str, tuple[str, str]]]:
    """Deploy the fault revision ``profile`` of the good model: it downloads beside the serving revision,
    the restart switches to it, real SGLang loads it and serves (/health 200, fingerprint and speed as
    planned), the smoke gate finds wrong answers; rolled back, the good revision serves again and a
    re-run changes nothing. Returns (the run's output, {prompt: (regex, what came back)})."""
    good_unit = real.run("cat /etc/systemd/system/sglang.service").stdout
    before = unit_props(real, "sglang.service")
    proc = real_pyinfra("deploy.py", "--data", f"model={profile}", limit=real.name, env=ENV)
    assert proc.returncode != 0, proc.out[-4000:]
    assert "restart sglang.service: unit file changed" in proc.out, proc.out[-4000:]
    assert f"ready: sglang.service serves {MODEL}" in proc.out and "readiness: launch fingerprint as planned" in \
        proc.out, proc.out[-4000:]  # it loaded and answered: only its answers are wrong
    # the second start of this model's weights: decode speed held to the good start's, kept as last good
    speed = SPEED.search(proc.out)
    assert speed and "no last good figure" not in speed.group(3), proc.out[-4000:]
    print(f"\n{profile}: decode speed as expected: c1 {speed.group(1)} tok/s, c4 {speed.group(2)} tok/s "
          f"({speed.group(3)})")
    wrong = {prompt: (regex, got) for prompt, regex, got in WRONG.findall(proc.out)}
    assert wrong, proc.out[-4000:]
    print(f"{profile}: the smoke gate's wrong answers: {wrong}")
    assert "readiness: rolled back: sglang.service serves the last good configuration again" in proc.out, \
        proc.out[-4000:]
    assert real.run("cat /etc/systemd/system/sglang.service").stdout == good_unit
    after = unit_props(real, "sglang.service")
    assert after["ActiveState"] == "active" and after["MainPID"] != before["MainPID"]
    code, answer = curl(real, "/v1/chat/completions", CHAT)
    assert code == 200 and "Paris" in json.loads(answer)["choices"][0]["message"]["content"], answer
    again = real_pyinfra("deploy.py", limit=real.name, env=ENV)
    assert again.returncode == 0 and grand_total(again.out)[:2] == (0, 0), again.out[-4000:]
    return proc.out, wrong


def test_a_corrupted_revision_serves_health_200_answers_garbage_and_is_rolled_back(real):
    """models/sandbox-real-smollm2-corrupt.yaml: the repo's next revision with one layer's down_proj rows
    permuted (sandbox/smollm2.py corrupt). Real SGLang loads it and answers /health 200; every chat
    answer is the real garbage, named with its prompt and regex."""
    out, wrong = a_bad_revision_is_rolled_back(real, "sandbox-real-smollm2-corrupt")
    assert "'What is the capital of France?'" in wrong and "Paris" not in wrong["'What is the capital of France?'"][1]
    assert wrong["'What is 2+2?'"][0] == r"/\b4\b/", wrong


def test_a_chat_template_without_the_user_turn_answers_the_wrong_question_and_is_rolled_back(real):
    """models/sandbox-real-smollm2-no-user-turn.yaml: the next revision's tokenizer_config.json drops the
    user's turn from the chat template. Recorded here: real SGLang 0.5.23 takes the template, starts and
    serves; the chat answers are about a question the model never saw (the smoke gate fails them),
    while the completions check, which uses no template, still passes."""
    out, wrong = a_bad_revision_is_rolled_back(real, "sandbox-real-smollm2-no-user-turn")
    assert {"'What is the capital of France?'", "'What is 2+2?'"} <= set(wrong), wrong
    assert "'1, 2, 3, 4, 5,'" not in wrong, wrong  # /v1/completions: no template, the right answer


# --------------------------------------------------------------------------- the memory plan held to it

SHIM_LINE = re.compile(r"sandbox shim \(simulated GPU\): TP(\d+) of (\d+) loaded (\w+): (\d+) parameter bytes")
TP3_UNIT, TP3_PORT = "sglang-tp3-probe.service", 30200


def planned_per_rank(tp: int) -> int:
    """core/tensor_plan.py's weights per rank for the model the real server loads: SmolLM2's own
    safetensors header and config.json, as the sandbox Hub serves them."""
    from core.tensor_plan import file_tensors, place, summarize
    from sandbox import smollm2
    from sandbox.hubd import MODEL_CACHE

    repo = MODEL_CACHE / f"{smollm2.REPO.replace('/', '--')}-{smollm2.REVISIONS['good'][:12]}-smollm2"
    config = json.loads((repo / "config.json").read_text())
    return place(summarize(file_tensors([repo / "model.safetensors"])), config, tp).per_rank_bytes


def shim_counts(log: str) -> dict[tuple[int, int], int]:
    """{(rank, tp): parameter bytes} the GPU shim counted in the real scheduler processes."""
    return {(int(m[1]), int(m[2])): int(m[4]) for m in SHIM_LINE.finditer(log)}


def test_the_plans_weights_per_rank_are_what_the_real_server_holds_at_tp_1_and_3(real):
    """The memory plan's weights per GPU (core/tensor_plan.py, from the checkpoint's safetensors
    headers: the preflight read them from the sandbox Hub by range requests) against the bytes of
    the parameters the real SGLang scheduler holds once it has loaded the model, counted inside
    the process by the GPU shim: at TP 1 (the serving unit) and at TP 3 (the unit's command line on
    simulated GPUs 2-4, gloo between its ranks), within 5%. SmolLM2 has 9 heads and 3 KV heads (TP 2
    does not divide them: SGLang refuses it): at TP 3 each rank holds 3 heads and one KV head, and
    its vocabulary (49152, tied to the LM head) splits in thirds."""
    assert "counted per tensor at TP 1: " in real.converge_out and "(from the Hub's safetensors headers)" \
        in real.converge_out, real.converge_out[-4000:]
    held = shim_counts(journal(real))
    assert held.get((0, 1)), journal(real)[-3000:]
    assert abs(held[(0, 1)] - planned_per_rank(1)) <= 0.05 * planned_per_rank(1), (held, planned_per_rank(1))
    argv = unit_argv(real, port=TP3_PORT)
    argv[argv.index("--tp-size") + 1] = "3"
    env = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1|0", "SGLANG_NCCL_SO_PATH": "/nonexistent",
           "CUDA_VISIBLE_DEVICES": "2,3,4", "PYTHONPATH": "/usr/local/lib/sandbox-gpu/realshim",
           "SANDBOX_GPU_SHIM_MIB": "1024", "SGLANG_USE_CPU_ENGINE": "1",
           "LD_LIBRARY_PATH": "/usr/local/lib/sandbox-gpu/cuda"}  # as at TP 2 (FACTS), a rank more
    setenv = " ".join(f"--setenv={k}={shlex.quote(v)}" for k, v in env.items())
    real.run(f"systemctl reset-failed {TP3_UNIT} 2>/dev/null; systemd-run --unit {TP3_UNIT} -p KillMode=mixed "
             f"{setenv} {' '.join(shlex.quote(a) for a in argv)}")
    ranks = {(0, 3), (1, 3), (2, 3)}
    try:
        tp3_log = lambda: real.run(f"journalctl -u {TP3_UNIT} --no-pager -o cat", timeout=60).stdout  # noqa: E731
        wait_until(lambda: ranks <= set(shim_counts(tp3_log())), 300, "the three TP 3 ranks to load the model")
        counts = shim_counts(tp3_log())
    finally:
        real.run(f"systemctl stop {TP3_UNIT}; systemctl reset-failed {TP3_UNIT} 2>/dev/null; true", timeout=120)
    plan3 = planned_per_rank(3)
    print(f"\nweights per rank: TP 1 plan {planned_per_rank(1)}, held {held[(0, 1)]}; TP 3 plan {plan3}, held "
          f"{', '.join(str(counts[rank]) for rank in sorted(ranks))} bytes")
    for rank in sorted(ranks):
        assert abs(counts[rank] - plan3) <= 0.05 * plan3, (rank, counts, plan3)
    assert plan3 < 0.4 * planned_per_rank(1)  # split, not bytes / 3 + whole copies
