"""A local stand-in for the Hugging Face Hub (sandbox test bed only, never deployed).

It speaks the part of the Hub HTTP API that huggingface_hub (2.x) uses for
`snapshot_download(repo_id, revision=..., local_dir=..., endpoint=...)`,
`hf_hub_download` and `HfApi(endpoint=...).model_info(repo, revision=,
files_metadata=True)`, over plain HTTP (no Xet: no X-Xet-Hash header):

    GET  /api/models/{repo}[/revision/{rev}][?blobs=true]   sha, siblings (+ size, blobId, lfs)
    GET  /api/models/{repo}/tree/{rev}[/{dir}][?recursive=true&expand=false]
    HEAD /{repo}/resolve/{rev}/{path}                      X-Repo-Commit, ETag, X-Linked-Etag,
    GET  /{repo}/resolve/{rev}/{path}                      X-Linked-Size, Content-Length,
                                                           Accept-Ranges; Range: bytes=N-[M] -> 206
    GET  /api/whoami-v2                                    who the token is (401 without one)
    GET  /  or  /health                                    200 "sandbox hub" (never needs a token)

Errors as the Hub sends them: 404 with `X-Error-Code: RepoNotFound |
RevisionNotFound | EntryNotFound`; with a token configured, a request without
it gets 401 + RepoNotFound (what the Hub answers for a private repo), one with
a wrong token 401 + `X-Error-Message: Invalid credentials in Authorization
header`. Revisions: the 40-hex commit, or the branch "main" (-> the newest
commit of the repo).

Test hooks: `throttle_bps` (a global byte rate over all connections and
addresses, settable while running), `drop_connections()` (cut every open
connection, like a network drop), and a request log: `requests` (one
RequestRecord per request), `request_count`, `bytes_served`,
`content_gets()`, `reset_log()`.

Faults (the ways the real Hub fails), set at start (`HubServer(faults=)`,
`serve --faults-file`) or while running (`set_faults()`, rewriting the
faults file, `POST /_sandbox/faults`), as JSON:

    {"token": "hf_...",          # require this bearer token from now on (null: none);
                                 #   absent: the token the server started with
     "token_clients": ["10.77.5.2"],  # optional: the token above applies to requests from these source
                                 #   addresses (or networks, "10.77.5.0/24") only; the others keep the
                                 #   token the server started with (absent: every client)
     "rules": [                  # the first rule that matches a request and has uses left answers it
       {"path": "*.safetensors", "status": 500, "times": 2, "methods": ["GET"]},
       {"path": "*", "status": 429, "retry_after": 1, "times": 3},
       {"path": "model-00001-of-00003.safetensors", "stall": 5, "after_bytes": 65536, "times": 1},
       {"path": "config.json", "stall": "forever"},
       {"path": "model-00002-of-00003.safetensors", "corrupt": true, "times": 1}]}

A rule's `path` is a glob (fnmatch, `*` crosses `/`) on the file's path in the
repo for /resolve/ requests and on the URL path for /api/ ones; `kinds`
(["resolve", "api"], default both) and `methods` (default GET and HEAD; a
stall only applies to a GET's body) narrow it; `clients` (source addresses or networks, e.g. ["10.77.5.2"];
default: every client) limits it to requests from those, so a test can fault
its own host only while others share the hub; `times` is how many matching
requests it answers (absent or null: all of them). A rule has exactly one of
`status`, `stall` and `corrupt`. A `status` rule answers that status in the
Hub's error shape (JSON body, X-Error-Message; 429 with `Retry-After: N` when
`retry_after` is given). A `stall` rule sends the headers and `after_bytes`
body bytes, then nothing for `stall` seconds ("forever": until the client
goes away or the server stops), then the rest. A `corrupt` rule (`"corrupt":
true`; like a stall, a GET's body only) sends the body with the same length
and headers but one byte changed (inverted): the byte at `after_bytes` of the
body (default: its middle; past the end: the last one), so only a client that
checks the content's digest notices; the request log marks it "corrupt".
Wrong or missing tokens get 401 as described above.

Byte accounting: `stats()` (also `GET /_sandbox/stats[?settle=S]`; `POST
/_sandbox/stats/reset[?settle=S]` answers the stats and starts over; `python
-m sandbox hub-stats`) counts the body bytes served, in total, per file and
per client address; settle waits up to S seconds for requests in flight. The /_sandbox/ endpoints answer loopback clients and the
hub's own address only, are never faulted and are not logged.

Stdlib only (plus sandbox.tinymodel), so the sandbox can run it anywhere.

    python -m sandbox.hub serve --addr 127.0.0.1 --port 0 --size-mb 40 [--draft-repo sandbox/tiny-kimi-eagle3]
"""

from __future__ import annotations

import argparse
import errno
import fnmatch
import hashlib
import ipaddress
import json
import os
import re
import select
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit
from urllib.request import ProxyHandler, Request, build_opener

try:  # `python -m sandbox.hub` and `import sandbox.hub`
    from sandbox.tinymodel import LFS_MIN_SIZE, LFS_SUFFIXES, ModelInfo, generate, generate_draft, git_blob_sha1, scan
except ImportError:  # run as a plain script next to tinymodel.py
    from tinymodel import (  # type: ignore
        LFS_MIN_SIZE, LFS_SUFFIXES, ModelInfo, generate, generate_draft, git_blob_sha1, scan)

__all__ = ["HubServer", "RequestRecord", "DEFAULT_REPO_ID", "admin_request", "main"]

DEFAULT_REPO_ID = "sandbox/tiny-moe"
_FIXED_DATE = "2025-01-01T00:00:00.000Z"  # deterministic lastModified / createdAt
_CHUNK = 64 * 1024
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


# ---------------------------------------------------------------------------
# the served content


@dataclass(frozen=True)
class _File:
    path: str  # in the repo
    disk: Path
    size: int
    sha256: str
    blob_id: str  # git oid: of the content, or of the LFS pointer for LFS files
    lfs: bool
    pointer_size: int

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.blob_id


