"""Hub and disk faults, end to end: a sandbox host converges preflight, python_env
and model (tests/integration/steps_deploy.py) while the Hub misbehaves the way
the real one does, or while another writer fills the model disk.

Each test asserts the state on the host after the fault (marker, files, partial
files, the download unit, the token file), then that the next run converges and
the one after changes nothing (and fetches nothing).

The Hub is this module's own HubServer on hubd.HUB_ADDRESS at a port of its
own (`--data hf_endpoint=...`), so its faults, token, throttle and byte counts
never reach other tests; rules are scoped to the test host's address
(`clients`, `token_clients`): the controller's own Hub calls are answered.

The host is sgc<SGC_FAULTS_HOST_INDEX> (default 270), removed at the end
unless SGC_FAULTS_KEEP_HOST=1.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

from core.paths import fetch_unit_name, token_file
from sandbox import hosts as sandbox_hosts_api
from sandbox import hubd
from sandbox.hub import HubServer
from sandbox.tinymodel import ModelInfo, generate
from tests.integration.helpers import (BackgroundDeploy, grand_total, pyinfra, remove_host,
                                       wait_until)
from tests.integration.templates import staged_hosts

pytestmark = pytest.mark.sandbox

INDEX = int(os.environ.get("SGC_FAULTS_HOST_INDEX", "270"))  # this module's range: 270-279
STEPS = "preflight,python_env,model"
MARKER = ".sglang-converge.json"  # core.paths.MODEL_MARKER
MODELS_ROOT = "/srv/models"
FETCH_UNIT = fetch_unit_name(  # the bed's revision dir's download unit
    f"{MODELS_ROOT}/{hubd.profile()['served_model_name']}-revisions/{hubd.profile()['revision'][:12]}")
TOKEN_FILE = token_file("sglang")  # the default unit's (sglang.service) token file
# the download's retry settings for these runs (download_* in group_data/all.py; defaults 5, 5 s, 30 s):
# 5 attempts per phase, 1 s after the first failure, doubling; huggingface_hub's read timeout 10 s
ATTEMPTS = 5
BACKOFFS = (1, 2, 4, 8)
READ_TIMEOUT_S = 10
TOKEN_HOLD_S = 10  # Retry-After that keeps the download (and its token file) alive while the host is searched
# where the token must never be (and the positive control must be found)
SECRET_DIRS = ("/etc", "/var", "/srv", "/opt", "/run", "/root", "/tmp", "/usr/local")
TIMINGS: dict[str, float] = {}


@dataclass
class Bed:
    host: sandbox_hosts_api.SandboxHost
    hub: HubServer
    model: ModelInfo
    repo: str
    revision: str
    model_dir: str  # the pinned revision's own dir (<model_dir>-revisions/<revision[:12]>)
    runs: list[tuple[str, float, int]] = field(default_factory=list)  # (what, seconds, rc)

    @property
    def endpoint(self) -> str:
        return self.hub.url()

    @property
    def client(self) -> str:
        """The host's address as the Hub sees it (no NAT between a guest and the machine's address)."""
        return self.host.address

    @property
    def sizes(self) -> dict[str, int]:
        return {f.path: f.size for f in self.model.files}

    @property
    def shard(self) -> str:
        return self.model.shard_names[0]


# ---------------------------------------------------------------------------
# the bed: one host, one Hub, converged once without faults


@pytest.fixture(scope="module")
def bed(tmp_path_factory) -> Iterator[Bed]:
    # staged (tests/integration/templates.py), its models removed: the venv built as after stage.py,
    # the download this module's
    host = staged_hosts([INDEX])[0]
    host.run("find /srv/models -mindepth 1 -maxdepth 1 -exec rm -rf {} +")
    try:
        prof = hubd.profile()
        model = generate(tmp_path_factory.mktemp("hub") / "model", 40, 3, prof["quantization"]["format"],
                         repo_name=prof["repo"], commit=prof["revision"])
        with HubServer({prof["repo"]: model}, [hubd.HUB_ADDRESS]) as hub:
            bed = Bed(host, hub, model, prof["repo"], prof["revision"],
                      f"{MODELS_ROOT}/{prof['served_model_name']}-revisions/{prof['revision'][:12]}")  # the revision's dir
            host.run(f"rm -rf {shlex.quote(bed.model_dir)}")  # a kept host (SGC_FAULTS_KEEP_HOST) starts over too
            t0 = time.monotonic()
            first = deploy(bed, "converge (no faults)")
            assert first.returncode == 0, first.out
            TIMINGS["setup: boot + first converge"] = time.monotonic() - t0
            assert_converged(bed)
            # the host's downloads reach this hub, from the host's own address
            assert bed.hub.stats(settle_s=5)["clients"][bed.client]["file_bytes"] == model.total_bytes
            yield bed
    finally:
        if os.environ.get("SGC_FAULTS_KEEP_HOST") != "1":  # 1: keep it for the next run (debugging)
            remove_host(host)
        if TIMINGS:
            print("\ntest_faults_hub timings:\n" + "\n".join(f"  {k}: {v:.1f} s" for k, v in TIMINGS.items()))


@pytest.fixture(autouse=True)
def _timed(request):
    t0 = time.monotonic()
    yield
    TIMINGS[request.node.name] = time.monotonic() - t0


# ---------------------------------------------------------------------------
# running the deploy


def _argv(bed: Bed) -> list[str]:
    return ["tests/integration/steps_deploy.py", "--data", f"hf_endpoint={bed.endpoint}", "--data",
            f"download_backoff_s={BACKOFFS[0]}", "--data", f"download_read_timeout_s={READ_TIMEOUT_S}"]


def _env(token: str | None) -> dict[str, str]:
    # group_data/all.py: hf_token_env = "HF_TOKEN"; empty means no token
    return {"SGC_STEPS": STEPS, "HF_TOKEN": token or ""}


def deploy(bed: Bed, what: str, token: str | None = None, timeout: float = 400) -> subprocess.CompletedProcess:
    """One run of the steps; .out is stdout + stderr, .seconds its wall time."""
    t0 = time.monotonic()
    proc = pyinfra(*_argv(bed), limit=bed.host.name, env=_env(token), timeout=timeout)
    proc.seconds = time.monotonic() - t0  # type: ignore[attr-defined]
    bed.runs.append((what, proc.seconds, proc.returncode))  # type: ignore[attr-defined]
    return proc


def background_deploy(bed: Bed, token: str | None = None) -> BackgroundDeploy:
    """A deploy run in the background whose output is read as it comes (for faults timed against it)."""
    return BackgroundDeploy(*_argv(bed), limit=bed.host.name, env=_env(token))


@contextmanager
def hub_faults(bed: Bed, spec: dict) -> Iterator[None]:
    """Faults on this module's hub for the length of the block (always cleared after)."""
    bed.hub.set_faults(spec)
    try:
        yield
    finally:
        bed.hub.clear_faults()


