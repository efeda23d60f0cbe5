"""The disk check, written once: how many bytes of a pinned revision are
still to fetch, and whether they fit in the free space minus the margin.

Used by the preflight step, the model step and the rollout's fleet preflight.
Sizes come from the Hub (or ``hf_endpoint``) for the pinned revision, asked
once per run from the controller; the host's side from its facts.

    need = disk_need(repo, revision, local_dir, margin_bytes)
    if need and need.short: fail(need.shortfall())

A model profile with a draft model pins two downloads (``pins(spec)``: the
model, then the draft into its own dir); their needs are checked together
(``shortfall(needs)``: downloads on one filesystem add up, its margin counted once).

When the Hub cannot say (a revision or repo it does not have, a refused
token, a Hub that stays unreachable), ``hub_files`` raises ``HubError`` with
one line that names the repo, the revision and what to do; transient
failures (HTTP 408, 429, 5xx, connection errors, timeouts) are retried first,
``HUB_ATTEMPTS`` calls at most.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from pyinfra import host

from core.ops import gb
from facts.files import FreeBytes
from core.paths import revisions_root
from facts.model_dir import ModelDir, ModelDirState, ModelRevisions
from tasks.spec import Spec

HUB = "https://huggingface.co"
HUB_ATTEMPTS = 3  # calls of model_info before a transient failure is reported
HUB_BACKOFF_S = 2.0  # wait after the first transient failure, doubling (or the Hub's Retry-After, up to...)
HUB_MAX_WAIT_S = 30.0  # ...this long)
HUB_TIMEOUT_S = 30.0  # per call


class HubError(Exception):
    """The Hub cannot give a pinned revision's files: the message is one line that says why and what to do.

    ``transient``: it failed every attempt for a reason that may pass (the Hub down, rate limits, the network).
    """

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


class HubListing(NamedTuple):
    """One revision's files as the Hub lists them: sizes, and the digest it publishes for each
    ("sha256:<hex>" for LFS files, "sha1:<hex>" the git blob id of the others; None: none given)."""

    sizes: dict[str, int]
    digests: dict[str, str | None]


_HUB_ANSWERS: dict[tuple[str, str, str | None, str | None], HubListing | HubError] = {}


def hub_listing(repo: str, revision: str, endpoint: str | None, token: str | None) -> HubListing:
    """Files, sizes and digests of one pinned revision, from the Hub API (a pinned revision never changes:
    asked once per process, and a refusal is remembered too); HubError when the Hub cannot give them."""
    key = (repo, revision, endpoint, token)
    answer = _HUB_ANSWERS.get(key)
    if answer is None:
        answer = _ask_hub(repo, revision, endpoint, token)
        if not (isinstance(answer, HubError) and answer.transient):
            _HUB_ANSWERS[key] = answer
    if isinstance(answer, HubError):
        raise HubError(str(answer), answer.transient)
    return HubListing(dict(answer.sizes), dict(answer.digests))


def hub_files(repo: str, revision: str, endpoint: str | None, token: str | None) -> dict[str, int]:
    """File sizes of one pinned revision (``hub_listing``)."""
    return hub_listing(repo, revision, endpoint, token).sizes


def hub_digests(repo: str, revision: str, endpoint: str | None, token: str | None) -> dict[str, str | None]:
    """The Hub's digest of each file of one pinned revision (``hub_listing``)."""
    return hub_listing(repo, revision, endpoint, token).digests


def _sibling_digest(sibling) -> str | None:
    """What remote/file_digests.py's hub_digest says of a RepoSibling (the marker records the same)."""
    sha256 = getattr(getattr(sibling, "lfs", None), "sha256", None)
    if sha256:
        return f"sha256:{str(sha256).lower()}"
    blob_id = getattr(sibling, "blob_id", None)
    return f"sha1:{str(blob_id).lower()}" if blob_id else None


