"""The model step's side of the download: it succeeds only on the host's verified marker for the wanted
revision, reads how the unit ended from systemd (a signal, or fetch_model's exit code and its meaning),
fails on any other end (no second round: fetch_model retried already), and says what a lost host means (tasks/model.py's _fetch, with a
scripted host). And the controller's question to the Hub (core/disk.py hub_files) against the Hub
stand-in on loopback: a revision or repo the Hub does not have, a refused token and a Hub that stays
down each give one clear line (HubError), transient failures are retried, and the preflight and the
model step refuse with that line before any change."""

from __future__ import annotations

import json
import socket
import time
from types import SimpleNamespace
from unittest.mock import patch

import pytest
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.util import FakeState, create_host

from core import disk as disk_check
from core.paths import MODEL_MARKER, fetch_unit_name
from core.runstate import run_state
from facts.model_dir import ModelDir
from sandbox.hub import HubServer
from sandbox.tinymodel import generate
from tasks import model
from tests.unit.test_step_operations import EMPTY_DIR, at_revision_dirs, disk, failure, model_kwargs, sandbox_spec

REPO = "sandbox/tiny-step"
REVISION = "0123456789abcdef0123456789abcdef01234567"
FILES = {"config.json": 2_000, "model-00001-of-00002.safetensors": 20_000_000,
         "model-00002-of-00002.safetensors": 18_000_000}
MARKER = {"repo": REPO, "revision": REVISION, "files": FILES}
UNIT = fetch_unit_name("/srv/models/tiny")  # the download unit of fetch()'s dir
GONE = {"LoadState": "not-found", "ActiveState": "inactive", "Result": "success", "ExecMainCode": "0",
        "ExecMainStatus": "0", "InvocationID": ""}


def unit(active: str, result: str = "success", code: str = "0", status: str = "0") -> dict[str, str]:
    return {"LoadState": "loaded", "ActiveState": active, "Result": result, "ExecMainCode": code,
            "ExecMainStatus": status, "InvocationID": "abc123"}


RUNNING = unit("active")
KILLED = unit("failed", "signal", "2", "9")


def exited(status: int) -> dict[str, str]:
    return unit("failed", "exit-code", "1", str(status))


def dir_lines(marker: dict | None, files: dict[str, int], partial: int = 0) -> list[str]:
    """What ModelDirState's command prints for a model dir."""
    lines = [f"marker: {json.dumps(marker)}"] if marker else []
    lines += [f"file: {size} {name}" for name, size in files.items()]
    return lines + ([f"partial: {partial} .cache/huggingface/download/x.incomplete"] if partial else [])


class ScriptedHost:
    """The host as _fetch sees it: each run of the unit ("life") is a list of what `systemctl show`
    answers while it runs (the last one sticks), the journal it leaves and the model dir after it."""

    def __init__(self, lives: list[dict], before: dict[str, str] | None = None, lose_after: int | None = None,
                 before_dir: list[str] | None = None, start_refused: bool = False):
        self.lives, self.before, self.lose_after = lives, before or GONE, lose_after
        self.before_dir = before_dir or []  # the model dir before any start (a sibling may have filled it)
        self.start_refused = start_refused  # systemd-run refused: a sibling started the unit a moment before
        self.life = -1
        self.shows: list[dict[str, str]] = []
        self.commands: list[str] = []
        self.logged: list[str] = []
        self.name = "sgc-test"

    def run_shell_command(self, command, print_output=False, print_input=False):
        text = command.get_raw_value() if hasattr(command, "get_raw_value") else str(command)
        self.commands.append(text)
        if self.lose_after is not None and len(self.commands) > self.lose_after:
            raise OSError("Socket is closed")
        if text.startswith("systemd-run"):
            self.life += 1
            self.shows = list(self.lives[self.life]["show"])
            if self.start_refused:
                return False, SimpleNamespace(stdout_lines=[
                    "Failed to start transient service unit: Unit x.service was already loaded or has a fragment file."])
            return True, SimpleNamespace(stdout_lines=[])
        if text.startswith("systemctl show"):
            props = self.before if self.life < 0 else (self.shows.pop(0) if len(self.shows) > 1 else self.shows[0])
            return True, SimpleNamespace(stdout_lines=[f"{k}={v}" for k, v in props.items()])
        if text.startswith("du -sb"):
            return True, SimpleNamespace(stdout_lines=["4096"])
        if "journalctl" in text:
            return True, SimpleNamespace(stdout_lines=self.lives[self.life]["journal"])
        if MODEL_MARKER in text:
            return True, SimpleNamespace(stdout_lines=self.lives[self.life]["dir"] if self.life >= 0 else self.before_dir)
        return True, SimpleNamespace(stdout_lines=[])

    def log(self, message, log_func=None):
        self.logged.append(message)

    def log_styled(self, message, fg=None, log_func=None):
        self.logged.append(message)

    def starts(self) -> int:
        return sum(1 for c in self.commands if c.startswith("systemd-run") and not self.start_refused)