def fetched(bed: Bed) -> dict:
    """What the host fetched from the Hub since the last call (and start counting again)."""
    stats = bed.hub.stats(reset=True, settle_s=5)
    return stats["clients"].get(bed.client, {"requests": 0, "bytes": 0, "file_bytes": 0, "files": {}})


def gets(bed: Bed, name: str) -> list:
    """The host's GETs of one file, in order (requests since the last reset_log)."""
    return [r for r in bed.hub.requests if r.client == bed.client and r.method == "GET" and r.file == name]


# ---------------------------------------------------------------------------
# the host's state


def host_state(bed: Bed) -> dict:
    """The model dir as it is on the host: marker, files (outside .cache) with sizes, partial files
    anywhere under it; the download unit; the token file."""
    d = shlex.quote(bed.model_dir)
    out = bed.host.run(
        f"cd {d} 2>/dev/null && {{ "
        f"  [ -f {MARKER} ] && printf 'marker %s\\n' \"$(tr -d '\\n' < {MARKER})\"; "
        f"  find . -path ./.cache -prune -o -type f ! -name '{MARKER}' -printf 'file %s %P\\n'; "
        f"  find . -name '*.incomplete' -printf 'partial %s %P\\n'; }}; "
        f"printf 'unit %s\\n' \"$(systemctl show {FETCH_UNIT} --property=ActiveState --value)\"; "
        f"[ -e {TOKEN_FILE} ] && echo token-file; true").stdout
    state: dict = {"marker": None, "files": {}, "partial": {}, "unit": "", "token_file": False}
    for line in out.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "marker":
            state["marker"] = json.loads(rest)
        elif kind in ("file", "partial"):
            size, _, name = rest.partition(" ")
            state["files" if kind == "file" else "partial"][name] = int(size)
        elif kind == "unit":
            state["unit"] = rest.strip()
        elif kind == "token-file":
            state["token_file"] = True
    return state


