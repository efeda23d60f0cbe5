"""The sandbox Hub stand-in against the real huggingface_hub client (loopback only)."""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import struct
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

# huggingface_hub reads HF_HOME (cache, token path) and HF_HUB_OFFLINE when it is imported:
# point it at a throw-away home before the import, and pin paths again per test below.
_HF_HOME = tempfile.mkdtemp(prefix="test-hub-hfhome-")
atexit.register(shutil.rmtree, _HF_HOME, True)  # gone with the test process
os.environ["HF_HOME"] = _HF_HOME
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.pop("HF_HUB_OFFLINE", None)

import pytest  # noqa: E402
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download  # noqa: E402
from huggingface_hub.errors import (  # noqa: E402
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from sandbox.hub import HubServer  # noqa: E402
from sandbox.tinymodel import ModelInfo, generate  # noqa: E402

REPO = "sandbox/tiny-moe"


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@pytest.fixture(autouse=True)
def hf_env(tmp_path, monkeypatch):
    home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"), raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"), raising=False)
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"), raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False, raising=False)
    return home


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> ModelInfo:
    return generate(tmp_path_factory.mktemp("model") / "tiny", size_mb=4, shards=3)


@pytest.fixture
def hub(model):
    with HubServer({REPO: model}, ["127.0.0.1"]) as h:
        yield h


def _download(hub, model, local_dir, **kw):
    return snapshot_download(
        REPO,
        revision=kw.pop("revision", model.commit),
        local_dir=str(local_dir),
        endpoint=hub.url(),
        cache_dir=str(local_dir.parent / "cache"),
        **kw,
    )


# ---------------------------------------------------------------------------
# the generated model