def _lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def _safetensors_params(path: Path) -> dict[str, int]:
    """Element counts by dtype from a safetensors header (what the Hub reports as `safetensors`)."""
    out: dict[str, int] = {}
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100_000_000:
                return {}
            header = json.loads(f.read(n))
    except (OSError, ValueError, struct.error):
        return {}
    for name, t in header.items():
        if name == "__metadata__" or not isinstance(t, dict):
            continue
        count = 1
        for d in t.get("shape", []):
            count *= d
        out[t["dtype"]] = out.get(t["dtype"], 0) + count
    return out


class _Revision:
    def __init__(self, info: ModelInfo):
        self.info = info
        self.commit = info.commit
        self.files: dict[str, _File] = {}
        for fe in info.files:
            disk = Path(info.root) / fe.path
            lfs = fe.path.endswith(LFS_SUFFIXES) or fe.size >= LFS_MIN_SIZE
            if lfs:
                pointer = _lfs_pointer(fe.sha256, fe.size)
                blob_id, pointer_size = git_blob_sha1(pointer), len(pointer)
            else:
                blob_id, pointer_size = git_blob_sha1(disk.read_bytes()), 0
            self.files[fe.path] = _File(fe.path, disk, fe.size, fe.sha256, blob_id, lfs, pointer_size)
        self.dirs: set[str] = set()
        for p in self.files:
            parts = p.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                self.dirs.add("/".join(parts[:i]))
        params: dict[str, int] = {}
        for f in self.files.values():
            if f.path.endswith(".safetensors"):
                for k, v in _safetensors_params(f.disk).items():
                    params[k] = params.get(k, 0) + v
        self.safetensors = {"parameters": params, "total": sum(params.values())} if params else None

    def dir_oid(self, d: str) -> str:
        h = hashlib.sha1(f"tree\0{self.commit}\0{d}".encode())
        return h.hexdigest()


class _Repo:
    def __init__(self, repo_id: str, revisions: list[ModelInfo]):
        if not revisions:
            raise ValueError(f"repo {repo_id!r} has no revision")
        self.repo_id = repo_id
        self.revisions: dict[str, _Revision] = {}
        for info in revisions:
            if not _COMMIT_RE.match(info.commit):
                raise ValueError(f"repo {repo_id!r}: commit must be 40 lowercase hex, got {info.commit!r}")
            self.revisions[info.commit] = _Revision(info)
        self.branches = {"main": revisions[-1].commit}

    def resolve(self, rev: str) -> _Revision | None:
        commit = self.branches.get(rev, rev)
        return self.revisions.get(commit)


# ---------------------------------------------------------------------------
# request log


@dataclass
class RequestRecord:
    method: str
    path: str  # as requested (with the query)
    kind: str  # "resolve" | "revision" | "tree" | "whoami" | "health" | "other"
    status: int = 0
    bytes_sent: int = 0  # body bytes actually written
    range: str | None = None
    authorization: bool = False  # an Authorization header was sent
    client: str = ""  # the peer's address
    address: str = ""  # the bound address that answered
    seconds: float = 0.0  # set when the response is done
    complete: bool = True  # False while the body is going out, and when the connection dropped mid-body
    file: str | None = None  # the file's path in the repo, for /resolve/ requests
    fault: str | None = None  # the fault that answered: "500", "429", ..., "stall", "corrupt"
    started: float = 0.0  # time.monotonic() when the request arrived
    done: bool = False  # the handler has finished with it (bytes_sent is final)


# ---------------------------------------------------------------------------
# faults


_RULE_KEYS = {"path", "kinds", "methods", "clients", "status", "retry_after", "stall", "corrupt", "after_bytes",
              "times"}
_KINDS = ("resolve", "api")
_Networks = tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]


def _networks(value, what: str) -> _Networks | None:
    """A `clients` list (addresses or networks) as networks; None (absent or null): every client."""
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} is a non-empty list of addresses or networks (strings), got {value!r}")
    try:
        return tuple(ipaddress.ip_network(v, strict=False) for v in value)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None


def _client_in(client: str, networks: _Networks | None) -> bool:
    if networks is None:
        return True
    try:
        address = ipaddress.ip_address(client)
    except ValueError:
        return False
    return any(address in net for net in networks)


class _Rule:
    def __init__(self, spec: dict):
        if not isinstance(spec, dict):
            raise ValueError(f"a fault rule is an object, got {spec!r}")
        unknown = set(spec) - _RULE_KEYS
        if unknown:
            raise ValueError(f"unknown keys in fault rule {spec!r}: {sorted(unknown)}")
        self.path = str(spec.get("path", "*"))
        self.kinds = tuple(spec.get("kinds") or _KINDS)
        if not set(self.kinds) <= set(_KINDS):
            raise ValueError(f"fault rule kinds must be among {_KINDS}, got {self.kinds}")
        self.status = spec.get("status")
        self.is_stall = "stall" in spec
        self.is_corrupt = "corrupt" in spec
        if [self.status is not None, self.is_stall, self.is_corrupt].count(True) != 1:
            raise ValueError(f"a fault rule has exactly one of status, stall and corrupt: {spec!r}")
        if self.is_corrupt and spec["corrupt"] is not True:
            raise ValueError(f"corrupt is true (absent: no corruption), got {spec['corrupt']!r}")
        if self.status is not None and not (
            isinstance(self.status, int) and 400 <= self.status <= 599 and self.status in HTTPStatus._value2member_map_
        ):
            raise ValueError(f"fault status must be an HTTP error status (400..599), got {self.status!r}")
        self.retry_after = spec.get("retry_after")
        if self.retry_after is not None and not (isinstance(self.retry_after, int) and self.retry_after >= 0):
            raise ValueError(f"retry_after must be a non-negative int (seconds), got {self.retry_after!r}")
        stall = spec.get("stall")
        if stall in ("forever", None):
            self.stall: float | None = None
        elif isinstance(stall, (int, float)) and not isinstance(stall, bool) and stall >= 0:
            self.stall = float(stall)
        else:
            raise ValueError(f'stall is seconds (>= 0) or "forever", got {stall!r}')
        after = spec.get("after_bytes")
        if after is not None and not (isinstance(after, int) and not isinstance(after, bool) and after >= 0):
            raise ValueError(f"after_bytes is a non-negative int (bytes of the body), got {after!r}")
        self.after_bytes: int | None = after  # None: 0 for a stall, the body's middle for a corruption
        self.is_body = self.is_stall or self.is_corrupt  # acts on a GET's body, after the headers
        default_methods = ("GET",) if self.is_body else ("GET", "HEAD")
        self.methods = tuple(m.upper() for m in (spec.get("methods") or default_methods))
        times = spec.get("times")
        if times is not None and not (isinstance(times, int) and times >= 0):
            raise ValueError(f"times must be a non-negative int or null, got {times!r}")
        self.times: int | None = times
        self.clients = _networks(spec.get("clients"), "a fault rule's clients")
        self.hits = 0
        self.spec = dict(spec)

    def matches(self, kind: str, method: str, target: str, client: str = "") -> bool:
        return (
            kind in self.kinds
            and method in self.methods
            and (self.times is None or self.hits < self.times)
            and _client_in(client, self.clients)
            and fnmatch.fnmatchcase(target, self.path)
        )

    def describe(self) -> dict:
        return {**self.spec, "hits": self.hits}