def assert_converged(bed: Bed) -> dict:
    state = host_state(bed)
    assert state["marker"] is not None, state
    assert (state["marker"]["repo"], state["marker"]["revision"]) == (bed.repo, bed.revision), state["marker"]
    assert state["marker"]["files"] == bed.sizes
    assert state["files"] == bed.sizes, state  # every file at the Hub's size, nothing else
    assert state["partial"] == {}, state
    assert state["unit"] in ("inactive", ""), state  # the transient unit is gone
    assert not state["token_file"], state
    return state


def assert_nothing_claimed_complete(bed: Bed, state: dict) -> None:
    """After a failed download: no marker, and no file outside .cache at a size other than the Hub's
    (huggingface_hub moves a file into place only once it is complete)."""
    assert state["marker"] is None, state
    wrong = {n: s for n, s in state["files"].items() if bed.sizes.get(n) != s}
    assert wrong == {}, f"files kept at the wrong size: {wrong}"
    assert state["unit"] in ("inactive", "failed", ""), state


def assert_no_change(bed: Bed, what: str) -> subprocess.CompletedProcess:
    fetched(bed)
    again = deploy(bed, what)
    assert again.returncode == 0, again.out
    assert grand_total(again.out)[:2] == (0, 0), again.out
    assert fetched(bed)["file_bytes"] == 0
    assert_converged(bed)
    return again


def drop(bed: Bed, *names: str) -> None:
    """Remove the marker and these files of the model dir: the next run has them to fetch."""
    paths = " ".join(shlex.quote(f"{bed.model_dir}/{n}") for n in (MARKER, *names))
    bed.host.run(f"rm -f {paths}")
    fetched(bed)
    bed.hub.reset_log()


def model_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if "model:" in line]


def show(what: str, run: subprocess.CompletedProcess) -> None:
    """What the operator saw of the model step (without the progress lines), shown with pytest -s."""
    lines = [line.strip() for line in run.out.splitlines()
             if ("model:" in line or "preflight:" in line) and "% " not in line]
    print(f"\n--- {what}: rc {run.returncode}, {run.seconds:.1f} s\n" + "\n".join(lines))  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------
# 1. HTTP 500 on one shard


