"""The disk check, written once: how many bytes of a pinned revision are
still to fetch, and whether they fit in the free space minus the margin.

Used by the preflight step, the model step and the rollout's fleet preflight.
Sizes come from the Hub (or ``hf_endpoint``) for the pinned revision, asked
once per run from the controller; the host's side from its facts.

    need = disk_need(repo, revision, local_dir, margin_bytes)
    if need and need.short: fail(need.shortfall())
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from pyinfra import host

from core.ops import gb
from facts.files import FreeBytes
from facts.model_dir import ModelDir, ModelDirState
from tasks.spec import Spec


@cache
def hub_files(repo: str, revision: str, endpoint: str | None, token: str | None) -> dict[str, int]:
    """File sizes of one pinned revision, from the Hub API (a pinned revision never changes)."""
    from huggingface_hub import HfApi

    info = HfApi(endpoint=endpoint, token=token).model_info(repo, revision=revision, files_metadata=True)
    return {sibling.rfilename: int(sibling.size or 0) for sibling in info.siblings or []}


def model_complete(state: ModelDir, repo: str, revision: str) -> bool:
    """The marker names this revision and every file it lists is on disk at its size."""
    marker = state.marker
    if not marker or marker.get("repo") != repo or marker.get("revision") != revision:
        return False
    return all(state.files.get(name) == size for name, size in marker.get("files", {}).items())


def bytes_to_fetch(expected: dict[str, int], state: ModelDir) -> int:
    return sum(size for name, size in expected.items() if state.files.get(name) != size)


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

    @property
    def short(self) -> bool:
        return self.need > self.free - self.margin

    def shortfall(self) -> str:
        return (
            f"not enough disk for {self.repo}@{self.revision[:12]}: need {gb(self.need)} more "
            f"(of {gb(self.total)}), {self.where} has {gb(self.free)} free and {gb(self.margin)} must stay "
            f"free (size_margin_gb); nothing was downloaded"
        )


def disk_need(repo: str, revision: str, local_dir: str, margin_bytes: int,
              endpoint: str | None = None, token: str | None = None) -> DiskNeed | None:
    """None when ``local_dir`` already holds the revision, verified; else what the download needs."""
    state = host.get_fact(ModelDirState, path=local_dir)
    if model_complete(state, repo, revision):
        return None
    expected = hub_files(repo, revision, endpoint, token)
    space = host.get_fact(FreeBytes, path=local_dir)
    return DiskNeed(repo=repo, revision=revision, files=len(expected), need=bytes_to_fetch(expected, state),
                    total=sum(expected.values()), free=space.free_bytes if space else 0,
                    where=space.path if space else local_dir, margin=margin_bytes)


def hf_token(spec: Spec) -> str | None:
    return spec.hf_token.get_secret_value() if spec.hf_token else None


def disk_shortfall(spec: Spec) -> str | None:
    """Why the model's remaining bytes do not fit on the host's disk, or None."""
    need = disk_need(spec.profile.repo, spec.profile.revision, spec.model_dir, spec.margin_bytes,
                     spec.hf_endpoint, hf_token(spec))
    return need.shortfall() if need and need.short else None