class _Faults:
    """The fault rules in force, with how often each has answered (thread-safe)."""

    def __init__(self, spec: dict | None = None, digest: str | None = None):
        spec = spec or {}
        if not isinstance(spec, dict):
            raise ValueError(f"faults are a JSON object, got {type(spec).__name__}")
        unknown = set(spec) - {"token", "token_clients", "rules"}
        if unknown:
            raise ValueError(f"unknown keys in faults: {sorted(unknown)} (known: token, token_clients, rules)")
        rules = spec.get("rules") or []
        if not isinstance(rules, list):
            raise ValueError("faults.rules is a list")
        self.rules = [_Rule(r) for r in rules]
        self.token_set = "token" in spec
        self.token = spec.get("token")
        if self.token is not None and not isinstance(self.token, str):
            raise ValueError("faults.token is a string or null")
        self.token_clients = _networks(spec.get("token_clients"), "faults.token_clients")
        self.digest = digest
        self._lock = threading.Lock()

    def take(self, kind: str, method: str, target: str, body: bool, client: str = "") -> _Rule | None:
        """The first rule of the body sort (stall, corrupt: body=True) or of the status sort that answers
        this request from `client`; counts the use."""
        with self._lock:
            for rule in self.rules:
                if rule.is_body == body and rule.matches(kind, method, target, client):
                    rule.hits += 1
                    return rule
        return None

    def describe(self) -> dict:
        with self._lock:
            return {"rules": [r.describe() for r in self.rules], "digest": self.digest}


def _admin_allowed(client: str, bound: str) -> bool:
    """/_sandbox/ endpoints: only this machine (loopback, or the hub's own address as the source)."""
    try:
        return ipaddress.ip_address(client).is_loopback or client == bound
    except ValueError:
        return False


def admin_request(url: str, path: str, body: dict | None = None, timeout: float = 10.0) -> dict:
    """GET (or POST with a JSON body) one of a hub's /_sandbox/ endpoints; never through a proxy."""
    data = None if body is None else json.dumps(body).encode()
    req = Request(url.rstrip("/") + path, data=data, method="GET" if body is None else "POST",
                  headers={"Content-Type": "application/json"} if data is not None else {})
    with build_opener(ProxyHandler({})).open(req, timeout=timeout) as response:
        return json.loads(response.read())


class _Pacer:
    """One byte budget for the whole server: throttle_bps over all connections."""

    def __init__(self, hub: HubServer):
        self._hub = hub
        self._lock = threading.Lock()
        self._next = 0.0

    def wait(self, n: int) -> None:
        bps = self._hub.throttle_bps
        if not bps:
            return
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + n / bps
            delay = self._next - now
        if delay > 0:
            time.sleep(delay)