def _read_safetensors_header(p: Path) -> tuple[dict, int]:
    with open(p, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return header, 8 + n


def test_tinymodel_is_deterministic_and_consistent(model, tmp_path):
    again = generate(tmp_path / "again", size_mb=4, shards=3)
    assert again.commit == model.commit and len(model.commit) == 40
    assert [(f.path, f.size, f.sha256) for f in again.files] == [(f.path, f.size, f.sha256) for f in model.files]
    for f in model.files:  # the ModelInfo describes what is on disk
        p = model.root / f.path
        assert p.stat().st_size == f.size and _sha256(p) == f.sha256
    assert model.total_bytes == sum(f.size for f in model.files)
    assert 3_000_000 < model.total_bytes < 6_000_000

    cfg = json.loads((model.root / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"]
    assert cfg["kv_lora_rank"] > 0 and cfg["qk_rope_head_dim"] > 0
    q = cfg["quantization_config"]
    assert q["quant_method"] == "compressed-tensors" and q["format"] == "nvfp4-pack-quantized"
    g = q["config_groups"]["group_0"]
    assert g["targets"] == ["Linear"] and g["format"] == "nvfp4-pack-quantized"
    assert g["weights"]["num_bits"] == 4 and g["weights"]["type"] == "float"
    assert g["weights"]["strategy"] == "tensor_group" and g["weights"]["group_size"] == 16
    assert q["ignore"] == ["lm_head"] and q["quantization_status"] == "compressed"
    for name in ("generation_config.json", "tokenizer_config.json", "tokenizer.json"):
        json.loads((model.root / name).read_text())

    # safetensors shards: header offsets cover the data exactly, the index matches the headers
    index = json.loads((model.root / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert shards == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)] == model.shard_names
    seen: dict[str, str] = {}
    data_total = 0
    for shard in shards:
        header, data_start = _read_safetensors_header(model.root / shard)
        assert data_start % 8 == 0
        meta = header.pop("__metadata__")
        assert meta == {"format": "pt"}
        end = 0
        for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            a, b = t["data_offsets"]
            assert a == end, f"hole before {name}"
            width = {"BF16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1, "I32": 4, "I64": 8}[t["dtype"]]
            n = width
            for d in t["shape"]:
                n *= d
            assert b - a == n
            end = b
            seen[name] = shard
        assert data_start + end == (model.root / shard).stat().st_size
        data_total += end
    assert seen == index["weight_map"]
    assert index["metadata"]["total_size"] == data_total
    assert any(k.endswith("mlp.experts.0.gate_proj.weight_packed") for k in seen)
    assert "lm_head.weight" in seen


def test_tinymodel_other_format_and_commit(tmp_path):
    info = generate(tmp_path / "int4", size_mb=4, shards=2, quant_format="pack-quantized", commit="ab" * 20)
    assert info.commit == "ab" * 20
    cfg = json.loads((info.root / "config.json").read_text())
    assert cfg["quantization_config"]["format"] == "pack-quantized"
    assert cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["type"] == "int"
    assert info.shard_names == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


# ---------------------------------------------------------------------------
# huggingface_hub against the stand-in


def test_dry_run_lists_every_file(hub, model, tmp_path):
    infos = _download(hub, model, tmp_path / "dl", dry_run=True)
    got = {i.filename: i for i in infos}
    assert set(got) == {f.path for f in model.files}
    for f in model.files:
        assert got[f.path].file_size == f.size
        assert got[f.path].will_download is True
        assert got[f.path].commit_hash == model.commit
    assert sum(i.file_size for i in infos) == model.total_bytes
    assert not hub.content_gets()  # a dry run fetches no content
    assert not (tmp_path / "dl").exists() or not any((tmp_path / "dl").glob("*.safetensors"))


def test_snapshot_download_is_byte_identical_then_idempotent(hub, model, tmp_path):
    dl = tmp_path / "dl"
    assert _download(hub, model, dl) == str(dl.resolve())
    for f in model.files:
        assert _sha256(dl / f.path) == f.sha256, f.path
    index = json.loads((dl / "model.safetensors.index.json").read_text())
    for shard in set(index["weight_map"].values()):
        assert (dl / shard).is_file()
    assert not list(dl.rglob("*.incomplete"))
    gets = hub.content_gets()
    assert sorted(r.path.rsplit("/", 1)[-1] for r in gets) == sorted(f.path.rsplit("/", 1)[-1] for f in model.files)
    assert all(r.status == 200 and r.complete for r in gets)
    assert sum(r.bytes_sent for r in gets) == model.total_bytes

    # dry run after the download: nothing left to fetch
    infos = _download(hub, model, dl, dry_run=True)
    assert all(i.will_download is False for i in infos)

    hub.reset_log()
    _download(hub, model, dl)
    assert hub.content_gets() == []  # complete files are skipped
    assert hub.request_count == 0  # and with the tree cached, nothing is asked at all


def test_branch_main_resolves_to_the_commit(hub, model, tmp_path):
    dl = tmp_path / "dl"
    _download(hub, model, dl, revision="main")
    assert _sha256(dl / model.shard_names[0]) == model.file(model.shard_names[0]).sha256
    assert any(r.path.startswith(f"/api/models/{REPO}/revision/main") for r in hub.requests)
    assert HfApi(endpoint=hub.url()).model_info(REPO).sha == model.commit


def test_model_info_files_metadata(hub, model):
    info = HfApi(endpoint=hub.url()).model_info(REPO, revision=model.commit, files_metadata=True)
    assert info.sha == model.commit
    sizes = {s.rfilename: s.size for s in info.siblings}
    assert sizes == {f.path: f.size for f in model.files}
    assert sum(sizes.values()) == model.total_bytes
    for s in info.siblings:
        if s.rfilename.endswith(".safetensors"):
            assert s.lfs is not None and s.lfs.sha256 == model.file(s.rfilename).sha256
        else:
            assert s.lfs is None and len(s.blob_id) == 40
    assert info.safetensors is not None and info.safetensors.total > 0


def test_wrong_revision_repo_and_file(hub, model, tmp_path):
    api = HfApi(endpoint=hub.url())
    with pytest.raises(RevisionNotFoundError):
        _download(hub, model, tmp_path / "dl", revision="0" * 40)
    with pytest.raises(RevisionNotFoundError):
        _download(hub, model, tmp_path / "dl", revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="1" * 40, files_metadata=True)
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("sandbox/nope", revision=model.commit)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(
            REPO,
            "missing.bin",
            revision=model.commit,
            endpoint=hub.url(),
            local_dir=str(tmp_path / "one"),
            cache_dir=str(tmp_path / "cache"),
        )


def test_token_is_required_when_configured(model, tmp_path, monkeypatch):
    with HubServer({REPO: model}, ["127.0.0.1"], token="hf_sandbox_secret") as hub:
        with pytest.raises(HfHubHTTPError) as no_token:
            _download(hub, model, tmp_path / "a")
        assert no_token.value.response.status_code == 401
        assert not any(r.authorization for r in hub.requests)

        monkeypatch.setenv("HF_TOKEN", "hf_wrong")
        with pytest.raises(HfHubHTTPError) as wrong:
            _download(hub, model, tmp_path / "b")
        assert wrong.value.response.status_code == 401
        assert not hub.content_gets()

        # HF_TOKEN from the environment reaches every request of the download
        monkeypatch.setenv("HF_TOKEN", "hf_sandbox_secret")
        hub.reset_log()
        dl = tmp_path / "c"
        _download(hub, model, dl)
        assert _sha256(dl / model.shard_names[-1]) == model.file(model.shard_names[-1]).sha256
        assert hub.requests and all(r.authorization and r.status in (200, 206) for r in hub.requests)

        monkeypatch.delenv("HF_TOKEN")
        info = HfApi(endpoint=hub.url(), token="hf_sandbox_secret").model_info(REPO, files_metadata=True)
        assert info.sha == model.commit and info.private is True


def _http(url: str, method: str = "GET", headers: dict | None = None):
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_resolve_headers_and_ranges(hub, model):
    shard = model.shard_names[1]
    f = model.file(shard)
    data = (model.root / shard).read_bytes()
    url = f"{hub.url()}/{REPO}/resolve/{model.commit}/{shard}"

    st, h, body = _http(url, "HEAD")
    assert st == 200 and body == b""
    assert h["X-Repo-Commit"] == model.commit
    assert h["ETag"] == f'"{f.sha256}"' and h["X-Linked-Etag"] == f'"{f.sha256}"'
    assert h["X-Linked-Size"] == h["Content-Length"] == str(f.size)
    assert h["Accept-Ranges"] == "bytes"
    assert "X-Xet-Hash" not in h

    st, h, body = _http(url, headers={"Range": "bytes=1000-"})
    assert st == 206 and body == data[1000:]
    assert h["Content-Range"] == f"bytes 1000-{f.size - 1}/{f.size}"
    assert h["Content-Length"] == str(f.size - 1000)
    st, h, body = _http(url, headers={"Range": "bytes=10-19"})
    assert st == 206 and body == data[10:20]
    st, h, body = _http(url, headers={"Range": "bytes=-5"})
    assert st == 206 and body == data[-5:]
    st, h, _ = _http(url, headers={"Range": f"bytes={f.size}-"})
    assert st == 416 and h["Content-Range"] == f"bytes */{f.size}"

    # a small (non-LFS) file: git blob sha1 as ETag, no X-Linked-*
    st, h, body = _http(f"{hub.url()}/{REPO}/resolve/main/config.json", "GET")
    assert st == 200 and body == (model.root / "config.json").read_bytes()
    assert h["X-Repo-Commit"] == model.commit and "X-Linked-Etag" not in h
    blob_sha1 = hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest()
    assert h["ETag"] == f'"{blob_sha1}"'

    for path, code in [
        (f"/{REPO}/resolve/{model.commit}/nope.txt", "EntryNotFound"),
        (f"/{REPO}/resolve/{'2' * 40}/config.json", "RevisionNotFound"),
        ("/other/repo/resolve/main/config.json", "RepoNotFound"),
        (f"/api/models/{REPO}/tree/{'3' * 40}", "RevisionNotFound"),
    ]:
        st, h, _ = _http(hub.url() + path, "HEAD")
        assert st == 404 and h["X-Error-Code"] == code, path

    served = hub.bytes_served
    assert served >= (f.size - 1000) + 10 + 5 + len(body)

    st, _, body = _http(f"{hub.url()}/api/models/{REPO}/tree/{model.commit}?recursive=true&expand=false")
    tree = json.loads(body)
    assert {e["path"]: e["size"] for e in tree} == {x.path: x.size for x in model.files}
    assert all(("lfs" in e) == e["path"].endswith(".safetensors") for e in tree)


def test_throttle_limits_the_rate(model):
    shard = model.shard_names[0]
    size = model.file(shard).size
    rate = 4_000_000
    with HubServer({REPO: model}, ["127.0.0.1"], throttle_bps=rate) as hub:
        t0 = time.monotonic()
        st, _, body = _http(f"{hub.url()}/{REPO}/resolve/{model.commit}/{shard}")
        took = time.monotonic() - t0
    assert st == 200 and len(body) == size
    assert took >= 0.9 * size / rate, (took, size / rate)
    assert took < 3 * size / rate + 1


def test_dropped_connection_resumes_with_range(tmp_path):
    # shards above huggingface_hub's 10 MiB download chunk, so a drop after it resumes with a Range request
    model = generate(tmp_path / "m", size_mb=40, shards=3)
    assert all(model.file(s).size > 11 << 20 for s in model.shard_names)
    with HubServer({REPO: model}, ["127.0.0.1"], throttle_bps=30_000_000) as hub:
        dl = tmp_path / "dl"
        errors: list[BaseException] = []

        def run():
            try:
                _download(hub, model, dl)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        t = threading.Thread(target=run)
        t.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if any(r.path.endswith(".safetensors") and r.bytes_sent > (10 << 20) + (256 << 10) for r in hub.requests):
                break
            time.sleep(0.005)
        dropped = hub.drop_connections()
        t.join(60)
        assert not t.is_alive() and not errors, errors
    assert dropped >= 1
    assert any(not r.complete for r in hub.requests)  # the server saw the cut
    resumed = [r for r in hub.requests if r.status == 206]
    assert resumed and all(r.range == f"bytes={10 << 20}-" for r in resumed)
    for f in model.files:
        assert _sha256(dl / f.path) == f.sha256, f.path


def test_several_addresses_share_one_port(model):
    with HubServer({REPO: model}, ["127.0.0.1", "127.0.0.2"]) as hub:
        urls = hub.urls
        assert len(urls) == 2 and urls[0].rsplit(":", 1)[1] == urls[1].rsplit(":", 1)[1] == str(hub.port)
        for u in urls:
            st, _, body = _http(f"{u}/api/models/{REPO}/revision/main")
            assert st == 200 and json.loads(body)["sha"] == model.commit
        assert {r.address for r in hub.requests} == {"127.0.0.1", "127.0.0.2"}


# ---------------------------------------------------------------------------
# /get-pip.py: the stand-in for bootstrap.pypa.io


def test_get_pip_stand_in_installs_pip_into_a_venv_without_pip(hub, tmp_path, monkeypatch):
    import subprocess
    import sys

    from sandbox import getpip, scenario

    wheel = scenario.pip_wheel()  # pip's own wheel (the sandbox cache; fetched from PyPI once)
    monkeypatch.setattr(getpip, "WHEELS", wheel.parent)
    with urllib.request.urlopen(hub.url() + "/get-pip.py", timeout=30) as response:
        text = response.read().decode()
    assert "stand-in for https://bootstrap.pypa.io/get-pip.py" in text and wheel.name in text
    script = tmp_path / "get-pip.py"
    script.write_text(text)
    venv = tmp_path / "venv"
    subprocess.run([sys.base_prefix + "/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    assert subprocess.run([str(venv / "bin/python"), "-m", "pip", "--version"], capture_output=True).returncode != 0
    run = subprocess.run([str(venv / "bin/python"), str(script), "--disable-pip-version-check"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    version = subprocess.run([str(venv / "bin/python"), "-m", "pip", "--version"], capture_output=True, text=True)
    assert version.stdout.startswith("pip " + wheel.name.split("-")[1])
