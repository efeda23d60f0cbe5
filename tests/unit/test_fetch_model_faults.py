"""remote/fetch_model.py against a Hub stand-in that fails like the real Hub (loopback only): the
real huggingface_hub from the venv, the script run as the deploy runs it (a subprocess), faults
switched on in the stand-in. Retries are bounded and logged, the last line names what failed, the
token never shows, a killed run's partial files are removed, and the bytes the script says it
fetched are the bytes the Hub served."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox.hub import HubServer
from sandbox.tinymodel import generate

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "remote" / "fetch_model.py"
PYTHON = os.environ.get("FETCH_MODEL_PYTHON", sys.executable)  # another venv's python (huggingface_hub 1.x)
REPO = "sandbox/tiny-faults"
TOKEN = "hf_fault_test_token_5f1c2e"
FAST = ["--backoff-s", "0.2", "--read-timeout", "1"]  # keep the waits short; the policy is the same


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return generate(tmp_path_factory.mktemp("model"), size_mb=4, shards=2)


@pytest.fixture
def hub(model):
    with HubServer({REPO: model}, ["127.0.0.1"], 0, token=TOKEN) as server:
        yield server


def fetch(server, model, tmp_path, *extra, token=TOKEN, revision=None, endpoint=None, local_dir=None,
          timeout=60, popen=False, python_argv=None):
    token_file = tmp_path / "hf-token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    for var in ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE", "HF_HUB_DOWNLOAD_TIMEOUT", "HF_HUB_ETAG_TIMEOUT"):
        env.pop(var, None)
    argv = [*(python_argv or [PYTHON, str(SCRIPT)]), "--repo", REPO, "--revision", revision or model.commit,
            "--local-dir", str(local_dir or tmp_path / "dl"), "--endpoint", endpoint or server.url(),
            "--token-file", str(token_file), *extra]
    if popen:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    proc.took = time.monotonic() - started
    return proc


def out(proc) -> str:
    return proc.stdout + proc.stderr


def last_line(proc) -> str:
    return proc.stdout.strip().splitlines()[-1]


def leaks(proc, secret: str) -> bool:
    """The secret anywhere in what the process wrote (stdout and stderr)."""
    return secret in out(proc)


def fetched(proc) -> tuple[int, int]:
    """(file bytes, all bytes) from the script's 'fetched N bytes of files (M bytes in all)' line."""
    m = re.search(r"fetched (\d+) bytes of files \((\d+) bytes in all\)", proc.stdout)
    assert m, proc.stdout
    return int(m.group(1)), int(m.group(2))


def gets(server, name: str):
    return [r for r in server.requests if r.method == "GET" and r.file == name]


def test_500_twice_then_ok_is_retried_and_bytes_match_the_hub(hub, model, tmp_path):
    shard = model.shard_names[0]
    hub.set_faults({"rules": [{"path": shard, "status": 500, "times": 2, "methods": ["GET"]}]})
    proc = fetch(hub, model, tmp_path, *FAST)
    assert proc.returncode == 0, out(proc)
    assert f"attempt 1/5 to download failed: HTTP 500 from the Hub for {shard}; retrying in 0.2 s" in proc.stdout
    assert f"attempt 2/5 to download failed: HTTP 500 from the Hub for {shard}; retrying in 0.4 s" in proc.stdout
    assert "(3 download attempts)" in proc.stdout and last_line(proc).startswith("verified ")
    assert [r.status for r in gets(hub, shard)] == [500, 500, 200]
    assert all(len(gets(hub, f.path)) == 1 for f in model.files if f.path != shard)  # complete files kept
    stats = hub.stats(settle_s=5)
    assert fetched(proc) == (stats["file_bytes"], stats["bytes"]) == (model.total_bytes, stats["bytes"])


def test_500_on_head_is_absorbed_by_huggingface_hubs_own_backoff(hub, model, tmp_path):
    shard = model.shard_names[1]
    hub.set_faults({"rules": [{"path": shard, "status": 500, "times": 2, "methods": ["HEAD"]}]})
    proc = fetch(hub, model, tmp_path, *FAST)
    assert proc.returncode == 0, out(proc)
    assert "attempt 1/" not in proc.stdout and "(1 download attempt)" in proc.stdout
    heads = [r.status for r in hub.requests if r.method == "HEAD" and r.file == shard]
    assert heads == [500, 500, 200]


def test_500_always_gives_up_after_the_attempts_naming_the_file(hub, model, tmp_path):
    shard = model.shard_names[0]
    hub.set_faults({"rules": [{"path": shard, "status": 500, "methods": ["GET"]}]})
    proc = fetch(hub, model, tmp_path, *FAST, "--attempts", "3")
    assert proc.returncode == 7, out(proc)
    assert last_line(proc) == f"FAILED: gave up after 3 attempts to download: HTTP 500 from the Hub for {shard}"
    assert len(gets(hub, shard)) == 3
    size = model.file(shard).size
    assert f"1 file ({size} bytes) not complete: a re-run fetches them" in proc.stdout
    assert "Traceback" not in out(proc)
    assert not (tmp_path / "dl" / ".sglang-converge.json").exists()


