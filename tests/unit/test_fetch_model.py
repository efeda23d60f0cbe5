"""remote/fetch_model.py against the Hub stand-in on loopback: the disk check
refuses before writing, the token comes from a file, the result is verified
and recorded in the marker that makes the deploy's next run a no-op."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.hub import HubServer
from sandbox.tinymodel import generate

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "remote" / "fetch_model.py"
REPO = "sandbox/tiny-kimi-int4"
TOKEN = "hf_test_token_abc123"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    info = generate(tmp_path_factory.mktemp("model"), size_mb=4, shards=2)
    with HubServer({REPO: info}, ["127.0.0.1"], 0, token=TOKEN) as server:
        yield server, info


def fetch(server, info, local_dir, tmp_path, *extra, token=TOKEN):
    token_file = tmp_path / "hf-token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_TOKEN", None)
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--repo", REPO, "--revision", info.commit, "--local-dir", str(local_dir),
         "--endpoint", server.url(), "--token-file", str(token_file), *extra],
        capture_output=True, text=True, env=env, timeout=120,
    )


def test_refuses_before_writing_when_the_margin_does_not_fit(hub, tmp_path):
    server, info = hub
    local_dir = tmp_path / "models" / "tiny"
    proc = fetch(server, info, local_dir, tmp_path, "--margin-bytes", str(10**18))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"needs {info.total_bytes / 1e9:.2f} GB more" in proc.stdout
    assert not local_dir.exists()
    assert server.content_gets() == []  # not one byte of the weights was fetched


def test_downloads_verifies_and_writes_the_marker(hub, tmp_path):
    server, info = hub
    local_dir = tmp_path / "tiny"
    proc = fetch(server, info, local_dir, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verified" in proc.stdout and TOKEN not in proc.stdout + proc.stderr
    # what the deploy shows of the journal
    fetched_line, by_digest_line, verified_line = proc.stdout.strip().splitlines()[-3:]
    assert verified_line.startswith(f"verified {len(info.files)} files, {info.total_bytes} bytes, downloaded ")
    assert by_digest_line.startswith(f"verified {len(info.files)} files by digest (sha256 for LFS, git blob sha1 "
                                     f"for the others), {info.total_bytes} bytes in ")
    assert fetched_line.startswith(f"fetched {info.total_bytes} bytes of files (")
    marker = json.loads((local_dir / ".sglang-converge.json").read_text())
    assert marker["repo"] == REPO and marker["revision"] == info.commit
    assert marker["files"] == {path: size for path, size, _sha in info.files}
    assert set(marker["digests"]) == set(marker["files"])
    for path, size, _sha in info.files:
        assert (local_dir / path).stat().st_size == size


def test_a_wrong_token_fails_and_writes_no_marker(hub, tmp_path):
    server, info = hub
    local_dir = tmp_path / "tiny"
    proc = fetch(server, info, local_dir, tmp_path, token="hf_wrong")
    assert proc.returncode == 5, proc.stdout + proc.stderr  # the Hub refused the token: not retried
    assert proc.stdout.strip().splitlines()[-1] == f"FAILED: the Hub refused the token (401) for {REPO}"
    assert not (local_dir / ".sglang-converge.json").exists()
    assert "hf_wrong" not in proc.stdout + proc.stderr


def test_verify_names_a_missing_shard_and_a_size_mismatch(tmp_path):
    sys.path.insert(0, str(ROOT / "remote"))
    import fetch_model

    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "s1.safetensors"}}))
    (tmp_path / "config.json").write_text("{}")
    problems = fetch_model.verify(tmp_path, {"config.json": 5, "s1.safetensors": 10,
                                             "model.safetensors.index.json": 51})
    assert "size mismatch: config.json has 2 bytes, the Hub says 5" in problems
    assert "missing: s1.safetensors" in problems
    assert "shard named in the safetensors index is missing: s1.safetensors" in problems


def _fetch_module():
    """hub_failures, imported as fetch_model.py imports it on the host: from the script's directory."""
    sys.path.insert(0, str(ROOT / "remote"))
    import hub_failures

    return hub_failures


def test_a_disk_filling_up_names_the_files_in_flight_as_huggingface_hub_lays_them_out(tmp_path):
    """ENOSPC from a write carries no file name: the partial files huggingface_hub left say which
    repo files were being written. The layout comes from huggingface_hub's own path function."""
    import errno

    from huggingface_hub._local_folder import get_local_download_paths

    fetch = _fetch_module()
    in_flight = {"model-00001-of-00002.safetensors": 4096, "sub/dir/tokenizer.json": 7}
    for name, size in in_flight.items():
        paths = get_local_download_paths(tmp_path, name)
        paths.lock_path.touch()
        paths.incomplete_path("0123abcd").write_bytes(b"x" * size)
    done = get_local_download_paths(tmp_path, "config.json")  # complete: metadata, no partial file
    done.metadata_path.write_text("x")
    (tmp_path / "config.json").write_text("{}")

    assert fetch.files_in_flight(tmp_path) == in_flight
    failure = fetch.disk_full(OSError(errno.ENOSPC, "No space left on device"), str(tmp_path))
    assert failure.code == fetch.EXIT_DISK
    assert "writing model-00001-of-00002.safetensors (4096 bytes received)" in failure.message
    assert "sub/dir/tokenizer.json (7 bytes received)" in failure.message
    assert re.search(r"\d+ bytes free now", failure.message)
    # nothing in flight (the error came from elsewhere): still says what it knows
    empty = fetch.disk_full(OSError(errno.ENOSPC, "No space left on device"), str(tmp_path / "none"))
    assert "writing a file;" in empty.message
