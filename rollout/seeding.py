"""Peer seeding in a rollout: one Hub download per revision for the whole fleet.

The first host that needs a pinned revision (model or draft) downloads it from
the Hub. Every host of a later batch that lacks it copies it from a host that
holds it verified - one that held it at the fleet preflight, or that converged
in an earlier batch of this rollout - with rsync over ssh between the hosts
(remote/peer_seed.py), then fetches from the Hub whatever the copy did not
bring and checks every file against the digests the Hub publishes, exactly as
after a Hub download. A failed copy falls back to the Hub, and says so.

The server venv of a package set is seeded the same way (core/venv_seeding.py):
a host that lacks ``<venv_path>-envs/<digest>`` copies it from a host that
built and checked it in an earlier batch of this rollout (never from one that
merely had the dir at the preflight: only a converge proves it whole), then
checks it as it checks a venv it built; a copy made on another Python is not
used and the venv is built with pip.

The ssh access exists for this rollout only:

- an ed25519 key pair made in memory on the controller (never on its disk);
- its public key appended to the peer's ``~/.ssh/authorized_keys`` (the
  user the rollout connects as) with ``restrict`` (no shell prompt, no
  forwarding) and ``expiry-time`` 12 hours ahead (sshd refuses it after that,
  should the rollout die before it cleans up), tagged with the rollout's id;
- the private key and the peer's host keys written root-only on the copying
  host by the model step, and removed after its download;
- the peer's line removed when the rollout ends, whatever happened.

The peer is reached at its ``ssh_hostname`` and ``ssh_port`` (what the
controller uses), so the hosts must reach each other there. Dry runs never
seed. ``python -m rollout --no-seed`` turns it off; a plain ``pyinfra
INVENTORY deploy.py`` does not seed (every host downloads from the Hub).
"""

from __future__ import annotations

import shlex
import time
import uuid
from collections.abc import Callable
from dataclasses import replace

from core.seeding import SeedSource, venv_key

EXPIRY_HOURS = 12


def revisions_held(spec) -> dict[str, bool]:
    """{"repo@revision": held verified} for each revision the spec pins, from the host's ModelDirState fact
    (run inside a host context, like the preflight's checks)."""
    from pyinfra import host

    from core.disk import model_complete, pins
    from facts.model_dir import ModelDirState

    return {f"{pin.repo}@{pin.revision}": model_complete(host.get_fact(ModelDirState, path=pin.local_dir),
                                                          pin.repo, pin.revision) for pin in pins(spec)}


def venv_missing(spec) -> set[str]:
    """{venv_key} when the host lacks the venv of the spec's package set, else empty (in a host context).
    There is no "held" counterpart: a venv dir proves nothing until a converge here checks it."""
    from pyinfra import host

    from facts.venv import VenvState

    return set() if host.get_fact(VenvState, path=spec.server_venv).exists else {venv_key(spec.env_digest)}


def new_key(tag: str) -> tuple[str, str]:
    """(private key in OpenSSH format, public key line) of a fresh ed25519 key, in memory."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    return private, f"{public} {tag}"


def grant_script(public_line: str) -> str:
    """On the peer: allow the key (restricted, expiring), then say who we are and the host's keys."""
    line = shlex.quote(public_line)
    return ("set -e; umask 077; mkdir -p \"$HOME/.ssh\"; touch \"$HOME/.ssh/authorized_keys\"; "
            f"until=$(date -d '+{EXPIRY_HOURS} hours' +%Y%m%d%H%M); "
            f"printf 'restrict,expiry-time=\"%s\" %s\\n' \"$until\" {line} >> \"$HOME/.ssh/authorized_keys\"; "
            "echo \"user=$(id -un)\"; cat /etc/ssh/ssh_host_*_key.pub")


def revoke_script(tag: str) -> str:
    """On the peer: remove the rollout's line (in place: the file keeps its inode, owner and mode)."""
    tag = shlex.quote(tag)
    return (f"f=\"$HOME/.ssh/authorized_keys\"; [ -f \"$f\" ] || exit 0; t=$(mktemp); "
            f"grep -vF -- {tag} \"$f\" > \"$t\" || true; cat \"$t\" > \"$f\"; rm -f \"$t\"; "
            f"! grep -qF -- {tag} \"$f\"")


def known_hosts(address: str, port: int, lines: list[str]) -> str:
    """The peer's host keys in known_hosts format, for the address and port the copy connects to.

    >>> known_hosts("10.0.0.1", 22, ["ssh-ed25519 AAAAC3 root@a"])
    '10.0.0.1 ssh-ed25519 AAAAC3\\n'
    >>> known_hosts("10.0.0.1", 2222, ["ssh-rsa AAAAB3 root@a", "garbage"])
    '[10.0.0.1]:2222 ssh-rsa AAAAB3\\n'
    """
    where = address if port == 22 else f"[{address}]:{port}"
    keys = [line.split()[:2] for line in lines if line.startswith(("ssh-", "ecdsa-")) and len(line.split()) >= 2]
    return "".join(f"{where} {kind} {key}\n" for kind, key in keys)