def _ask_hub(repo: str, revision: str, endpoint: str | None, token: str | None) -> HubListing | HubError:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint, token=token)
    head, hub = f"{repo}@{revision[:12]}", (endpoint or HUB).rstrip("/")
    delay = HUB_BACKOFF_S
    for attempt in range(1, HUB_ATTEMPTS + 1):
        try:
            info = api.model_info(repo, revision=revision, files_metadata=True, timeout=HUB_TIMEOUT_S)
            siblings = info.siblings or []
            return HubListing({sibling.rfilename: int(sibling.size or 0) for sibling in siblings},
                              {sibling.rfilename: _sibling_digest(sibling) for sibling in siblings})
        except Exception as err:  # noqa: BLE001 - sorted below
            reason, transient, retry_after = hub_failure(err, repo, revision, hub, token)
        if not transient:
            return HubError(f"{head}: {reason}")
        if attempt == HUB_ATTEMPTS:
            return HubError(f"{head}: {reason} ({HUB_ATTEMPTS} attempts): the Hub or the way to it is down; "
                            f"try again later", transient=True)
        time.sleep(min(max(delay, retry_after or 0.0), HUB_MAX_WAIT_S))
        delay *= 2
    raise AssertionError("not reached")


def _chain(err: BaseException | None):
    seen: list[BaseException] = []
    while err is not None and all(err is not s for s in seen) and len(seen) < 12:
        seen.append(err)
        yield err
        err = err.__cause__ or err.__context__


def hub_failure(err: BaseException, repo: str, revision: str, hub: str,
                token: str | None) -> tuple[str, bool, float | None]:
    """What an exception of huggingface_hub's model_info means: (one line, transient, Retry-After seconds).

    Matched by class names along the exception's chain, so it holds for huggingface_hub 1.x (httpx) and 2.x
    (httpx2)."""
    find = (f"pin a commit that exists, e.g. from `{'HF_ENDPOINT=' + hub + ' ' if hub != HUB else ''}"
            f"hf models info {repo} --expand sha` or {hub}/{repo}/commits/main")
    for e in _chain(err):
        names = {cls.__name__ for cls in type(e).__mro__}
        response = getattr(e, "response", None)
        status = getattr(response, "status_code", None)
        if "RevisionNotFoundError" in names:
            return f"revision {revision} not found on the Hub ({hub}, HTTP {status}): {find}", False, None
        if "GatedRepoError" in names:
            return (f"the Hub ({hub}) refused access ({status}) to the gated repo {repo}: accept its terms on "
                    f"{hub}/{repo} with the account of hf_token"), False, None
        if "RepositoryNotFoundError" in names or status in (401, 403):
            return _refused(repo, hub, status, token, "RepositoryNotFoundError" in names), False, None
        if isinstance(status, int) and (status in (408, 429) or status >= 500):
            wait = ((response.headers.get("Retry-After") if response is not None else None) or "").strip()
            return f"HTTP {status} from the Hub ({hub})", True, float(wait) if wait.isdigit() else None
        if isinstance(status, int):
            return f"HTTP {status} from the Hub ({hub}) for the file list of revision {revision}", False, None
        if names & {"TimeoutException", "TimeoutError"}:
            return f"the Hub ({hub}) did not answer within {HUB_TIMEOUT_S:.0f} s", True, None
        if names & {"NetworkError", "TransportError", "RemoteProtocolError", "ConnectionError"}:
            detail = (str(e).strip().splitlines() or [""])[0]
            return f"cannot reach the Hub ({hub}): {type(e).__name__}: {detail}", True, None
    detail = (str(err).strip().splitlines() or [""])[0]
    return f"cannot read the file list from the Hub ({hub}): {type(err).__name__}: {detail}", False, None


def _refused(repo: str, hub: str, status: int | None, token: str | None, not_found: bool) -> str:
    if status == 404:
        return (f"repo {repo} not found on the Hub ({hub}, HTTP 404), or hf_token cannot see it: check the "
                f"profile's repo ({hub}/{repo})")
    if not token:
        return (f"the Hub ({hub}) refused access ({status}) without a token: a private or gated repo needs "
                f"hf_token (or the repo {repo} does not exist)")
    what = "refused hf_token" if status == 401 else "denied hf_token access"
    return f"the Hub ({hub}) {what} ({status}) for {repo}" + (" (or the repo does not exist)" if not_found else "")


def model_complete(state: ModelDir, repo: str, revision: str) -> bool:
    """The marker names this revision and every file it lists is on disk at its size."""
    marker = state.marker
    if not marker or marker.get("repo") != repo or marker.get("revision") != revision:
        return False
    return all(state.files.get(name) == size for name, size in marker.get("files", {}).items())