@pytest.mark.parametrize("where", ["api", "file"])
def test_429_waits_for_retry_after_then_succeeds(hub, model, tmp_path, where):
    shard = model.shard_names[0]
    if where == "api":  # the file list (model_info): the script's own retry honours Retry-After
        rule = {"path": "*", "kinds": ["api"], "status": 429, "retry_after": 1, "times": 1}
    else:  # a file's GET: huggingface_hub retries 429s itself, after Retry-After (+1 s)
        rule = {"path": shard, "status": 429, "retry_after": 1, "times": 1, "methods": ["GET"]}
    hub.set_faults({"rules": [rule]})
    proc = fetch(hub, model, tmp_path, *FAST)
    assert proc.returncode == 0, out(proc)
    limited = [r for r in hub.requests if r.status == 429]
    assert len(limited) == 1
    after = [r for r in hub.requests if r.started > limited[0].started and r.path == limited[0].path]
    assert after and after[0].status == 200
    assert after[0].started - limited[0].started >= 1.0  # waited at least Retry-After
    if where == "api":
        assert "(Retry-After 1 s); retrying in 1.0 s" in proc.stdout


def test_stalled_body_times_out_and_is_resumed_from_the_last_byte_written(hub, model, tmp_path):
    shard = model.shard_names[0]
    hub.set_faults({"rules": [{"path": shard, "stall": "forever", "after_bytes": 65536, "times": 1}]})
    proc = fetch(hub, model, tmp_path, *FAST)
    assert proc.returncode == 0, out(proc)
    stalled, again = gets(hub, shard)
    # --read-timeout 1 reached huggingface_hub (its default would wait 10 s): the hub saw the client
    # leave the stall within seconds (measured on the hub's side, so no process start is counted in)
    assert stalled.seconds < 6, stalled.seconds
    assert stalled.fault == "stall" and stalled.bytes_sent == 65536 and not stalled.complete
    # the body is written as it arrives (hub_bytes.tune_transfer): the 64 KiB before the stall are on disk
    assert (again.status, again.range) == (206, "bytes=65536-") and again.complete
    stats = hub.stats(settle_s=5)
    assert fetched(proc)[0] == stats["file_bytes"] == model.total_bytes  # not one byte twice


def test_stall_past_huggingface_hubs_own_retries_is_retried_by_the_script(hub, model, tmp_path):
    shard = model.shard_names[0]
    # huggingface_hub tries a stalled body 6 times (1 + 5 resumes, 1 s apart) before it raises
    hub.set_faults({"rules": [{"path": shard, "stall": "forever", "times": 6}]})
    proc = fetch(hub, model, tmp_path, *FAST)
    assert proc.returncode == 0, out(proc)
    assert (f"attempt 1/5 to download failed: read timed out (no byte for 1 s) fetching {shard}; "
            f"retrying in 0.2 s") in proc.stdout
    assert [r.fault for r in gets(hub, shard)] == ["stall"] * 6 + [None]


def test_wrong_token_is_not_retried_and_never_printed(hub, model, tmp_path):
    wrong = "hf_wrong_token_7a9b3c"
    proc = fetch(hub, model, tmp_path, *FAST, token=wrong)
    assert proc.returncode == 5, out(proc)
    assert last_line(proc) == f"FAILED: the Hub refused the token (401) for {REPO}"
    assert "attempt" not in proc.stdout and len(hub.requests) == 1  # not retried
    assert not leaks(proc, wrong) and not leaks(proc, TOKEN)
    assert not (tmp_path / "dl").exists()

    # positive control: the same check finds the token when it is printed
    control = subprocess.run([sys.executable, "-c", "import sys; print('token:', open(sys.argv[1]).read())",
                              str(tmp_path / "hf-token")], capture_output=True, text=True, timeout=30)
    assert leaks(control, wrong)


def test_a_private_repo_without_a_token_says_so(hub, model, tmp_path):
    proc = fetch(hub, model, tmp_path, *FAST, token="")
    assert proc.returncode == 5, out(proc)
    assert last_line(proc).startswith(f"FAILED: the Hub refused access (401) to {REPO} without a token")


def test_a_revision_that_does_not_exist_names_repo_revision_and_how_to_find_one(hub, model, tmp_path):
    missing = "0123456789abcdef0123456789abcdef01234567"
    proc = fetch(hub, model, tmp_path, *FAST, revision=missing)
    assert proc.returncode == 6, out(proc)
    line = last_line(proc)
    assert line.startswith(f"FAILED: revision {missing} does not exist in {REPO}")
    assert "hf models info" in line and f"{hub.url()}/{REPO}/commits/main" in line
    assert len(proc.stdout.strip().splitlines()) == 1 and "Traceback" not in out(proc)
    assert hub.content_gets() == []