def test_500_twice_then_ok_is_retried_inside_the_step(bed):
    drop(bed, bed.shard)
    rule = {"path": bed.shard, "status": 500, "times": 2, "methods": ["GET"], "clients": [bed.client]}
    with hub_faults(bed, {"rules": [rule]}):
        run = deploy(bed, "500 x2")
    show("500 x2", run)
    assert run.returncode == 0, run.out
    assert [r.status for r in gets(bed, bed.shard)] == [500, 500, 200]
    assert run.seconds >= BACKOFFS[0] + BACKOFFS[1]  # the backoff happened inside the step
    assert_converged(bed)
    assert fetched(bed)["file_bytes"] == bed.sizes[bed.shard]  # only the dropped shard
    assert_no_change(bed, "500 x2: no change")
    # the operator sees the retries: how many, and each with the file, the status and the wait
    assert "(3 download attempts)" in run.out, "\n".join(model_lines(run.out))
    for n, wait in ((1, BACKOFFS[0]), (2, BACKOFFS[1])):
        line = (f"attempt {n}/{ATTEMPTS} to download failed: HTTP 500 from the Hub for {bed.shard}; "
                f"retrying in {wait:.1f} s")
        assert line in run.out, ("PRODUCT GAP (tasks/model.py): a download that succeeded after retries shows "
                                 f"only its last journal lines, not {line!r}:\n" + "\n".join(model_lines(run.out)))


def test_500_always_fails_bounded_naming_file_and_status_then_converges(bed):
    drop(bed, bed.shard)
    rule = {"path": bed.shard, "status": 500, "methods": ["GET"], "clients": [bed.client]}
    with hub_faults(bed, {"rules": [rule]}):
        run = deploy(bed, "500 always")
    show("500 always", run)
    assert run.returncode != 0, run.out
    # bounded: exactly ATTEMPTS tries of the file, the backoffs and not much more
    assert [r.status for r in gets(bed, bed.shard)] == [500] * ATTEMPTS
    assert sum(BACKOFFS) <= run.seconds < sum(BACKOFFS) + 60, run.seconds
    state = host_state(bed)
    assert_nothing_claimed_complete(bed, state)
    assert bed.shard not in state["files"], state
    assert state["partial"] == {}, state  # no leftover *.incomplete
    assert not state["token_file"], state
    spent = fetched(bed)
    assert spent["files"].get(bed.shard, 0) == 0  # error bodies are not file bytes
    print(f"\n--- 500 always: host after {state}")

    t0 = time.monotonic()
    again = deploy(bed, "500 always: converge")
    assert again.returncode == 0, again.out
    TIMINGS["500 always: converge again"] = time.monotonic() - t0
    assert_converged(bed)
    assert fetched(bed)["file_bytes"] == bed.sizes[bed.shard]  # the shard, once
    assert_no_change(bed, "500 always: no change")
    # the operator sees which file failed, with what, after how many attempts
    assert (f"gave up after {ATTEMPTS} attempts to download: HTTP 500 from the Hub for {bed.shard}"
            in run.out), "\n".join(model_lines(run.out))
    assert "Traceback" not in run.out, run.out


# ---------------------------------------------------------------------------
# 2. 429 with Retry-After


def test_429_with_retry_after_waits_then_completes(bed):
    drop(bed, bed.shard)
    retry_after = 3
    rule = {"path": bed.shard, "status": 429, "retry_after": retry_after, "times": 1, "methods": ["GET"],
            "clients": [bed.client]}
    with hub_faults(bed, {"rules": [rule]}):
        run = deploy(bed, "429 Retry-After")
    show("429 Retry-After", run)
    assert run.returncode == 0, run.out
    limited, then = gets(bed, bed.shard)
    assert (limited.status, limited.fault, then.status) == (429, "429", 200)
    assert then.started - limited.started >= retry_after  # it waited at least Retry-After
    assert_converged(bed)
    assert fetched(bed)["file_bytes"] == bed.sizes[bed.shard]
    assert_no_change(bed, "429: no change")


# ---------------------------------------------------------------------------
# 3. a stalled body