def bytes_to_fetch(expected: dict[str, int], state: ModelDir) -> int:
    return sum(size for name, size in expected.items() if state.files.get(name) != size)


def link_sources(local_dir: str, root: str | None) -> list[tuple[str, dict]]:
    """The dirs a new revision's files may be hard-linked from, with their markers: the model's other
    revision dirs (``<root>-revisions/*``) and ``root`` itself (the layout before revision dirs)."""
    if not root:
        return []
    out = []
    legacy = host.get_fact(ModelDirState, path=root)
    if legacy.marker:
        out.append((root, legacy.marker))
    for revision in host.get_fact(ModelRevisions, root=revisions_root(root)).revisions:
        if revision.path != local_dir.rstrip("/") and revision.marker:
            out.append((revision.path, revision.marker))
    return out


def stored_files(sources: Sequence[tuple[str, dict]], same: tuple[str, str] | None = None) -> dict[tuple[str, int], str]:
    """(digest, size) -> a dir that holds that content verified (the markers' digests); with ``same``
    (repo, revision), a dir holding that very revision also by ("name:" + file name, size), as
    remote/fetch_model.py links them (a marker older than digests)."""
    out: dict[tuple[str, int], str] = {}
    for path, marker in sources:
        sizes = marker.get("files") or {}
        for name, digest in (marker.get("digests") or {}).items():
            if digest and isinstance(sizes.get(name), int):
                out.setdefault((digest, sizes[name]), path)
        if same is not None and (marker.get("repo"), marker.get("revision")) == same:
            for name, size in sizes.items():
                if isinstance(size, int):
                    out.setdefault((f"name:{name}", size), path)
    return out


def linkable(expected: dict[str, int], digests: dict[str, str | None], state: ModelDir,
             sources: Sequence[tuple[str, dict]], same: tuple[str, str] | None = None) -> dict[str, int]:
    """The files still missing that a kept revision holds with the same digest and size: hard-linked
    from there (stored once), not fetched."""
    stored = stored_files(sources, same)
    return {name: size for name, size in expected.items() if state.files.get(name) != size
            and ((digests.get(name) or "", size) in stored or (f"name:{name}", size) in stored)}


def freeable_bytes(sources: Sequence[tuple[str, dict]], digests: dict[str, str | None],
                   expected: dict[str, int]) -> int:
    """What removing the kept revisions frees (model_update = "in-place"): their content the new
    revision does not share, each content counted once (hard links between them)."""
    keep = {(digest, expected[name]) for name, digest in digests.items() if digest and name in expected}
    return sum(size for (digest, size) in stored_files(sources) if (digest, size) not in keep)


@dataclass(frozen=True)
class DiskNeed:
    """What a download of one revision still needs, and where it would land."""

    repo: str
    revision: str
    files: int
    need: int  # bytes still to fetch
    total: int  # bytes of the whole revision
    free: int
    where: str  # the existing parent the free bytes were measured at
    margin: int  # bytes that must stay free (size_margin_gb)
    expected: dict[str, int] = field(default_factory=dict, compare=False, hash=False)  # the Hub's files and sizes
    mount: str = ""  # the filesystem's mount point: downloads on one filesystem share its free bytes
    linked: int = 0  # bytes a kept revision holds already: hard-linked, not fetched, not counted
    link_from: tuple[str, ...] = ()  # the kept revisions' dirs (and the old layout's dir) to link from
    freeable: int = 0  # bytes only the kept revisions hold (what model_update = "in-place" frees)

    @property
    def short(self) -> bool:
        return self.need > self.free - self.margin

    def shortfall(self) -> str:
        shared = f", {gb(self.linked)} shared with the kept revision(s) linked" if self.linked else ""
        both = (f"; the disk cannot hold it beside the kept revision(s) ({gb(self.freeable)} only they hold): "
                f"allowed: model_update = \"in-place\" (stops the server for the download and removes them), "
                f"or more free space" if self.link_from else "")
        return (
            f"not enough disk for {self.repo}@{self.revision[:12]}: need {gb(self.need)} more "
            f"(of {gb(self.total)}{shared}), {self.where} has {gb(self.free)} free and {gb(self.margin)} must "
            f"stay free (size_margin_gb){both}; nothing was downloaded"
        )


