"""rollout/seeding.py: which peer each host of a batch copies from, the key given to a peer for the
rollout only (the grant and revoke scripts run for real with sh, in a throw-away HOME), and the
model step's command line when a peer is offered."""

from __future__ import annotations

import os
import subprocess

import pytest

from core.seeding import SeedSource, venv_key
from rollout.seeding import PeerSeeding, grant_script, known_hosts, new_key, revoke_script

MODEL = "org/model@" + "a" * 40
DRAFT = "org/draft@" + "b" * 40
HOST_KEYS = ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKey root@peer", "ecdsa-sha2-nistp256 AAAAE2Vj root@peer"]


class Fleet:
    """Hosts that all pin the model (and some the draft); run_on answers like a peer's shell."""

    def __init__(self, names, drafts=(), refuse=()):
        self.names, self.drafts, self.refuse = list(names), set(drafts), set(refuse)
        self.calls: list[tuple[str, str]] = []
        self.lines: list[str] = []

    def pins(self, name):
        out = {MODEL: f"/srv/models/{name}-model"}
        if name in self.drafts:
            out[DRAFT] = f"/srv/models/{name}-draft"
        return out

    def run_on(self, name, script):
        self.calls.append((name, script))
        if name in self.refuse:
            return False, ["ssh: connect to host 10.0.0.9 port 22: Connection refused"]
        return True, ["user=root", *HOST_KEYS]

    def seeding(self, enabled=True):
        return PeerSeeding(self.run_on, lambda name: (f"10.0.0.{self.names.index(name) + 1}", 22), self.pins,
                           self.lines.append, enabled)


def test_the_first_batch_downloads_and_later_hosts_copy_from_the_converged_one():
    fleet = Fleet(["a", "b", "c", "d"])
    seeding = fleet.seeding()
    seeding.learn({name: set() for name in fleet.names}, {name: {MODEL} for name in fleet.names})
    assert seeding.offers(["a"]) == {}  # nobody holds it yet: the canary goes to the Hub
    seeding.converged(["a"])
    offers = seeding.offers(["b", "c", "d"])
    assert set(offers) == {"b", "c", "d"} and {o.peer for o in offers.values()} == {"a"}
    source = offers["b"]
    assert (source.user, source.address, source.port) == ("root", "10.0.0.1", 22)
    assert source.dirs == {MODEL: "/srv/models/a-model"}
    assert source.source("/srv/models/a-model") == "root@10.0.0.1:/srv/models/a-model"
    assert source.known_hosts.splitlines()[0] == "10.0.0.1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKey"
    assert "PRIVATE KEY" in source.private_key and "PRIVATE KEY" not in repr(source)
    assert [name for name, _ in fleet.calls] == ["a"]  # the peer is prepared once per rollout
    assert any("b, c, d copy what they lack from a (10.0.0.1)" in line for line in fleet.lines)
    seeding.close()
    assert [name for name, _ in fleet.calls] == ["a", "a"] and seeding.tag in fleet.calls[-1][1]


def test_hosts_that_hold_the_revision_get_no_offer_and_a_batch_spreads_over_the_peers():
    fleet = Fleet(["a", "b", "c", "d", "e"])
    seeding = fleet.seeding()
    seeding.learn({"a": {MODEL}, "b": {MODEL}, "c": set(), "d": set(), "e": {MODEL}},
                  {"a": set(), "b": set(), "c": {MODEL}, "d": {MODEL}, "e": set()})
    offers = seeding.offers(["c", "d", "e"])
    assert set(offers) == {"c", "d"}  # e holds it: nothing to copy
    assert {offers["c"].peer, offers["d"].peer} == {"a", "b"}


def test_the_peer_that_holds_most_of_what_a_host_lacks_is_chosen():
    fleet = Fleet(["a", "b", "c"], drafts={"a", "b", "c"})
    seeding = fleet.seeding()
    seeding.learn({"a": {MODEL}, "b": {MODEL, DRAFT}, "c": set()}, {"a": {DRAFT}, "b": set(), "c": {MODEL, DRAFT}})
    offers = seeding.offers(["c"])
    assert offers["c"].peer == "b" and set(offers["c"].dirs) == {MODEL, DRAFT}


def test_a_peer_that_cannot_be_prepared_is_said_and_the_hosts_go_to_the_hub():
    fleet = Fleet(["a", "b"], refuse={"a"})
    seeding = fleet.seeding()
    seeding.converged(["a"])
    assert seeding.offers(["b"]) == {}
    assert any("cannot prepare a as a peer (ssh: connect to host 10.0.0.9 port 22: Connection refused)" in line
               and "from the Hub" in line for line in fleet.lines)
    seeding.close()
    assert [name for name, _ in fleet.calls] == ["a"]  # nothing to revoke


def test_no_seeding_when_turned_off():
    fleet = Fleet(["a", "b"])
    seeding = fleet.seeding(enabled=False)
    seeding.converged(["a"])
    assert seeding.offers(["b"]) == {} and fleet.calls == []


