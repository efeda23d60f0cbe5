"""Speculative decoding as part of a model profile (an EAGLE3 draft model): the profile's draft
block validated, the spec's draft_dir and SGLang's --speculative-* flags (accepted by the real
sglang 0.5.23 parser), the model step downloading model + draft with one disk check, the memory
fit counting the draft on every GPU, the restart stamp seeing the draft's revision, and the
sandbox's pieces: the generated draft, the Hub stand-in serving it, the server stand-in loading it
and reporting the settings in /get_server_info."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import patch

import pytest
import yaml
from pyinfra.api import FunctionCommand
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.util import FakeState, create_host

from core import disk as disk_check, last_good, memory_fit
from core.render import packages_digest, render
from core.stamps import restart_reasons, stamp_path
from facts.model_dir import ModelDir
from facts.systemd import UnitState
from sandbox import hubd
from sandbox.hub import HubServer
from sandbox.tinymodel import EAGLE3_ARCHITECTURE, generate, generate_draft
from tasks import model, service
from tasks.spec import SpecError, build_spec, load_profile
from tasks.spec.profile import DEFAULT_MIN_ACCEPT_LENGTH, LaunchExpectations, ModelProfile
from tests.unit.test_fetch_model import fetch as run_fetch_model
from tests.unit.test_fetch_model_step import COMPLETE, GONE, RUNNING, ScriptedHost
from tests.unit.test_sglang_standin import (READY, SGLANG_VENV_PY, Bed, assert_failed_like_sglang, free_port, http,
                                            venv_python)
from tests.unit.test_step_operations import at_revision_dirs, at_server_venv, HUB_FILES, REVISION, failure, gpus, run, sandbox_spec

ROOT = Path(__file__).resolve().parents[2]
DRAFT_REPO = "sandbox/tiny-kimi-eagle3"
DRAFT_REVISION = "e3a6e3a6e3a6e3a6e3a6e3a6e3a6e3a6e3a6e3a6"
DRAFT_FILES = {"config.json": 700, "model.safetensors": 7_000_000}
MODEL_DIR, DRAFT_DIR = "/srv/models/tiny", "/srv/models/tiny-draft"
# the pinned revisions' own dirs (side by side with other revisions), what the server reads
MODEL_PATH, DRAFT_PATH = f"{MODEL_DIR}-revisions/{REVISION[:12]}", f"{DRAFT_DIR}-revisions/{DRAFT_REVISION[:12]}"
FLAGS = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", DRAFT_PATH,
         "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
SETTINGS = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 4}


def eagle3_spec(**overrides):
    return sandbox_spec(model="sandbox-tiny-eagle3", **overrides)


# --- the profile and the spec ---------------------------------------------------------


def test_the_eagle3_profile_is_sandbox_tiny_plus_its_draft():
    tiny, eagle3 = load_profile("sandbox-tiny"), load_profile("sandbox-tiny-eagle3")
    assert eagle3.draft is not None and tiny.draft is None
    assert eagle3.draft.model_dump() == {"repo": DRAFT_REPO, "revision": DRAFT_REVISION, "algorithm": "EAGLE3",
                                         "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    same = {"name", "description", "draft"}
    assert eagle3.model_dump(exclude=same) == tiny.model_dump(exclude=same)
    assert hubd.draft() == eagle3.draft.model_dump()  # what the sandbox's Hub serves


def test_the_spec_puts_the_draft_beside_the_model_and_gives_sglang_its_flags():
    spec = eagle3_spec()
    assert spec.draft_dir == DRAFT_DIR and spec.speculative_argv == FLAGS
    argv = spec.server_argv
    start = argv.index("--speculative-algorithm")
    assert argv[start:start + len(FLAGS)] == FLAGS and argv.index("--port") < start
    assert eagle3_spec(draft_dir="/data/drafts/kimi").draft_dir == "/data/drafts/kimi"
    assert eagle3_spec(model_dir="/data/kimi/").draft_dir == "/data/kimi-draft"
    plain = sandbox_spec(draft_dir="/data/drafts/kimi")  # no draft in the profile: no draft dir, no flags
    assert plain.draft_dir is None and plain.speculative_argv == [] and "--speculative-algorithm" not in plain.server_argv


@pytest.fixture
def models_dir(tmp_path) -> Path:
    out = tmp_path / "models"
    shutil.copytree(ROOT / "models", out)
    return out


def build_with_draft(models_dir: Path, **draft_changes):
    path = models_dir / "sandbox-tiny-eagle3.yaml"
    raw = yaml.safe_load(path.read_text())
    for key, value in draft_changes.items():
        if value is None:
            raw["draft"].pop(key)
        else:
            raw["draft"][key] = value
    path.write_text(yaml.safe_dump(raw))
    data = sandbox_spec().model_dump(include={"gpu_ids", "tp_size", "server_module"})
    return build_spec("sgc1", {**data, "model": "sandbox-tiny-eagle3"}, environ={}, models_dir=models_dir)


BAD_DRAFT = [
    ("repo", {"repo": "Kimi-K26-eagle3"}, ["draft.repo = 'Kimi-K26-eagle3'", "'org/name'"]),
    ("revision_branch", {"revision": "main"}, ["draft.revision = 'main'", "40 lowercase hex"]),
    ("revision_missing", {"revision": None}, ["draft.revision is required", "the draft's commit"]),
    ("algorithm", {"algorithm": "EAGLE"}, ["draft.algorithm = 'EAGLE'", "allowed: 'EAGLE3'", "the only one"]),
    ("num_steps", {"num_steps": 0}, ["draft.num_steps = 0", "greater than or equal to 1", "an integer >= 1"]),
    ("eagle_topk", {"eagle_topk": 0}, ["draft.eagle_topk = 0", "greater than or equal to 1"]),
    ("num_draft_tokens", {"num_draft_tokens": 0}, ["draft.num_draft_tokens = 0", "greater than or equal to 1"]),
    ("num_steps_text", {"num_steps": "3"}, ["draft.num_steps = '3'", "valid integer"]),
    ("unknown_key", {"draft_model_path": "/x"},
     ["draft.draft_model_path is not a known key", "allowed: repo, revision, algorithm"]),
    ("chain", {"num_draft_tokens": 6}, ["draft.num_draft_tokens = 6: with eagle_topk 1 SGLang uses num_steps + 1 = 4",
                                        "allowed: 4, or eagle_topk > 1"]),
]


@pytest.mark.parametrize("changes, expected", [c[1:] for c in BAD_DRAFT], ids=[c[0] for c in BAD_DRAFT])
def test_a_bad_draft_field_is_refused_naming_the_field_the_value_and_what_is_allowed(models_dir, changes, expected):
    with pytest.raises(SpecError) as caught:
        build_with_draft(models_dir, **changes)
    message = str(caught.value)
    for part in ["sgc1: model 'sandbox-tiny-eagle3' (sandbox-tiny-eagle3.yaml): ", *expected]:
        assert part in message, message


def test_a_good_draft_with_a_tree_builds(models_dir):
    spec = build_with_draft(models_dir, eagle_topk=4, num_draft_tokens=8)  # topk > 1: SGLang keeps the tokens
    assert spec.speculative_argv[-4:] == ["--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8"]


def profile_with_expect(models_dir: Path, name: str, **expect) -> ModelProfile:
    path = models_dir / f"{name}.yaml"
    raw = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**raw, "expect": {**raw.get("expect", {}), **expect}}))
    return load_profile(name, models_dir)


def test_a_draft_is_held_to_min_accept_length_and_without_one_to_the_default(models_dir):
    assert load_profile("sandbox-tiny-eagle3").min_accept_length == DEFAULT_MIN_ACCEPT_LENGTH == 1.5
    assert load_profile("sandbox-tiny").min_accept_length is None  # no draft: no draft gate
    assert profile_with_expect(models_dir, "sandbox-tiny-eagle3", min_accept_length=2.2).min_accept_length == 2.2
    assert profile_with_expect(models_dir, "sandbox-tiny-eagle3", min_accept_length=2).min_accept_length == 2.0
    why = LaunchExpectations.model_fields["min_accept_length"].description
    assert "unset with a draft: 1.5" in why and "1.0 means every draft token was rejected" in why


@pytest.mark.parametrize("name, value, expected", [
    ("sandbox-tiny-eagle3", 1.0, ["expect.min_accept_length = 1.0: Input should be greater than 1",
                                  "allowed: a number > 1.0, only with a draft"]),
    ("sandbox-tiny-eagle3", 0.5, ["expect.min_accept_length = 0.5: Input should be greater than 1"]),
    ("sandbox-tiny-eagle3", "2.0", ["expect.min_accept_length = '2.0': Input should be a valid number",
                                    "allowed: a number > 1.0"]),
    ("sandbox-tiny", 2.0, ["expect.min_accept_length = 2.0: the profile has no draft (speculative decoding)",
                           "allowed: only in a profile with a draft: block; leave it out here"]),
], ids=["nothing_accepted", "below_one", "text", "no_draft"])
def test_a_bad_min_accept_length_is_refused_naming_the_field_the_value_and_what_is_allowed(models_dir, name, value,
                                                                                          expected):
    with pytest.raises(SpecError) as caught:
        profile_with_expect(models_dir, name, min_accept_length=value)
    for part in [f"model {name!r} ({name}.yaml): ", *expected]:
        assert part in str(caught.value), str(caught.value)


@pytest.mark.parametrize("overrides, expected", [
    ({"draft_dir": "/etc/kimi-draft"}, ["draft_dir = '/etc/kimi-draft'", "directly under the system directory /etc",
                                        "e.g. '/srv/models/kimi-k2.6-draft'"]),
    ({"draft_dir": "/srv"}, ["draft_dir = '/srv'", "a top-level directory"]),
    ({"draft_dir": "drafts/kimi"}, ["draft_dir = 'drafts/kimi'", "absolute path"]),
    ({"draft_dir": "/srv/models/tiny/draft"}, ["draft_dir = '/srv/models/tiny/draft'", "lies in model_dir",
                                               "allowed: e.g. '/srv/models/tiny-draft' (the default)"]),
    ({"draft_dir": "/srv/models/tiny"}, ["draft_dir = '/srv/models/tiny'", "a directory of its own"]),
    ({"extra_server_args": ["--speculative-algorithm", "EAGLE"]},
     ["--speculative-algorithm is set by the model profile's draft.algorithm"]),
    ({"extra_server_args": ["--speculative-draft-model=/x"]}, ["--speculative-draft-model is set by draft_dir"]),
    ({"draft": {"repo": DRAFT_REPO}}, ["draft = ", "is a model profile key"]),
])
def test_host_settings_around_the_draft_are_checked(overrides, expected):
    with pytest.raises(SpecError) as caught:
        eagle3_spec(**overrides)
    for part in expected:
        assert part in str(caught.value), str(caught.value)


_PARSE = """
import json, sys
from sglang.srt.server_args import prepare_server_args
args = prepare_server_args(sys.argv[1:])
print(json.dumps({k: getattr(args, k) for k in %r}))
"""


def sglang_parse(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    keys = [*SETTINGS, "speculative_draft_model_path", "model_path", "tp_size"]
    return subprocess.run([venv_python(SGLANG_VENV_PY), "-c", _PARSE % keys, *argv], capture_output=True,
                          text=True, timeout=240, cwd=cwd)


def test_sglangs_own_parser_accepts_the_flags_the_spec_emits(tmp_path):
    # the real sglang 0.5.23 server_args parser (.sandbox/sglang-venv), as server_args_accepted runs it on a host
    argv = eagle3_spec().resolve("12.0", True).server_argv[3:]
    proc = sglang_parse(argv, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parsed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert parsed == {**SETTINGS, "speculative_draft_model_path": DRAFT_PATH, "model_path": MODEL_PATH, "tp_size": 8}
    # positive control: the parser does refuse a flag it does not know
    wrong = [arg.replace("--speculative-eagle-topk", "--speculative-eagle-top-k") for arg in argv]
    refused = sglang_parse(wrong, tmp_path)
    assert refused.returncode == 2 and "unrecognized arguments: --speculative-eagle-top-k" in refused.stderr


# --- the model step: one disk check, two downloads, one no-op -------------------------------


def hub_answer(repo, revision, endpoint, token):
    return dict(DRAFT_FILES) if repo == DRAFT_REPO else dict(HUB_FILES)


def run_op(op, facts, **kwargs):
    return run(op, facts, _hub=hub_answer, **kwargs)


def space(free: int) -> dict:
    one = {"path": "/srv/models", "mount": "/srv/models", "free_bytes": free, "total_bytes": free}
    return {f"path={MODEL_DIR}": one, f"path={DRAFT_DIR}": one}


EMPTY = ModelDir(marker=None, files={}, partial_bytes=0)
MODEL_DONE = ModelDir({"repo": "sandbox/tiny-kimi-int4", "revision": REVISION, "files": HUB_FILES}, dict(HUB_FILES), 0)
DRAFT_DONE = ModelDir({"repo": DRAFT_REPO, "revision": DRAFT_REVISION, "files": DRAFT_FILES}, dict(DRAFT_FILES), 0)


def step_kwargs(spec=None):
    spec = spec or eagle3_spec()
    return dict(repo=spec.profile.repo, revision=spec.profile.revision, local_dir=spec.model_dir,
                python=spec.python_bin, margin_bytes=spec.margin_bytes, endpoint=spec.hf_endpoint,
                draft_repo=DRAFT_REPO, draft_revision=DRAFT_REVISION, draft_dir=spec.draft_dir)


def dirs(model_dir=EMPTY, draft_dir=EMPTY) -> dict:
    return {f"path={MODEL_DIR}": model_dir, f"path={DRAFT_DIR}": draft_dir}


def test_one_disk_check_counts_model_and_draft_together_before_anything_changes():
    # 38.002 MB + 7.0007 MB still to fetch; 48 MB free, 5 MB must stay free: each alone fits, both do not
    facts = {"model_dir.ModelDirState": dirs(), "files.FreeBytes": space(48_000_000)}
    _host, commands = run_op(model.model_downloaded, facts, **step_kwargs())
    message = failure(commands)  # the only command: nothing uploaded, no unit started
    assert message == (
        "model: not enough disk for sandbox/tiny-kimi-int4@0123456789ab and sandbox/tiny-kimi-eagle3@e3a6e3a6e3a6 "
        "together: need 0.045 GB (45.0 MB) more (0.038 GB (38.0 MB) for sandbox/tiny-kimi-int4 + 0.007 GB (7.0 MB) "
        "for sandbox/tiny-kimi-eagle3; of 0.045 GB (45.0 MB)), /srv/models has 0.048 GB (48.0 MB) free and "
        "0.005 GB (5.0 MB) must stay free (size_margin_gb); nothing was downloaded")
    # the preflight's disk check (core/checks.py) says the same; 51 MB hold both (positive control)
    assert preflight_disk(facts) == message.removeprefix("model: ")
    assert preflight_disk({**facts, "files.FreeBytes": space(51_000_000)}) is None


def preflight_disk(facts: dict) -> str | None:
    state = FakeState()
    with ctx_state.use(state), ctx_host.use(create_host(state, facts=at_revision_dirs(facts, eagle3_spec()))), \
            patch.object(disk_check, "hub_files", side_effect=hub_answer):
        return disk_check.disk_shortfall(eagle3_spec())


def test_both_are_fetched_in_sequence_by_the_same_unit_the_model_keeping_the_drafts_room():
    facts = {"model_dir.ModelDirState": dirs(), "files.FreeBytes": space(10**9)}
    _host, commands = run_op(model.model_downloaded, facts, token="hf_secret", **step_kwargs())
    fetches = [c.args[0] for c in commands if isinstance(c, FunctionCommand) and c.function.__name__ == "_fetch"]
    assert [(d.label, d.repo, d.local_dir, d.last) for d in fetches] == [
        ("model", "sandbox/tiny-kimi-int4", MODEL_DIR, False), ("model: draft", DRAFT_REPO, DRAFT_DIR, True)]
    first, second = fetches
    assert "--reserve-bytes 7000700" in first.argv and "--reserve-bytes" not in second.argv
    assert f"--repo {DRAFT_REPO} --revision {DRAFT_REVISION} --local-dir {DRAFT_DIR}" in second.argv
    assert second.expected == DRAFT_FILES and second.need == 7_000_700
    assert all(d.token_file == "/etc/sglang/sglang.hf-token" and "hf_secret" not in d.argv for d in fetches)
    uploads = [str(c) for c in commands if not isinstance(c, FunctionCommand)]
    assert uploads.count("install -m 600 -o root -g root /dev/null /etc/sglang/sglang.hf-token") == 1  # once for both


def test_a_model_on_disk_fetches_only_the_draft_and_both_on_disk_is_a_no_op():
    facts = {"model_dir.ModelDirState": dirs(model_dir=MODEL_DONE), "files.FreeBytes": space(10**9)}
    _host, commands = run_op(model.model_downloaded, facts, **step_kwargs())
    (only,) = [c.args[0] for c in commands if isinstance(c, FunctionCommand)]
    assert only.repo == DRAFT_REPO and only.last and "--reserve-bytes" not in only.argv
    facts["model_dir.ModelDirState"] = dirs(MODEL_DONE, DRAFT_DONE)
    host, commands = run_op(model.model_downloaded, facts, **step_kwargs())
    assert commands == [] and host.noop_description == (
        f"sandbox/tiny-kimi-int4@{REVISION[:12]} is in {MODEL_DIR}, verified; "
        f"draft {DRAFT_REPO}@{DRAFT_REVISION[:12]} is in {DRAFT_DIR}, verified")
    # a draft marker of another revision is not the postcondition
    other = ModelDir({**DRAFT_DONE.marker, "revision": "f" * 40}, dict(DRAFT_FILES), 0)
    facts["model_dir.ModelDirState"] = dirs(MODEL_DONE, other)
    _host, commands = run_op(model.model_downloaded, facts, **step_kwargs())
    assert [c.args[0].repo for c in commands if isinstance(c, FunctionCommand)] == [DRAFT_REPO]


def scripted_fetch(host: ScriptedHost, last: bool, label: str = "model"):
    download = model.Download(repo=DRAFT_REPO, revision=DRAFT_REVISION, local_dir=DRAFT_DIR, argv="python f.py",
                              need=1, expected=DRAFT_FILES, token_file="/etc/sglang/hf-token", label=label, last=last)
    with patch.object(model.time, "sleep", lambda _s: None):
        return model._fetch(SimpleNamespace(), host, download)


def test_the_token_file_stays_for_the_next_download_and_goes_after_the_last_or_a_failure():
    draft_marker = {"repo": DRAFT_REPO, "revision": DRAFT_REVISION, "files": DRAFT_FILES}
    done = {**COMPLETE, "dir": [f"marker: {json.dumps(draft_marker)}",
                                *[f"file: {size} {name}" for name, size in DRAFT_FILES.items()]]}
    kept = ScriptedHost([{"show": [RUNNING, GONE], **done}])
    assert scripted_fetch(kept, last=False) and "rm -f /etc/sglang/hf-token" not in kept.commands
    gone = ScriptedHost([{"show": [RUNNING, GONE], **done}])
    assert scripted_fetch(gone, last=True, label="model: draft") and "rm -f /etc/sglang/hf-token" in gone.commands
    assert any(line.startswith("model: draft: done in ") for line in gone.logged)
    failed = ScriptedHost([{"show": [RUNNING, GONE], "journal": [], "dir": []}])
    assert not scripted_fetch(failed, last=False) and "rm -f /etc/sglang/hf-token" in failed.commands


# --- fetch_model.py and the Hub stand-in serving the draft ---------------------------------


@pytest.fixture(scope="module")
def draft_hub(tmp_path_factory):
    model_info = generate(tmp_path_factory.mktemp("model"), size_mb=1, shards=1)
    draft = generate_draft(tmp_path_factory.mktemp("draft"), commit=DRAFT_REVISION, repo_name=DRAFT_REPO)
    with HubServer({"sandbox/tiny-kimi-int4": model_info, DRAFT_REPO: draft}, ["127.0.0.1"], 0,
                   token="hf_test_token_abc123") as server:
        yield server, draft


def test_fetch_model_downloads_the_draft_and_writes_its_own_marker(draft_hub, tmp_path, monkeypatch):
    server, draft = draft_hub
    monkeypatch.setattr("tests.unit.test_fetch_model.REPO", DRAFT_REPO)
    local_dir = tmp_path / "tiny-draft"
    proc = run_fetch_model(server, draft, local_dir, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    marker = json.loads((local_dir / ".sglang-converge.json").read_text())
    assert (marker["repo"], marker["revision"]) == (DRAFT_REPO, DRAFT_REVISION)
    assert marker["files"] == {f.path: f.size for f in draft.files}
    config = json.loads((local_dir / "config.json").read_text())
    assert config["architectures"] == [EAGLE3_ARCHITECTURE] and 2_000_000 < draft.total_bytes < 10_000_000


def test_fetch_model_keeps_the_reserved_bytes_of_the_next_download_free(draft_hub, tmp_path, monkeypatch):
    server, draft = draft_hub
    monkeypatch.setattr("tests.unit.test_fetch_model.REPO", DRAFT_REPO)
    local_dir = tmp_path / "tiny-draft"
    proc = run_fetch_model(server, draft, local_dir, tmp_path, "--reserve-bytes", str(10**18))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "GB reserved for the next download (the draft model)" in proc.stdout and "REFUSED:" in proc.stdout
    assert not local_dir.exists()


def test_the_hub_cli_serves_the_model_and_the_draft(tmp_path):
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen([sys.executable, "-m", "sandbox.hub", "serve", "--port", "0", "--size-mb", "1",
                             "--shards", "1", "--commit", REVISION, "--repo", "sandbox/tiny-kimi-int4",
                             "--draft-repo", DRAFT_REPO, "--draft-commit", DRAFT_REVISION,
                             "--draft-dir", str(tmp_path / "draft"), "--ready-file", str(ready)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        served = json.loads(ready.read_text())
        assert served["draft"]["repo"] == DRAFT_REPO and served["draft"]["commit"] == DRAFT_REVISION
        files = disk_check._ask_hub(DRAFT_REPO, DRAFT_REVISION, served["url"], None)
        assert set(files.sizes) == {".gitattributes", "README.md", "config.json", "model.safetensors"}
    finally:
        proc.send_signal(signal.SIGTERM)  # the hub this test started, by its own Popen
        proc.wait(timeout=60)


# --- the memory fit, the restart stamp, the last good configuration --------------------------


def test_the_memory_fit_counts_the_draft_whole_on_every_gpu():
    spec = eagle3_spec().resolve("12.0", True)
    facts = {"model_dir.ModelDirState": dirs(), "model_dir.ModelConfig": {f"path={MODEL_DIR}": None}}
    state = FakeState()
    with ctx_state.use(state), ctx_host.use(create_host(state, facts=at_revision_dirs(facts, spec))), \
            patch.object(disk_check, "hub_files", side_effect=hub_answer), \
            patch.object(memory_fit, "hub_config", side_effect=OSError("offline")):
        fit, notes = memory_fit.memory_fit(spec, gpus())
    shards = 38_000_000  # the model's *.safetensors (the Hub's sizes), over TP 8
    assert fit.draft_bytes == 7_000_000 and fit.weights_per_gpu == shards / 8 + 7_000_000
    assert "weights ~0.012 GB (11.8 MB) (0.038 GB (38.0 MB) of safetensors / TP 8 + draft 0.007 GB (7.0 MB) of " \
           "safetensors on every GPU)" in fit.summary()
    # (50 MB + the CUDA/NCCL overhead) x 0.9 = 45 MB per GPU: the model's 4.75 MB share fits, with a 41 MB
    # draft on every GPU it does not
    tight = eagle3_spec(extra_server_args=["--mem-fraction-static", "0.9"])
    gpu = 50_000_000 + memory_fit.GPU_OVERHEAD_BYTES
    small = memory_fit.fit_for(tight, gpu, (shards, "of safetensors"), None, (41_000_000, "of safetensors"))
    assert small.problems() and "(0.038 GB (38.0 MB) / 8 + draft 0.041 GB (41.0 MB))" in small.problems()[0]
    assert not memory_fit.fit_for(tight, gpu, (shards, "of safetensors"), None).problems()
    assert not [note for note in notes if "draft" in note]


def stamp_facts(spec, stamp: dict, draft_revision: str | None):
    unit = UnitState("loaded", "active", "running", 812, "enabled", spec.unit_path, 0, "x", 1)
    draft = ModelDir({"revision": draft_revision}, {}, 0) if draft_revision else EMPTY
    return {"systemd.SystemdUnitState": {f"unit={spec.unit_name}": unit},
            "files.FileText": {f"path={stamp_path(spec)}": json.dumps(stamp),
                               f"path={service.pending_stamp_path(spec)}": None},
            "venv.VenvPackages": {"path=/opt/sglang/venv": {"sglang": "0.5.23"}},
            "model_dir.ModelDirState": dirs(ModelDir({"revision": REVISION}, {}, 0), draft)}


def reasons_with(spec, stamp: dict, draft_revision: str | None) -> list[str]:
    state = FakeState()
    with ctx_state.use(state), ctx_host.use(create_host(state, facts=at_server_venv(stamp_facts(spec, stamp, draft_revision), spec))):
        return restart_reasons(spec, render(spec))


def test_a_new_draft_revision_restarts_the_server_and_says_why():
    spec = eagle3_spec()
    started = {**render(spec).digests(), "packages": packages_digest({"sglang": "0.5.23"}),
               "package_versions": {"sglang": "0.5.23"}, "model_revision": REVISION, "draft_revision": DRAFT_REVISION}
    assert reasons_with(spec, started, DRAFT_REVISION) == []  # as started: no restart
    assert reasons_with(spec, started, "f" * 40) == [f"draft revision {DRAFT_REVISION[:12]} -> ffffffffffff"]
    # tuning changes the unit file (argv), nothing else does
    tuned = eagle3_spec().model_copy(update={"profile": spec.profile.model_copy(
        update={"draft": spec.profile.draft.model_copy(update={"num_steps": 4, "num_draft_tokens": 5})})})
    assert reasons_with(tuned, started, DRAFT_REVISION) == ["unit file changed"]
    # a server without a draft keeps its stamp as it was: no draft key, no reason
    plain = sandbox_spec()
    plain_started = {key: value for key, value in {**started, **render(plain).digests()}.items()
                     if key != "draft_revision"}
    assert reasons_with(plain, plain_started, None) == []


def test_a_draft_revision_changed_since_it_served_is_not_rolled_back_by_files():
    kept = {"unit": "u1", "packages": "p", "model_revision": REVISION, "draft_revision": DRAFT_REVISION}
    now = {**kept, "unit": "u2", "draft_revision": "f" * 40}
    assert last_good.not_by_files_alone(kept, now) == (
        f"the draft model's revision changed since it served ({DRAFT_REVISION[:12]} -> ffffffffffff): its files "
        "alone would not bring it back")


# --- the server stand-in ---------------------------------------------------------------------


@pytest.fixture
def bed(tmp_path):
    b = Bed(tmp_path)
    generate_draft(tmp_path / "draft")
    yield b
    b.cleanup()


def draft_args(bed, draft: Path, port: int) -> list[str]:
    flags = [str(draft) if arg == DRAFT_PATH else arg for arg in FLAGS]
    return ["--model-path", str(bed.model), "--tp-size", "2", "--host", "127.0.0.1", "--port", str(port), *flags]


@pytest.mark.parametrize("parser", ["fallback", "sglang"])
def test_the_stand_in_loads_the_draft_and_reports_the_settings_under_sglangs_names(bed, tmp_path, parser):
    port = free_port()
    python, env = (sys.executable, {}) if parser == "fallback" else (venv_python(SGLANG_VENV_PY),
                                                                     {"SANDBOX_SGLANG_PARSER": None})
    proc = bed.start(draft_args(bed, tmp_path / "draft", port), python=python, **env)
    proc.wait_for(READY, timeout=120)
    for tp in (0, 1):  # every rank loads the draft after the target
        assert f" TP{tp}] Load weight end (draft model). type={EAGLE3_ARCHITECTURE}" in proc.out()
    status, info = http("GET", f"http://127.0.0.1:{port}/get_server_info")
    assert status == 200
    assert {key: info[key] for key in SETTINGS} == SETTINGS
    assert info["speculative_draft_model_path"] == str(tmp_path / "draft")
    proc.p.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0


def standin_module(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "sandbox"))  # as in a guest: beside its siblings
    monkeypatch.setenv("SANDBOX_SGLANG_PARSER", "fallback")
    import sglang_standin

    return sglang_standin


@pytest.mark.parametrize("accept, verify_ct", [(None, 9), ("1.0", 21), ("9", 6), ("0.3", 21)],
                         ids=["default", "nothing_accepted", "above_the_draft_tokens", "below_one"])
def test_the_stand_ins_simulated_acceptance_gives_sglangs_meta_info_consistently(monkeypatch, accept, verify_ct):
    standin = standin_module(monkeypatch)
    if accept is None:
        monkeypatch.delenv("SANDBOX_DRAFT_ACCEPT", raising=False)
    else:
        monkeypatch.setenv("SANDBOX_DRAFT_ACCEPT", accept)
    args = standin.parse_args(["--model-path", "/m", *FLAGS])
    meta = standin.spec_meta_info(args, 21)  # default 2.6; at most the 4 draft tokens; at least 1.0
    assert meta == {"spec_accept_rate": (21 - verify_ct) / (3 * verify_ct), "spec_accept_length": 21 / verify_ct,
                    "spec_num_correct_drafts": 21 - verify_ct, "spec_num_proposed_drafts": 3 * verify_ct,
                    "spec_verify_ct": verify_ct}
    assert standin.spec_meta_info(args, 0) == {}  # sglang: only with verify steps
    assert standin.spec_meta_info(standin.parse_args(["--model-path", "/m"]), 21) == {}  # no draft: no keys


def test_the_stand_in_reports_the_drafts_acceptance_in_generate_and_metrics_like_sglang(bed, tmp_path):
    port = free_port()
    proc = bed.start([*draft_args(bed, tmp_path / "draft", port), "--enable-metrics"], SANDBOX_DRAFT_ACCEPT="1.0")
    proc.wait_for(READY, timeout=120)
    base = f"http://127.0.0.1:{port}"
    status, answer = http("POST", base + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 128}})
    assert status == 200, answer
    meta = answer["meta_info"]
    tokens = meta["completion_tokens"]
    assert {k: v for k, v in meta.items() if k.startswith("spec_")} == {
        "spec_accept_rate": 0.0, "spec_accept_length": 1.0, "spec_num_correct_drafts": 0,
        "spec_num_proposed_drafts": 3 * tokens, "spec_verify_ct": tokens}  # every draft token rejected
    status, text = http("GET", base + "/metrics")
    assert status == 200
    # sglang 0.5.23 observability/metrics_collector.py: the gauge's HELP and TYPE, the scheduler's labels
    assert ("# HELP sglang:spec_accept_length Mean acceptance length of speculative decoding (accepted drafts + "
            "bonus token per forward).\n# TYPE sglang:spec_accept_length gauge\n"
            f'sglang:spec_accept_length{{model_name="{bed.model}",engine_type="unified",tp_rank="0",pp_rank="0",'
            'moe_ep_rank="0"} 1.0\n') in text, text
    proc.p.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    plain_port = free_port()  # without a draft: neither
    plain = bed.start(["--model-path", str(bed.model), "--tp-size", "2", "--host", "127.0.0.1", "--port",
                       str(plain_port), "--enable-metrics"])
    plain.wait_for(READY, timeout=120)
    status, answer = http("POST", f"http://127.0.0.1:{plain_port}/generate", {"text": "hi"})
    assert status == 200 and not [k for k in answer["meta_info"] if k.startswith("spec_")], answer
    assert "spec_accept_length" not in http("GET", f"http://127.0.0.1:{plain_port}/metrics")[1]
    plain.p.send_signal(signal.SIGTERM)
    assert plain.wait(60) == 0


def test_the_stand_in_fails_like_sglang_on_a_missing_draft(bed, tmp_path):
    proc = bed.run(draft_args(bed, tmp_path / "no-draft", free_port()), timeout=120)
    assert_failed_like_sglang(proc, f"OSError: Can't load the configuration of '{tmp_path / 'no-draft'}'")
    # a draft dir without weights fails the same way SGLang's loader does
    (tmp_path / "no-weights").mkdir()
    shutil.copy(tmp_path / "draft" / "config.json", tmp_path / "no-weights" / "config.json")
    proc = bed.run(draft_args(bed, tmp_path / "no-weights", free_port()), timeout=120)
    assert_failed_like_sglang(proc, f"RuntimeError: Cannot find any model weights with `{tmp_path / 'no-weights'}`")


def test_the_sandbox_hub_is_restarted_to_serve_the_draft_of_the_eagle3_profile():
    state = {"repo": "sandbox/tiny-kimi-int4", "revision": REVISION, "format": "pack-quantized", "size_mb": 40,
             "extra": hubd._extra_key()}
    profile = hubd.profile()
    assert not hubd._serves(state, profile, 40)  # a hub started without the draft is restarted
    with_draft = {**state, "draft_repo": DRAFT_REPO, "draft_revision": DRAFT_REVISION}
    assert hubd._serves(with_draft, profile, 40)
    # a hub started before the real-server profiles existed does not serve their repos: restarted
    assert "sandbox/smollm2-135m-instruct@" + "5301" * 10 in hubd._extra_key()
    assert not hubd._serves({**with_draft, "extra": []}, profile, 40)