def test_a_stalled_body_times_out_is_resumed_and_completes(bed):
    drop(bed, bed.shard)
    head = 1 << 20
    rule = {"path": bed.shard, "stall": "forever", "after_bytes": head, "times": 1, "clients": [bed.client]}
    with hub_faults(bed, {"rules": [rule]}):
        run = deploy(bed, "stall once")
    show("stall once", run)
    assert run.returncode == 0, run.out
    stalled, *rest = gets(bed, bed.shard)
    assert stalled.fault == "stall" and not stalled.complete and stalled.bytes_sent == head
    assert rest and rest[-1].status in (200, 206) and rest[-1].complete
    # it waited for the read timeout, not for ever (and not much longer)
    assert rest[0].started - stalled.started >= READ_TIMEOUT_S - 1
    assert run.seconds < READ_TIMEOUT_S + 60, run.seconds
    assert_converged(bed)
    got = fetched(bed)["file_bytes"]
    assert bed.sizes[bed.shard] <= got <= bed.sizes[bed.shard] + head  # resumed (206) or fetched again (200)
    assert_no_change(bed, "stall: no change")


# ---------------------------------------------------------------------------
# 4. a wrong HF token


def _find_secret(bed: Bed, needle: str) -> dict[str, list[str]]:
    """Where `needle` is on the host: files under SECRET_DIRS, /proc/*/cmdline and /proc/*/environ.
    The needle goes over ssh's stdin, never into an argv (where the search itself would find it).
    Read-only mounts directly under a searched dir are skipped: nothing on the host can write there
    (the sandbox's pip mirrors /opt/pypi, /opt/pypi-more, /opt/wheels: 7.6 of /opt's 9.8 GB)."""
    paths = " ".join(f"{d}/* {d}/.[!.]*" for d in SECRET_DIRS)
    search = (f"set -- ; for p in {paths}; do [ -e \"$p\" ] || continue; "
              "findmnt -rn -o OPTIONS --mountpoint \"$p\" | grep -qE '(^|,)ro(,|$)' && continue; "
              "set -- \"$@\" \"$p\"; done; "
              "LC_ALL=C grep -rlaF -D skip -f /dev/stdin \"$@\" 2>/dev/null; true")  # -D skip: FIFOs block
    files = bed.host.run(search, input=needle + "\n", timeout=300).stdout.split()
    scan = ("import os, sys\n"
            "needle = sys.stdin.read().strip().encode()\n"
            "me = str(os.getpid())\n"
            "for pid in os.listdir('/proc'):\n"
            "    if not pid.isdigit() or pid == me:\n"
            "        continue\n"
            "    for what in ('cmdline', 'environ'):\n"
            "        try:\n"
            "            data = open(f'/proc/{pid}/{what}', 'rb').read()\n"
            "        except OSError:\n"
            "            continue\n"
            "        if needle in data:\n"
            "            print(f'/proc/{pid}/{what}')\n")
    procs = bed.host.run(f"python3 -c {shlex.quote(scan)}", input=needle + "\n").stdout.split()
    return {"files": files, "procs": procs}


def _fetch_pid(bed: Bed) -> int:
    out = bed.host.run(f"systemctl show {FETCH_UNIT} --property=MainPID --value").stdout.strip()
    return int(out or 0)


