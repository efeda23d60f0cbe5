"""Part of remote/fetch_model.py (uploaded beside it, imported from the script's directory): the
digests the Hub publishes for a revision's files, computed over the files on disk. Stands alone:
the standard library only.

huggingface_hub checks a downloaded file's size, not its content (over plain HTTP it hashes
nothing), so a body changed on the way (a bad proxy, a flipped bit) would pass. The Hub gives,
with `HfApi.model_info(repo, revision=, files_metadata=True)`, for each file:

- an LFS file (the weights): `sibling.lfs.sha256`, the sha256 of the content;
- any other file: `sibling.blob_id`, its git blob id, the sha1 of `b"blob <size>\\0" + content`
  (what `git hash-object` prints). An LFS file's blob_id is that of its pointer, not of the
  content: it is never compared to the content.

A digest is written "sha256:<hex>" or "sha1:<hex>" (the git blob sha1). Files are hashed in
parallel threads (hashlib releases the GIL on large updates, and so does reading), 8 MiB at a
time, with a progress line at most every `interval` seconds (5 s; after the first minute every
30 s, so that a long hash leaves the rest of the journal's tail readable).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

CHUNK = 8 << 20  # bytes read (and hashed) at a time
GB = 1000**3
SHA256 = "sha256"  # the content's sha256 (LFS files)
GIT_SHA1 = "sha1"  # the git blob sha1 (the other files)
NAMES = {SHA256: "sha256", GIT_SHA1: "git blob sha1"}  # as the log lines say them
SLOW_INTERVAL = 30.0  # seconds between progress lines after the first minute


def hub_digest(sibling) -> str | None:
    """The digest the Hub publishes for a file (a RepoSibling of model_info(files_metadata=True), or
    its JSON): "sha256:<hex>" for an LFS file, "sha1:<hex>" (git blob) for the others, None when the
    Hub gives neither."""
    lfs = _field(sibling, "lfs")
    sha256 = _field(lfs, "sha256") if lfs else None
    if sha256:
        return f"{SHA256}:{str(sha256).lower()}"
    blob_id = _field(sibling, "blob_id") or _field(sibling, "blobId")
    if blob_id:
        return f"{GIT_SHA1}:{str(blob_id).lower()}"
    return None


def _field(obj, name: str):
    if obj is None:
        return None
    if isinstance(obj, dict) and name in obj:
        return obj[name]
    return getattr(obj, name, None)


def split(digest: str) -> tuple[str, str]:
    """("sha256" | "sha1", hex) of a digest string; ValueError for another algorithm."""
    algo, _, hexdigest = digest.partition(":")
    if algo not in NAMES or not hexdigest:
        raise ValueError(f"not a digest this module computes: {digest!r}")
    return algo, hexdigest


def file_digest(path: Path | str, algo: str, progress: Callable[[int], None] | None = None) -> str:
    """The digest ("algo:hex") of a file's content: sha256, or the git blob sha1 (its header is the
    size of the file as it is read). progress(n) is called after each chunk of n bytes."""
    if algo not in NAMES:
        raise ValueError(f"unknown digest algorithm {algo!r} (known: {', '.join(NAMES)})")
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        if algo == SHA256:
            h = hashlib.sha256()
        else:
            h = hashlib.sha1(b"blob %d\0" % os.fstat(fh.fileno()).st_size, usedforsecurity=False)
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            h.update(view[:n])
            if progress is not None:
                progress(n)
    return f"{algo}:{h.hexdigest()}"


@dataclass
class Hashed:
    """What hash_files found: the digest of each file on disk (None: unreadable, see errors)."""

    digests: dict[str, str | None] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # file -> why it could not be read
    bytes: int = 0
    seconds: float = 0.0

    def mismatched(self, wanted: dict[str, str]) -> dict[str, str | None]:
        """The files whose digest on disk is not the wanted one: file -> the digest found (None: unreadable)."""
        return {name: self.digests.get(name) for name, want in sorted(wanted.items())
                if self.digests.get(name) != want}


class _Progress:
    def __init__(self, total_bytes: int, total_files: int, log: Callable[[str], None], interval: float):
        self.total_bytes, self.total_files = total_bytes, total_files
        self.log, self.interval = log, interval
        self.done_bytes = self.done_files = 0
        self.started = self.last = time.monotonic()
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        """n more bytes hashed (from a worker thread, after each chunk): a progress line when it is time."""
        with self._lock:
            self.done_bytes += n
        self.maybe_log()

    def file_done(self) -> None:
        with self._lock:
            self.done_files += 1

    def maybe_log(self) -> None:
        now = time.monotonic()
        # after the first minute, every 30 s at most: the deploy reads the last lines of the journal only
        interval = self.interval if now - self.started < 60 else max(self.interval, SLOW_INTERVAL)
        with self._lock:
            if now - self.last < interval:
                return
            self.last = now
            done, files = self.done_bytes, self.done_files
        rate = done / max(now - self.started, 1e-9)
        self.log(f"hashing: {done / GB:.1f} of {self.total_bytes / GB:.1f} GB, {files} of {self.total_files} files, "
                 f"{rate / GB:.1f} GB/s")


def hash_files(root: Path, wanted: dict[str, str], log: Callable[[str], None] = print,
               workers: int | None = None, interval: float = 5.0) -> Hashed:
    """Hash each file of `wanted` (path under root -> its "algo:hex" digest, which says the algorithm)
    in `workers` threads (default: the CPUs, at most 8), the biggest first; a progress line every
    `interval` seconds while it runs."""
    sizes = {}
    for name in wanted:
        try:
            sizes[name] = (root / name).stat().st_size
        except OSError:
            sizes[name] = 0
    progress = _Progress(sum(sizes.values()), len(wanted), log, interval)
    result = Hashed()
    if not wanted:
        return result
    workers = max(1, min(workers or min(os.cpu_count() or 1, 8), len(wanted)))

    def one(name: str) -> str | None:
        try:
            return file_digest(root / name, split(wanted[name])[0], progress.add)
        except OSError as err:
            result.errors[name] = f"{type(err).__name__}: {err.strerror or err}"
            return None
        finally:
            progress.file_done()

    biggest_first = sorted(wanted, key=lambda n: (-sizes[n], n))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hash") as pool:
        result.digests = dict(zip(biggest_first, pool.map(one, biggest_first), strict=True))
    result.bytes = progress.done_bytes
    result.seconds = time.monotonic() - progress.started
    return result
