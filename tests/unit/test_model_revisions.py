"""Model revisions side by side: a new revision goes into its own dir beside the serving one, files a
kept revision holds with the same digest are hard-linked (stored once: not fetched, not counted by the
disk check), the disk check refuses with the numbers when both do not fit (unless model_update =
"in-place"), and the revisions beyond keep_revisions are removed after a good restart. The script runs
against the Hub stand-in on loopback (the real huggingface_hub), as the deploy runs it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from core import last_good
from core.disk import DiskNeed, freeable_bytes, linkable, stored_files
from core.model_revisions import revisions_to_remove
from facts.model_dir import ModelDir, Revision, Revisions
from sandbox.hub import HubServer
from sandbox.tinymodel import generate, scan
from tasks.model import _disk_decision
from tests.unit.test_fetch_model_faults import FAST, REPO, TOKEN, fetch, gets, last_line, out

MARKER = ".sglang-converge.json"
GB = 10**9


# ---------------------------------------------------------------------------
# what is linked, what is counted (core/disk.py), from the kept revisions' markers

def marker(files: dict[str, int], digests: dict[str, str], repo="r", revision="a" * 40) -> dict:
    return {"repo": repo, "revision": revision, "files": files, "digests": digests}


OLD = ("/m-revisions/aaaaaaaaaaaa", marker({"config.json": 10, "w.safetensors": 1000},
                                           {"config.json": "sha1:c1", "w.safetensors": "sha256:w"}))


def test_a_file_with_the_same_digest_and_size_is_linked_a_changed_one_is_fetched():
    expected = {"config.json": 11, "w.safetensors": 1000}
    digests = {"config.json": "sha1:c2", "w.safetensors": "sha256:w"}
    empty = ModelDir(marker=None, files={}, partial_bytes=0)
    assert linkable(expected, digests, empty, [OLD]) == {"w.safetensors": 1000}
    # the same digest at another size is another content: fetched
    assert linkable({"w.safetensors": 999}, digests, empty, [OLD]) == {}
    # a file already complete in the new dir is neither linked nor fetched
    done = ModelDir(marker=None, files={"w.safetensors": 1000}, partial_bytes=0)
    assert linkable(expected, digests, done, [OLD]) == {}


def test_a_marker_older_than_digests_links_by_name_only_for_the_very_same_revision():
    legacy = ("/m", {"repo": "r", "revision": "b" * 40, "files": {"w.safetensors": 1000}})
    empty = ModelDir(marker=None, files={}, partial_bytes=0)
    expected, digests = {"w.safetensors": 1000}, {"w.safetensors": "sha256:w"}
    assert linkable(expected, digests, empty, [legacy], ("r", "b" * 40)) == {"w.safetensors": 1000}
    assert linkable(expected, digests, empty, [legacy], ("r", "c" * 40)) == {}
    assert stored_files([legacy]) == {}  # no digests, another revision: nothing known about the content


def test_freeable_counts_only_what_the_new_revision_does_not_share_each_content_once():
    newer = ("/m-revisions/bbbbbbbbbbbb", marker({"config.json": 10, "w.safetensors": 1000, "x.safetensors": 500},
                                                 {"config.json": "sha1:c1", "w.safetensors": "sha256:w",
                                                  "x.safetensors": "sha256:x"}))
    expected = {"config.json": 12, "w.safetensors": 1000}
    digests = {"config.json": "sha1:c3", "w.safetensors": "sha256:w"}
    # w is shared (stays, linked); config.json (10, in both kept dirs: one inode) and x go
    assert freeable_bytes([OLD, newer], digests, expected) == 10 + 500


def need(**kw) -> DiskNeed:
    base = dict(repo="moonshotai/Kimi-K2.6", revision="f" * 40, files=64, need=595 * GB, total=595 * GB,
                free=405 * GB, where="/srv/models", margin=50 * GB, mount="/srv/models", linked=0,
                link_from=("/srv/models/kimi-k2.6-revisions/aaaaaaaaaaaa",), freeable=590 * GB)
    base.update(kw)
    return DiskNeed(**base)


def test_a_revision_that_does_not_fit_beside_the_serving_one_is_refused_with_the_numbers():
    short, in_place = _disk_decision([need()], "side-by-side")
    assert in_place is None
    assert short.startswith("not enough disk for moonshotai/Kimi-K2.6@ffffffffffff: need 595.00 GB")
    assert "/srv/models has 405.00 GB" in short and "50.00 GB must stay free" in short
    assert "590.00 GB only they hold" in short and 'model_update = "in-place"' in short


def test_in_place_goes_ahead_when_removing_the_kept_revisions_makes_room():
    short, in_place = _disk_decision([need()], "in-place")
    assert short is None and in_place.startswith("not enough disk for moonshotai/Kimi-K2.6@ffffffffffff")


def test_in_place_still_refuses_when_even_the_freed_room_is_too_small():
    short, in_place = _disk_decision([need(freeable=100 * GB)], "in-place")
    assert in_place is None and "even with the kept revisions removed" in short


def test_a_revision_that_fits_is_neither_refused_nor_in_place():
    assert _disk_decision([need(free=2000 * GB)], "in-place") == (None, None)


# ---------------------------------------------------------------------------
# what is removed after a good restart (core/model_revisions.py)

def revisions(*entries, referenced=(), legacy=None) -> Revisions:
    return Revisions(tuple(Revision(f"/m-revisions/{name}", None, at) for name, at in entries),
                     tuple(f"/m-revisions/{name}" for name in referenced), (), legacy)


def test_the_serving_revision_and_the_newest_rollback_points_are_kept():
    found = revisions(("a", 10), ("b", 20), ("c", 30), ("d", 40))
    assert revisions_to_remove(found, "/m-revisions/d", 2) == ["/m-revisions/b", "/m-revisions/a"]
    assert revisions_to_remove(found, "/m-revisions/d", 1) == ["/m-revisions/c", "/m-revisions/b", "/m-revisions/a"]
    assert revisions_to_remove(found, "/m-revisions/d", 4) == []


def test_a_revision_another_unit_serves_or_a_staged_one_is_never_removed():
    found = revisions(("a", 10), ("b", 20), ("staged", None), ("d", 40), referenced=("a",))
    assert revisions_to_remove(found, "/m-revisions/d", 1) == ["/m-revisions/b"]


def test_the_old_layouts_model_dir_counts_as_the_oldest_revision():
    found = revisions(("a", 10), legacy="/m")
    assert revisions_to_remove(found, "/m-revisions/a", 2) == []
    assert revisions_to_remove(revisions(("a", 10), ("b", 20), legacy="/m"), "/m-revisions/b", 2) == ["/m"]


# ---------------------------------------------------------------------------
# remote/fetch_model.py: --link-from and --free-dir against the Hub stand-in

@pytest.fixture(scope="module")
def two_revisions(tmp_path_factory):
    """Revision 1 and revision 2 of one repo: the shards the same, config.json changed."""
    first = generate(tmp_path_factory.mktemp("rev1"), size_mb=4, shards=2)
    root2 = tmp_path_factory.mktemp("rev2")
    shutil.copytree(first.root, root2, dirs_exist_ok=True)
    config = json.loads((root2 / "config.json").read_text())
    config["max_position_embeddings"] = config.get("max_position_embeddings", 4096) * 2
    (root2 / "config.json").write_text(json.dumps(config, indent=2))
    second = scan(root2)
    assert second.commit != first.commit
    return first, second


@pytest.fixture
def revisions_hub(two_revisions):
    with HubServer({REPO: list(two_revisions)}, ["127.0.0.1"], 0, token=TOKEN) as server:
        yield server


def test_a_new_revision_links_the_shared_shards_and_fetches_only_what_changed(revisions_hub, two_revisions, tmp_path):
    first, second = two_revisions
    old_dir, new_dir = tmp_path / "m-revisions" / first.commit[:12], tmp_path / "m-revisions" / second.commit[:12]
    proc = fetch(revisions_hub, first, tmp_path, *FAST, local_dir=old_dir)
    assert proc.returncode == 0, out(proc)
    revisions_hub.requests.clear()

    proc = fetch(revisions_hub, second, tmp_path, *FAST, "--link-from", str(old_dir), local_dir=new_dir)
    assert proc.returncode == 0, out(proc)
    assert last_line(proc).startswith("verified ")
    shards = [f.path for f in first.files if f.path.endswith(".safetensors")]
    unchanged = [f for f in second.files if f.path != "config.json"]
    assert f"linked {len(unchanged)} files ({sum(f.size for f in unchanged)} bytes)" in proc.stdout
    assert "not fetched" in proc.stdout and len(shards) == 2
    for name in shards:
        assert (new_dir / name).stat().st_ino == (old_dir / name).stat().st_ino  # stored once
        assert not [r for r in gets(revisions_hub, name) if r.status in (200, 206)]
    assert [r.status for r in gets(revisions_hub, "config.json")] == [200]
    assert json.loads((new_dir / MARKER).read_text())["revision"] == second.commit
    # the serving revision is untouched: its marker and its config are revision 1's
    assert json.loads((old_dir / MARKER).read_text())["revision"] == first.commit
    assert (old_dir / "config.json").read_bytes() == (first.root / "config.json").read_bytes()

    again = fetch(revisions_hub, second, tmp_path, *FAST, "--link-from", str(old_dir), local_dir=new_dir)
    assert again.returncode == 0 and "linked" not in again.stdout  # the second run has nothing to link


def test_a_kept_file_changed_on_disk_is_not_linked(revisions_hub, two_revisions, tmp_path):
    first, second = two_revisions
    old_dir, new_dir = tmp_path / "old", tmp_path / "new"
    assert fetch(revisions_hub, first, tmp_path, *FAST, local_dir=old_dir).returncode == 0
    shard = next(f.path for f in first.files if f.path.endswith(".safetensors"))
    with open(old_dir / shard, "ab") as fh:  # another size than the marker says
        fh.write(b"x")
    proc = fetch(revisions_hub, second, tmp_path, *FAST, "--link-from", str(old_dir), local_dir=new_dir)
    assert proc.returncode == 0, out(proc)
    assert (new_dir / shard).stat().st_ino != (old_dir / shard).stat().st_ino
    assert [r.status for r in gets(revisions_hub, shard)][-1] == 200


def test_in_place_removes_the_kept_revision_after_linking(revisions_hub, two_revisions, tmp_path):
    first, second = two_revisions
    old_dir, new_dir = tmp_path / "old", tmp_path / "new"
    assert fetch(revisions_hub, first, tmp_path, *FAST, local_dir=old_dir).returncode == 0
    proc = fetch(revisions_hub, second, tmp_path, *FAST, "--link-from", str(old_dir), "--free-dir", str(old_dir),
                 local_dir=new_dir)
    assert proc.returncode == 0, out(proc)
    assert f"removed {old_dir} (model_update = in-place)" in proc.stdout
    assert not old_dir.exists() and not Path(f"{old_dir}.removing").exists()
    assert json.loads((new_dir / MARKER).read_text())["revision"] == second.commit
    assert {f.path: f.size for f in second.files} == {
        p.relative_to(new_dir).as_posix(): p.stat().st_size for p in new_dir.rglob("*")
        if p.is_file() and ".cache" not in p.parts and not p.name.startswith(".sglang-converge")}


def test_a_rollback_brings_the_model_revision_back_while_its_dir_holds_it():
    old, new = "/srv/m-revisions/0123456789ab", "/srv/m-revisions/1123456789ab"
    kept = {"unit": "u1", "packages": "p", "model_revision": "0" * 40, "model_path": old}
    now = {**kept, "unit": "u2", "model_revision": "1" * 40, "model_path": new}
    held = {old: "0" * 40, new: "1" * 40}
    assert last_good.not_by_files_alone(kept, now, None, None, lambda path, rev: held.get(path) == rev) is None
    # pruned beyond keep_revisions (or another revision there): refused, with the dir named
    assert last_good.not_by_files_alone(kept, now, None, None, lambda path, rev: False) == (
        f"the model revision changed since it served (000000000000 -> 111111111111) and {old} no longer holds "
        "it (keep_revisions): its files alone would not bring it back")
    # a stamp from before revision dirs names no dir: refused as before
    legacy = {key: value for key, value in kept.items() if key != "model_path"}
    assert last_good.not_by_files_alone(legacy, now, None, None, lambda path, rev: True) == (
        "the model revision changed since it served (000000000000 -> 111111111111): its files alone would not "
        "bring it back")