def disk_need(repo: str, revision: str, local_dir: str, margin_bytes: int,
              endpoint: str | None = None, token: str | None = None, root: str | None = None) -> DiskNeed | None:
    """None when ``local_dir`` already holds the revision, verified; else what the download needs: the
    bytes neither on disk there nor in a kept revision of ``root`` (``link_sources``).
    Raises HubError when the Hub cannot give the revision's files (not asked when the model is there)."""
    state = host.get_fact(ModelDirState, path=local_dir)
    if model_complete(state, repo, revision):
        return None
    expected = hub_files(repo, revision, endpoint, token)
    sources = link_sources(local_dir, root)
    linked, freeable = 0, 0
    if sources:
        digests = hub_digests(repo, revision, endpoint, token)
        linked = sum(linkable(expected, digests, state, sources, (repo, revision)).values())
        freeable = freeable_bytes(sources, digests, expected)
    space = host.get_fact(FreeBytes, path=local_dir)
    return DiskNeed(repo=repo, revision=revision, files=len(expected), need=bytes_to_fetch(expected, state) - linked,
                    total=sum(expected.values()), free=space.free_bytes if space else 0,
                    where=space.path if space else local_dir, margin=margin_bytes, expected=expected,
                    mount=space.mount if space else local_dir, linked=linked,
                    link_from=tuple(path for path, _marker in sources), freeable=freeable)


def shortfall(needs: Sequence[DiskNeed]) -> str | None:
    """Why downloads do not fit together (None: they do). Those on one filesystem (the same mount) add up
    and keep its margin free once; a download alone says what DiskNeed.shortfall says.

    .. code:: python

        problem = shortfall([model_need, draft_need])   # the model and its draft model
    """
    by_mount: dict[str, list[DiskNeed]] = {}
    for one in needs:
        by_mount.setdefault(one.mount or one.where, []).append(one)
    for together in by_mount.values():
        first = together[0]
        if len(together) == 1:
            if first.short:
                return first.shortfall()
            continue
        need = sum(n.need for n in together)
        if need > first.free - first.margin:
            names = " and ".join(f"{n.repo}@{n.revision[:12]}" for n in together)
            parts = " + ".join(f"{gb(n.need)} for {n.repo}" for n in together)
            return (f"not enough disk for {names} together: need {gb(need)} more ({parts}; of "
                    f"{gb(sum(n.total for n in together))}), {first.where} has {gb(first.free)} free and "
                    f"{gb(first.margin)} must stay free (size_margin_gb); nothing was downloaded")
    return None


class Pin(NamedTuple):
    """One pinned download of a spec: what it is ("model" or "draft"), the repo, the revision, the dir."""

    what: str
    repo: str
    revision: str
    local_dir: str  # the revision's own dir (<root>-revisions/<revision[:12]>)
    root: str | None = None  # the model_dir / draft_dir setting: its other revisions are linked from


def pins(spec: Spec) -> list[Pin]:
    """The downloads a spec pins, in the order the model step fetches them: the model, then its draft model."""
    out = [Pin("model", spec.profile.repo, spec.profile.revision, spec.model_path, spec.model_dir)]
    if spec.draft is not None and spec.draft_dir is not None and spec.draft_path is not None:
        out.append(Pin("draft", spec.draft.repo, spec.draft.revision, spec.draft_path, spec.draft_dir))
    return out


def hf_token(spec: Spec) -> str | None:
    return spec.hf_token.get_secret_value() if spec.hf_token else None


def disk_shortfall(spec: Spec) -> str | None:
    """Why the model's (and its draft model's) remaining bytes do not fit on the host's disk, or why the Hub
    cannot say how many there are (HubError's line: a revision it does not have, a refused token, ...);
    None when they fit."""
    needs = []
    try:
        for pin in pins(spec):
            need = disk_need(pin.repo, pin.revision, pin.local_dir, spec.margin_bytes, spec.hf_endpoint,
                             hf_token(spec), pin.root)
            if need is not None:
                needs.append(need)
    except HubError as err:
        return str(err)
    return shortfall(needs)