class PeerSeeding:
    """One rollout's seeding: who holds which revision, the peers prepared, the offers per batch.

    ``connect(name)`` runs a shell command on a host of the inventory and gives (ok, output lines);
    ``address(name)`` is (ssh address, port) of a host; ``pins(name)`` is {"repo@revision": dir}
    of what the host's spec pins.
    """

    def __init__(self, run_on: Callable[[str, str], tuple[bool, list[str]]],
                 address: Callable[[str], tuple[str, int]], pins: Callable[[str], dict[str, str]],
                 echo: Callable[[str], None], enabled: bool = True) -> None:
        self.run_on, self.address, self.pins, self.echo = run_on, address, pins, echo
        self.enabled = enabled
        self.tag = f"sglang-converge-seed-{uuid.uuid4().hex[:12]}"
        self.holders: dict[str, list[str]] = {}  # "repo@revision" -> hosts that hold it verified, in order
        self.missing: dict[str, set[str]] | None = None  # host -> revisions it lacks (None: not known)
        self.sources: dict[str, SeedSource | None] = {}  # peer -> its source (None: could not be prepared)
        self._key: tuple[str, str] | None = None

    def learn(self, held: dict[str, set[str]], missing: dict[str, set[str]]) -> None:
        """What the fleet preflight saw: per host, the revisions held verified and the ones missing."""
        for name, keys in held.items():
            for key in sorted(keys):
                self.holders.setdefault(key, []).append(name)
        self.missing = {name: set(keys) for name, keys in missing.items()}

    def converged(self, names: list[str]) -> None:
        """Hosts that ended a batch ok hold every revision they pin, verified (the model step's postcondition)."""
        for name in names:
            for key in self.pins(name):
                if name not in self.holders.setdefault(key, []):
                    self.holders[key].append(name)
            if self.missing is not None:
                self.missing[name] = set()

    def offers(self, batch: list[str]) -> dict[str, SeedSource]:
        """For each host of the batch that lacks a revision some other host holds: that peer, prepared."""
        if not self.enabled:
            return {}
        out: dict[str, SeedSource] = {}
        for i, name in enumerate(batch):
            wanted = self.pins(name)
            lacking = set(wanted) if self.missing is None else self.missing.get(name, set()) & set(wanted)
            candidates = [peer for key in sorted(lacking) for peer in self.holders.get(key, [])
                          if peer != name and peer not in batch]
            if not candidates:
                continue
            peers = list(dict.fromkeys(candidates))
            held = {peer: sum(peer in self.holders.get(key, []) for key in lacking) for peer in peers}
            best = [peer for peer in peers if held[peer] == max(held.values())]
            peer = best[i % len(best)]  # spread a batch over the peers that hold as much
            source = self._prepared(peer)
            if source is not None:
                out[name] = source
        if out:
            by_peer: dict[str, list[str]] = {}
            for name, source in out.items():
                by_peer.setdefault(source.peer, []).append(name)
            for peer, names in by_peer.items():
                self.echo(f"rollout: seed: {', '.join(names)} copy what they lack from {peer} "
                          f"({out[names[0]].address}) before asking the Hub")
        return out

    def _held_by(self, peer: str) -> dict[str, str]:
        return {key: path for key, path in self.pins(peer).items() if peer in self.holders.get(key, [])}

    def _prepared(self, peer: str) -> SeedSource | None:
        if peer in self.sources:  # prepared before: what it holds now (it may have converged since)
            source = self.sources[peer]
            return None if source is None else replace(source, dirs=self._held_by(peer))
        if self._key is None:
            self._key = new_key(self.tag)
        private, public = self._key
        address, port = self.address(peer)
        started = time.monotonic()
        ok, lines = self.run_on(peer, grant_script(public))
        user = next((line.split("=", 1)[1] for line in lines if line.startswith("user=")), "")
        hosts = known_hosts(address, port, lines)
        if not ok or not user or not hosts:
            why = (lines[-1] if lines else "no output") if not ok else "no user or host keys in its answer"
            self.echo(f"rollout: seed: cannot prepare {peer} as a peer ({why}): its revisions come from the Hub")
            self.sources[peer] = None
            return None
        self.sources[peer] = SeedSource(peer=peer, user=user, address=address, port=port, dirs=self._held_by(peer),
                                        known_hosts=hosts, private_key=private)
        self.echo(f"rollout: seed: {peer} serves its verified revisions to the later hosts over ssh "
                  f"(a key for this rollout only, {time.monotonic() - started:.1f} s to set up)")
        return self.sources[peer]

    def close(self) -> None:
        """Remove the rollout's key from every peer it was given to."""
        for peer, source in self.sources.items():
            if source is None:
                continue
            ok, lines = self.run_on(peer, revoke_script(self.tag))
            if not ok:
                self.echo(f"rollout: seed: could not remove this rollout's key from {peer} "
                          f"({lines[-1] if lines else 'no output'}); sshd refuses it after {EXPIRY_HOURS} h "
                          f"(expiry-time), or remove the line tagged {self.tag} from its authorized_keys")
        self.sources.clear()
