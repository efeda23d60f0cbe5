"""The Hub stand-in's faults (the ways the real Hub fails, switched on at start
or while running) and its byte accounting."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

from tests.unit.test_hub import (  # noqa: F401 - hf_env (autouse), hub and model are fixtures
    REPO,
    HubServer,
    hf_env,
    hub,
    model,
)

# ---------------------------------------------------------------------------
# faults: the ways the real Hub fails, switched on at start or while running


def _get(url: str, method: str = "GET", headers: dict | None = None, source: str | None = None, timeout: float = 10):
    """One request over http.client (optionally from a given source address): status, headers, body."""
    import http.client

    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout,
                                      source_address=(source, 0) if source else None)
    try:
        conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers or {})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def test_fault_rules_answer_status_by_glob_method_and_count(model, tmp_path):
    shard, other = model.shard_names[0], model.shard_names[1]
    faults = {"rules": [{"path": shard, "status": 500, "times": 2, "methods": ["GET"]},
                        {"path": "*.json", "kinds": ["resolve"], "status": 503}]}
    with HubServer({REPO: model}, ["127.0.0.1"], faults=faults) as hub:
        base = f"{hub.url()}/{REPO}/resolve/{model.commit}"
        st, h, body = _get(f"{base}/{shard}")
        assert st == 500 and h["Content-Type"].startswith("application/json")
        assert json.loads(body)["error"] == h["X-Error-Message"] and "X-Error-Code" not in h
        assert _get(f"{base}/{shard}", "HEAD")[0] == 200  # GET only
        assert _get(f"{base}/{other}")[0] == 200  # another file
        assert _get(f"{base}/{shard}")[0] == 500
        st, _, body = _get(f"{base}/{shard}")  # two uses spent: the file again
        assert st == 200 and body == (model.root / shard).read_bytes()
        assert _get(f"{base}/config.json", "HEAD")[0] == 503  # no `times`: every matching request
        assert _get(f"{hub.url()}/api/models/{REPO}/revision/main")[0] == 200  # kinds: resolve only
        assert [r["hits"] for r in hub.faults()["rules"]] == [2, 1]
        assert [r.fault for r in hub.requests if r.fault] == ["500", "500", "503"]

        # the real client sees the Hub's error (huggingface_hub does not retry a 5xx on a file GET)
        hub.set_faults({"rules": [{"path": shard, "status": 502, "methods": ["GET"]}]})
        with pytest.raises(HfHubHTTPError) as err:
            hf_hub_download(REPO, shard, revision=model.commit, endpoint=hub.url(), local_dir=str(tmp_path / "dl"))
        assert err.value.response.status_code == 502
        hub.clear_faults()
        assert _get(f"{base}/{shard}")[0] == 200 and hub.faults()["rules"] == []


def test_malformed_faults_are_refused_and_change_nothing(model):
    with HubServer({REPO: model}, ["127.0.0.1"], faults={"rules": [{"path": "x", "status": 500}]}) as hub:
        for bad in ({"rules": [{"path": "x"}]},  # neither status nor stall
                    {"rules": [{"status": 500, "stall": 1}]},  # both
                    {"rules": [{"status": 200}]},
                    {"rules": [{"status": 500, "colour": "red"}]},
                    {"rules": [{"stall": -1}]},
                    {"rules": [{"status": 500, "kinds": ["web"]}]},
                    {"rules": [{"corrupt": True, "status": 500}]},  # corrupt and another sort
                    {"rules": [{"corrupt": True, "stall": 1}]},
                    {"rules": [{"corrupt": False}]},  # corrupt is true or absent
                    {"rules": [{"corrupt": "yes"}]},
                    {"rules": [{"corrupt": True, "after_bytes": -1}]},
                    {"tokens": "x"}):
            with pytest.raises(ValueError):
                hub.set_faults(bad)
        assert hub.faults()["rules"][0]["path"] == "x"
        with pytest.raises(ValueError, match="exactly one of status, stall and corrupt"):
            hub.set_faults({"rules": [{"path": "x"}]})
        hub.set_faults({"rules": [{"path": "y", "corrupt": True, "after_bytes": 0, "times": 1}]})  # a good one
        assert hub.faults()["rules"][0]["path"] == "y"


def test_rules_and_the_token_can_be_scoped_to_client_addresses(model):
    """A test faults its own host only: `clients` on a rule, `token_clients` for the token; every other
    client of the shared hub is answered as if there were no faults (positive control: the listed one is)."""
    shard = model.shard_names[0]
    me, other = "127.0.0.2", "127.0.0.1"
    faults = {"token": "hf_scoped_secret", "token_clients": [me],
              "rules": [{"path": shard, "status": 500, "methods": ["GET"], "clients": [me]},
                        {"path": "config.json", "stall": 1.0, "clients": ["127.0.0.0/31"]},  # .0 and .1 only
                        {"path": "*", "kinds": ["api"], "status": 429, "retry_after": 2, "times": 1,
                         "clients": ["127.0.0.3"]}]}
    auth = {"Authorization": "Bearer hf_scoped_secret"}
    with HubServer({REPO: model}, ["127.0.0.1"], faults=faults) as hub:
        base = f"{hub.url()}/{REPO}/resolve/{model.commit}"
        st, _, body = _get(f"{base}/{shard}", source=other)
        assert st == 200 and body == (model.root / shard).read_bytes()  # not for the others...
        assert _get(f"{base}/{shard}", headers=auth, source=me)[0] == 500  # ...for the listed client
        assert _get(f"{base}/{shard}", "HEAD", headers=auth, source=me)[0] == 200  # its methods only

        # the token: required from the listed client only, the others keep the start token (none)
        api = f"{hub.url()}/api/models/{REPO}/revision/{model.commit}"
        st, h, _ = _get(api, source=me)
        assert st == 401 and h["X-Error-Code"] == "RepoNotFound"
        st, h, _ = _get(api, headers={"Authorization": "Bearer hf_wrong"}, source=me)
        assert st == 401 and h["X-Error-Message"] == "Invalid credentials in Authorization header"
        st, _, body = _get(api, headers=auth, source=me)
        assert st == 200 and json.loads(body)["private"] is True
        st, _, body = _get(api, source=other)
        assert st == 200 and json.loads(body)["private"] is False

        # a network: the stall holds 127.0.0.1's body, not 127.0.0.2's
        t0 = time.monotonic()
        assert _get(f"{base}/config.json", headers=auth, source=me)[0] == 200
        quick = time.monotonic() - t0
        t0 = time.monotonic()
        assert _get(f"{base}/config.json", source=other)[0] == 200
        held = time.monotonic() - t0
        assert quick < 0.8 <= 1.0 <= held, (quick, held)

        # a rule for a client that sends nothing is never used up by the others
        assert _get(api, source=other)[0] == 200
        st, h, _ = _get(api, source="127.0.0.3")
        assert st == 429 and h["Retry-After"] == "2"
        assert [r["hits"] for r in hub.faults()["rules"]] == [1, 1, 1]
        assert [(r.client, r.fault) for r in hub.requests if r.fault] == [
            (me, "500"), (other, "stall"), ("127.0.0.3", "429")]
        described = hub.faults()
        assert described["token_required"] is True and described["token_clients"] == ["127.0.0.2/32"]
        assert "hf_scoped_secret" not in json.dumps(described)

        for bad in ({"rules": [{"path": "x", "status": 500, "clients": "127.0.0.2"}]},  # a list, not a string
                    {"rules": [{"path": "x", "status": 500, "clients": []}]},  # empty: would match nobody
                    {"rules": [{"path": "x", "status": 500, "clients": ["sgc5"]}]},  # addresses, not names
                    {"token": "t", "token_clients": ["10.77.999.2"]}):
            with pytest.raises(ValueError):
                hub.set_faults(bad)
        assert hub.faults()["token_clients"] == ["127.0.0.2/32"]  # a refused spec changed nothing
        hub.clear_faults()
        assert _get(api, source=me)[0] == 200 and hub.faults()["token_clients"] is None


def test_429_carries_retry_after_and_huggingface_hub_waits_for_it(hub, model, tmp_path):
    hub.set_faults({"rules": [{"path": "config.json", "status": 429, "retry_after": 1, "times": 3}]})
    st, h, _ = _get(f"{hub.url()}/{REPO}/resolve/{model.commit}/config.json", "HEAD")
    assert st == 429 and h["Retry-After"] == "1"
    hub.reset_log()
    path = hf_hub_download(REPO, "config.json", revision=model.commit, endpoint=hub.url(),
                           local_dir=str(tmp_path / "dl"), etag_timeout=5)
    assert Path(path).read_bytes() == (model.root / "config.json").read_bytes()
    heads = [r for r in hub.requests if r.method == "HEAD"]
    # the first HEAD fails fast, the retried one (huggingface_hub's backoff) waits Retry-After (+1 s) after a 429
    assert [r.status for r in heads] == [429, 429, 200]
    assert heads[2].started - heads[1].started >= 1.0


def test_stall_sends_headers_then_no_body_byte_for_the_stall(model):
    import http.client
    import socket as socket_mod

    shard = model.shard_names[0]
    data = (model.root / shard).read_bytes()
    faults = {"rules": [{"path": shard, "stall": 1.0, "after_bytes": 1000, "times": 1},
                        {"path": "config.json", "stall": "forever"}]}
    with HubServer({REPO: model}, ["127.0.0.1"], faults=faults) as hub:
        conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=5)
        t0 = time.monotonic()
        conn.request("GET", f"/{REPO}/resolve/{model.commit}/{shard}")
        r = conn.getresponse()
        assert r.status == 200 and int(r.getheader("Content-Length")) == len(data)
        head = r.read(1000)
        got_head = time.monotonic() - t0
        rest = r.read()
        took = time.monotonic() - t0
        conn.close()
        assert head + rest == data
        assert got_head < 0.5 and took >= 1.0, (got_head, took)
        assert _get(f"{hub.url()}/{REPO}/resolve/{model.commit}/{shard}")[0] == 200  # once only

        # forever: headers, then nothing until the client gives up; the server notices it left
        conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=0.5)
        conn.request("GET", f"/{REPO}/resolve/{model.commit}/config.json")
        r = conn.getresponse()
        assert r.status == 200
        with pytest.raises((socket_mod.timeout, TimeoutError)):
            r.read(1)
        conn.close()
        rec = [x for x in hub.requests if x.file == "config.json"][-1]
        deadline = time.monotonic() + 20  # a bound only
        while time.monotonic() < deadline and rec.seconds == 0.0:
            time.sleep(0.05)
        assert rec.fault == "stall" and not rec.complete and rec.bytes_sent == 0 and rec.seconds > 0
        assert _get(f"{hub.url()}/{REPO}/resolve/{model.commit}/config.json", "HEAD")[0] == 200  # GETs only
    t1 = time.monotonic()
    hub2 = HubServer({REPO: model}, ["127.0.0.1"], faults={"rules": [{"path": "config.json", "stall": "forever"}]})
    with hub2:
        conn = http.client.HTTPConnection("127.0.0.1", hub2.port, timeout=5)
        conn.request("GET", f"/{REPO}/resolve/{model.commit}/config.json")
        assert conn.getresponse().status == 200
    assert time.monotonic() - t1 < 3  # stopping the hub ends a stall that is still going on
    conn.close()


def test_corrupt_sends_the_same_length_and_headers_with_one_byte_changed(model):
    shard = model.shard_names[0]
    data = (model.root / shard).read_bytes()
    faults = {"rules": [{"path": shard, "corrupt": True, "after_bytes": 1000, "times": 1},
                        {"path": "config.json", "corrupt": True, "times": 1},
                        {"path": "tokenizer.json", "corrupt": True, "after_bytes": 10**9, "times": 1}]}
    with HubServer({REPO: model}, ["127.0.0.1"], faults=faults) as hub:
        base = f"{hub.url()}/{REPO}/resolve/{model.commit}"
        _, clean_headers, _ = _get(f"{base}/{shard}", "HEAD")  # HEAD: not a body, not faulted
        st, headers, body = _get(f"{base}/{shard}")
        assert st == 200 and len(body) == len(data)
        assert {k: v for k, v in headers.items() if k != "Date"} == {
            k: v for k, v in clean_headers.items() if k != "Date"}
        assert [i for i in range(len(data)) if body[i] != data[i]] == [1000] and body[1000] == data[1000] ^ 0xFF
        assert _get(f"{base}/{shard}")[2] == data  # times: 1

        config = (model.root / "config.json").read_bytes()  # default: the middle of the body
        body = _get(f"{base}/config.json")[2]
        assert [i for i in range(len(config)) if body[i] != config[i]] == [len(config) // 2]
        tokenizer = (model.root / "tokenizer.json").read_bytes()  # past the end: the last byte
        body = _get(f"{base}/tokenizer.json")[2]
        assert len(body) == len(tokenizer) and body[:-1] == tokenizer[:-1] and body[-1] != tokenizer[-1]
        assert [r.fault for r in hub.requests if r.method == "GET"] == ["corrupt", None, "corrupt", "corrupt"]
        assert all(r.complete and r.status == 200 for r in hub.requests)

        # a range (a resumed download): the offset counts from the body's first byte
        hub.set_faults({"rules": [{"path": shard, "corrupt": True, "after_bytes": 5, "times": 1}]})
        st, headers, body = _get(f"{base}/{shard}", headers={"Range": "bytes=100-199"})
        assert st == 206 and headers["Content-Range"] == f"bytes 100-199/{len(data)}" and len(body) == 100
        assert [i for i in range(100) if body[i] != data[100 + i]] == [5]


def test_token_switch_at_run_time_answers_401_in_the_hubs_shape(hub, model):
    url = f"{hub.url()}/api/models/{REPO}/revision/{model.commit}"
    assert _get(url)[0] == 200
    hub.set_faults({"token": "hf_runtime_secret"})
    st, h, body = _get(url, headers={"Authorization": "Bearer hf_wrong"})
    assert st == 401 and h["X-Error-Message"] == "Invalid credentials in Authorization header"
    assert "X-Error-Code" not in h and json.loads(body)["error"] == h["X-Error-Message"]
    st, h, _ = _get(url)
    assert st == 401 and h["X-Error-Code"] == "RepoNotFound"
    assert hub.faults()["token_required"] is True and "hf_runtime_secret" not in json.dumps(hub.faults())

    # what huggingface_hub makes of them: a wrong token is a plain 401, no token looks like a missing repo
    with pytest.raises(HfHubHTTPError) as wrong:
        HfApi(endpoint=hub.url(), token="hf_wrong").model_info(REPO, revision=model.commit)
    assert wrong.value.response.status_code == 401 and not isinstance(wrong.value, RepositoryNotFoundError)
    with pytest.raises(RepositoryNotFoundError) as none:
        HfApi(endpoint=hub.url(), token=False).model_info(REPO, revision=model.commit)
    assert none.value.response.status_code == 401
    assert HfApi(endpoint=hub.url(), token="hf_runtime_secret").model_info(REPO, revision=model.commit).sha
    hub.clear_faults()  # back to the token the hub started with: none
    assert _get(url)[0] == 200 and hub.faults()["token_required"] is False


def test_byte_accounting_per_file_and_client(model):
    shard = model.shard_names[0]
    size = model.file(shard).size
    with HubServer({REPO: model}, ["127.0.0.1"]) as hub:
        base = f"{hub.url()}/{REPO}/resolve/{model.commit}"
        assert _get(f"{base}/{shard}", source="127.0.0.1")[0] == 200
        assert _get(f"{base}/{shard}", source="127.0.0.2", headers={"Range": "bytes=100-"})[0] == 206
        assert _get(f"{base}/config.json", source="127.0.0.2")[0] == 200
        assert _get(f"{base}/config.json", "HEAD", source="127.0.0.2")[0] == 200
        st, _, listing = _get(f"{hub.url()}/api/models/{REPO}/tree/{model.commit}", source="127.0.0.2")
        stats = hub.stats(settle_s=5)  # a body can reach the client a moment before its handler counts it
        assert stats["in_flight"] == 0
        cfg = model.file("config.json").size
        assert stats["files"][shard] == {"bytes": size + size - 100, "requests": 2, "full": 1}
        assert stats["files"]["config.json"] == {"bytes": cfg, "requests": 1, "full": 1}
        assert stats["file_bytes"] == 2 * size - 100 + cfg
        assert stats["bytes"] == stats["file_bytes"] + len(listing) == hub.bytes_served
        one, two = stats["clients"]["127.0.0.1"], stats["clients"]["127.0.0.2"]
        assert one == {"requests": 1, "bytes": size, "file_bytes": size, "files": {shard: size}}
        assert two["requests"] == 4 and two["files"] == {shard: size - 100, "config.json": cfg}
        assert two["bytes"] == size - 100 + cfg + len(listing)

        # over HTTP (this machine only), and a reset answers the counts it clears
        assert urllib_json(hub.url() + "/_sandbox/stats?settle=1") == hub.stats()
        before = _admin_post(hub.url() + "/_sandbox/stats/reset")
        assert before["bytes"] == stats["bytes"]
        after = hub.stats()
        assert after["bytes"] == 0 and after["files"] == {} and after["clients"] == {}


def urllib_json(url: str) -> dict:
    st, _, body = _get(url)
    assert st == 200, body
    return json.loads(body)


def _admin_post(url: str, body: dict | None = None) -> dict:
    from sandbox.hub import admin_request

    parts = urllib.parse.urlsplit(url)
    return admin_request(f"{parts.scheme}://{parts.netloc}", parts.path, body=body if body is not None else {})


def test_admin_endpoints_answer_this_machine_only():
    from sandbox.hub import _admin_allowed

    assert _admin_allowed("127.0.0.1", "10.77.0.1") and _admin_allowed("::1", "10.77.0.1")
    assert _admin_allowed("10.77.0.1", "10.77.0.1")  # the machine itself, through the hub's address
    assert not _admin_allowed("10.77.0.2", "10.77.0.1")  # a guest
    assert not _admin_allowed("", "10.77.0.1")


def test_serve_follows_the_faults_file_and_hub_stats_reads_the_counts(tmp_path, monkeypatch):
    """The background hub (python -m sandbox.hub serve) as the sandbox runs it: faults from a file, read
    at start and while running; `python -m sandbox hub-stats --url` and sandbox.hubd's helpers."""
    import subprocess
    import sys

    from sandbox import hubd

    root = Path(__file__).resolve().parents[2]
    faults_file, ready = tmp_path / "faults.json", tmp_path / "ready.json"
    faults_file.write_text(json.dumps({"rules": [{"path": "config.json", "status": 500}]}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandbox.hub", "serve", "--addr", "127.0.0.1", "--port", "0", "--size-mb", "2",
         "--shards", "1", "--model-dir", str(tmp_path / "m"), "--ready-file", str(ready),
         "--faults-file", str(faults_file)],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the hub did not start"
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        url, commit = info["url"], info["commit"]
        cfg = f"{url}/sandbox/tiny-moe/resolve/{commit}/config.json"
        assert _get(cfg)[0] == 500  # in force from the first request

        # hubd's helpers against this hub (its state dir pointed at tmp_path)
        monkeypatch.setattr(hubd, "STATE_DIR", tmp_path)
        monkeypatch.setattr(hubd, "FAULTS_FILE", faults_file)
        loaded = hubd.set_faults({"rules": [{"path": "config.json", "status": 503, "times": 1}]}, url=url)
        assert loaded["rules"][0]["status"] == 503
        assert _get(cfg)[0] == 503 and _get(cfg)[0] == 200
        hubd.set_faults(None, url=url)
        assert not faults_file.exists() and _get(cfg)[0] == 200
        with pytest.raises(ValueError):
            hubd.set_faults({"rules": [{"path": "x"}]}, url=url)

        run = subprocess.run([sys.executable, "-m", "sandbox", "hub-stats", "--url", url],
                             cwd=root, capture_output=True, text=True, timeout=30)
        assert run.returncode == 0, run.stderr
        stats = json.loads(run.stdout)
        size = info["files"][[f[0] for f in info["files"]].index("config.json")][1]
        assert stats["files"]["config.json"]["bytes"] == 2 * size  # the two 200s; error bodies are not file bytes
        assert stats["clients"]["127.0.0.1"]["requests"] == 4  # the /_sandbox/ calls are not logged
        run = subprocess.run([sys.executable, "-m", "sandbox", "hub-stats", "--url", url, "--reset"],
                             cwd=root, capture_output=True, text=True, timeout=30)
        assert json.loads(run.stdout)["bytes"] == stats["bytes"]
        assert hubd.stats(url=url)["requests"] == 0
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0, out