def test_a_wrong_token_fails_clearly_and_is_never_written_down(bed):
    right, wrong = f"hf_right_{secrets.token_hex(12)}", f"hf_wrong_{secrets.token_hex(12)}"
    plant = f"sgc-plant-{secrets.token_hex(12)}"
    drop(bed, bed.shard)
    # positive controls: the same searches find a planted string in a file and in a process
    planted = ["/etc/sgc-faults-plant", "/opt/sglang/venv-envs/sgc-faults-plant", "/var/tmp/sgc-faults/plant"]
    bed.host.run(f"install -d /var/tmp/sgc-faults && for f in {' '.join(planted)}; do printf '%s\\n' {plant} > $f; "
                 "done")
    planter = bed.host.run(f"SGC_PLANT={plant} setsid python3 -c 'import time; time.sleep(600)' {plant} "
                           f">/dev/null 2>&1 < /dev/null & echo $!").stdout.strip()
    try:
        t0 = time.monotonic()
        found = _find_secret(bed, plant)
        TIMINGS["token: one search of the host"] = time.monotonic() - t0
        assert sorted(found["files"]) == planted, found
        assert sorted(found["procs"]) == [f"/proc/{planter}/cmdline", f"/proc/{planter}/environ"], found

        # the Hub wants `right` from this host; its first answer is a 429 with Retry-After, which
        # holds the download with the token file in place long enough to look at it
        spec = {"token": right, "token_clients": [bed.client],
                "rules": [{"path": "*", "kinds": ["api"], "status": 429, "retry_after": TOKEN_HOLD_S, "times": 1,
                           "clients": [bed.client]}]}
        with hub_faults(bed, spec):
            bg = background_deploy(bed, token=wrong)
            try:
                bg.wait_for("model: downloading in", timeout=120)
                wait_until(lambda: _fetch_pid(bed) > 0, 60, "the download's process")
                wait_until(lambda: any(r.status == 429 for r in bed.hub.requests if r.client == bed.client),
                           30, "the download's first request")
                held = time.monotonic()
                pid = _fetch_pid(bed)
                during = _find_secret(bed, wrong)
                still = bed.host.run(f"systemctl is-active {FETCH_UNIT}", check=False).stdout.strip()
                searched = time.monotonic() - held
                meta = bed.host.run(f"stat -c '%a %U %G' {TOKEN_FILE}", check=False).stdout.strip()
                cmdline = bed.host.run(f"tr '\\0' ' ' < /proc/{pid}/cmdline", check=False).stdout
            finally:
                run = bg.finish()
                show("wrong token", run)
    finally:
        bed.host.run(f"kill {planter}; rm -rf /var/tmp/sgc-faults {' '.join(planted)}", check=False)

    # during the download: the token is in the root-only token file and nowhere else; the
    # download process was found, and it names the file, not the token
    assert still == "active" and searched < TOKEN_HOLD_S, (still, searched)  # it looked while the file was there
    assert during["files"] == [TOKEN_FILE], during
    assert meta == "600 root root", meta
    assert f"--token-file {TOKEN_FILE}" in cmdline, cmdline
    assert during["procs"] == [], during

    # the operator sees why, the token never
    assert run.returncode != 0, run.out
    assert f"the Hub refused the token (401) for {bed.repo}" in run.out, "\n".join(model_lines(run.out))
    assert wrong not in run.out and right not in run.out
    # a refused token is not retried, and no file was asked for
    asked = [(r.path.split("?")[0].startswith("/api/models/"), r.status) for r in bed.hub.requests
             if r.client == bed.client]
    assert asked == [(True, 429), (True, 401)], asked
    journal = bed.host.run(f"journalctl -u {FETCH_UNIT} -o cat --no-pager", check=False).stdout
    assert "refused the token (401)" in journal and wrong not in journal

    # after: nowhere on the host, the token file gone, nothing claimed complete
    after = _find_secret(bed, wrong)
    assert after == {"files": [], "procs": []}, after
    state = host_state(bed)
    assert not state["token_file"], state
    assert_nothing_claimed_complete(bed, state)

    # the fault gone (no token required), the next run converges, then nothing changes
    again = deploy(bed, "token: converge")
    assert again.returncode == 0, again.out
    assert_converged(bed)
    assert fetched(bed)["file_bytes"] == bed.sizes[bed.shard]
    assert_no_change(bed, "token: no change")


