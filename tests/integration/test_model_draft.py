"""Speculative decoding from a model profile, on the shared converged sandbox host (sgc280:
tests/integration/helpers.py): the eagle3 profile (models/sandbox-tiny-eagle3.yaml: sandbox-tiny
plus a tiny EAGLE3 draft model that the sandbox's Hub serves) is deployed through
`--data model=sandbox-tiny-eagle3`. The model step keeps the model it verified and downloads and
verifies the draft into its own dir with its own marker; the server restarts, loads the draft on
every rank and reports SGLang's speculative settings in /get_server_info; a second run changes
nothing. Two deploy runs in all.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.helpers import grand_total, shared_converged_host
from tests.integration.helpers import timed as timed_run

pytestmark = pytest.mark.sandbox

MODEL = ("--data", "model=sandbox-tiny-eagle3")
MODEL_DIR, DRAFT_DIR = "/srv/models/tiny", "/srv/models/tiny-draft"
MARKER = ".sglang-converge.json"
TIMINGS: dict[str, float] = {}
# the server's own view of its arguments, with the key when the controller exported one (the auth file)
SERVER_INFO = ("H=/etc/sglang/sglang.auth; if [ -f $H ]; then curl -sf -H @$H http://127.0.0.1:30000/get_server_info; "
               "else curl -sf http://127.0.0.1:30000/get_server_info; fi")


def timed(name: str, *args, **kwargs):
    return timed_run(TIMINGS, name, *args, **kwargs)


@pytest.fixture(scope="module")
def host(request):
    host = shared_converged_host(request, TIMINGS)
    proc = timed("deploy with the draft", "deploy.py", *MODEL, limit=host.name)
    assert proc.returncode == 0, proc.out
    host.draft_out = proc.out
    yield host
    print("\nmodel draft timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in TIMINGS.items()))


def marker(host, directory: str) -> dict:
    return json.loads(host.run(f"cat {directory}/{MARKER}").stdout)


def test_the_model_and_its_draft_are_downloaded_each_with_its_own_marker(host):
    out = host.draft_out
    assert "Model | model sandbox/tiny-kimi-int4@0123456789ab + draft sandbox/tiny-kimi-eagle3@e3a6e3a6e3a6" in out
    # the model was there, verified (the shared host's converge): only the draft is fetched
    assert "model: draft: done in " in out and "the host holds sandbox/tiny-kimi-eagle3@e3a6e3a6e3a6" in out, out
    assert "the host holds sandbox/tiny-kimi-int4" not in out, out  # (positive control: the line above)
    assert "restart sglang.service" in out or "service: restart sglang.service" in out, out
    model, draft = marker(host, MODEL_DIR), marker(host, DRAFT_DIR)
    assert (model["repo"], model["revision"]) == ("sandbox/tiny-kimi-int4", "0123456789abcdef0123456789abcdef01234567")
    assert (draft["repo"], draft["revision"]) == ("sandbox/tiny-kimi-eagle3", "e3a6e3a6e3a6e3a6e3a6e3a6e3a6e3a6e3a6e3a6")
    assert set(draft["files"]) == {".gitattributes", "README.md", "config.json", "model.safetensors"}
    assert "model.safetensors" in draft["digests"]  # verified by content, like the model
    config = json.loads(host.run(f"cat {DRAFT_DIR}/config.json").stdout)
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]


def test_the_server_runs_with_the_draft_and_reports_sglangs_speculative_settings(host):
    out = host.draft_out
    assert "ready: sglang.service serves tiny" in out, out
    info = json.loads(host.run(SERVER_INFO, timeout=30).stdout)
    assert {key: info.get(key) for key in ("speculative_algorithm", "speculative_draft_model_path",
                                           "speculative_num_steps", "speculative_eagle_topk",
                                           "speculative_num_draft_tokens")} == {
        "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": DRAFT_DIR, "speculative_num_steps": 3,
        "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}
    journal = host.run("journalctl -u sglang.service --no-pager -o cat", timeout=30).stdout
    for tp in range(8):  # every TP rank loaded the draft after the target
        assert f" TP{tp}] Load weight end (draft model). type=LlamaForCausalLMEagle3" in journal, journal[-3000:]


def test_a_second_run_changes_nothing(host):
    invocation = "systemctl show sglang.service -p InvocationID --value"
    before = host.run(invocation).stdout.strip()
    again = timed("no-op", "deploy.py", "-v", *MODEL, limit=host.name)  # -v: the no-op reasons are shown
    assert again.returncode == 0, again.out
    assert grand_total(again.out)[:2] == (0, 0), again.out
    assert (f"sandbox/tiny-kimi-int4@0123456789ab is in {MODEL_DIR}, verified; draft "
            f"sandbox/tiny-kimi-eagle3@e3a6e3a6e3a6 is in {DRAFT_DIR}, verified") in again.out, again.out
    assert "sglang.service runs as wanted: no restart" in again.out, again.out
    assert host.run(invocation).stdout.strip() == before  # not restarted
