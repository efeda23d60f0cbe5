"""Part of remote/fetch_model.py (uploaded beside it, imported from the script's directory): the
bytes a download moves. The counter of what the Hub served over httpx, the two knobs that make
huggingface_hub's plain-HTTP path cheaper per byte, and the line that reports what a run fetched.
The standard library only; huggingface_hub and its HTTP client are imported by the caller.
"""

from __future__ import annotations

import importlib
import sys
import threading
from pathlib import Path

# hub_failures.py is uploaded beside this module: its directory is the first entry of sys.path
from hub_failures import _what

READ_BYTES = 1 << 20  # one socket read of a response body (httpcore reads 64 KiB)


def local_size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def plural(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def tune_transfer(constants, http11=None) -> list[str]:
    """Make each plain-HTTP download cheaper in CPU; the knobs set (for the tests). `http11`: httpcore's
    module that reads responses (default: the one under huggingface_hub's httpx or httpx2).

    Measured (one 1 GB body from the Hub stand-in, CPU seconds of the reading process, user + sys):
    huggingface_hub's defaults 0.6-1.2 + 1.1, both knobs 0.4 + 1.1-1.4, curl 0.06 + 1.8; eight such
    bodies share one GIL.
    - http_get reads the body with `response.iter_bytes(chunk_size=constants.DOWNLOAD_CHUNK_SIZE)`
      (10 MiB), a module constant read at call time. httpx's chunker joins the socket reads into
      10 MiB buffers and slices them, several copies of every byte; chunk_size None is httpx's
      documented "as they arrive". A resumed body restarts from the last chunk written: finer.
    - httpcore reads the socket READ_NUM_BYTES (64 KiB) at a time and runs its HTTP parser per
      read; 1 MiB reads cut those rounds 16-fold. There is no supported knob for it, so the class
      attribute is set when it is still an int (httpcore 1.0, httpcore2 2.16), else left alone.
    Xet-backed files do not take this path (hf_xet moves them, in Rust)."""
    tuned = []
    if isinstance(getattr(constants, "DOWNLOAD_CHUNK_SIZE", None), int):
        constants.DOWNLOAD_CHUNK_SIZE = None  # typed int upstream; iter_bytes takes None
        tuned.append("DOWNLOAD_CHUNK_SIZE=None")
    connection = getattr(http11 if http11 is not None else _http11(), "HTTP11Connection", None)
    if isinstance(getattr(connection, "READ_NUM_BYTES", None), int):
        connection.READ_NUM_BYTES = max(connection.READ_NUM_BYTES, READ_BYTES)  # type: ignore[union-attr]
        tuned.append(f"READ_NUM_BYTES={connection.READ_NUM_BYTES}")  # type: ignore[union-attr]
    return tuned


def _http11():
    """httpcore's HTTP/1.1 module under the client huggingface_hub uses (hub 1.x: httpx, 2.x: httpx2);
    None when it cannot be found. httpx imports httpcore only when its first client is made."""
    try:
        import huggingface_hub.utils._http  # noqa: F401  (imports the HTTP client it uses)
        core = "httpcore2" if "httpx2" in sys.modules else "httpcore"
        return importlib.import_module(f"{core}._sync.http11")
    except ImportError:
        return None


class ByteCounter:
    """Response body bytes received from the Hub (and its CDN) by this process, as they arrive, and by
    repo file (its latest body): a failed write names no file, these say which were in flight.

    Only what passes through huggingface_hub's httpx client is seen: a Xet-backed file (the Hub
    answers its HEAD with X-Xet-Hash) is fetched by hf_xet, outside it. `seen` tells those apart:
    a file completed in a run that `seen` does not name came some other way (fetched_bytes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = 0  # every body: API answers, errors, files
        self.files = 0  # bodies of successful file GETs (not /api/)
        self.installed = False
        self.received: dict[str, int] = {}  # repo file -> bytes of its latest body received so far
        self.seen: dict[str, int] = {}  # repo file -> bytes of all its bodies (a resumed file: both parts)
        self._redirects: dict[str, str] = {}  # CDN URL -> the repo file whose /resolve/ URL sent there

    def add(self, n: int, name: str | None, first: bool = False) -> None:
        with self._lock:
            self.total += n
            if name is not None:
                self.files += n
                self.received[name] = n + (0 if first else self.received.get(name, 0))
                self.seen[name] = n + self.seen.get(name, 0)

    def file_of(self, response) -> str:
        """The repo file a response carries; a redirect is remembered so the CDN's answer maps back."""
        url = str(response.request.url)
        with self._lock:
            name = self._redirects.pop(url, None) or _what(url)
            location = response.headers.get("Location") if 300 <= response.status_code < 400 else None
            if location:
                self._redirects[str(response.request.url.join(location))] = name
        return name

    def install(self) -> bool:
        """Count through huggingface_hub's supported set_client_factory: its default client plus a
        response hook that wraps each body stream (proxies and other settings stay as they are)."""
        try:
            import huggingface_hub
            from huggingface_hub.utils._http import default_client_factory
        except ImportError:
            return False
        counter = self

        def factory():
            client = default_client_factory()
            http = sys.modules[type(client).__module__.split(".")[0]]  # httpx (hub 1.x) or httpx2 (2.x)

            class Counted(http.SyncByteStream):  # type: ignore[name-defined]
                def __init__(self, inner, name: str | None):
                    self._inner, self._name = inner, name
                    if name is not None:
                        counter.add(0, name, first=True)

                def __iter__(self):
                    for chunk in self._inner:
                        counter.add(len(chunk), self._name)
                        yield chunk

                def close(self) -> None:
                    self._inner.close()

            def on_response(response) -> None:
                request = response.request
                name = counter.file_of(response)
                is_file = (request.method == "GET" and 200 <= response.status_code < 300
                           and not request.url.path.startswith("/api/"))
                response.stream = Counted(response.stream, name if is_file else None)

            hooks = client.event_hooks
            hooks["response"] = [*hooks.get("response", []), on_response]
            client.event_hooks = hooks
            return client

        huggingface_hub.set_client_factory(factory)
        self.installed = True
        return True


def fetched_bytes(counter: ByteCounter, local_dir: Path, before: dict[str, int]) -> str:
    """What this run fetched, for the "fetched ..." line: the bytes counted on the wire, and the files that
    completed in this run (`before`: still to fetch when it started) without a byte passing the counter
    (Xet: hf_xet fetched them), by their size, so that a Xet download does not read as 0 bytes."""
    done = {name: size for name, size in before.items() if size and local_size(local_dir / name) == size}
    if not counter.installed:
        return f"at least {sum(done.values())} bytes ({plural(len(done), 'file')} completed; not counted on the wire)"
    line = f"{counter.files} bytes of files ({counter.total} bytes in all)"
    unseen = {name: size for name, size in done.items() if not counter.seen.get(name)}
    if unseen:
        line += (f" plus {sum(unseen.values())} bytes in {plural(len(unseen), 'file')} not counted on the wire "
                 f"(Xet storage: hf_xet fetched them, outside the HTTP client)")
    return line
