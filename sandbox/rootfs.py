"""The sandbox hosts' shared Debian root filesystem and ssh key, built once.

The rootfs is made by mmdebstrap from the machine's own apt sources, cached
read-only at /var/cache/sglang-converge/rootfs-<hash of the recipe> and used
as the lower layer of every guest's overlay. Only what rarely changes is baked
in; everything that changes often (the GPU simulator, nvidia-smi stand-in,
authorized_keys, hostname, layout) is copied into each guest's overlay at `up`.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

CACHE_DIR = Path(os.environ.get("SGC_CACHE_DIR", "/var/cache/sglang-converge"))
SSH_KEY = CACHE_DIR / "ssh" / "id_ed25519"
APT_SOURCES = Path("/etc/apt/sources.list.d/debian.sources")

SUITE = "bookworm"
VARIANT = "minbase"
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "libpam-systemd",
    "openssh-server",
    "python3",
    "python3-venv",
    "iproute2",
    "procps",
    "curl",
    "ca-certificates",
    "sudo",
    "rsync",  # peer seeding: a host copies the model from a peer over ssh (remote/peer_seed.py)
)
# bump when _finish_rootfs changes what it bakes in
POST_VERSION = "1"

# host tool -> Debian package that provides it
HOST_TOOLS = {
    "systemd-nspawn": "systemd-container",
    "mmdebstrap": "mmdebstrap",
    "iptables": "iptables",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "ip": "iproute2",
}

SSHD_CONFIG = """\
# sandbox guest: key-only root login, no reverse DNS (it stalls without NAT)
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
"""

ETC_HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"


def recipe() -> str:
    """Everything that decides the rootfs' content, as one string."""
    return "\n".join(
        [f"suite={SUITE}", f"variant={VARIANT}", "include=" + ",".join(PACKAGES), f"post={POST_VERSION}"]
    )


def recipe_hash() -> str:
    return hashlib.sha256(recipe().encode()).hexdigest()[:12]


def rootfs_path() -> Path:
    return CACHE_DIR / f"rootfs-{recipe_hash()}"


def _log(msg: str) -> None:
    print(f"[sandbox] {msg}", flush=True)


def missing_tools() -> list[str]:
    return sorted({pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None})


def ensure_tools() -> None:
    """apt-get install the host tools the sandbox needs, when missing."""
    missing = missing_tools()
    if not missing:
        return
    _log(f"installing {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    still = missing_tools()
    if still:
        raise RuntimeError(f"could not install host tools: {still}")


def ensure_ssh_key() -> Path:
    """The sandbox's ssh key pair (made once)."""
    if not SSH_KEY.exists():
        SSH_KEY.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(SSH_KEY.parent, 0o700)
        tmp = SSH_KEY.with_name(f".tmp-{os.getpid()}")
        for p in (tmp, tmp.with_suffix(".pub")):
            p.unlink(missing_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sglang-converge-sandbox", "-f", str(tmp)],
            check=True,
        )
        tmp.with_suffix(".pub").replace(SSH_KEY.with_suffix(".pub"))
        tmp.replace(SSH_KEY)
    return SSH_KEY


def _finish_rootfs(root: Path) -> None:
    """Bake in what every guest needs and that rarely changes."""
    (root / "etc/ssh/sshd_config.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/ssh/sshd_config.d/sandbox.conf").write_text(SSHD_CONFIG)
    (root / "etc/hosts").write_text(ETC_HOSTS)
    # empty machine-id: systemd makes a fresh one per boot (per guest)
    (root / "etc/machine-id").write_text("")
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    # the mirror is the machine's: copied into each guest's overlay at `up`
    for src in (root / "etc/apt/sources.list.d").glob("*.sources"):
        src.unlink()
    (root / "etc/apt/sources.list").unlink(missing_ok=True)
    # no console/tty gettys inside a container booted with --console=passive
    for unit in ("getty@tty1.service", "console-getty.service"):
        link = root / "etc/systemd/system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    (root / ".sandbox-recipe").write_text(recipe() + "\n")


def ensure_rootfs(rebuild: bool = False) -> Path:
    """The cached rootfs for the current recipe; built (atomically) when absent."""
    final = rootfs_path()
    if final.is_dir() and not rebuild:
        return final
    ensure_tools()
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / ".rootfs.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_dir() and not rebuild:
            return final  # built by a concurrent run meanwhile
        # leftovers of an interrupted build
        for old in CACHE_DIR.glob(f"{final.name}.tmp-*"):
            shutil.rmtree(old, ignore_errors=True)
        tmp = CACHE_DIR / f"{final.name}.tmp-{os.getpid()}"
        if not APT_SOURCES.exists():
            raise RuntimeError(f"{APT_SOURCES} is missing: the rootfs is built from the machine's apt sources")
        _log(f"building rootfs {final} (mmdebstrap {SUITE}, ~30 s)")
        started = time.monotonic()
        try:
            with open(APT_SOURCES, "rb") as sources:
                proc = subprocess.run(
                    [
                        "mmdebstrap",
                        "--quiet",
                        f"--variant={VARIANT}",
                        "--include=" + ",".join(PACKAGES),
                        SUITE,
                        str(tmp),
                        "-",
                    ],
                    stdin=sources,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            if proc.returncode != 0:
                raise RuntimeError(f"mmdebstrap failed ({proc.returncode}):\n{proc.stdout[-4000:]}")
            _finish_rootfs(tmp)
            if final.exists():
                old = CACHE_DIR / f"{final.name}.old-{os.getpid()}"
                final.rename(old)
                shutil.rmtree(old, ignore_errors=True)
            tmp.rename(final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        _log(f"rootfs built in {time.monotonic() - started:.1f} s")
    return final
