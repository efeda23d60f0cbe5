"""Peer seeding, the part steps read: where a host may copy a pinned revision
(and a server venv the same package set built, venv_key) from instead of the Hub
or pip, offered for one run by the rollout (rollout/seeding.py)
on pyinfra's State, never in a setting. The model step (tasks/model.py) passes it
to remote/fetch_model.py, which copies from the peer, then fetches from the Hub
whatever is still missing and checks every file against the Hub's digests.

    from core.seeding import offer, seed_source
    offer(state, {"gpu-b": SeedSource(peer="gpu-a", ...)})   # the rollout, before a batch runs
    seed_source(host.name)                                    # the model step
"""

from __future__ import annotations

from dataclasses import dataclass, field
from io import StringIO
from typing import Any

from pyinfra.api import FileUploadCommand, QuoteString, StringCommand

from core.paths import seed_key_file, seed_known_hosts_file
from core.runstate import run_state

_KEY = "seed_sources"


@dataclass(frozen=True)
class SeedSource:
    """A peer that holds revisions verified, and how this host reaches it (for this rollout only)."""

    peer: str  # the peer's inventory name (for messages)
    user: str  # the ssh user on the peer
    address: str  # the peer's address as the hosts reach it (its ssh_hostname)
    port: int
    dirs: dict[str, str]  # "repo@revision" (or venv_key) -> the dir on the peer that holds it verified
    known_hosts: str = field(repr=False)  # the peer's host keys, known_hosts lines
    private_key: str = field(repr=False)  # the rollout's key for the copy (never logged)

    def dir_for(self, repo: str, revision: str) -> str | None:
        return self.dirs.get(f"{repo}@{revision}")

    def venv_for(self, digest: str) -> str | None:
        """The peer's verified venv of the package set ``digest`` (tasks/spec: ``Spec.env_digest``)."""
        return self.dirs.get(venv_key(digest))

    def source(self, remote_dir: str) -> str:
        """rsync's source for one dir on the peer: user@address:/dir (IPv6 addresses bracketed)."""
        address = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.user}@{address}:{remote_dir}"


def venv_key(digest: str) -> str:
    """The seeding key of a server venv by its package set's digest (a repo id never has a colon).

    >>> venv_key("95f9894a772e")
    'venv:95f9894a772e'
    """
    return f"venv:{digest}"


def offer(state: Any, sources: dict[str, SeedSource]) -> None:
    """Make ``sources`` (host name -> peer) this run's offers."""
    run_state(state).extensions[_KEY] = dict(sources)


def seed_source(host_name: str, state: Any = None) -> SeedSource | None:
    """The peer this run offers ``host_name``, if any."""
    sources: dict[str, SeedSource] = run_state(state).extensions.get(_KEY, {})
    return sources.get(host_name)


def seed_files_uploaded(seed: SeedSource, owner: str):
    """Commands: the rollout's key and the peer's host keys written root-only (0600) for the copy, created
    empty with that mode before a byte is written; the copy's command removes them."""
    for path, text in ((seed_key_file(owner), seed.private_key), (seed_known_hosts_file(owner), seed.known_hosts)):
        yield StringCommand("install -m 600 -o root -g root /dev/null", QuoteString(path))
        yield FileUploadCommand(StringIO(text), path)
