"""Runs ON the target host, inside a transient systemd unit, with the venv's python:
download one pinned model revision into a local dir with huggingface_hub, then
verify it and write the marker that makes the next deploy a no-op.

    fetch_model.py --repo moonshotai/Kimi-K2.6 --revision <40 hex> --local-dir /srv/models/kimi-k2.6 \
        --margin-bytes 50000000000 [--reserve-bytes N] [--endpoint URL] [--token-file /etc/sglang/sglang.hf-token] \
        [--max-workers 8] [--attempts 5] [--backoff-s 5] [--max-wait-s 300] [--read-timeout 30]

--reserve-bytes: what a later download of the same deploy (the profile's draft
model, fetched next) still needs on this disk; the disk check keeps
it free too, so the model does not take the draft's room.

The token is read from a root-only file (never argv) and never printed.

Transient Hub failures (HTTP 5xx, 408 and 429, connection errors, read
timeouts: a body that stalls) are retried: at most --attempts calls of each
phase (listing the files, downloading), waiting --backoff-s after the first
failure and twice as long after each next one (at most 60 s), or the Hub's
Retry-After when that is longer (at most --max-wait-s). huggingface_hub also
retries inside each call (HEAD requests and 429s with its own backoff; a
dropped or stalled body is resumed with a Range request up to 5 times, from
the last byte written: bodies are written as they arrive, hub_bytes.py), with
--read-timeout as its HF_HUB_DOWNLOAD_TIMEOUT (seconds without a byte) and
HEAD timeout. Complete files are kept between attempts; a file in flight when
an attempt fails starts again from zero.

Before downloading, the *.incomplete files a killed earlier run left in
<local-dir>/.cache/huggingface/download/ are removed (huggingface_hub never
resumes them across runs; a lock file there keeps two runs apart). The last
lines say how many bytes this run fetched from the Hub: the bytes counted on
the wire (huggingface_hub's HTTP client), plus, by their size, the files that
completed without passing it (Xet-backed files, which hf_xet fetches).

Verification, before the marker is written: every file the Hub lists is on
disk at the Hub's size (no partial file left, every shard the safetensors
index names present), then its content has the digest the Hub publishes
(model_info(files_metadata=True)): the sha256 of an LFS file, the git blob
sha1 of the others (file_digests.py, uploaded beside this script; in parallel
threads, a "hashing:" progress line every 5 s, after a minute every 30 s). huggingface_hub itself checks
sizes only, so this is what catches a body changed on the way or on disk. A
file that does not match is logged (`DIGEST MISMATCH: <file>: sha256 <hex> on
disk, the Hub says <hex>`), deleted and fetched again, then hashed again: at
most --attempts rounds of hashing in all. One still wrong after the last round
is deleted and the run ends with `VERIFY FAILED: <file> ...` and exit code 4,
without a marker. A file the Hub gives no digest for is checked by size only;
the "verified N files by digest" line says how many were. The marker records
the sizes and the digests verified ("sha256:<hex>" or "sha1:<hex>").

Exit codes and the one-line causes: hub_failures.py (uploaded beside this script).
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import NamedTuple

# file_digests.py, hub_bytes.py, hub_failures.py and peer_seed.py are uploaded beside this script: its directory is the first entry of sys.path
from file_digests import NAMES, hash_files, hub_digest, split
from hub_bytes import ByteCounter, fetched_bytes, local_size, plural, tune_transfer
from hub_failures import (DOWNLOAD_DIR, EXIT_DISK, EXIT_VERIFY, SECRETS, Failure, IncompleteSnapshot, log, redact,
                          with_retries)
from peer_seed import Seeded, copy_from_peer, ssh_command

MARKER = ".sglang-converge.json"
GB = 1000**3
LOCK_FILE = Path(".cache") / "huggingface" / ".sglang-converge-fetch.lock"


class Listing(NamedTuple):
    """The revision's files as the Hub lists them: their sizes, and the digest it publishes for each
    ("sha256:<hex>" for LFS files, "sha1:<hex>" the git blob id of the others; None: it gives none)."""

    sizes: dict[str, int]
    digests: dict[str, str | None]


def remote_files(api, repo: str, revision: str, timeout: float | None = None) -> Listing:
    info = api.model_info(repo, revision=revision, files_metadata=True, timeout=timeout)
    siblings = info.siblings or []
    return Listing({sibling.rfilename: int(sibling.size or 0) for sibling in siblings},
                   {sibling.rfilename: hub_digest(sibling) for sibling in siblings})


def spoken(digest: str | None, error: str | None = None) -> str:
    """A digest as the log lines say it: "sha256 <hex>", "git blob sha1 <hex>"."""
    if digest is None:
        return f"unreadable ({error or 'gone'})"
    algo, hexdigest = split(digest)
    return f"{NAMES[algo]} {hexdigest}"


def verify(local_dir: Path, expected: dict[str, int]) -> list[str]:
    """Problems with the files on disk: empty when the snapshot is complete."""
    problems = []
    partial = list(local_dir.glob(".cache/huggingface/download/**/*.incomplete"))
    partial += [p for p in local_dir.rglob("*.incomplete") if ".cache" not in p.parts]
    problems += [f"partial file left: {p.relative_to(local_dir)}" for p in partial]
    for name, size in sorted(expected.items()):
        have = local_size(local_dir / name)
        if have is None:
            problems.append(f"missing: {name}")
        elif have != size:
            problems.append(f"size mismatch: {name} has {have} bytes, the Hub says {size}")
    index = local_dir / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        for shard in shards:
            if local_size(local_dir / shard) is None:
                problems.append(f"shard named in the safetensors index is missing: {shard}")
    return problems


def still_to_fetch(local_dir: Path, expected: dict[str, int]) -> dict[str, int]:
    return {name: size for name, size in expected.items() if local_size(local_dir / name) != size}


# ---------------------------------------------------------------------------
# partial files of a killed run, and the lock that tells them from a live run's


def take_lock(local_dir: Path):
    """An exclusive lock for this run (held until exit); None when another run holds it."""
    import fcntl

    path = local_dir / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        return None
    fh.seek(0)
    fh.truncate()
    fh.write(f"{os.getpid()}\n")
    fh.flush()
    return fh


def kept_files(dirs: list[str], repo: str, revision: str) -> dict[tuple[str, int], Path]:
    """(digest, size) -> the file of a kept revision that holds it verified (its marker says so and it is
    on disk at that size); a dir that holds this very revision (a marker older than digests) also by
    ("name:" + its name, size)."""
    out: dict[tuple[str, int], Path] = {}
    for root in map(Path, dirs):
        try:
            marker = json.loads((root / MARKER).read_text())
        except (OSError, ValueError):
            continue
        sizes = marker.get("files") or {}
        same = (marker.get("repo"), marker.get("revision")) == (repo, revision)
        keys = [(digest, name) for name, digest in (marker.get("digests") or {}).items() if digest]
        keys += [(f"name:{name}", name) for name in sizes] if same else []
        for key, name in keys:
            if isinstance(sizes.get(name), int) and local_size(root / name) == sizes[name]:
                out.setdefault((key, sizes[name]), root / name)
    return out


def remove_revision(path: Path) -> None:
    """Remove a kept revision's dir (renamed first: a dir half removed never looks like a revision)."""
    if not path.is_dir():
        return
    gone = path.with_name(path.name + ".removing")
    path.rename(gone)
    shutil.rmtree(gone, ignore_errors=True)
    log(f"removed {path} (model_update = in-place): its files shared with this revision stay, linked")