class _HTTPError(Exception):
    def __init__(self, status: int, code: str | None = None, message: str = "", headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message or HTTPStatus(status).phrase
        self.headers = headers or {}


# ---------------------------------------------------------------------------
# HTTP


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like the Hub
    server_version = "sandbox-hub/1"
    hub: HubServer  # set on the subclass made per HubServer

    # quiet unless the server is verbose
    def log_message(self, format: str, *args) -> None:  # noqa: A002
        if self.hub.verbose:
            sys.stderr.write(f"hub {self.address_string()} {format % args}\n")

    def setup(self) -> None:
        super().setup()
        self.hub._track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.hub._track(self.connection, False)

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch("HEAD")

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        self._body = self.rfile.read(length) if length else b""
        self._dispatch("POST")

    # -- routing -----------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        t0 = time.monotonic()
        url = urlsplit(self.path)
        path = url.path
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        rec = RequestRecord(
            method=method,
            path=self.path,
            kind="other",
            range=self.headers.get("Range"),
            authorization=bool(self.headers.get("Authorization")),
            client=self.client_address[0] if self.client_address else "",
            address=str(self.server.server_address[0]),
            started=t0,
        )
        if path.startswith("/_sandbox/"):
            self._admin(rec, method, path, query)  # the control plane: not logged, never faulted
            return
        fault_kind, target = None, path
        if "/resolve/" in path and method in ("GET", "HEAD"):
            rec.kind = fault_kind = "resolve"
            rec.file = target = unquote(path.split("/resolve/", 1)[1].partition("/")[2])
        elif path.startswith("/api/"):
            fault_kind = "api"
        self.hub._record(rec)  # logged now, updated live (bytes_sent grows while the body goes out)
        try:
            rule = self.hub._faults.take(fault_kind, method, target, body=False, client=rec.client) \
                if fault_kind else None
            if rule is not None:
                rec.fault = str(rule.status)
                raise _fault_error(rule)
            if path in ("/", "/health"):
                rec.kind = "health"
                self._send_json(rec, method, {"status": "ok", "server": "sandbox hub"})
            elif path == "/api/whoami-v2":
                rec.kind = "whoami"
                self._check_auth(require=True)
                self._send_json(rec, method, {"type": "user", "name": "sandbox", "auth": {"type": "access_token"}})
            elif path.startswith("/api/models/"):
                if method == "POST":
                    raise _HTTPError(405, None, "Method not allowed")
                self._api_models(rec, method, path[len("/api/models/") :], query)
            elif path == "/get-pip.py" and method in ("GET", "HEAD"):
                rec.kind = "get-pip"
                self._get_pip(rec, method)
            elif "/resolve/" in path and method in ("GET", "HEAD"):
                rec.kind = "resolve"
                self._resolve(rec, method, path)
            else:
                raise _HTTPError(404, None, "Not found")
        except _HTTPError as e:
            self._send_error(rec, method, e)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError, OSError):
            rec.complete = False
            self.close_connection = True
        finally:
            rec.seconds = time.monotonic() - t0
            rec.done = True

    def _admin(self, rec: RequestRecord, method: str, path: str, query: dict[str, str]) -> None:
        try:
            if not _admin_allowed(rec.client, rec.address):
                raise _HTTPError(403, None, "the /_sandbox/ endpoints answer this machine only")
            settle = min(float(query.get("settle") or 0), 30.0)
            if path == "/_sandbox/stats" and method in ("GET", "HEAD"):
                self._send_json(rec, method, self.hub.stats(settle_s=settle))
            elif path == "/_sandbox/stats/reset" and method == "POST":
                self._send_json(rec, method, self.hub.stats(reset=True, settle_s=settle))
            elif path == "/_sandbox/faults" and method in ("GET", "HEAD"):
                self._send_json(rec, method, self.hub.faults())
            elif path == "/_sandbox/faults" and method == "POST":
                try:
                    spec = json.loads(self._body or b"null")
                    self.hub.set_faults(spec, digest=hashlib.sha256(self._body).hexdigest() if spec else None)
                except ValueError as e:
                    raise _HTTPError(400, None, f"bad faults: {e}") from None
                self._send_json(rec, method, self.hub.faults())
            else:
                raise _HTTPError(404, None, "Not found")
        except ValueError:
            self._send_error(rec, method, _HTTPError(400, None, "settle is a number of seconds"))
        except _HTTPError as e:
            self._send_error(rec, method, e)
        except OSError:
            self.close_connection = True

    def _get_pip(self, rec: RequestRecord, method: str) -> None:
        """The sandbox's stand-in for bootstrap.pypa.io/get-pip.py (sandbox/getpip.py)."""
        from sandbox import getpip

        wheel = getpip.newest_wheel()
        if wheel is None:
            raise _HTTPError(404, None, f"no pip wheel in {getpip.WHEELS} (python -m sandbox up makes one)")
        self._send_body(rec, method, getpip.script(wheel).encode(), "text/x-python")

    def _check_auth(self, require: bool = False) -> None:
        expected = self.hub.token_for(self.client_address[0] if self.client_address else "")
        if expected is None and not require:
            return
        auth = self.headers.get("Authorization") or ""
        if not auth:
            # what the Hub answers for a private repo without credentials
            raise _HTTPError(401, "RepoNotFound", "Invalid username or password.")
        given = auth[7:] if auth.lower().startswith("bearer ") else ""
        if expected is not None and given != expected:
            raise _HTTPError(401, None, "Invalid credentials in Authorization header")

    def _repo(self, rest: str) -> tuple[_Repo, str]:
        """Split 'ns/name/...' into (repo, remainder) using the known repo ids (longest match)."""
        rest = unquote(rest)
        for repo_id in sorted(self.hub._repos, key=len, reverse=True):
            if rest == repo_id or rest.startswith(repo_id + "/"):
                return self.hub._repos[repo_id], rest[len(repo_id) + 1 :]
        raise _HTTPError(
            404,
            "RepoNotFound",
            "Repository not found",
        )

    def _revision(self, repo: _Repo, rev: str) -> _Revision:
        r = repo.resolve(unquote(rev))
        if r is None:
            raise _HTTPError(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return r

    def _api_models(self, rec: RequestRecord, method: str, rest: str, query: dict[str, str]) -> None:
        self._check_auth()
        # /api/models/{repo}/revision/{rev} | /api/models/{repo}/tree/{rev}[/{path}] | /api/models/{repo}
        m = re.match(r"^(?P<repo>.+?)/(?P<op>revision|tree)/(?P<rest>.+)$", rest)
        if m and any(m.group("repo") == r or unquote(m.group("repo")) == r for r in self.hub._repos):
            repo, _ = self._repo(m.group("repo"))
            op = m.group("op")
            if op == "revision":
                rec.kind = "revision"
                rev = self._revision(repo, m.group("rest"))
                self._send_json(rec, method, self._model_info(repo, rev, _truthy(query.get("blobs"))))
                return
            rec.kind = "tree"
            rev_s, _, sub = m.group("rest").partition("/")
            rev = self._revision(repo, rev_s)
            entries = self._tree(
                rev, unquote(sub).strip("/"), _truthy(query.get("recursive")), _truthy(query.get("expand"))
            )
            self._send_json(rec, method, entries)
            return
        repo, remainder = self._repo(rest)
        if remainder:
            raise _HTTPError(404, None, "Not found")
        rec.kind = "revision"
        rev = self._revision(repo, "main")
        self._send_json(rec, method, self._model_info(repo, rev, _truthy(query.get("blobs"))))

    # -- payloads ------------------------------------------------------------

    def _model_info(self, repo: _Repo, rev: _Revision, blobs: bool) -> dict:
        siblings = []
        for f in sorted(rev.files.values(), key=lambda f: f.path):
            s: dict = {"rfilename": f.path}
            if blobs:
                s["size"] = f.size
                s["blobId"] = f.blob_id
                if f.lfs:
                    s["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": f.pointer_size}
            siblings.append(s)
        cfg = rev.info.config or {}
        config = {k: cfg[k] for k in ("architectures", "model_type") if k in cfg}
        if isinstance(cfg.get("quantization_config"), dict):
            config["quantization_config"] = {"quant_method": cfg["quantization_config"].get("quant_method")}
        author = repo.repo_id.split("/")[0] if "/" in repo.repo_id else None
        info = {
            "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": author,
            "sha": rev.commit,
            "lastModified": _FIXED_DATE,
            "createdAt": _FIXED_DATE,
            "private": self.hub.token_for(self.client_address[0] if self.client_address else "") is not None,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "library_name": "transformers",
            "pipeline_tag": "text-generation",
            "tags": ["transformers", "safetensors", cfg.get("model_type", "custom"), "compressed-tensors"],
            "config": config,
            "siblings": siblings,
            "spaces": [],
            "usedStorage": sum(f.size for f in rev.files.values()),
        }
        if rev.safetensors:
            info["safetensors"] = rev.safetensors
        return info

    def _tree(self, rev: _Revision, sub: str, recursive: bool, expand: bool) -> list[dict]:
        if sub and sub not in rev.dirs:
            if sub in rev.files:
                raise _HTTPError(400, None, f"{sub} is a file, not a directory")
            raise _HTTPError(404, "EntryNotFound", f"{sub} does not exist on {rev.commit}")
        prefix = sub + "/" if sub else ""

        def wanted(p: str) -> bool:
            if not p.startswith(prefix) or p == sub:
                return False
            return recursive or "/" not in p[len(prefix) :]

        out: list[dict] = []
        for d in sorted(x for x in rev.dirs if wanted(x)):
            out.append({"type": "directory", "oid": rev.dir_oid(d), "size": 0, "path": d})
        for f in sorted((f for f in rev.files.values() if wanted(f.path)), key=lambda f: f.path):
            e: dict = {"type": "file", "oid": f.blob_id, "size": f.size, "path": f.path}
            if f.lfs:
                e["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": f.pointer_size}
            if expand:
                e["lastCommit"] = {"id": rev.commit, "title": "Upload folder", "date": _FIXED_DATE}
            out.append(e)
        return out

    # -- resolve ---------------------------------------------------------------

    def _resolve(self, rec: RequestRecord, method: str, path: str) -> None:
        self._check_auth()
        repo_part, _, rest = path.lstrip("/").partition("/resolve/")
        repo, remainder = self._repo(repo_part)
        if remainder:
            raise _HTTPError(404, "RepoNotFound", "Repository not found")
        rev_s, _, file_s = rest.partition("/")
        rev = self._revision(repo, rev_s)
        f = rev.files.get(unquote(file_s))
        if f is None:
            raise _HTTPError(
                404,
                "EntryNotFound",
                f"{unquote(file_s)} does not exist on {rev.commit}",
                headers={"X-Repo-Commit": rev.commit},
            )
        headers = {
            "Content-Type": _content_type(f.path),
            "Accept-Ranges": "bytes",
            "ETag": f'"{f.etag}"',
            "X-Repo-Commit": rev.commit,
            "Content-Disposition": (
                f"inline; filename*=UTF-8''{quote(f.path.rsplit('/', 1)[-1])}; "
                f'filename="{f.path.rsplit("/", 1)[-1]}"'
            ),
            "Cache-Control": "private, max-age=0, must-revalidate" if self.hub.token_for(rec.client)
            else "public, max-age=3600",
        }
        if f.lfs:
            headers["X-Linked-Etag"] = f'"{f.sha256}"'
            headers["X-Linked-Size"] = str(f.size)
        start, end = 0, f.size - 1
        status = 200
        rng = self.headers.get("Range")
        if rng:
            parsed = _parse_range(rng, f.size)
            if parsed is None:  # malformed or multi-range: ignore it, like many servers
                pass
            elif parsed == "unsatisfiable":
                raise _HTTPError(416, None, "Range Not Satisfiable", headers={"Content-Range": f"bytes */{f.size}"})
            else:
                start, end = parsed
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{f.size}"
        length = max(0, end - start + 1)
        headers["Content-Length"] = str(length)
        rec.status = status
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if method == "HEAD" or length == 0:
            return
        rule = self.hub._faults.take("resolve", method, f.path, body=True, client=rec.client)
        self._send_file(rec, f.disk, start, length, rule)

    def _send_file(self, rec: RequestRecord, disk: Path, offset: int, length: int, rule: _Rule | None = None) -> None:
        sock = self.connection
        rec.complete = False
        with open(disk, "rb") as fh:
            if rule is not None and rule.is_stall:
                rec.fault = "stall"
                first = min(rule.after_bytes or 0, length)
                self._send_chunks(rec, fh, offset, first)
                self._stall(rule.stall)
                offset, length = offset + first, length - first
            if rule is not None and rule.is_corrupt:
                rec.fault = "corrupt"
                at = length // 2 if rule.after_bytes is None else min(rule.after_bytes, length - 1)
                self._send_chunks(rec, fh, offset, length, flip=at)  # read + send: the bytes pass through here
            elif self.hub.throttle_bps:
                self._send_chunks(rec, fh, offset, length)
            else:
                pos, remaining = offset, length
                while remaining > 0:
                    try:
                        n = os.sendfile(sock.fileno(), fh.fileno(), pos, min(remaining, 8 << 20))
                    except BlockingIOError:
                        time.sleep(0.001)
                        continue
                    if n == 0:
                        raise ConnectionAbortedError("file shrank while serving")
                    pos += n
                    remaining -= n
                    rec.bytes_sent += n
        rec.complete = True

    def _send_chunks(self, rec: RequestRecord, fh, offset: int, length: int, flip: int | None = None) -> None:
        """Send length bytes from offset with read + sendall, through the pacer when throttled; `flip`: the
        body byte (counted from offset) sent inverted."""
        fh.seek(offset)
        remaining = length
        while remaining > 0:
            chunk = fh.read(min(_CHUNK, remaining))
            if not chunk:
                raise ConnectionAbortedError("file shrank while serving")
            at = None if flip is None else flip - (length - remaining)
            if at is not None and 0 <= at < len(chunk):
                chunk = chunk[:at] + bytes([chunk[at] ^ 0xFF]) + chunk[at + 1:]
            self.hub._pacer.wait(len(chunk))
            self.connection.sendall(chunk)
            rec.bytes_sent += len(chunk)
            remaining -= len(chunk)

    def _stall(self, seconds: float | None) -> None:
        """Send nothing for `seconds` (None: until the client goes away or the server stops)."""
        sock = self.connection
        deadline = None if seconds is None else time.monotonic() + seconds
        while True:
            if self.hub._stopping.is_set():
                raise ConnectionAbortedError("the hub is stopping")
            left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if left <= 0:
                return
            readable, _, _ = select.select([sock], [], [], left)
            if readable:  # mid-response, readable means the client closed (or reset) the connection
                try:
                    if not sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                        raise ConnectionAbortedError("the client went away during the stall")
                except BlockingIOError:
                    pass
                time.sleep(left)

    # -- responses ---------------------------------------------------------------

    def _send_json(self, rec: RequestRecord, method: str, obj) -> None:
        self._send_body(rec, method, json.dumps(obj).encode(), "application/json; charset=utf-8")

    def _send_body(self, rec: RequestRecord, method: str, body: bytes, content_type: str) -> None:
        rec.status = 200
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if method != "HEAD":
            self._write_body(rec, body)

    def _write_body(self, rec: RequestRecord, body: bytes) -> None:
        rec.bytes_sent += len(body)  # counted first: the client may have it before this thread runs again
        try:
            self.wfile.write(body)
        except OSError:
            rec.bytes_sent -= len(body)
            raise

    def _send_error(self, rec: RequestRecord, method: str, e: _HTTPError) -> None:
        body = json.dumps({"error": e.message}).encode()
        rec.status = e.status
        self.send_response(e.status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        if e.code:
            self.send_header("X-Error-Code", e.code)
        self.send_header("X-Error-Message", e.message)
        for k, v in e.headers.items():
            self.send_header(k, v)
        self.end_headers()
        if method != "HEAD":
            self._write_body(rec, body)


_FAULT_MESSAGES = {
    429: "You have exceeded our rate limit. Retry later.",
    500: "Internal Error - We're working hard to fix this as soon as possible!",
}


def _fault_error(rule: _Rule) -> _HTTPError:
    headers = {"Retry-After": str(rule.retry_after)} if rule.retry_after is not None else {}
    message = _FAULT_MESSAGES.get(rule.status) or HTTPStatus(rule.status).phrase
    return _HTTPError(rule.status, None, message, headers=headers)


def _truthy(v: str | None) -> bool:
    return v is not None and v.lower() in ("1", "true", "yes")


def _content_type(path: str) -> str:
    if path.endswith(".json"):
        return "application/json"
    if path.endswith((".md", ".txt", ".py", ".gitattributes")):
        return "text/plain; charset=utf-8"
    return "application/octet-stream"


def _parse_range(value: str, size: int) -> tuple[int, int] | str | None:
    """'bytes=N-', 'bytes=N-M', 'bytes=-K' -> (start, end) inclusive; 'unsatisfiable'; None if unusable."""
    m = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", value)
    if not m or (m.group(1) == "" and m.group(2) == ""):
        return None
    a, b = m.group(1), m.group(2)
    if a == "":  # suffix: the last K bytes
        k = int(b)
        if k == 0:
            return "unsatisfiable"
        return (max(0, size - k), size - 1)
    start = int(a)
    end = size - 1 if b == "" else min(int(b), size - 1)
    if start >= size or (b != "" and int(b) < start):
        return "unsatisfiable"
    return (start, end)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    allow_reuse_address = True


class _Server6(_Server):
    address_family = socket.AF_INET6


# ---------------------------------------------------------------------------


class HubServer:
    """Serve generated repos on one port of each given address.

    repos: repo id -> a ModelInfo (from sandbox.tinymodel.generate), a directory
    (scanned: every file but .git/ and .cache/; the commit is a content hash), or a
    list of those (several revisions; "main" is the last).
    """

    def __init__(
        self,
        repos: dict[str, Path | str | ModelInfo | list[Path | str | ModelInfo]],
        addresses: list[str] | tuple[str, ...] = ("127.0.0.1",),
        port: int = 0,
        token: str | None = None,
        throttle_bps: int | None = None,
        verbose: bool = False,
        faults: dict | None = None,
    ):
        if not addresses:
            raise ValueError("HubServer needs at least one address")
        self.addresses = list(addresses)
        self.port = port
        self.token = token
        self._start_token = token
        self._faults = _Faults()
        self._stopping = threading.Event()
        self._since = time.time()
        self.throttle_bps = throttle_bps
        self.verbose = verbose
        self._repos: dict[str, _Repo] = {}
        for repo_id, value in repos.items():
            values = value if isinstance(value, (list, tuple)) else [value]
            infos = [v if isinstance(v, ModelInfo) else scan(Path(v)) for v in values]
            self._repos[repo_id] = _Repo(repo_id, infos)
        self._servers: list[_Server] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._pacer = _Pacer(self)
        self.requests: list[RequestRecord] = []
        if faults:
            self.set_faults(faults)

    # -- info ------------------------------------------------------------------

    def commit(self, repo_id: str, branch: str = "main") -> str:
        return self._repos[repo_id].branches[branch]

    def url(self, address: str | None = None) -> str:
        """The endpoint (HF_ENDPOINT) for one of the bound addresses (default: the first)."""
        addr = address or self.addresses[0]
        if addr not in self.addresses:
            raise ValueError(f"{addr} is not one of the bound addresses {self.addresses}")
        host = f"[{addr}]" if ":" in addr else addr
        return f"http://{host}:{self.port}"

    @property
    def urls(self) -> list[str]:
        return [self.url(a) for a in self.addresses]

    # -- request log -------------------------------------------------------------

    def _record(self, rec: RequestRecord) -> None:
        with self._lock:
            self.requests.append(rec)

    @property
    def request_count(self) -> int:
        with self._lock:
            return len(self.requests)

    @property
    def bytes_served(self) -> int:
        with self._lock:
            return sum(r.bytes_sent for r in self.requests)

    def content_gets(self) -> list[RequestRecord]:
        """GET requests for file contents (resolve), in order."""
        with self._lock:
            return [r for r in self.requests if r.kind == "resolve" and r.method == "GET"]

    def reset_log(self) -> None:
        with self._lock:
            self.requests.clear()
            self._since = time.time()

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Wait until every logged request is finished (its byte count final); False on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                busy = any(not r.done for r in self.requests)
            if not busy:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def stats(self, reset: bool = False, settle_s: float = 0.0) -> dict:
        """Body bytes served since the last reset: in total, per file (/resolve/ GETs) and per client address.

        settle_s: first wait up to that long for requests in flight to finish (in_flight says how many did not).

        files[path]: bytes (of its content, 200/206 answers), requests (GETs of it, errors included),
        full (200 answers that sent the whole file). clients[address]: requests, bytes (every body),
        file_bytes, files {path: bytes}.
        A body still going out counts what was sent so far; reset=True answers, then starts over.
        """
        if settle_s > 0:
            self.wait_idle(settle_s)
        with self._lock:
            recs = list(self.requests)
            since = self._since
            if reset:
                self.requests.clear()
                self._since = time.time()
        files: dict[str, dict] = {}
        clients: dict[str, dict] = {}
        for r in recs:
            c = clients.setdefault(r.client, {"requests": 0, "bytes": 0, "file_bytes": 0, "files": {}})
            c["requests"] += 1
            c["bytes"] += r.bytes_sent
            if r.kind == "resolve" and r.method == "GET" and r.file is not None:
                f = files.setdefault(r.file, {"bytes": 0, "requests": 0, "full": 0})
                f["requests"] += 1
                if r.status in (200, 206):  # file content (an error's JSON body counts in bytes only)
                    f["bytes"] += r.bytes_sent
                    f["full"] += int(r.complete and r.status == 200 and r.fault is None)
                    c["file_bytes"] += r.bytes_sent
                    c["files"][r.file] = c["files"].get(r.file, 0) + r.bytes_sent
        return {
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since)),
            "requests": len(recs),
            "in_flight": sum(not r.done for r in recs),
            "bytes": sum(r.bytes_sent for r in recs),
            "file_bytes": sum(f["bytes"] for f in files.values()),
            "files": files,
            "clients": clients,
        }

    # -- faults ----------------------------------------------------------------------

    def set_faults(self, spec: dict | None, digest: str | None = None) -> None:
        """Replace the fault rules (None or {}: none) and the token rule; counts start over.

        Raises ValueError (and changes nothing) when the spec is malformed.
        """
        faults = _Faults(spec, digest)
        self._faults = faults
        self.token = faults.token if faults.token_set else self._start_token

    def clear_faults(self) -> None:
        self.set_faults(None)

    def token_for(self, client: str) -> str | None:
        """The token a request from `client` must carry (None: none): the faults' token for the clients
        their token_clients names (all when absent), the token the server started with for the others."""
        faults = self._faults
        if faults.token_set and not _client_in(client, faults.token_clients):
            return self._start_token
        return self.token

    def faults(self) -> dict:
        """The rules in force with their hit counts, and whether a token is required (never the token)
        and from which clients (null: all)."""
        clients = self._faults.token_clients
        return {**self._faults.describe(), "token_required": self.token is not None,
                "token_clients": None if clients is None else [str(n) for n in clients]}

    # -- connections ---------------------------------------------------------------

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            (self._conns.add if add else self._conns.discard)(conn)

    def drop_connections(self) -> int:
        """Cut every open client connection now (a network drop). Returns how many."""
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return len(conns)

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> HubServer:
        if self._servers:
            return self
        self._stopping.clear()
        handler = type("_BoundHandler", (_Handler,), {"hub": self})
        last_err: OSError | None = None
        for _attempt in range(50):
            servers: list[_Server] = []
            port = self.port
            try:
                for addr in self.addresses:
                    cls = _Server6 if ":" in addr else _Server
                    srv = cls((addr, port), handler)
                    servers.append(srv)
                    port = srv.server_address[1]
            except OSError as e:
                for s in servers:
                    s.server_close()
                last_err = e
                # an ephemeral port free on the first address but taken on another: try again
                if self.port == 0 and e.errno == errno.EADDRINUSE and len(self.addresses) > 1:
                    continue
                raise
            self.port = port
            self._servers = servers
            break
        else:
            raise last_err or OSError("could not bind")
        for srv in self._servers:
            t = threading.Thread(
                target=srv.serve_forever, kwargs={"poll_interval": 0.1}, name=f"hub-{srv.server_address[0]}"
            )
            t.daemon = True
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stopping.set()  # stalled responses end now
        for srv in self._servers:
            srv.shutdown()
        self.drop_connections()
        for srv in self._servers:
            srv.server_close()
        for t in self._threads:
            t.join(timeout=5)
        self._servers, self._threads = [], []

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------------------
# CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sandbox.hub", description="A local Hugging Face Hub stand-in.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="generate (or take) a model and serve it until interrupted")
    s.add_argument("--addr", action="append", help="address to bind (repeatable; default 127.0.0.1)")
    s.add_argument("--port", type=int, default=0, help="port (0: any free one)")
    s.add_argument("--repo", default=DEFAULT_REPO_ID, help=f"repo id (default {DEFAULT_REPO_ID})")
    s.add_argument("--size-mb", type=int, default=40, help="size of the generated model")
    s.add_argument("--shards", type=int, default=3)
    s.add_argument("--format", dest="quant_format", default="nvfp4-pack-quantized")
    s.add_argument("--commit", help="serve the model at this 40-hex revision (default: derived from content)")
    s.add_argument("--model-type", default="deepseek_v3", choices=["deepseek_v3", "kimi_k2"])
    s.add_argument("--model-dir", type=Path, help="where to generate the model (default: a temp dir)")
    s.add_argument("--serve-dir", type=Path, help="serve this existing directory instead of generating")
    s.add_argument("--draft-repo", help="also serve a tiny generated EAGLE3 draft model under this repo id")
    s.add_argument("--draft-commit", help="the draft's 40-hex revision (default: derived from content)")
    s.add_argument("--draft-dir", type=Path, help="where to generate the draft (default: a temp dir)")
    s.add_argument("--extra-repo", action="append", default=[], metavar="REPO@COMMIT=DIR",
                   help="also serve the existing directory DIR as REPO at COMMIT (repeatable)")
    s.add_argument("--token-env", metavar="VAR", help="require the token held in this environment variable")
    s.add_argument("--throttle-mbps", type=float, help="limit the total rate (MB/s, 10^6 bytes)")
    s.add_argument("--throttle-file", type=Path,
                   help="a file holding a rate in MB/s that overrides --throttle-mbps while it exists (tests)")
    s.add_argument("--ready-file", type=Path, help="write {url, urls, port, repo, commit, files} here once serving")
    s.add_argument("--faults-file", type=Path,
                   help="a JSON file of faults (see the module doc), read at start and whenever it changes; "
                        "removing it clears them")
    s.add_argument("-v", "--verbose", action="store_true", help="log every request to stderr")
    st = sub.add_parser("stats", help="print a running hub's byte accounting (JSON)")
    st.add_argument("--url", required=True, help="the hub's endpoint, e.g. http://127.0.0.1:18080")
    st.add_argument("--reset", action="store_true", help="print, then start counting from zero")
    fa = sub.add_parser("faults", help="print (or set) a running hub's faults (JSON)")
    fa.add_argument("--url", required=True, help="the hub's endpoint")
    fa.add_argument("spec", nargs="?", help="faults as JSON ('{}' or 'null' clears them); omitted: print")
    args = ap.parse_args(argv)

    if args.cmd == "stats":
        path = ("/_sandbox/stats/reset" if args.reset else "/_sandbox/stats") + "?settle=2"
        print(json.dumps(admin_request(args.url, path, body={} if args.reset else None, timeout=15),
                         indent=1, sort_keys=True))
        return 0
    if args.cmd == "faults":
        if args.spec is None:
            out = admin_request(args.url, "/_sandbox/faults")
        else:
            out = admin_request(args.url, "/_sandbox/faults", body=json.loads(args.spec))
        print(json.dumps(out, indent=1, sort_keys=True))
        return 0

    token = None
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            ap.error(f"--token-env {args.token_env}: the variable is empty or unset")

    tmp = tmp_draft = None
    if args.serve_dir:
        info = scan(args.serve_dir)
    else:
        model_dir = args.model_dir
        if model_dir is None:
            tmp = tempfile.TemporaryDirectory(prefix="sandbox-hub-")
            model_dir = Path(tmp.name)
        t0 = time.monotonic()
        info = generate(
            model_dir,
            args.size_mb,
            args.shards,
            args.quant_format,
            model_type=args.model_type,
            repo_name=args.repo,
            commit=args.commit,
        )
        print(f"generated {info.total_bytes} bytes in {time.monotonic() - t0:.2f}s at {model_dir}", flush=True)
    repos: dict = {args.repo: info}
    if args.draft_repo:
        draft_dir = args.draft_dir
        if draft_dir is None:
            tmp_draft = tempfile.TemporaryDirectory(prefix="sandbox-hub-draft-")
            draft_dir = Path(tmp_draft.name)
        repos[args.draft_repo] = generate_draft(draft_dir, commit=args.draft_commit, repo_name=args.draft_repo)
        print(f"generated the draft {args.draft_repo} ({repos[args.draft_repo].total_bytes} bytes) at {draft_dir}",
              flush=True)

    for extra in args.extra_repo:
        name, _, directory = extra.partition("=")
        repo_id, _, commit = name.partition("@")
        served = scan(Path(directory), commit=commit or None)
        if repo_id in repos:  # another revision of a repo served already: both ("main" stays the first one's)
            before = repos[repo_id] if isinstance(repos[repo_id], list) else [repos[repo_id]]
            repos[repo_id] = [served, *before]
        else:
            repos[repo_id] = served
        print(f"serving {repo_id}@{served.commit} from {directory}", flush=True)

    hub = HubServer(
        repos,
        args.addr or ["127.0.0.1"],
        args.port,
        token=token,
        throttle_bps=int(args.throttle_mbps * 1e6) if args.throttle_mbps else None,
        verbose=args.verbose,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    default_bps = hub.throttle_bps

    def follow_throttle_file() -> None:
        while not stop.wait(0.25):
            try:
                hub.throttle_bps = int(float(args.throttle_file.read_text()) * 1e6)
            except (OSError, ValueError):
                hub.throttle_bps = default_bps

    if args.throttle_file:
        threading.Thread(target=follow_throttle_file, daemon=True).start()

    def load_faults_file(last: str | None) -> str | None:
        """Apply the faults file when its content changed; returns the digest now in force."""
        try:
            raw = args.faults_file.read_bytes()
        except OSError:
            if last is not None:
                hub.clear_faults()
                print("faults cleared (faults file removed)", flush=True)
            return None
        digest = hashlib.sha256(raw).hexdigest()
        if digest != last:
            try:
                hub.set_faults(json.loads(raw or b"null"), digest=digest)
                print(f"faults from {args.faults_file}: {hub.faults()}", flush=True)
            except ValueError as e:
                print(f"faults file {args.faults_file} ignored: {e}", flush=True)
        return digest

    if args.faults_file:
        faults_digest = load_faults_file(None)  # in force before the first request

        def follow_faults_file() -> None:
            nonlocal faults_digest
            while not stop.wait(0.2):
                faults_digest = load_faults_file(faults_digest)

        threading.Thread(target=follow_faults_file, daemon=True).start()
    with hub:
        print(f"repo {args.repo} revision {info.commit} ({len(info.files)} files, {info.total_bytes} bytes)")
        for u in hub.urls:
            print(u)
        sys.stdout.flush()
        if args.ready_file:
            # Written aside and renamed: whoever waits for the file to exist must never read half of it.
            partial = args.ready_file.with_name(args.ready_file.name + ".partial")
            partial.write_text(
                json.dumps(
                    {
                        "url": hub.url(),
                        "urls": hub.urls,
                        "port": hub.port,
                        "repo": args.repo,
                        "commit": info.commit,
                        "total_bytes": info.total_bytes,
                        "files": [list(f) for f in info.files],
                        "draft": {"repo": args.draft_repo, "commit": repos[args.draft_repo].commit,
                                  "total_bytes": repos[args.draft_repo].total_bytes} if args.draft_repo else None,
                    },
                    indent=2,
                )
            )
            partial.replace(args.ready_file)
        stop.wait()
    print(f"served {hub.request_count} requests, {hub.bytes_served} bytes", flush=True)
    if tmp is not None:
        tmp.cleanup()
    if tmp_draft is not None:
        tmp_draft.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