def fetch(host: ScriptedHost, token_file: str | None = None) -> tuple[bool, object]:
    download = model.Download(repo=REPO, revision=REVISION, local_dir="/srv/models/tiny", argv="python fetch_model.py",
                              need=38_002_000, expected=FILES, token_file=token_file)
    state = SimpleNamespace()
    with patch.object(model.time, "sleep", lambda _s: None):
        ok = model._fetch(state, host, download)
    return ok, run_state(state).first_failure(host.name)


COMPLETE = {"dir": dir_lines(MARKER, FILES),
            "journal": ["fetched 18000000 bytes of files (18004000 bytes in all) from the Hub in this run "
                        "(1 download attempt)", "verified 3 files, 38002000 bytes, downloaded 18000000 bytes in 2.0 s"]}


def test_a_killed_unit_fails_the_step_naming_the_signal_and_what_is_missing():
    # the incident: systemctl kill -s KILL mid-way; the host holds no marker and one shard
    journal = ["need 38002000 bytes (0.04 GB) of 38002000; free ...",
               f"{UNIT}: Main process exited, code=killed, status=9/KILL",
               f"{UNIT}: Failed with result 'signal'."]
    host = ScriptedHost([{"show": [RUNNING, RUNNING, KILLED], "journal": journal,
                          "dir": dir_lines(None, {"config.json": 2_000}, partial=10_485_760)}])
    ok, failed = fetch(host)
    assert ok is False and failed is not None
    assert failed.step == "model"
    assert failed.cause.startswith(f"model: {UNIT} was killed by SIGKILL (Result=signal): "
                                   f"{UNIT}: Main process exited, code=killed, status=9/KILL")
    assert "no marker (.sglang-converge.json) for sandbox/tiny-step@0123456789ab" in failed.cause
    assert "2 of 3 files (0.038 GB (38.0 MB) of 0.038 GB (38.0 MB)) still to fetch" in failed.cause
    assert host.starts() == 1  # a kill is not undone by the step: the operator (or the OOM killer) meant it
    assert not any(line.startswith("model: done") for line in host.logged)
    # positive control: the same host story with the marker there is a success
    ok, failed = fetch(ScriptedHost([{"show": [RUNNING, KILLED], "journal": journal, "dir": dir_lines(MARKER, FILES)}]))
    assert ok is True and failed is None


def test_unit_success_without_the_marker_is_a_failure():
    # what the step used to trust: systemd's "success" (or a unit gone, with systemctl's defaults)
    for end in (unit("inactive"), GONE):
        host = ScriptedHost([{"show": [RUNNING, end], "journal": [], "dir": dir_lines(None, FILES)}])
        ok, failed = fetch(host)
        assert ok is False and "no marker (.sglang-converge.json)" in failed.cause
        assert "0 of 3 files (0.000 GB (0.0 MB) of 0.038 GB (38.0 MB)) still to fetch" in failed.cause