def test_a_wrong_token_is_refused_on_the_controller_before_the_host_is_touched(bed):
    """Where a wrong token meets the real Hub first: the controller's disk check asks the Hub for the
    revision's file sizes with it. The run stops there, and the host never gets the token."""
    wrong = f"hf_wrong_{secrets.token_hex(12)}"
    drop(bed, bed.shard)  # something to download: the disk check asks the Hub
    before = host_state(bed)
    journal = f"journalctl -u {FETCH_UNIT} -o cat --no-pager | wc -l"
    lines_before = bed.host.run(journal).stdout.strip()
    with hub_faults(bed, {"token": f"hf_right_{secrets.token_hex(12)}"}):  # from every client
        run = deploy(bed, "wrong token (controller)", token=wrong)
    show("wrong token (controller)", run)
    assert run.returncode != 0, run.out
    assert f"refused hf_token (401) for {bed.repo}" in run.out, run.out
    assert wrong not in run.out and "Traceback" not in run.out, run.out
    asked = [(r.client, r.status) for r in bed.hub.requests]
    assert asked and all(status == 401 for _, status in asked), asked
    assert bed.client not in {client for client, _ in asked}  # the host asked the Hub nothing
    assert host_state(bed) == before  # nothing changed on the host: no token file, no download unit
    assert bed.host.run(journal).stdout.strip() == lines_before
    assert _find_secret(bed, wrong) == {"files": [], "procs": []}

    again = deploy(bed, "token (controller): converge")
    assert again.returncode == 0, again.out
    assert_converged(bed)
    assert fetched(bed)["file_bytes"] == bed.sizes[bed.shard]
    assert_no_change(bed, "token (controller): no change")


# ---------------------------------------------------------------------------
# 5. the model disk fills up during the download


def test_the_disk_filling_up_during_the_download_fails_cleanly_then_converges(bed):
    # a fresh size-limited filesystem holding the model dir: room for the model and the margin
    # (5 MB) with ~6 MB to spare, until another writer takes it
    size_mib = (bed.model.total_bytes + 5_000_000 + 6_000_000) // (1 << 20) + 1
    sandbox_hosts_api.set_disk(bed.host, MODELS_ROOT, size_mib)
    filler = f"{MODELS_ROOT}/filler"
    try:
        fetched(bed)
        bed.hub.reset_log()
        bed.hub.throttle_bps = 8_000_000  # ~5 s for the model: time to fill the disk under it
        try:
            bg = background_deploy(bed)
            try:
                bg.wait_for("model: downloading in", timeout=120)
                # once some of it landed, another writer takes all the free space
                wait_until(lambda: bed.hub.stats()["clients"].get(bed.client, {}).get("file_bytes", 0) > 8_000_000,
                           30, "8 MB of the download")
                fill = bed.host.run(f"dd if=/dev/zero of={filler} bs=1M status=none; df -B1 --output=avail "
                                    f"{MODELS_ROOT} | tail -n1", check=False)
                assert "No space left on device" in fill.stderr, fill
            finally:
                run = bg.finish()
                show("disk filled", run)
        finally:
            bed.hub.throttle_bps = None
        assert run.returncode != 0, run.out
        lines = "\n".join(model_lines(run.out))
        assert "No space left on device" in run.out, lines
        assert "Traceback" not in run.out, run.out
        state = host_state(bed)
        assert_nothing_claimed_complete(bed, state)
        assert not state["token_file"], state
        spent = fetched(bed)

        # the space freed, the next run converges, then nothing changes
        bed.host.run(f"rm -f {filler}")
        t0 = time.monotonic()
        again = deploy(bed, "disk: converge")
        assert again.returncode == 0, again.out
        TIMINGS["disk: converge again"] = time.monotonic() - t0
        assert_converged(bed)
        refetched = fetched(bed)["file_bytes"]
        print(f"\n--- disk filled: host after {state}; fetched during the failed run {spent['file_bytes']}; "
              f"again {refetched}")
        kept = sum(bed.sizes[n] for n in state["files"])
        assert refetched == bed.model.total_bytes - kept, (refetched, kept, spent)
        assert_no_change(bed, "disk: no change")
        # why, in the line that says the download failed: ENOSPC naming the file it was writing and the free bytes
        failed = [line for line in model_lines(run.out) if "FAILED:" in line and "No space left" in line]
        assert any(f in line and re.search(r"\d+ bytes free now", line) for line in failed for f in bed.sizes), lines
    finally:
        bed.host.run(f"rm -f {filler}; umount {MODELS_ROOT}", check=False)
