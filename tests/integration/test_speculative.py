"""Speculative decoding from a model profile, on a sandbox host of its own (sgc290): the eagle3
profile (models/sandbox-tiny-eagle3.yaml: sandbox-tiny plus a tiny EAGLE3 draft model that the
sandbox's Hub serves) is deployed through `--data model=sandbox-tiny-eagle3`. The model step
downloads and verifies both, each into its own dir with its own marker; the server stand-in loads
the draft on every rank and reports SGLang's speculative settings in /get_server_info; a second
run changes nothing. Two deploy runs in all.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.helpers import converged_extra_host, grand_total
from tests.integration.helpers import timed as timed_run

pytestmark = pytest.mark.sandbox

INDEX = 290
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
def host():
    with converged_extra_host(INDEX, TIMINGS, "speculative", *MODEL) as host:
        yield host


def marker(host, directory: str) -> dict:
    return json.loads(host.run(f"cat {directory}/{MARKER}").stdout)


def test_the_model_and_its_draft_are_downloaded_each_with_its_own_marker(host):
    out = host.converge_out
    assert "plan: download sandbox/tiny-kimi-int4@0123456789ab into /srv/models/tiny" in out, out
    assert "plan: download draft sandbox/tiny-kimi-eagle3@e3a6e3a6e3a6 into /srv/models/tiny-draft" in out, out
    assert "model: done in " in out and "model: draft: done in " in out, out
    model, draft = marker(host, MODEL_DIR), marker(host, DRAFT_DIR)
    assert (model["repo"], model["revision"]) == ("sandbox/tiny-kimi-int4", "0123456789abcdef0123456789abcdef01234567")
    assert (draft["repo"], draft["revision"]) == ("sandbox/tiny-kimi-eagle3", "e3a6e3a6e3a6e3a6e3a6e3a6e3a6e3a6e3a6e3a6")
    assert set(draft["files"]) == {".gitattributes", "README.md", "config.json", "model.safetensors"}
    assert "model.safetensors" in draft["digests"]  # verified by content, like the model
    config = json.loads(host.run(f"cat {DRAFT_DIR}/config.json").stdout)
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]


def test_the_server_runs_with_the_draft_and_reports_sglangs_speculative_settings(host):
    out = host.converge_out
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
    again = timed("no-op", "deploy.py", *MODEL, limit=host.name)
    assert again.returncode == 0, again.out
    assert grand_total(again.out)[:2] == (0, 0), again.out
    assert (f"sandbox/tiny-kimi-int4@0123456789ab is in {MODEL_DIR}, verified; draft "
            f"sandbox/tiny-kimi-eagle3@e3a6e3a6e3a6 is in {DRAFT_DIR}, verified") in again.out, again.out
    assert "sglang.service runs as wanted: no restart" in again.out, again.out