def test_a_marker_of_another_revision_or_a_short_file_is_not_the_postcondition():
    other = {**MARKER, "revision": "f" * 40}
    host = ScriptedHost([{"show": [RUNNING, unit("inactive")], "journal": [], "dir": dir_lines(other, FILES)}])
    ok, failed = fetch(host)
    assert ok is False and f"the marker is for {REPO}@ffffffffffff" in failed.cause
    short = {**FILES, "model-00002-of-00002.safetensors": 17_999_999}
    host = ScriptedHost([{"show": [RUNNING, unit("inactive")], "journal": [], "dir": dir_lines(MARKER, short)}])
    ok, failed = fetch(host)
    assert ok is False and "the marker's files are not all on disk at their size" in failed.cause


def test_an_exit_code_is_named_with_its_meaning_and_the_failed_line():
    journal = ["VERIFY FAILED: size mismatch: model-00001-of-00002.safetensors has 5 bytes, the Hub says 20000000"]
    host = ScriptedHost([{"show": [RUNNING, exited(4)], "journal": journal, "dir": dir_lines(None, FILES)}])
    ok, failed = fetch(host)
    assert ok is False and host.starts() == 1  # 4 is not retried
    assert failed.cause.startswith(f"model: {UNIT} exited with code 4: verification failed: "
                                   "VERIFY FAILED: size mismatch: model-00001-of-00002.safetensors has 5 bytes")
    assert failed.detail == tuple(journal)


def test_exit_7_fails_the_step_once_and_a_success_shows_the_refetched_bytes():
    # fetch_model already tried 5 times with backoff: the step does not add another round
    gave_up = {"show": [RUNNING, exited(7)], "journal": ["FAILED: gave up after 5 attempts to download: HTTP 503"],
               "dir": dir_lines(None, {"config.json": 2_000})}
    host = ScriptedHost([gave_up, {"show": [RUNNING, GONE], **COMPLETE}])
    ok, failed = fetch(host)
    assert ok is False and host.starts() == 1
    assert "exited with code 7: gave up after repeated transient Hub failures: FAILED: gave up" in failed.cause
    host = ScriptedHost([{"show": [RUNNING, GONE], **COMPLETE}])
    ok, failed = fetch(host)
    assert ok is True and failed is None
    assert "model: fetched 18000000 bytes of files (18004000 bytes in all) from the Hub in this run " \
           "(1 download attempt)" in host.logged
    assert "model: verified 3 files, 38002000 bytes, downloaded 18000000 bytes in 2.0 s" in host.logged


def test_a_running_download_is_attached_to_not_started_again():
    host = ScriptedHost([{"show": [RUNNING, GONE], **COMPLETE}], before=RUNNING)
    host.life, host.shows = 0, [RUNNING, GONE]
    ok, _failed = fetch(host)
    assert ok is True and host.starts() == 0
    assert f"model: attaching to the download already running ({UNIT})" in host.logged


def test_a_lost_host_fails_the_step_with_what_a_rerun_does_and_the_token_file_is_removed():
    host = ScriptedHost([{"show": [RUNNING], "journal": [], "dir": []}], lose_after=6)
    ok, failed = fetch(host, token_file="/etc/sglang/hf-token")
    assert ok is False
    assert failed.cause.startswith(f"model: lost the host while {UNIT} ran (OSError: Socket is closed)")
    assert "after a reboot a re-run fetches only what is missing" in failed.cause
    ok, _failed = fetch(ScriptedHost([{"show": [RUNNING, GONE], **COMPLETE}]), token_file="/etc/sglang/hf-token")
    assert ok  # and on success the token file goes too:
    host = ScriptedHost([{"show": [RUNNING, GONE], **COMPLETE}])
    fetch(host, token_file="/etc/sglang/hf-token")
    assert "rm -f /etc/sglang/hf-token" in host.commands