def remove_leftovers(local_dir: Path) -> tuple[int, int]:
    """Remove the *.incomplete files a killed run left; (how many, their bytes)."""
    count = size = 0
    root = local_dir / DOWNLOAD_DIR
    if root.is_dir():
        for path in sorted(root.rglob("*.incomplete")):
            try:
                nbytes = path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                continue
            count += 1
            size += nbytes
    return count, size


class _OneLine(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact("huggingface_hub: " + record.getMessage().strip().replace("\n", " | "))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    parser.add_argument("--revision", required=True)
    parser.add_argument("--local-dir", required=True)
    parser.add_argument("--margin-bytes", type=int, default=0)
    parser.add_argument("--reserve-bytes", type=int, default=0,
                        help="bytes a later download of this deploy (the draft model) needs on this disk: kept free")
    parser.add_argument("--endpoint")
    parser.add_argument("--token-file")
    parser.add_argument("--max-workers", type=int, default=8)
    parser.add_argument("--attempts", type=int, default=5, help="calls per phase before giving up (default 5)")
    parser.add_argument("--backoff-s", type=float, default=5.0, help="first wait between attempts, doubling (max 60)")
    parser.add_argument("--max-wait-s", type=float, default=300.0, help="longest wait, Retry-After included")
    parser.add_argument("--read-timeout", type=int, default=30,
                        help="seconds without a byte before a request counts as stalled (HF_HUB_DOWNLOAD_TIMEOUT)")
    parser.add_argument("--link-from", action="append", default=[],
                        help="a dir holding another revision verified (its marker): files with the same digest and "
                        "size are hard-linked from there, not fetched (repeatable)")
    parser.add_argument("--free-dir", action="append", default=[],
                        help="model_update = in-place: a kept revision's dir removed after the links, before the "
                        "disk check (the server reading it is stopped; repeatable)")
    parser.add_argument("--seed-from", help="user@host:/dir of a peer that holds the revision verified (peer_seed.py)")
    parser.add_argument("--seed-port", type=int, default=22)
    parser.add_argument("--seed-key", help="the ssh key for the peer (a root-only file)")
    parser.add_argument("--seed-known-hosts", help="the peer's host keys (known_hosts format)")
    args = parser.parse_args(argv)
    if args.attempts < 1 or args.read_timeout < 1 or args.backoff_s < 0 or args.reserve_bytes < 0:
        parser.error("--attempts and --read-timeout are at least 1, --backoff-s and --reserve-bytes at least 0")
    if args.seed_from and not (args.seed_key and args.seed_known_hosts):
        parser.error("--seed-from needs --seed-key and --seed-known-hosts")
    return args


def read_token(token_file: str | None) -> str | None:
    """The token from its root-only file (never argv); it and $HF_TOKEN are redacted from all output."""
    token = None
    if token_file and os.path.exists(token_file):
        token = Path(token_file).read_text().strip() or None
    SECRETS[:] = [s for s in (token, os.environ.get("HF_TOKEN")) if s]
    return token


def import_hub(args: argparse.Namespace):
    """huggingface_hub, imported once its environment is set; its log lines go to stdout, one line each."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # the deploy prints its own progress
    # huggingface_hub reads these when it is imported: its read timeout for file bodies, and for HEAD requests
    os.environ["HF_HUB_DOWNLOAD_TIMEOUT"] = str(args.read_timeout)
    os.environ["HF_HUB_ETAG_TIMEOUT"] = str(args.read_timeout)
    if args.endpoint:
        os.environ["HF_ENDPOINT"] = args.endpoint
    import huggingface_hub
    from huggingface_hub import constants

    constants.HF_HUB_DOWNLOAD_TIMEOUT = args.read_timeout  # in case it was imported before the variable was set
    tune_transfer(constants)  # cheaper per byte over plain HTTP (hub_bytes.py)
    library_log = logging.getLogger("huggingface_hub")
    handler = logging.StreamHandler(sys.stdout)  # one line per message, next to ours, the token redacted
    handler.setFormatter(_OneLine())
    library_log.handlers[:] = [handler]
    library_log.propagate = False
    return huggingface_hub


class Fetch:
    """One run: list the revision's files, claim the dir, check the disk, download, verify, write the marker."""

    def __init__(self, args: argparse.Namespace, token: str | None, hub) -> None:
        self.args, self.token, self.hub = args, token, hub
        self.repo, self.revision = args.repo, args.revision
        self.local_dir = Path(args.local_dir)
        self.counter = ByteCounter()
        self.counter.install()
        self.lock = None  # held until the process ends (a kill releases it too)
        self.expected: dict[str, int] = {}
        self.digests: dict[str, str | None] = {}  # the Hub's digest of each file (None: it gives none)
        self.before: dict[str, int] = {}  # what was still to fetch when the download started
        self.need = 0
        self.seeded = Seeded(False)  # what the copy from a peer brought (--seed-from)
        self.linked: dict[str, str] = {}  # files hard-linked from a kept revision: their (verified) digest
        self.started = time.monotonic()

    def retrying(self, what: str, call, tries: list | None = None):
        return with_retries(what, call, self.args, self.repo, self.revision, self.token, tries,
                            self.in_flight)

    def in_flight(self) -> dict[str, int]:
        """Files whose body this run received (in part or whole) but which are not complete on disk."""
        left = still_to_fetch(self.local_dir, self.expected)
        return {name: got for name, got in dict(self.counter.received).items() if name in left}

    def run(self) -> int:
        try:
            api = self.hub.HfApi(endpoint=self.args.endpoint, token=self.token)
            self.expected, self.digests = self.retrying(
                "list the files", lambda: remote_files(api, self.repo, self.revision, self.args.read_timeout))
            if self.local_dir.is_dir():
                self.claim()
            if self.args.link_from:
                self.local_dir.mkdir(parents=True, exist_ok=True)
                if self.lock is None:
                    self.claim()
                self.link_shared()
            for path in self.args.free_dir:
                remove_revision(Path(path))
            refused = self.disk_refusal()
            if refused:
                return refused
            self.local_dir.mkdir(parents=True, exist_ok=True)
            if self.lock is None:
                self.claim()
            self.started = time.monotonic()
            if self.args.seed_from:
                self.seed()
            self.download()
            return self.finish()
        except Failure as failure:
            self.report_failure(failure)
            return failure.code

    def claim(self) -> None:
        """Take the dir's lock, then remove what a killed earlier run left (no live run holds the lock)."""
        self.lock = take_lock(self.local_dir)
        if self.lock is None:
            raise Failure(f"another fetch_model.py is downloading into {self.local_dir} (it holds {LOCK_FILE})")
        count, size = remove_leftovers(self.local_dir)
        if count:
            log(f"removed {plural(count, 'partial file')} ({size} bytes) that a killed earlier run left in "
                f"{self.local_dir / DOWNLOAD_DIR}: those files are fetched again from zero")

    def link_shared(self) -> None:
        """Hard-link the files a kept revision holds verified with the same digest and size (stored once);
        a link that fails (another filesystem) leaves the file to be fetched."""
        stored = kept_files(self.args.link_from, self.repo, self.revision)
        linked, nbytes, failed = 0, 0, []
        for name, size in sorted(still_to_fetch(self.local_dir, self.expected).items()):
            source = stored.get((self.digests.get(name) or "", size)) or stored.get((f"name:{name}", size))
            if source is None:
                continue
            target = self.local_dir / name
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                target.unlink(missing_ok=True)
                os.link(source, target)
            except OSError as err:
                failed.append(f"{name}: {err.strerror or err}")
                continue
            if (self.digests.get(name) or "", size) in stored:  # verified there by this digest
                self.linked[name] = self.digests[name] or ""
            linked, nbytes = linked + 1, nbytes + size
        if linked or failed:
            log(f"linked {plural(linked, 'file')} ({nbytes} bytes) shared with a kept revision (verified there, "
                f"the same digest): not fetched" + (f"; {len(failed)} could not be linked and are fetched: "
                                                    f"{'; '.join(failed[:3])}" if failed else ""))

    def disk_refusal(self) -> int:
        """The disk check, on the host, before a byte is written: EXIT_DISK when the rest does not fit, else 0."""
        self.need = sum(still_to_fetch(self.local_dir, self.expected).values())
        probe = self.local_dir
        while not probe.exists():
            probe = probe.parent
        stat = os.statvfs(probe)
        free = stat.f_bavail * stat.f_frsize
        margin, reserve = self.args.margin_bytes, self.args.reserve_bytes
        reserved = f" + {reserve / GB:.2f} GB reserved for the next download (the draft model)" if reserve else ""
        log(f"need {self.need} bytes ({self.need / GB:.2f} GB) of {sum(self.expected.values())}; "
            f"free {free} bytes ({free / GB:.2f} GB) at {probe}; margin {margin / GB:.2f} GB{reserved}")
        if self.need <= free - margin - reserve:
            return 0
        log(f"REFUSED: {self.repo}@{self.revision[:12]} needs {self.need / GB:.2f} GB more, "
            f"{probe} has {free / GB:.2f} GB free and {margin / GB:.2f} GB must stay free{reserved}")
        return EXIT_DISK

    def seed(self) -> None:
        """Copy what is missing from the peer first; whatever it does not bring comes from the Hub."""
        args = self.args
        self.seeded = copy_from_peer(args.seed_from, self.local_dir, still_to_fetch(self.local_dir, self.expected),
                                     ssh_command(args.seed_key, args.seed_known_hosts, args.seed_port), log)
        left = still_to_fetch(self.local_dir, self.expected)
        rate = self.seeded.bytes / max(self.seeded.seconds, 1e-6) / 1e6
        if self.seeded.ok:
            log(f"seed: copied {plural(self.seeded.files, 'file')}, {self.seeded.bytes} bytes from the peer in "
                f"{self.seeded.seconds:.1f} s ({rate:.1f} MB/s); every file is checked against the Hub's digests")
        else:
            log(f"seed: the copy from the peer {args.seed_from} failed: {self.seeded.why}; it brought "
                f"{plural(self.seeded.files, 'file')} ({self.seeded.bytes} bytes); fetching the other "
                f"{plural(len(left), 'file')} ({sum(left.values())} bytes) from the Hub")

    def download(self, again: list[str] | None = None) -> None:
        """Fetch what is not on disk at its size; `again`: files to delete first and fetch again."""
        if again:
            for name in again:
                (self.local_dir / name).unlink(missing_ok=True)
            log(f"fetching {plural(len(again), 'file')} again: {', '.join(again)}")
        missing = still_to_fetch(self.local_dir, self.expected)
        if again:
            self.before.update({name: missing[name] for name in again if name in missing})
        else:
            self.before = missing
        if not self.before:  # everything is on disk at its size (a peer copied it): the digests decide
            log(f"fetched {fetched_bytes(self.counter, self.local_dir, self.before)} from the Hub in this run "
                f"(every file was on disk at its size)")
            return
        attempts: list[int] = []
        # only the files not on disk at their size: huggingface_hub would re-fetch the small files a peer
        # copied (no download metadata of its own) and hash the big ones a second time
        patterns = sorted(glob.escape(name) for name in missing)

        def once() -> None:
            self.hub.snapshot_download(
                self.repo, revision=self.revision, local_dir=str(self.local_dir), endpoint=self.args.endpoint,
                token=self.token, max_workers=self.args.max_workers, etag_timeout=self.args.read_timeout,
                allow_patterns=patterns)
            missing = still_to_fetch(self.local_dir, self.expected)
            if missing:
                raise IncompleteSnapshot(missing)

        try:
            self.retrying("download", once, attempts)
        except Failure as failure:
            if not isinstance(getattr(failure, "cause", None), IncompleteSnapshot):
                raise
            # the last attempt still lacks files: verification names them
        log(f"fetched {fetched_bytes(self.counter, self.local_dir, self.before)} from the Hub in this run "
            f"({plural(len(attempts), 'download attempt')})")

    def report_failure(self, failure: Failure) -> None:
        if self.before:  # the download started: say what it cost and what a re-run fetches again
            left = still_to_fetch(self.local_dir, self.expected)
            log(f"fetched {fetched_bytes(self.counter, self.local_dir, self.before)} from the Hub in this run; "
                f"{plural(len(left), 'file')} ({sum(left.values())} bytes) not complete: a re-run fetches them "
                f"(from zero)")
        log(f"FAILED: {failure.message}")

    def finish(self) -> int:
        """Verify every file (sizes, then digests), then write the marker (atomically): the deploy's proof that
        the revision is here."""
        problems = verify(self.local_dir, self.expected)
        digests: dict[str, str] = {}
        if not problems:
            digests, problems = self.check_digests()
        if problems:
            for problem in problems:
                log(f"VERIFY FAILED: {problem}")
            return EXIT_VERIFY
        marker = {
            "repo": self.repo,
            "revision": self.revision,
            "files": self.expected,
            "digests": digests,
            "completed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        tmp = self.local_dir / (MARKER + ".tmp")
        tmp.write_text(json.dumps(marker, indent=1, sort_keys=True))
        tmp.replace(self.local_dir / MARKER)
        peer = f" ({self.seeded.bytes} of them copied from a peer)" if self.seeded.bytes else ""
        log(f"verified {len(self.expected)} files, {sum(self.expected.values())} bytes, "
            f"downloaded {self.need} bytes{peer} in {time.monotonic() - self.started:.1f} s")
        return 0


    def check_digests(self) -> tuple[dict[str, str], list[str]]:
        """Hash every file the Hub gives a digest for; one that does not match is deleted and fetched again,
        then hashed again, at most --attempts rounds of hashing in all. (The digests verified, the problems.)"""
        wanted = {name: digest for name, digest in self.digests.items() if digest}
        # a linked file is the kept revision's verified file itself (one inode): its digest holds
        verified = {name: digest for name, digest in wanted.items() if self.linked.get(name) == digest}
        todo = {name: digest for name, digest in wanted.items() if name not in verified}
        hashed_bytes, seconds = 0, 0.0
        for round_ in range(1, self.args.attempts + 1):
            hashed = hash_files(self.local_dir, todo, log)
            hashed_bytes, seconds = hashed_bytes + hashed.bytes, seconds + hashed.seconds
            bad = hashed.mismatched(todo)
            verified.update({name: digest for name, digest in todo.items() if name not in bad})
            for name, got in bad.items():
                log(f"DIGEST MISMATCH: {name}: {spoken(got, hashed.errors.get(name))} on disk, "
                    f"the Hub says {spoken(wanted[name])}")
            if not bad:
                break
            if round_ == self.args.attempts:
                for name in bad:
                    (self.local_dir / name).unlink(missing_ok=True)
                return verified, [f"{name}: {spoken(got, hashed.errors.get(name))} on disk, the Hub says "
                                  f"{spoken(wanted[name])}, after {plural(round_, 'round')} of hashing "
                                  f"(--attempts); the file is deleted: a re-run fetches it again"
                                  for name, got in bad.items()]
            self.download(again=sorted(bad))
            problems = verify(self.local_dir, self.expected)
            if problems:
                return verified, problems
            todo = {name: wanted[name] for name in bad}
        unchecked = len(self.expected) - len(wanted)
        log(f"verified {plural(len(verified), 'file')} by digest (sha256 for LFS, git blob sha1 for the others), "
            f"{hashed_bytes} bytes in {seconds:.1f} s"
            + (f"; {plural(unchecked, 'file')} by size only (the Hub gives no digest)" if unchecked else ""))
        return verified, []


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    token = read_token(args.token_file)
    return Fetch(args, token, import_hub(args)).run()


if __name__ == "__main__":
    sys.exit(main())