def test_an_unreachable_hub_is_retried_then_reported(model, tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = fetch(None, model, tmp_path, *FAST, "--attempts", "2", endpoint=f"http://127.0.0.1:{port}")
    assert proc.returncode == 7, out(proc)
    assert "attempt 1/2 to list the files failed: connection failed" in proc.stdout
    assert last_line(proc).startswith("FAILED: gave up after 2 attempts to list the files: connection failed")


def test_a_killed_runs_partial_files_are_removed_and_the_rerun_counts_what_it_fetched_again(tmp_path):
    # shards above huggingface_hub's 10 MiB write chunk, so the killed run leaves bytes in its .incomplete file
    big = generate(tmp_path / "big", size_mb=24, shards=2)
    shard = big.shard_names[0]
    local_dir = tmp_path / "dl"
    faults = {"rules": [{"path": shard, "stall": "forever", "after_bytes": (10 << 20) + 4096}]}
    with HubServer({REPO: big}, ["127.0.0.1"], 0, token=TOKEN, faults=faults) as hub:
        run = fetch(hub, big, tmp_path, "--read-timeout", "30", popen=True)
        try:
            partial_dir = local_dir / ".cache" / "huggingface" / "download"
            deadline = time.monotonic() + 20
            while not any(p.stat().st_size >= 10 << 20 for p in partial_dir.rglob("*.incomplete")):
                assert run.poll() is None and time.monotonic() < deadline, run.stdout and run.stdout.read()
                time.sleep(0.05)
            others = [f for f in big.files if f.path != shard]
            while not all((local_dir / f.path).exists() for f in others):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            run.send_signal(signal.SIGKILL)  # what an OOM kill or `systemctl kill -s KILL` does
        finally:
            run.kill()
            run.communicate(timeout=10)
        left = list(partial_dir.rglob("*.incomplete"))
        assert left, "SIGKILL leaves huggingface_hub's partial file behind"
        left_bytes = sum(p.stat().st_size for p in left)

        hub.clear_faults()
        hub.stats(reset=True, settle_s=5)
        proc = fetch(hub, big, tmp_path, *FAST)
        assert proc.returncode == 0, out(proc)
        assert len(left) == 1  # the stalled shard's
        assert f"removed 1 partial file ({left_bytes} bytes) that a killed earlier run left" in proc.stdout
        assert not list(partial_dir.rglob("*.incomplete"))
        stats = hub.stats(settle_s=5)
        size = big.file(shard).size
        assert fetched(proc) == (size, stats["bytes"]) and stats["file_bytes"] == size  # only the shard, from zero
        assert stats["files"][shard] == {"bytes": size, "requests": 1, "full": 1}

        # a re-run of a complete dir fetches nothing
        (local_dir / ".sglang-converge.json").unlink()
        hub.stats(reset=True)
        again = fetch(hub, big, tmp_path, *FAST)
        assert again.returncode == 0, out(again)
        assert fetched(again)[0] == 0 and hub.stats(settle_s=5)["file_bytes"] == 0
        assert "removed" not in again.stdout


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare (a tmpfs)")
def test_the_disk_filling_up_mid_download_names_the_files_being_written(hub, model, tmp_path):
    """A real ENOSPC: the local dir is a small tmpfs in a private mount namespace (gone with the
    process), another writer takes its free space while the throttled download runs. The write
    error carries no file name; the script names the files it was fetching and the bytes they got."""
    mount_dir = tmp_path / "disk"
    mount_dir.mkdir()
    size_kb = model.total_bytes // 1024 + 1024  # room for the model: the check before the download passes
    token_file = tmp_path / "hf-token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    script = (
        f"mount -t tmpfs -o size={size_kb}k sglang-test-enospc {mount_dir} || exit 90\n"
        f"{PYTHON} {SCRIPT} --repo {REPO} --revision {model.commit} --local-dir {mount_dir}/dl "
        f"--endpoint {hub.url()} --token-file {token_file} --backoff-s 0.2 --read-timeout 5 & pid=$!\n"
        f"i=0; while [ \"$(du -sb {mount_dir} | cut -f1)\" -lt 10000 ] && [ $i -lt 400 ]; do "
        f"sleep 0.05; i=$((i+1)); done\n"
        f"dd if=/dev/zero of={mount_dir}/filler bs=64k status=none 2>/dev/null\n"
        f"wait $pid\n")
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf-home")}
    env.pop("HF_TOKEN", None)
    hub.throttle_bps = 1_000_000
    try:
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                              capture_output=True, text=True, env=env, timeout=120)
    finally:
        hub.throttle_bps = None
    assert proc.returncode == 3, out(proc)
    failed = last_line(proc)
    assert failed.startswith("FAILED: the disk filled up during the download"), out(proc)
    cut = re.findall(r"(\S+) \((\d+) bytes received\)", failed)
    # huggingface_hub writes a body in 10 MB chunks: a small file's write fails after all of it arrived
    assert cut and all(0 < int(got) <= model.file(name).size for name, got in cut), failed
    assert re.search(r" \d+ bytes free now under ", failed), failed
    assert "Traceback" not in out(proc)
    assert not os.path.ismount(mount_dir)  # the tmpfs lived in the namespace only