@pytest.mark.parametrize("props, words, code", [
    (KILLED, "was killed by SIGKILL (Result=signal)", None),
    (unit("failed", "signal", "2", "15"), "was killed by SIGTERM (Result=signal)", None),
    (unit("failed", "core-dump", "3", "6"), "was killed by SIGABRT (core dumped) (Result=core-dump)", None),
    (exited(3), "exited with code 3: not enough disk (refused before the download, or the disk filled up during it)", 3),
    (exited(5), "exited with code 5: the Hub refused the token", 5),
    (exited(6), "exited with code 6: the repo or the revision does not exist on the Hub", 6),
    (exited(7), "exited with code 7: gave up after repeated transient Hub failures", 7),
    (exited(1), "exited with code 1: an error that is not retried", 1),
    (exited(2), "exited with code 2: not a code fetch_model.py uses", 2),
    (unit("inactive"), "exited 0", 0),
    (GONE, "ended and systemd kept no result (it unloads a unit that exited 0; a reboot forgets it)", None),
])
def test_unit_outcome_reads_systemds_result(props, words, code):
    assert model.unit_outcome(props) == (words, code)


# --- the controller asks the Hub (core/disk.py) -------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return generate(tmp_path_factory.mktemp("model"), size_mb=1, shards=2)


@pytest.fixture
def hub_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(disk_check, "HUB_BACKOFF_S", 0.05)
    disk_check._HUB_ANSWERS.clear()
    yield
    disk_check._HUB_ANSWERS.clear()


@pytest.fixture
def hub(tiny, hub_env):
    with HubServer({REPO: tiny}, ["127.0.0.1"], 0, token="hf_good") as server:
        yield server


@pytest.fixture
def open_hub(tiny, hub_env):
    """A Hub that needs no token (the sandbox spec has none)."""
    with HubServer({REPO: tiny}, ["127.0.0.1"], 0) as server:
        yield server


def hub_error(hub, revision: str, repo: str = REPO, token: str | None = "hf_good") -> disk_check.HubError:
    with pytest.raises(disk_check.HubError) as caught:
        disk_check.hub_files(repo, revision, hub.url(), token)
    assert "\n" not in str(caught.value) and "Traceback" not in str(caught.value)
    return caught.value


def test_hub_files_of_a_revision_that_exists(hub, tiny):
    assert disk_check.hub_files(REPO, tiny.commit, hub.url(), "hf_good") == {f.path: f.size for f in tiny.files}


def test_a_revision_the_hub_does_not_have_names_repo_revision_and_how_to_find_one(hub, tiny):
    missing = "fedcba9876543210fedcba9876543210fedcba98"
    err = hub_error(hub, missing)
    assert str(err) == (f"{REPO}@fedcba987654: revision {missing} not found on the Hub ({hub.url()}, HTTP 404): "
                        f"pin a commit that exists, e.g. from `HF_ENDPOINT={hub.url()} hf models info {REPO} "
                        f"--expand sha` or {hub.url()}/{REPO}/commits/main")
    assert not err.transient and len(hub.requests) == 1  # not retried
    hub_error(hub, missing)
    assert len(hub.requests) == 1  # and remembered: a fleet asks once


def test_a_repo_the_hub_does_not_have_and_refused_tokens(hub, tiny):
    assert str(hub_error(hub, tiny.commit, repo="sandbox/nope")) == (
        f"sandbox/nope@{tiny.commit[:12]}: repo sandbox/nope not found on the Hub ({hub.url()}, HTTP 404), or "
        f"hf_token cannot see it: check the profile's repo ({hub.url()}/sandbox/nope)")
    assert str(hub_error(hub, tiny.commit, token=None)) == (
        f"{REPO}@{tiny.commit[:12]}: the Hub ({hub.url()}) refused access (401) without a token: a private or "
        f"gated repo needs hf_token (or the repo {REPO} does not exist)")
    assert str(hub_error(hub, tiny.commit, token="hf_wrong")) == (
        f"{REPO}@{tiny.commit[:12]}: the Hub ({hub.url()}) refused hf_token (401) for {REPO}")