def test_the_grant_adds_a_restricted_expiring_line_and_the_revoke_removes_only_it(tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    keys = home / ".ssh" / "authorized_keys"
    keys.write_text("ssh-ed25519 AAAAC3Other operator@laptop\n")
    keys.chmod(0o600)
    inode = keys.stat().st_ino
    env = {**os.environ, "HOME": str(home)}
    _private, public = new_key("sglang-converge-seed-test1")
    proc = subprocess.run(["sh", "-c", grant_script(public)], env=env, capture_output=True, text=True)
    me = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    assert f"user={me}" in proc.stdout
    lines = keys.read_text().splitlines()
    assert lines[0] == "ssh-ed25519 AAAAC3Other operator@laptop"
    assert lines[1].startswith('restrict,expiry-time="') and lines[1].endswith(public), lines
    expiry = lines[1].split('"')[1]
    assert len(expiry) == 12 and expiry.isdigit()
    proc = subprocess.run(["sh", "-c", revoke_script("sglang-converge-seed-test1")], env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert keys.read_text() == "ssh-ed25519 AAAAC3Other operator@laptop\n"
    assert keys.stat().st_ino == inode and keys.stat().st_mode & 0o777 == 0o600


def test_known_hosts_use_the_bracketed_form_off_port_22():
    assert known_hosts("10.0.0.1", 2222, HOST_KEYS).splitlines() == [
        "[10.0.0.1]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKey", "[10.0.0.1]:2222 ecdsa-sha2-nistp256 AAAAE2Vj"]


@pytest.mark.parametrize("peer_holds, expected", [(True, True), (False, False)])
def test_the_model_step_passes_the_peer_only_for_a_revision_it_holds(peer_holds, expected):
    from core.disk import Pin
    from tasks.model import _fetch_argv

    pin = Pin("model", "org/model", "a" * 40, "/srv/models/m")
    seed = SeedSource(peer="a", user="root", address="10.0.0.1", port=22,
                      dirs={MODEL: "/srv/models/a-model"} if peer_holds else {DRAFT: "/srv/models/a-draft"},
                      known_hosts="", private_key="-----BEGIN OPENSSH PRIVATE KEY-----")
    options = {"attempts": 5, "backoff_s": 5.0, "read_timeout_s": 30, "endpoint": None}
    argv = _fetch_argv("/opt/venv/bin/python", pin, 0, 0, options, None, seed)
    assert ("--seed-from root@10.0.0.1:/srv/models/a-model" in argv) is expected
    assert ("--seed-key /etc/sglang/sglang.seed-key --seed-known-hosts /etc/sglang/sglang.seed-known-hosts"
            in argv) is expected
    assert "PRIVATE KEY" not in argv


def test_a_venv_is_offered_only_from_a_host_that_converged_and_a_cached_peer_offers_what_it_holds_now():
    venv = venv_key("95f9894a772e")
    fleet = Fleet(["a", "b", "c", "d"])
    base_pins = fleet.pins
    fleet.pins = lambda name: {**base_pins(name), venv: "/opt/sglang/venv-envs/95f9894a772e"}
    seeding = fleet.seeding()
    # a held the model at the preflight (and had some venv dir: that proves nothing); the others lack both
    seeding.learn({"a": {MODEL}, "b": set(), "c": set(), "d": set()},
                  {"a": set(), "b": {MODEL, venv}, "c": {MODEL, venv}, "d": {MODEL, venv}})
    first = seeding.offers(["b"])
    assert first["b"].peer == "a" and first["b"].dirs == {MODEL: "/srv/models/a-model"}
    assert first["b"].venv_for("95f9894a772e") is None  # b builds its venv with pip
    seeding.converged(["a", "b"])
    later = seeding.offers(["c", "d"])
    assert {source.venv_for("95f9894a772e") for source in later.values()} == {"/opt/sglang/venv-envs/95f9894a772e"}
    assert [name for name, _ in fleet.calls].count("a") == 1  # a was prepared once, its offer refreshed


def test_the_copy_command_removes_the_key_files_and_a_source_offers_only_its_venv():
    from core.venv_seeding import copy_command

    command = copy_command("/opt/sglang/venv-envs/abc", "/usr/bin/python3", "root@10.0.0.1:/opt/sglang/venv-envs/abc",
                           2222, "sglang")
    assert command.startswith("trap 'rm -f /etc/sglang/sglang.seed-key /etc/sglang/sglang.seed-known-hosts' EXIT")
    assert "--port 2222" in command and "--exclude .sgc-switched" in command
    source = SeedSource(peer="a", user="root", address="10.0.0.1", port=22, dirs={venv_key("abc"): "/e/abc"},
                        known_hosts="", private_key="")
    assert source.venv_for("abc") == "/e/abc" and source.venv_for("def") is None
