"""remote/fetch_model.py --seed-from: the revision copied from a peer with the real rsync, then checked
against the Hub stand-in's digests (loopback, the real huggingface_hub, the script as a subprocess).

The "peer" is this machine: a stand-in `ssh` first on PATH records its arguments and runs the remote
command (rsync's server side) locally, as sshd would on the peer; it can also fail like an
unreachable peer. What the tests show: a complete peer costs the Hub no file bytes; a file the peer
holds corrupted is caught by its digest and fetched again from the Hub; an unreachable peer or one
that lacks files is logged with rsync's exit code and reason and the Hub supplies the rest; the
copy is pinned to the key and host keys given, never prompts, and copies no stray file."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from tests.unit.test_fetch_model_digests import flip_in_place
from tests.unit.test_fetch_model_faults import FAST, fetch, hub, model, out  # noqa: F401 (fixtures)

pytestmark = pytest.mark.skipif(shutil.which("rsync") is None, reason="needs rsync (make setup installs it)")

MARKER = ".sglang-converge.json"
FAKE_SSH = r"""#!/bin/sh
# the peer's sshd, on this machine: note the arguments, then run the remote command here
printf '%s\n' "$*" >> "$FAKE_SSH_LOG"
if [ -n "$FAKE_SSH_FAIL" ]; then echo "$FAKE_SSH_FAIL" >&2; exit 255; fi
while [ $# -gt 0 ]; do
  case "$1" in -i|-p|-o|-l) shift 2 ;; -*) shift ;; *) break ;; esac
done
shift  # the host
exec sh -c "$*"
"""


@pytest.fixture
def peer_ssh(tmp_path, monkeypatch):
    """A stand-in ssh on PATH; returns the file its calls are logged to."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(ssh.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "ssh.log"
    log.write_text("")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SSH_LOG", str(log))
    monkeypatch.delenv("FAKE_SSH_FAIL", raising=False)
    return log


@pytest.fixture
def peer(model, tmp_path):
    """The peer's model dir: the revision, as a verified host holds it (plus its marker and a stray file)."""
    peer_dir = tmp_path / "peer" / "models"
    shutil.copytree(model.root, peer_dir)
    (peer_dir / MARKER).write_text(json.dumps({"repo": "peer's own marker"}))
    (peer_dir / "notes.txt").write_text("not part of the revision")
    return peer_dir


def seed_args(tmp_path, peer_dir: Path) -> list[str]:
    key = tmp_path / "seed-key"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot a real key\n-----END OPENSSH PRIVATE KEY-----\n")
    key.chmod(0o600)
    known = tmp_path / "seed-known-hosts"
    known.write_text("10.9.9.9 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPeer\n")
    return ["--seed-from", f"root@10.9.9.9:{peer_dir}", "--seed-port", "2222", "--seed-key", str(key),
            "--seed-known-hosts", str(known)]


def test_a_complete_peer_costs_the_hub_no_file_bytes_and_every_file_is_checked(hub, model, tmp_path, peer,
                                                                                peer_ssh):
    proc = fetch(hub, model, tmp_path, *FAST, *seed_args(tmp_path, peer))
    assert proc.returncode == 0, out(proc)
    assert f"seed: copied {len(model.files)} files, {model.total_bytes} bytes from the peer" in proc.stdout
    assert hub.stats(settle_s=2)["file_bytes"] == 0  # the Hub listed the files and gave the digests, no body
    assert "fetched 0 bytes of files" in proc.stdout
    lfs = [f for f in model.files if f.path.endswith(".safetensors")]
    assert f"verified {len(model.files)} files by digest" in proc.stdout, proc.stdout
    local = tmp_path / "dl"
    marker = json.loads((local / MARKER).read_text())
    assert marker["digests"][lfs[0].path] == f"sha256:{lfs[0].sha256}"
    assert not (local / "notes.txt").exists()  # only the files the Hub lists
    assert not (local / ".cache" / "sglang-converge-seed").exists()
    call = peer_ssh.read_text().splitlines()[0]
    for option in ("-i " + str(tmp_path / "seed-key"), "-p 2222", "BatchMode=yes", "StrictHostKeyChecking=yes",
                   f"UserKnownHostsFile={tmp_path / 'seed-known-hosts'}", "IdentitiesOnly=yes"):
        assert option in call, call
    assert "not a real key" not in out(proc)  # the key is a file, never in the output


def test_a_file_the_peer_holds_corrupted_is_fetched_again_from_the_hub(hub, model, tmp_path, peer, peer_ssh):
    shard = next(f for f in model.files if f.path.endswith(".safetensors"))
    flip_in_place(peer / shard.path)
    proc = fetch(hub, model, tmp_path, *FAST, *seed_args(tmp_path, peer))
    assert proc.returncode == 0, out(proc)
    assert f"DIGEST MISMATCH: {shard.path}: sha256" in proc.stdout
    stats = hub.stats(settle_s=2)
    assert stats["file_bytes"] == shard.size and set(stats["files"]) == {shard.path}
    assert json.loads((tmp_path / "dl" / MARKER).read_text())["digests"][shard.path] == f"sha256:{shard.sha256}"


def test_an_unreachable_peer_falls_back_to_the_hub_and_says_why(hub, model, tmp_path, peer, peer_ssh, monkeypatch):
    monkeypatch.setenv("FAKE_SSH_FAIL", "ssh: connect to host 10.9.9.9 port 2222: Connection refused")
    proc = fetch(hub, model, tmp_path, *FAST, *seed_args(tmp_path, peer))
    assert proc.returncode == 0, out(proc)
    assert f"seed: the copy from the peer root@10.9.9.9:{peer} failed: rsync exited " in proc.stdout
    assert (f"): ssh: connect to host 10.9.9.9 port 2222: Connection refused; it brought 0 files (0 bytes); fetching "
            f"the other {len(model.files)} files ({model.total_bytes} bytes) from the Hub") in proc.stdout, proc.stdout
    assert hub.stats(settle_s=2)["file_bytes"] == model.total_bytes
    assert (tmp_path / "dl" / MARKER).exists()


def test_a_peer_that_lacks_a_file_gives_the_rest_and_the_hub_that_one(hub, model, tmp_path, peer, peer_ssh):
    shard = next(f for f in model.files if f.path.endswith(".safetensors"))
    (peer / shard.path).unlink()
    proc = fetch(hub, model, tmp_path, *FAST, *seed_args(tmp_path, peer))
    assert proc.returncode == 0, out(proc)
    assert "seed: the copy from the peer" in proc.stdout and "rsync exited 23 (partial transfer" in proc.stdout
    assert f"it brought {len(model.files) - 1} files ({model.total_bytes - shard.size} bytes)" in proc.stdout
    stats = hub.stats(settle_s=2)
    assert stats["file_bytes"] == shard.size and set(stats["files"]) == {shard.path}


def test_seed_from_needs_its_key_and_host_keys(hub, model, tmp_path):
    proc = fetch(hub, model, tmp_path, "--seed-from", "root@10.9.9.9:/srv/models/x")
    assert proc.returncode == 2 and "--seed-from needs --seed-key and --seed-known-hosts" in proc.stderr