def test_5xx_and_429_are_retried_then_succeed(hub, tiny):
    hub.set_faults({"rules": [{"path": "*", "kinds": ["api"], "status": 503, "times": 1},
                              {"path": "*", "kinds": ["api"], "status": 429, "retry_after": 1, "times": 1}]})
    started = time.monotonic()
    assert disk_check.hub_files(REPO, tiny.commit, hub.url(), "hf_good") == {f.path: f.size for f in tiny.files}
    assert [r.status for r in hub.requests] == [503, 429, 200]
    assert time.monotonic() - started >= 1.0  # waited for Retry-After


def test_a_hub_that_stays_down_is_a_transient_error_after_the_attempts(hub, tiny):
    hub.set_faults({"rules": [{"path": "*", "kinds": ["api"], "status": 500}]})
    err = hub_error(hub, tiny.commit)
    assert err.transient and len(hub.requests) == disk_check.HUB_ATTEMPTS == 3
    assert str(err) == (f"{REPO}@{tiny.commit[:12]}: HTTP 500 from the Hub ({hub.url()}) (3 attempts): the Hub or "
                        f"the way to it is down; try again later")
    hub.clear_faults()  # not remembered: the next question asks again
    assert disk_check.hub_files(REPO, tiny.commit, hub.url(), "hf_good")


def test_an_unreachable_hub_is_retried_then_named(hub, tiny):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # nobody listens
    with pytest.raises(disk_check.HubError) as caught:
        disk_check.hub_files(REPO, tiny.commit, url, None)
    assert caught.value.transient
    assert str(caught.value).startswith(f"{REPO}@{tiny.commit[:12]}: cannot reach the Hub ({url}): ConnectError: ")
    assert "(3 attempts)" in str(caught.value)


def _run_op(op, facts, **kwargs):
    state = FakeState()
    host = create_host(state, facts=facts)
    with ctx_state.use(state), ctx_host.use(host):
        return list(op._inner(**kwargs))


def test_preflight_and_the_model_step_refuse_a_missing_revision_before_any_change(open_hub, tiny):
    # the preflight's disk check (core/checks.py host_problems lists what disk_shortfall says) and the model
    # step's operation: the same one line, before any command
    hub = open_hub
    missing = "fedcba9876543210fedcba9876543210fedcba98"
    spec = sandbox_spec().model_copy(update={"hf_endpoint": hub.url()})
    spec = spec.model_copy(update={"profile": spec.profile.model_copy(update={"repo": REPO, "revision": missing})})
    facts = {"model_dir.ModelDirState": EMPTY_DIR, "files.FreeBytes": disk(10**9)}
    state = FakeState()
    with ctx_state.use(state), ctx_host.use(create_host(state, facts=at_revision_dirs(facts, spec))):
        problem = disk_check.disk_shortfall(spec)
    line = f"{REPO}@fedcba987654: revision {missing} not found on the Hub ({hub.url()}, HTTP 404): pin a commit"
    assert problem is not None and problem.startswith(line), problem
    commands = _run_op(model.model_downloaded, facts, **model_kwargs(spec))
    assert failure(commands).startswith(f"model: {line}")
    # positive control: the revision that exists passes both
    real = spec.model_copy(update={"profile": spec.profile.model_copy(update={"revision": tiny.commit})})
    with ctx_state.use(state), ctx_host.use(create_host(state, facts=at_revision_dirs(facts, real))):
        assert disk_check.disk_shortfall(real) is None
    assert _run_op(model.model_downloaded, facts, **model_kwargs(real))[-1].function.__name__ == "_fetch"


def test_a_complete_model_dir_needs_no_hub(hub, tiny):
    # the marker says it is there: the Hub is not asked (a host keeps serving while the Hub is down)
    hub.set_faults({"rules": [{"path": "*", "status": 500}]})
    files = {f.path: f.size for f in tiny.files}
    facts = {"model_dir.ModelDirState": {"path=/srv/models/tiny": ModelDir(
        {"repo": REPO, "revision": tiny.commit, "files": files}, dict(files), 0)}}
    spec = sandbox_spec().model_copy(update={"hf_endpoint": hub.url()})
    commands = _run_op(model.model_downloaded, facts, **{**model_kwargs(spec), "repo": REPO, "revision": tiny.commit})
    assert commands == [] and hub.requests == []
