"""remote/fetch_model.py verifies content by the digests the Hub publishes (remote/file_digests.py):
sha256 for LFS files, the git blob sha1 for the others. The digest functions agree with git, hashlib
and huggingface_hub; against the Hub stand-in on loopback (the real huggingface_hub, the script run
as a subprocess) a body corrupted on the way is caught, deleted and fetched again, one that stays
corrupt fails the run with exit 4 and no marker, a file corrupted on disk under an unmarked dir is
caught too, and a file the Hub gives no digest for is checked by size and counted."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox import hub as hub_module
from sandbox.tinymodel import git_blob_sha1
# the same tiny model and Hub stand-in fixtures as the fault tests
from tests.unit.test_fetch_model_faults import (  # noqa: F401 (fixtures)
    FAST, REPO, ROOT, TOKEN, fetch, gets, hub, last_line, model, out)

sys.path.insert(0, str(ROOT / "remote"))  # as on the host: the script's modules from its directory
import fetch_model  # noqa: E402
import file_digests  # noqa: E402

MARKER = ".sglang-converge.json"


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def flip_in_place(path: Path, at: int | None = None) -> None:
    """Change one byte of a file, keeping its size and its mtime (what bit rot looks like)."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if at is None else at
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def lines(proc, prefix: str) -> list[str]:
    return [line for line in proc.stdout.splitlines() if line.startswith(prefix)]


def file_gets(hub, name: str) -> list:
    return [r for r in gets(hub, name) if r.status in (200, 206)]


# ---------------------------------------------------------------------------
# (a) the digest functions: as git, hashlib, huggingface_hub and the Hub compute them


@pytest.mark.parametrize("size", [0, 1, 4096, file_digests.CHUNK, file_digests.CHUNK + 3])
def test_the_git_blob_sha1_is_what_git_and_huggingface_hub_compute(tmp_path, size):
    from huggingface_hub.utils.sha import git_hash

    data = os.urandom(size)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    got = file_digests.file_digest(path, "sha1")
    assert got == f"sha1:{git_hash(data)}" == f"sha1:{git_blob_sha1(data)}"
    assert got != f"sha1:{hashlib.sha1(data).hexdigest()}"  # the blob header is part of it
    if shutil.which("git"):
        printed = subprocess.run(["git", "hash-object", "--no-filters", str(path)], capture_output=True, text=True,
                                 check=True, timeout=30).stdout.strip()
        assert got == f"sha1:{printed}"


@pytest.mark.parametrize("size", [0, 5, file_digests.CHUNK - 1, 2 * file_digests.CHUNK + 17])
def test_the_sha256_is_hashlibs_over_the_whole_file_and_huggingface_hubs(tmp_path, size):
    from huggingface_hub.utils.sha import sha_fileobj

    data = os.urandom(size)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    got = file_digests.file_digest(path, "sha256")
    assert got == f"sha256:{hashlib.sha256(data).hexdigest()}"
    with open(path, "rb") as fh:
        assert got == f"sha256:{sha_fileobj(fh).hex()}"
    with pytest.raises(ValueError):
        file_digests.file_digest(path, "md5")


