"""Part of remote/fetch_model.py (uploaded beside it, imported from the script's directory): what
went wrong talking to the Hub, in one line, with its exit code, and the bounded retries around each
call. Stands alone: the standard library only.

Exit codes: 0 done; 1 other errors (not retried); 3 not enough disk (refused before the download,
or the disk filled up during it); 4 verification failed; 5 the Hub refused the token; 6 the repo
or the revision does not exist; 7 gave up after --attempts transient failures.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import re
import sys
import time
import traceback
from pathlib import Path
from urllib.parse import unquote, urlsplit

DOWNLOAD_DIR = Path(".cache") / "huggingface" / "download"  # huggingface_hub's partial files for a local_dir
MAX_BACKOFF_S = 60.0

EXIT_ERROR = 1
EXIT_DISK = 3
EXIT_VERIFY = 4
EXIT_TOKEN = 5
EXIT_NOT_FOUND = 6
EXIT_GAVE_UP = 7

SECRETS: list[str] = []  # never printed: replaced by <redacted> in everything the scripts write


def redact(text: str) -> str:
    for secret in SECRETS:
        text = text.replace(secret, "<redacted>")
    return text


def log(message: str) -> None:
    print(redact(message), flush=True)


# ---------------------------------------------------------------------------
# what went wrong, in one line


class Failure(Exception):
    """Why a call failed: transient ones are retried, the others end the run with `code`."""

    def __init__(self, message: str, code: int = EXIT_ERROR, transient: bool = False,
                 retry_after: float | None = None):
        super().__init__(message)
        self.message, self.code, self.transient, self.retry_after = message, code, transient, retry_after
        self.cause: BaseException | None = None  # the exception it describes


class IncompleteSnapshot(Exception):
    """snapshot_download returned but files are missing (it does when the Hub's file list is unreachable
    and local_dir is not empty)."""

    def __init__(self, missing: dict[str, int]):
        super().__init__(f"{len(missing)} files missing after the download")
        self.missing = missing


def _chain(err: BaseException | None):
    seen: list[BaseException] = []
    while err is not None and all(err is not s for s in seen) and len(seen) < 12:
        seen.append(err)
        yield err
        err = err.__cause__ or err.__context__


def _class_names(err: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(err).__mro__}


def _request_url(err: BaseException) -> str | None:
    response = getattr(err, "response", None)
    try:
        if response is not None:
            history = getattr(response, "history", None) or []
            first = history[0] if history else response  # the Hub URL, not the CDN one it redirected to
            return str(first.request.url)
        return str(err.request.url)  # type: ignore[attr-defined]  # httpx's transport errors; raises when unset
    except Exception:  # noqa: BLE001
        return None


def _what(url: str | None) -> str:
    """The file a URL fetches (its path in the repo), or the API call."""
    if not url:
        return "the Hub"
    path = urlsplit(url).path
    if "/resolve/" in path:
        return unquote(path.split("/resolve/", 1)[1].partition("/")[2])
    if "/api/" in path:
        return f"the Hub API ({unquote(path)})"
    return url


def _retry_after(response) -> float | None:
    value = (response.headers.get("Retry-After") or "").strip() if response is not None else ""
    return float(value) if value.isdigit() else None


def disk_full(err: OSError, local_dir: str | None, in_flight: dict[str, int] | None = None) -> Failure:
    """ENOSPC mid-download (another writer filled the disk): the file and both numbers, the disk exit code.
    A failed write names no file: the bodies cut short (`in_flight`) or the partial files left say which."""
    free = "?"
    if local_dir:
        try:
            stat = os.statvfs(local_dir)
            free = str(stat.f_bavail * stat.f_frsize)
        except OSError:
            pass
    cut = {**(files_in_flight(Path(local_dir)) if local_dir else {}), **(in_flight or {})}
    where = err.filename or ", ".join(f"{name} ({size} bytes received)" for name, size in sorted(cut.items()))
    return Failure(f"the disk filled up during the download (another writer?): [Errno 28] No space left on device: "
                   f"writing {where or 'a file'}; {free} bytes free now under {local_dir} "
                   f"(the check before the download had room); "
                   f"free space and re-run: completed files are kept", EXIT_DISK)


def files_in_flight(local_dir: Path) -> dict[str, int]:
    """The repo files being written when a download stopped, and their bytes so far.

    huggingface_hub names a partial file after a hash of its metadata file's name
    (huggingface_hub/_local_folder.py: LocalDownloadFilePaths.incomplete_path,
    `{_short_hash(name + ".metadata")}.{etag}.incomplete`, next to `name.lock`), so
    the lock and metadata files beside a partial file say which repo file it is."""
    root = local_dir / DOWNLOAD_DIR
    if not root.is_dir():
        return {}
    partial = {p.parent / p.name.split(".", 1)[0]: p for p in root.rglob("*.incomplete")}
    found: dict[str, int] = {}
    for side in sorted([*root.rglob("*.lock"), *root.rglob("*.metadata")]):
        name = side.relative_to(root).with_suffix("").as_posix()
        digest = base64.urlsafe_b64encode(hashlib.sha1(f"{side.stem}.metadata".encode()).digest()).decode()
        path = partial.get(side.parent / digest)
        if path is not None and name not in found:
            try:
                found[name] = path.stat().st_size
            except FileNotFoundError:
                continue
    return found


def classify(err: BaseException, repo: str, revision: str, endpoint: str | None, token: str | None,
             local_dir: str | None = None, in_flight: dict[str, int] | None = None) -> Failure:
    hub = (endpoint or "https://huggingface.co").rstrip("/")
    for e in _chain(err):
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return disk_full(e, local_dir, in_flight)
    find_one = (f"`{'HF_ENDPOINT=' + hub + ' ' if endpoint else ''}hf models info {repo} --revision main "
                f"--expand sha` prints the newest commit; {hub}/{repo}/commits/main lists them all")
    if isinstance(err, IncompleteSnapshot):
        first = sorted(err.missing)[0]
        return Failure(f"{len(err.missing)} files still missing after the download returned (first: {first}); "
                       f"the Hub's file list was probably unreachable", transient=True)
    for e in _chain(err):
        names = _class_names(e)
        response = getattr(e, "response", None)
        status = getattr(response, "status_code", None)
        what = _what(_request_url(e))
        if "RevisionNotFoundError" in names:
            return Failure(f"revision {revision} does not exist in {repo} on {hub} (HTTP {status} RevisionNotFound); "
                           f"pin a real commit: {find_one}", EXIT_NOT_FOUND)
        if "GatedRepoError" in names:
            return Failure(f"the Hub refused access ({status}) to the gated repo {repo}: accept its terms on "
                           f"{hub}/{repo} with the account of the token", EXIT_TOKEN)
        if "RepositoryNotFoundError" in names:
            if status == 401 and not token:
                return Failure(f"the Hub refused access (401) to {repo} without a token: a private or gated repo "
                               f"needs one (hf_token), or the repo does not exist", EXIT_TOKEN)
            if status == 401:
                return Failure(f"the Hub refused the token (401) for {repo}", EXIT_TOKEN)
            return Failure(f"repo {repo} does not exist on {hub}, or the token cannot see it "
                           f"(HTTP {status} RepoNotFound, revision {revision})", EXIT_NOT_FOUND)
        if isinstance(status, int):
            if status == 401:
                return Failure(f"the Hub refused the token (401) for {repo}"
                               + ("" if token else " (no token was given)"), EXIT_TOKEN)
            if status == 403:
                return Failure(f"the Hub denied access (403) to {repo} with this token", EXIT_TOKEN)
            if status in (408, 429) or status >= 500:
                wait = _retry_after(response)
                return Failure(f"HTTP {status} from the Hub for {what}"
                               + (f" (Retry-After {wait:.0f} s)" if wait is not None else ""),
                               transient=True, retry_after=wait)
            code = (response.headers.get("X-Error-Code") or "") if response is not None else ""
            return Failure(f"HTTP {status}{' ' + code if code else ''} from the Hub for {what}")
        if "ReadTimeout" in names:
            limit = os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT", "?")
            return Failure(f"read timed out (no byte for {limit} s) fetching {what}", transient=True)
        if "TimeoutException" in names:
            return Failure(f"{type(e).__name__} fetching {what}", transient=True)
        if names & {"ConnectError", "NetworkError", "RemoteProtocolError", "ProtocolError", "TransportError"}:
            detail = (str(e).strip().splitlines() or [""])[0]
            return Failure(f"connection failed fetching {what}: {type(e).__name__}: {detail}", transient=True)
        if isinstance(e, OSError) and "Consistency check failed" in str(e):
            m = re.search(r"has size \d+ \((.*?)\)", str(e))
            return Failure(f"{m.group(1) if m else 'a file'} arrived short (connection cut?)", transient=True)
    if "LocalEntryNotFoundError" in _class_names(err):  # huggingface_hub's word for "the Hub could not be reached"
        return Failure(f"could not reach the Hub at {hub}", transient=True)
    first_line = (str(err).strip().splitlines() or [""])[0]
    return Failure(f"{type(err).__name__}: {first_line}")


def with_retries(what: str, call, args, repo: str, revision: str, token: str | None, tries: list | None = None,
                 in_flight=None):
    """call() until it succeeds, a non-transient failure (raised as Failure) or args.attempts transient ones;
    each attempt is appended to `tries`; in_flight() gives the file bodies cut short (for ENOSPC)."""
    delay = args.backoff_s
    for attempt in range(1, args.attempts + 1):
        if tries is not None:
            tries.append(attempt)
        try:
            return call()
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as err:  # noqa: BLE001
            failure = classify(err, repo, revision, args.endpoint, token, args.local_dir,
                               in_flight() if in_flight else None)
            if not failure.transient:
                if failure.code == EXIT_ERROR and not isinstance(err, OSError):
                    sys.stderr.write(redact(traceback.format_exc()))  # an unexpected error: the trace helps
                failure.cause = err
                raise failure from None
            if attempt == args.attempts:
                gave_up = Failure(f"gave up after {args.attempts} attempts to {what}: {failure.message}", EXIT_GAVE_UP)
                gave_up.cause = err
                raise gave_up from None
            wait = min(max(delay, failure.retry_after or 0.0), args.max_wait_s)
            log(f"attempt {attempt}/{args.attempts} to {what} failed: {failure.message}; retrying in {wait:.1f} s")
            time.sleep(wait)
            delay = min(delay * 2, MAX_BACKOFF_S)
    raise AssertionError("not reached")
