"""Speculative decoding from a model profile, on the shared converged sandbox host (sgc280:
tests/integration/helpers.py): the eagle3 profile (models/sandbox-tiny-eagle3.yaml: sandbox-tiny
plus a tiny EAGLE3 draft model that the sandbox's Hub serves) is deployed through
`--data model=sandbox-tiny-eagle3`. The model step keeps the model it verified and downloads and
verifies the draft into its own dir with its own marker; the server restarts, loads the draft on
every rank and reports SGLang's speculative settings in /get_server_info, and readiness reads the
draft's accept length (core/draft_gate.py); a second run changes nothing. Last, the draft gate's
fault: a draft that accepts nothing (the stand-in's SANDBOX_DRAFT_ACCEPT=1.0) fails readiness and
is rolled back to the draft deploy's configuration, which a re-run then leaves alone. At the end the
shared host goes back to the sandbox's default profile (its later users expect it). Six deploy runs.
"""

from __future__ import annotations

import json
import re
import runpy

import pytest

from tests.integration.helpers import SHARED_CONVERGED_GROUP, ROOT, grand_total, shared_converged_host, unit_props
from tests.integration.helpers import timed as timed_run

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group(SHARED_CONVERGED_GROUP)]

MODEL = ("--data", "model=sandbox-tiny-eagle3")
# the pinned revisions' own dirs (<model_dir>-revisions/<revision[:12]>), what the server reads
MODEL_DIR, DRAFT_DIR = "/srv/models/tiny-revisions/0123456789ab", "/srv/models/tiny-draft-revisions/e3a6e3a6e3a6"
MARKER = ".sglang-converge.json"
LAST_GOOD_SPEED = "/var/lib/sglang-converge/last-good/sglang/speed.json"
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
    # the host is shared (tests/integration/helpers.py): its later users expect the sandbox's default profile
    back = timed("back to the default profile", "deploy.py", limit=host.name)
    assert back.returncode == 0 and "ready: sglang.service serves tiny at " in back.out, back.out[-4000:]
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


def test_readiness_reads_the_drafts_accept_length_and_keeps_it_with_the_last_good_configuration(host):
    accepted = re.search(r"readiness: draft accepted: accept length ([\d.]+) \(min_accept_length 1.5\)",
                         host.draft_out)
    assert accepted and 1.5 <= float(accepted.group(1)) <= 4, host.draft_out[-4000:]  # at most the 4 draft tokens
    kept = json.loads(host.run(f"cat {LAST_GOOD_SPEED}").stdout)
    assert kept["verify_ct"] > 0 and f"{kept['accept_length']:.2f}" == accepted.group(1), kept


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


def faulty(tmp_path, **env) -> str:
    """A group_data override of the sandbox's extra_env (a restart) with the stand-in's fault env vars
    (as tests/integration/test_start_gates.py does)."""
    extra = {**runpy.run_path(str(ROOT / "group_data" / "sandbox.py"))["extra_env"], **env}
    (tmp_path / "sandbox.py").write_text(f"extra_env = {extra!r}\n")
    return str(tmp_path)


def test_a_draft_that_accepts_nothing_fails_the_draft_gate_and_is_rolled_back(host, tmp_path):
    """Last in this module: it leaves the draft deploy's configuration serving, as the module found it."""
    kept = json.loads(host.run(f"cat {LAST_GOOD_SPEED}").stdout)  # the draft deploy's (the test above)
    before = unit_props(host, "sglang.service")
    proc = timed("draft fault", "deploy.py", *MODEL, "--group-data", faulty(tmp_path, SANDBOX_DRAFT_ACCEPT="1.0"),
                 limit=host.name)
    assert proc.returncode != 0, proc.out[-4000:]
    nothing = re.search(r"readiness: draft gate: the draft accepts nothing: accept length 1\.00 over (\d+) verify "
                        r"steps, below min_accept_length 1\.5", proc.out)
    assert nothing and int(nothing.group(1)) > 0, proc.out[-4000:]
    assert "readiness: speed gate:" not in proc.out  # the cause, judged first
    assert "readiness: rolled back: sglang.service serves the last good configuration again" in proc.out, \
        proc.out[-4000:]
    after = unit_props(host, "sglang.service")
    assert after["ActiveState"] == "active" and after["MainPID"] != before["MainPID"]
    assert host.run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health").stdout == "200"
    assert json.loads(host.run(f"cat {LAST_GOOD_SPEED}").stdout) == kept  # the failed measurement is not kept
    again = timed("after the draft fault", "deploy.py", *MODEL, limit=host.name)
    assert again.returncode == 0 and grand_total(again.out)[:2] == (0, 0), again.out[-4000:]
    assert "readiness: gates passed in " not in again.out  # a run that restarts nothing measures nothing