def test_the_digests_on_disk_are_the_ones_the_hub_publishes(hub, model):
    """The stand-in's model_info(files_metadata=True), read by the real client, through remote_files()."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.url(), token=TOKEN)
    listing = fetch_model.remote_files(api, REPO, model.commit)
    assert listing.sizes == {f.path: f.size for f in model.files}
    assert set(listing.digests) == set(listing.sizes)
    for f in model.files:
        want = listing.digests[f.path]
        algo = "sha256" if f.path.endswith(".safetensors") else "sha1"
        assert want is not None and want.startswith(f"{algo}:"), (f.path, want)
        assert file_digests.file_digest(model.root / f.path, algo) == want
        if algo == "sha256":
            assert want == f"sha256:{f.sha256}"
    info = api.model_info(REPO, revision=model.commit, files_metadata=True)
    shard = next(s for s in info.siblings if s.rfilename == model.shard_names[0])
    # an LFS file's blob_id is its pointer's: comparing the content's git sha1 to it would always fail
    assert shard.blob_id != git_blob_sha1((model.root / shard.rfilename).read_bytes())
    # the JSON form and a sibling without a digest
    assert file_digests.hub_digest({"rfilename": "a", "blobId": "AB12"}) == "sha1:ab12"
    assert file_digests.hub_digest({"rfilename": "a", "blobId": "ab", "lfs": {"sha256": "cd"}}) == "sha256:cd"
    assert file_digests.hub_digest({"rfilename": "a", "size": 3}) is None
    assert file_digests.hub_digest(type(shard)(rfilename="a", size=3)) is None


def test_hash_files_logs_progress_and_finds_what_differs(tmp_path):
    names = [f"f{i}.bin" for i in range(4)]
    wanted = {}
    for i, name in enumerate(names):
        data = os.urandom(file_digests.CHUNK + i)
        (tmp_path / name).write_bytes(data)
        wanted[name] = f"sha256:{hashlib.sha256(data).hexdigest()}" if i % 2 else f"sha1:{git_blob_sha1(data)}"
    logged: list[str] = []
    hashed = file_digests.hash_files(tmp_path, wanted, logged.append, workers=2, interval=0.0)
    assert hashed.mismatched(wanted) == {} and hashed.digests == wanted
    assert hashed.bytes == sum((tmp_path / n).stat().st_size for n in names)
    assert logged and all(re.fullmatch(r"hashing: \d+\.\d of 0\.0 GB, \d of 4 files, \d+\.\d GB/s", line)
                          for line in logged), logged

    flip_in_place(tmp_path / names[1])  # same size, one byte changed
    (tmp_path / names[2]).unlink()
    hashed = file_digests.hash_files(tmp_path, wanted, logged.append, interval=60)
    bad = hashed.mismatched(wanted)
    assert sorted(bad) == [names[1], names[2]]
    assert bad[names[1]] is not None and bad[names[1]].startswith("sha256:") and bad[names[2]] is None
    assert hashed.errors[names[2]].startswith("FileNotFoundError")


def test_huggingface_hub_accepts_a_corrupted_body(hub, model, tmp_path):
    """Why the script hashes: a body with one byte changed (the stand-in's corrupt fault) passes
    huggingface_hub's own checks (size only), into the local dir and its metadata."""
    from huggingface_hub import hf_hub_download

    shard = model.shard_names[0]
    hub.set_faults({"rules": [{"path": shard, "corrupt": True, "times": 1}]})
    path = Path(hf_hub_download(REPO, shard, revision=model.commit, endpoint=hub.url(), token=TOKEN,
                                local_dir=str(tmp_path / "dl")))
    assert path.stat().st_size == model.file(shard).size
    assert sha256_of(path) != model.file(shard).sha256
    assert [r.fault for r in file_gets(hub, shard)] == ["corrupt"]


# ---------------------------------------------------------------------------
# (b) to (e): the script against the stand-in


@pytest.mark.parametrize("which", ["shard", "config.json"])
def test_a_body_corrupted_once_is_caught_deleted_and_only_that_file_fetched_again(hub, model, tmp_path, which):
    name = model.shard_names[1] if which == "shard" else "config.json"
    said = "sha256" if which == "shard" else "git blob sha1"
    want = model.file(name).sha256 if which == "shard" else git_blob_sha1((model.root / name).read_bytes())
    hub.set_faults({"rules": [{"path": name, "corrupt": True, "times": 1}]})
    proc = fetch(hub, model, tmp_path, *FAST)
    assert proc.returncode == 0, out(proc)

    (mismatch,) = lines(proc, "DIGEST MISMATCH:")
    m = re.fullmatch(rf"DIGEST MISMATCH: {re.escape(name)}: {said} ([0-9a-f]+) on disk, the Hub says {said} {want}",
                     mismatch)
    assert m and m.group(1) != want, mismatch
    assert lines(proc, "fetching ") == [f"fetching 1 file again: {name}"]
    assert [r.fault for r in file_gets(hub, name)] == ["corrupt", None]  # one extra GET, for that file only
    assert all(len(file_gets(hub, f.path)) == 1 for f in model.files if f.path != name)

    local_dir = tmp_path / "dl"
    assert sha256_of(local_dir / name) == model.file(name).sha256
    marker = json.loads((local_dir / MARKER).read_text())
    assert marker["digests"][name] == f"{'sha256' if which == 'shard' else 'sha1'}:{want}"
    assert set(marker["digests"]) == {f.path for f in model.files}
    assert marker["files"] == {f.path: f.size for f in model.files}
    by_digest = lines(proc, "verified 9 files by digest (sha256 for LFS, git blob sha1 for the others), ")
    assert len(by_digest) == 1 and last_line(proc).startswith("verified 9 files, ")
    total = re.findall(r"fetched (\d+) bytes of files", proc.stdout)[-1]  # the run's bytes: both bodies
    assert int(total) == model.total_bytes + model.file(name).size == hub.stats(settle_s=5)["file_bytes"]


def test_a_body_corrupted_every_time_fails_verification_with_exit_4_and_no_marker(hub, model, tmp_path):
    shard = model.shard_names[0]
    want = model.file(shard).sha256
    hub.set_faults({"rules": [{"path": shard, "corrupt": True}]})
    proc = fetch(hub, model, tmp_path, *FAST, "--attempts", "3")
    assert proc.returncode == 4, out(proc)
    last = last_line(proc)
    assert last.startswith(f"VERIFY FAILED: {shard}: sha256 ") and f"the Hub says sha256 {want}" in last, last
    assert "after 3 rounds of hashing" in last
    assert len(lines(proc, f"DIGEST MISMATCH: {shard}: ")) == 3 and len(lines(proc, "fetching 1 file again")) == 2
    assert [r.fault for r in file_gets(hub, shard)] == ["corrupt"] * 3  # --attempts fetches in all
    assert all(len(file_gets(hub, f.path)) == 1 for f in model.files if f.path != shard)
    local_dir = tmp_path / "dl"
    assert not (local_dir / MARKER).exists() and not (local_dir / shard).exists()
    assert "Traceback" not in out(proc)


def test_an_unmarked_dir_with_a_file_of_the_right_size_but_wrong_content_is_fetched_again(hub, model, tmp_path):
    """A dir the deploy adopts (no marker) whose files huggingface_hub takes as done (its metadata and
    the sizes match): bit rot, or a body corrupted before the script hashed. Only the digest sees it."""
    first = fetch(hub, model, tmp_path, *FAST)
    assert first.returncode == 0, out(first)
    local_dir = tmp_path / "dl"
    (local_dir / MARKER).unlink()
    shard = model.shard_names[0]
    flip_in_place(local_dir / shard)
    flip_in_place(local_dir / "tokenizer.json", at=10)
    hub.reset_log()

    proc = fetch(hub, model, tmp_path, *FAST)
    assert proc.returncode == 0, out(proc)
    assert "need 0 bytes" in proc.stdout  # by size, nothing was missing
    mismatches = lines(proc, "DIGEST MISMATCH:")
    assert [line.split(":")[1].strip() for line in mismatches] == [shard, "tokenizer.json"]
    assert f"the Hub says sha256 {model.file(shard).sha256}" in mismatches[0]
    assert " git blob sha1 " in mismatches[1]
    assert lines(proc, "fetching ") == [f"fetching 2 files again: {shard}, tokenizer.json"]
    assert {f.path: len(file_gets(hub, f.path)) for f in model.files} == {
        f.path: 1 if f.path in (shard, "tokenizer.json") else 0 for f in model.files}
    for f in model.files:
        assert sha256_of(local_dir / f.path) == f.sha256
    assert json.loads((local_dir / MARKER).read_text())["digests"][shard] == f"sha256:{model.file(shard).sha256}"


def test_a_file_the_hub_gives_no_digest_for_is_checked_by_size_and_counted(hub, model, tmp_path, monkeypatch):
    served = hub_module._Handler._model_info

    def without_digest(self, repo, rev, blobs):
        info = served(self, repo, rev, blobs)
        for sibling in info["siblings"]:
            if sibling["rfilename"] == "README.md":
                sibling.pop("blobId", None)
                sibling.pop("lfs", None)
        return info

    monkeypatch.setattr(hub_module._Handler, "_model_info", without_digest)
    proc = fetch(hub, model, tmp_path, *FAST)
    assert proc.returncode == 0, out(proc)
    (line,) = lines(proc, "verified 8 files by digest ")
    assert line.endswith("; 1 file by size only (the Hub gives no digest)"), line
    marker = json.loads((tmp_path / "dl" / MARKER).read_text())
    assert "README.md" in marker["files"] and "README.md" not in marker["digests"]
    assert len(marker["digests"]) == len(model.files) - 1

    # the size check still holds for it: a README.md of another size fails verification
    problems = fetch_model.verify(tmp_path / "dl", {**marker["files"], "README.md": model.file("README.md").size + 1})
    assert problems == [f"size mismatch: README.md has {model.file('README.md').size} bytes, the Hub says "
                        f"{model.file('README.md').size + 1}"]
