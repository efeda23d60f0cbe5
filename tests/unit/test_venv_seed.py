"""remote/venv_seed.py: a server venv copied from a peer with the real rsync (the stand-in ssh of
test_peer_seed runs rsync's server side on this machine, as sshd would on the peer), used only when it
was made on this Python for this platform, else removed with the reason and left to pip."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core.paths import REMOTE_SRC_DIR
from core.venv_seeding import NOT_COPIED
from tests.unit.test_peer_seed import peer_ssh  # noqa: F401 (fixture)

pytestmark = pytest.mark.skipif(shutil.which("rsync") is None, reason="needs rsync (make setup installs it)")

# the interpreter a host builds its venvs with (the spec's venv_python), not this test's venv
BASE_PYTHON = os.path.realpath(getattr(sys, "_base_executable", sys.executable))


@pytest.fixture
def peer_venv(tmp_path) -> Path:
    """The peer's venv of a package set, as a converge leaves it: a real venv, a package, its markers."""
    venv = tmp_path / "peer" / "venv-envs" / "95f9894a772e"
    subprocess.run([BASE_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "tinypkg").mkdir()
    (site / "tinypkg" / "__init__.py").write_text("VALUE = 42\n")
    os.link(site / "tinypkg" / "__init__.py", site / "tinypkg" / "linked.py")
    for name in NOT_COPIED:
        (venv / name).write_text("the peer's own\n")
    return venv


def run_seed(tmp_path, peer_dir: Path, into: Path) -> subprocess.CompletedProcess:
    key, known = tmp_path / "seed-key", tmp_path / "seed-known-hosts"
    key.write_text("not a real key\n")
    known.write_text("10.9.9.9 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPeer\n")
    argv = [BASE_PYTHON, str(REMOTE_SRC_DIR / "venv_seed.py"), "--from", f"root@10.9.9.9:{peer_dir}",
            "--into", str(into), "--port", "2222", "--key", str(key), "--known-hosts", str(known),
            *[part for name in NOT_COPIED for part in ("--exclude", name)]]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def here(tmp_path) -> Path:
    return tmp_path / "host" / "venv-envs" / "95f9894a772e"


def test_the_copy_is_the_venv_without_the_peers_markers_and_runs_here(tmp_path, peer_venv, peer_ssh):  # noqa: F811
    into = here(tmp_path)
    proc = run_seed(tmp_path, peer_venv, into)
    assert proc.returncode == 0, proc.stderr
    assert "seed: copied the venv from the peer root@10.9.9.9:" in proc.stdout, proc.stdout
    assert [name for name in NOT_COPIED if (into / name).exists()] == []
    assert (peer_venv / NOT_COPIED[0]).exists()  # positive control: the peer had them
    site = next((into / "lib").glob("python3*/site-packages"))
    assert os.stat(site / "tinypkg" / "__init__.py").st_ino == os.stat(site / "tinypkg" / "linked.py").st_ino
    ran = subprocess.run([str(into / "bin" / "python"), "-c", "import tinypkg, sys; print(tinypkg.VALUE, sys.prefix)"],
                         capture_output=True, text=True, check=True)
    assert ran.stdout.split() == ["42", str(into)]
    assert not list(into.parent.glob(".seeding-*"))
    calls = peer_ssh.read_text()
    assert "-p 2222" in calls and "StrictHostKeyChecking=yes" in calls and "BatchMode=yes" in calls


@pytest.mark.parametrize("spoil, why", [
    (lambda venv: (venv / "pyvenv.cfg").write_text(
        (venv / "pyvenv.cfg").read_text().replace("version", "version = 3.9.1\nold_version")),
     "it was built on Python 3.9.1"),
    (lambda venv: (next((venv / "lib").glob("python3*/site-packages")) / "fast.cpython-39-aarch64-linux-gnu.so")
     .write_bytes(b"\x7fELF"), "is built for cpython-39-aarch64-linux-gnu"),
    (lambda venv: (venv / "pyvenv.cfg").unlink(), "no pyvenv.cfg in the copy"),
])
def test_a_venv_made_for_another_python_is_not_used_and_nothing_is_left(tmp_path, peer_venv, peer_ssh,  # noqa: F811
                                                                         spoil, why):
    spoil(peer_venv)
    into = here(tmp_path)
    proc = run_seed(tmp_path, peer_venv, into)
    assert proc.returncode == 0, proc.stderr
    assert "is not used: " in proc.stdout and why in proc.stdout, proc.stdout
    assert proc.stdout.rstrip().endswith("building the venv here")
    assert not into.exists() and list(into.parent.iterdir()) == []


def test_an_unreachable_peer_is_said_and_the_venv_is_left_to_pip(tmp_path, peer_venv, peer_ssh, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FAKE_SSH_FAIL", "ssh: connect to host 10.9.9.9 port 2222: Connection refused")
    into = here(tmp_path)
    proc = run_seed(tmp_path, peer_venv, into)
    assert proc.returncode == 0, proc.stderr
    assert "is not used: " in proc.stdout and "Connection refused" in proc.stdout, proc.stdout
    assert not into.exists() and list(into.parent.iterdir()) == []


def test_a_venv_already_here_is_not_touched(tmp_path, peer_venv, peer_ssh):  # noqa: F811
    into = here(tmp_path)
    into.mkdir(parents=True)
    (into / "mine").write_text("kept\n")
    proc = run_seed(tmp_path, peer_venv, into)
    assert "exists: not copied" in proc.stdout
    assert sorted(path.name for path in into.iterdir()) == ["mine"] and peer_ssh.read_text() == ""
