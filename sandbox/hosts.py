"""Sandbox hosts: Debian guests booted by systemd-nspawn, reachable by ssh.

Each host sgcN is a real systemd (PID 1) + sshd in its own network namespace
(sgc-nsN; veth sgc-hN on the machine, eth0 in the guest; 10.77.N.2, machine
side 10.77.N.1, NAT for the guest's apt/pip), on a throw-away overlayfs over
the cached rootfs (sandbox.rootfs), in its own cgroup (sgc-sgcN). GPUs are
simulated (sandbox.gpusim + the nvidia-smi stand-in), and so is their PCIe tree: the sysfs
paths, /proc/cmdline and lspci the host-fitness preflight reads (sandbox.pcisim, bound over the
kernel's at boot; good by default, up(iommu=..., acs_redirect=...) makes it bad).

A host can reboot and keep its disk: a small supervisor (sh, argv[0]
sgc-nspawn-supervisor; its PID is SandboxHost.nspawn_pid) runs systemd-nspawn
and starts it again on the same root when it exits with 133 (the guest
rebooted: `systemctl reboot` in it, or reboot() here); any other exit (a
poweroff, SIGTERM, the SIGKILL remove/down send) ends the host for good.

Python API:
    up(count, **layout_opts) -> list[SandboxHost]   ensure hosts 1..count run
    down()                                          remove every sandbox host
    status() -> list[dict]                          hosts and their state
    reboot(name) -> SandboxHost                     reboot one host, wait until booted
    kill(name)                                      cut its power: killed at once, disk kept; up() boots it again
    wait_booted(name)                               wait for systemd + sshd (after a reboot)
    load_hosts() -> list[SandboxHost]               from the state file
    set_disk(host, path, size_mib) / grow_disk(...)  size-limited fs at path
    snapshot(name, label) -> Path                   a converged host's changes, a layer for clones
    up(indexes=[...], snapshot=path)                boot hosts on that layer (sandbox.clones)

Everything made here is named with the "sgc" prefix, so `down()` also cleans
up after a crashed or interrupted run by scanning for those names.
"""

from __future__ import annotations

import concurrent.futures
import configparser
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import gpusim, pcisim, rootfs

PREFIX = "sgc"
STATE_DIR = Path(os.environ.get("SGC_STATE_DIR", "/run/sglang-converge-sandbox"))
STATE_FILE = STATE_DIR / "hosts.json"
VAR_DIR = Path(os.environ.get("SGC_VAR_DIR", "/var/lib/sglang-converge/sandbox"))
NETNS_DIR = Path("/run/netns")
CGROUP_BASE = Path("/sys/fs/cgroup")
SUBNET = "10.77"
GUEST_LIB = "/usr/local/lib/sandbox-gpu"
WHEEL_DIRS = ("/opt/wheels", "/opt/pypi", "/opt/pypi-more")
PIP_CONFIG_FILES = (
    "/etc/pip.conf",
    "/etc/xdg/pip/pip.conf",
    os.path.expanduser("~/.pip/pip.conf"),
    os.path.expanduser("~/.config/pip/pip.conf"),
)
BOOT_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
REBOOT_TIMEOUT_S = BOOT_TIMEOUT_S + STOP_TIMEOUT_S
NSPAWN_REBOOT_EXIT = 133  # systemd-nspawn's exit status when the guest asked for a reboot
SUPERVISOR_ARGV0 = f"{PREFIX}-nspawn-supervisor"  # how the supervisor shows in ps
MAX_HOSTS = 254
# inotify instances one booted guest holds (systemd, journald, logind, dbus... ~10 seen): the
# kernel's default of 128 per user (all guests run as root) stops a 12th guest's systemd
# ("Failed to allocate manager object: Too many open files")
INOTIFY_PER_GUEST = 16
INOTIFY_SLACK = 256  # for the machine's own root processes
INOTIFY_LIMIT = Path("/proc/sys/fs/inotify/max_user_instances")

SRC_DIR = Path(__file__).resolve().parent
# files of sandbox/ copied into every guest's GUEST_LIB at `up` (those that exist):
# stdlib-only scripts that run on the sandbox host
NSPAWN_PROPAGATE_DIR = Path("/run/systemd/nspawn/propagate")  # systemd-nspawn's, one dir per machine name
GUEST_FILES = ("gpusim.py", "hold.py", "lspci.py", "nvidia_smi.py", "sglang_standin.py", "sglang_sigterm.py",
               "standin_cache.py")

DEFAULT_LAYOUT = {
    "gpus": 8,
    "gpu_mib": gpusim.CT200_GPU_MIB,
    "compute_cap": "12.0",
    "p2p": "OK",
    "gpu_name": gpusim.CT200_GPU_NAME,
    "driver_version": "580.95.05",
    "iommu": "pt",  # sandbox.pcisim: "pt" (good), "off" (good), "dma-fq" / "dma" (translating: bad)
    "acs_redirect": "",  # sandbox.pcisim: "" (good), "all" or "0,3": the GPUs below a bridge that redirects (bad)
}


def _log(msg: str) -> None:
    print(f"[sandbox] {msg}", flush=True)


# --------------------------------------------------------------------------- names


def host_name(index: int) -> str:
    return f"{PREFIX}{index}"


def netns_name(index: int) -> str:
    return f"{PREFIX}-ns{index}"


def veth_host(index: int) -> str:
    return f"{PREFIX}-h{index}"


def cgroup_name(name: str) -> str:
    return f"{PREFIX}-{name}"


def host_net(index: int) -> str:
    """The first three octets of host ``index``'s /24: 10.77.<index> for 1..254; above
    (the indexes parallel test sessions are given, e.g. 280), 10.78.<index - 254>."""
    return f"{SUBNET}.{index}" if index <= MAX_HOSTS else f"10.78.{index - MAX_HOSTS}"


def guest_address(index: int) -> str:
    return f"{host_net(index)}.2"


def machine_address(index: int) -> str:
    return f"{host_net(index)}.1"


def _index_of(name: str) -> int | None:
    m = re.fullmatch(rf"{PREFIX}(\d+)", name)
    return int(m.group(1)) if m else None


# --------------------------------------------------------------------------- host


SSH_OPTIONS = (
    "-o", "BatchMode=yes",
    "-o", "StrictHostKeyChecking=no",
    "-o", "UserKnownHostsFile=/dev/null",
    "-o", "GlobalKnownHostsFile=/dev/null",
    "-o", "LogLevel=ERROR",
    "-o", "ConnectTimeout=5",
    "-o", "IdentitiesOnly=yes",
)  # fmt: skip


@dataclass
class SandboxHost:
    name: str
    index: int
    address: str
    ssh_key: str
    machine_address: str = ""
    netns: str = ""
    nspawn_pid: int = 0
    root: str = ""  # the guest's / as seen from the machine (overlay mount)
    gpus: dict = field(default_factory=dict)  # layout summary

    def ssh_args(self) -> list[str]:
        """argv prefix for subprocess: ssh_args() + ["cmd ..."]."""
        return ["ssh", "-i", self.ssh_key, *SSH_OPTIONS, f"root@{self.address}"]

    def run(
        self,
        cmd: str | list[str],
        check: bool = True,
        timeout: float | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess:
        """Run a shell command on the guest over ssh (text output captured)."""
        remote = cmd if isinstance(cmd, str) else shlex.join(cmd)
        # stdin only without input: gevent's subprocess.run (pyinfra's CLI monkey-patches
        # subprocess when imported) refuses the two together even when stdin is None
        stdin = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL}
        return subprocess.run(
            [*self.ssh_args(), remote],
            check=check,
            timeout=timeout,
            text=True,
            capture_output=True,
            **stdin,
        )

    def gpu_summary(self) -> str:
        g = self.gpus or {}
        if not g:
            return "GPUs: simulated"
        return (
            f"GPUs: simulated ({g.get('count')} x {g.get('name')}, {g.get('memory_mib')} MiB, "
            f"compute {g.get('compute_cap')}, p2p {g.get('p2p')})"
        )


# --------------------------------------------------------------------------- helpers


def _sh(*argv: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), text=True, capture_output=True, input=input)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


@contextmanager
def _state_lock():
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _read_state() -> dict:
    try:
        state = json.loads(STATE_FILE.read_text())
    except (OSError, ValueError):
        return {"version": 1, "hosts": {}}
    state.setdefault("hosts", {})
    return state


def _write_state(state: dict) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = STATE_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    tmp.replace(STATE_FILE)


def _host_from_entry(entry: dict) -> SandboxHost:
    known = {f for f in SandboxHost.__dataclass_fields__}
    return SandboxHost(**{k: v for k, v in entry.items() if k in known})


def load_hosts() -> list[SandboxHost]:
    """The hosts of the state file, in index order (empty when none is up)."""
    hosts = [_host_from_entry(e) for e in _read_state()["hosts"].values()]
    return sorted(hosts, key=lambda h: h.index)


def _proc_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _is_our_nspawn(pid: int, name: str | None = None) -> bool:
    """A systemd-nspawn of a guest of ours (of `name`), or the supervisor that runs it."""
    argv = _proc_cmdline(pid)
    if not argv or os.path.basename(argv[0]) not in ("systemd-nspawn", SUPERVISOR_ARGV0):
        return False
    joined = " ".join(argv)
    if str(VAR_DIR) not in joined:
        return False
    return name is None or f"{VAR_DIR}/{name}/" in joined


def _scan_nspawn_pids() -> dict[str, list[int]]:
    """nspawn processes running a guest of ours (and their supervisors), by host name."""
    found: dict[str, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if not _is_our_nspawn(pid):
            continue
        m = re.search(rf"{re.escape(str(VAR_DIR))}/({PREFIX}\d+)/", " ".join(_proc_cmdline(pid)))
        if m:
            found.setdefault(m.group(1), []).append(pid)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours counts as dead
    try:
        st = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return st != "Z"
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _is_supervised(host: SandboxHost) -> bool:
    argv = _proc_cmdline(host.nspawn_pid)
    return bool(argv) and argv[0] == SUPERVISOR_ARGV0


def guest_nspawn_pid(host: SandboxHost) -> int | None:
    """The systemd-nspawn of the guest's current boot (a new one after each reboot)."""
    if not _is_supervised(host):  # started without a supervisor (an older sandbox)
        return host.nspawn_pid if _is_our_nspawn(host.nspawn_pid, host.name) else None
    for child in _children(host.nspawn_pid):
        argv = _proc_cmdline(child)
        if argv and os.path.basename(argv[0]) == "systemd-nspawn" and _alive(child):
            return child
    return None


def guest_init_pid(host: SandboxHost) -> int | None:
    """The guest's systemd (PID 1 inside it), as a PID on the machine (for nsenter)."""
    nspawn = guest_nspawn_pid(host)
    children = _children(nspawn) if nspawn else []
    return children[0] if children else None


# ------------------------------------------------------------------ cgroups


def cgroup_roots() -> list[Path]:
    """Hierarchies where each guest gets its own directory."""
    if (CGROUP_BASE / "cgroup.controllers").exists():  # pure cgroup2
        return [CGROUP_BASE]
    roots = []
    for sub in ("systemd", "unified"):
        p = CGROUP_BASE / sub
        if (p / "cgroup.procs").exists():
            roots.append(p)
    return roots


def _cgroup_dirs(name: str) -> list[Path]:
    return [root / cgroup_name(name) for root in cgroup_roots()]


def _cgroup_subdirs(path: Path) -> list[Path]:
    """Every directory under path, deepest first. os.walk, not Path.rglob: a session scope that
    systemd removes during the walk is skipped (rglob raised FileNotFoundError in CI)."""
    dirs = [Path(top) / d for top, names, _ in os.walk(path) for d in names]
    return sorted(dirs, key=lambda p: len(p.parts), reverse=True)


def _cgroup_pids(path: Path) -> set[int]:
    pids: set[int] = set()
    if not path.is_dir():
        return pids
    for d in [path, *_cgroup_subdirs(path)]:
        try:
            pids.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        except OSError:
            pass
    return pids


def _rmdir_tree(path: Path) -> None:
    if not path.is_dir():
        return
    for d in [*_cgroup_subdirs(path), path]:
        for _ in range(50):
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.05)


# ------------------------------------------------------------------ network


def _iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _sh("iptables", "-w", *args, check=check)


def _nat_rule(index: int) -> list[str]:
    return [
        "POSTROUTING", "-s", f"{host_net(index)}.0/24", "!", "-o", veth_host(index),
        "-m", "comment", "--comment", cgroup_name(host_name(index)), "-j", "MASQUERADE",
    ]  # fmt: skip


def _setup_network(index: int) -> None:
    ns, vh = netns_name(index), veth_host(index)
    marker = STATE_DIR / "netns-mount.created"
    if not _is_mountpoint(NETNS_DIR) and not marker.exists():
        # `ip netns add` makes /run/netns a mount point: down() undoes that
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        marker.write_text("dir-existed\n" if NETNS_DIR.is_dir() else "dir-created\n")
    _sh("ip", "netns", "add", ns)
    _sh("ip", "link", "add", vh, "type", "veth", "peer", "name", f"{PREFIX}-g{index}", "netns", ns)
    _sh("ip", "-n", ns, "link", "set", f"{PREFIX}-g{index}", "name", "eth0")
    _sh("ip", "addr", "add", f"{machine_address(index)}/24", "dev", vh)
    _sh("ip", "link", "set", vh, "up")
    _sh("ip", "-n", ns, "addr", "add", f"{guest_address(index)}/24", "dev", "eth0")
    _sh("ip", "-n", ns, "link", "set", "eth0", "up")
    _sh("ip", "-n", ns, "link", "set", "lo", "up")
    _sh("ip", "-n", ns, "route", "add", "default", "via", machine_address(index))
    fwd = Path("/proc/sys/net/ipv4/ip_forward")
    if fwd.read_text().strip() != "1":
        orig = STATE_DIR / "ip_forward.orig"
        if not orig.exists():
            orig.write_text(fwd.read_text())
        fwd.write_text("1\n")
    rule = _nat_rule(index)
    if _iptables("-t", "nat", "-C", *rule, check=False).returncode != 0:
        _iptables("-t", "nat", "-A", *rule)
    # a machine whose FORWARD policy drops (docker) still forwards our guests
    if "-P FORWARD ACCEPT" not in _iptables("-S", "FORWARD", check=False).stdout:
        for direction in ("-s", "-d"):
            r = ["FORWARD", direction, f"{host_net(index)}.0/24", "-m", "comment", "--comment",
                 cgroup_name(host_name(index)), "-j", "ACCEPT"]  # fmt: skip
            if _iptables("-C", *r, check=False).returncode != 0:
                _iptables("-I", *r)


def _our_iptables_rules(name: str | None = None) -> list[tuple[str, list[str]]]:
    """(table, rule args after -A) of every rule commented sgc-<host> (of `name` only, if given)."""
    rules = []
    for table, chain in (("nat", "POSTROUTING"), ("filter", "FORWARD")):
        out = _iptables("-t", table, "-S", chain, check=False).stdout
        for line in out.splitlines():
            args = shlex.split(line)
            if args[:1] != ["-A"] or "--comment" not in args:
                continue
            comment = args[args.index("--comment") + 1]
            if re.fullmatch(rf"{PREFIX}-{PREFIX}\d+", comment) and (name is None or comment == cgroup_name(name)):
                rules.append((table, args[1:]))
    return rules


# ------------------------------------------------------------------ guest files


def pip_settings() -> dict[str, str]:
    """find-links / extra-index-url / index-url / constraint of the machine's pip config."""
    wanted = ("find-links", "extra-index-url", "index-url", "constraint", "cert")
    settings: dict[str, str] = {}
    parser = configparser.RawConfigParser()
    for path in PIP_CONFIG_FILES:  # later files win, like pip
        try:
            parser.read(path)
        except configparser.Error:
            continue
        for section in ("global", "install"):
            if parser.has_section(section):
                for key in wanted:
                    if parser.has_option(section, key):
                        settings[key] = " ".join(parser.get(section, key).split())
        parser = configparser.RawConfigParser()
    for key in wanted:
        env = os.environ.get("PIP_" + key.upper().replace("-", "_"))
        if env:
            settings[key] = " ".join(env.split())
    return settings


GUEST_PIP_CACHE = "/root/.cache/pip"  # root's pip cache in the guest: the deploy runs pip as root


def machine_pip_cache() -> Path | None:
    """The machine's pip cache (PIP_CACHE_DIR, else $XDG_CACHE_HOME/pip or ~/.cache/pip), made if
    missing; None when pip's cache is off here (PIP_NO_CACHE_DIR) or SGC_SHARE_PIP_CACHE=0.

    Bound into every guest at root's pip cache, so a wheel is downloaded once per machine, not once per
    guest (the ~8 GB real-server venv, the stand-in's packages): the guests' pip still resolves and
    installs everything itself; only the download is saved, like a warm cache on a real host."""
    if os.environ.get("SGC_SHARE_PIP_CACHE", "1") == "0" or os.environ.get("PIP_NO_CACHE_DIR", "").lower() in (
            "1", "true", "yes", "on"):
        return None
    explicit = os.environ.get("PIP_CACHE_DIR")
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    cache = Path(explicit) if explicit else Path(xdg) / "pip"
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return cache.resolve()


def _guest_pip_conf() -> tuple[str, list[Path]]:
    """(pip.conf text, machine files to copy to the same path in the guest)."""
    settings = pip_settings()
    # no byte-compiling in the test bed: torch's ~3,000 modules cost ~13 s of CPU per venv (of ~20 s to
    # install it); Python compiles what it imports anyway. pip reads "no-compile = false" as --no-compile
    # (its inverted-boolean quirk for --no-* options)
    lines = ["[global]", "disable-pip-version-check = true", "no-compile = false"]
    extra_files: list[Path] = []
    for key in ("index-url", "extra-index-url", "find-links"):
        if key in settings:
            lines.append(f"{key} = {settings[key]}")
    if settings.get("cert") == CA_BUNDLE:  # the guest's bundle has the machine's CAs
        lines.append(f"cert = {CA_BUNDLE}")
    constraint = settings.get("constraint")
    if constraint and Path(constraint).is_file():
        lines.append(f"constraint = {constraint}")
        extra_files.append(Path(constraint))
    return "\n".join(lines) + "\n", extra_files


def _guest_resolv_conf() -> str:
    try:
        text = Path("/etc/resolv.conf").read_text()
    except OSError:
        return ""
    keep = []
    for line in text.splitlines():
        parts = line.split()
        if parts[:1] == ["nameserver"] and len(parts) > 1:
            if parts[1].startswith("127.") or parts[1] == "::1":
                continue
            keep.append(line)
        elif parts[:1] in (["search"], ["options"]):
            keep.append(line)
    return "\n".join(keep) + "\n" if keep else ""


CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
_PEM = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)
# CA environment the machine's tools use: passed on to ssh sessions in the guest
CA_ENV = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT")


def _machine_extra_cas(guest_bundle: Path) -> list[str]:
    """CA certificates the machine trusts and the guest does not (egress proxies...)."""
    try:
        machine = _PEM.findall(Path(CA_BUNDLE).read_text())
        guest = set(_PEM.findall(guest_bundle.read_text()))
    except OSError:
        return []
    return [pem for pem in machine if pem not in guest]


def _install_machine_cas(root: Path) -> None:
    bundle = root / CA_BUNDLE.lstrip("/")
    extra = _machine_extra_cas(bundle)
    if not extra:
        return
    for i, pem in enumerate(extra):  # kept by update-ca-certificates in the guest
        _write(root, f"/usr/local/share/ca-certificates/sgc-machine-{i}.crt", pem + "\n")
    _write(root, CA_BUNDLE, bundle.read_text().rstrip("\n") + "\n" + "\n".join(extra) + "\n")
    env = [f"{k}={CA_BUNDLE}" for k in CA_ENV if os.environ.get(k)]
    if env:
        current = (root / "etc/environment").read_text() if (root / "etc/environment").exists() else ""
        _write(root, "/etc/environment", current + "".join(line + "\n" for line in env))


def _write(root: Path, rel: str, data: str | bytes, mode: int = 0o644) -> None:
    dest = root / rel.lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.sgc-tmp")
    if isinstance(data, str):
        tmp.write_text(data)
    else:
        tmp.write_bytes(data)
    os.chmod(tmp, mode)
    tmp.replace(dest)


def _layout_for(index: int, opts: dict) -> dict:
    return gpusim.make_layout(
        count=int(opts["gpus"]),
        memory_mib=int(opts["gpu_mib"]),
        name=str(opts["gpu_name"]),
        compute_cap=str(opts["compute_cap"]),
        driver_version=str(opts["driver_version"]),
        p2p=str(opts["p2p"]),
        host_tag=f"{index:04x}",
    ) | {"pci": pcisim.settings(str(opts["iommu"]), str(opts["acs_redirect"]))}


def _layout_summary(layout: dict) -> dict:
    g0 = layout["gpus"][0] if layout["gpus"] else {}
    return {
        "count": len(layout["gpus"]),
        "name": g0.get("name", ""),
        "memory_mib": g0.get("memory_total_mib", 0),
        "compute_cap": g0.get("compute_cap", ""),
        "p2p": layout.get("p2p", ""),
        "driver_version": layout.get("driver_version", ""),
    }


def install_guest_files(root: Path, name: str, layout: dict) -> None:
    """Copy what changes often into a guest's root (before boot, or live)."""
    for mod in GUEST_FILES:
        if (SRC_DIR / mod).is_file():
            _write(root, f"{GUEST_LIB}/{mod}", (SRC_DIR / mod).read_bytes(), 0o755)
    # the memory plan's placement rules: the stand-in holds each rank's weights by them
    _write(root, f"{GUEST_LIB}/tensor_plan.py", (SRC_DIR.parent / "core" / "tensor_plan.py").read_bytes(), 0o644)
    _write(root, "/usr/local/bin/nvidia-smi", (SRC_DIR / "nvidia_smi.py").read_bytes(), 0o755)
    gpu_layout = {k: v for k, v in layout.items() if k != "pci"}  # what the GPU stand-ins read (and key on)
    _write(root, "/etc/sandbox-gpu/layout.json", json.dumps(gpu_layout, indent=2) + "\n")
    # the GPUs' PCIe tree, as sysfs, /proc/cmdline and lspci show it (nspawn binds it at boot: _launch_guest)
    found = pcisim.write_tree(root / pcisim.TREE_DIR.lstrip("/"), layout)
    _write(root, pcisim.MODEL_PATH, pcisim.model(layout, found))
    fast = root / pcisim.FAST_DIR.lstrip("/")
    shutil.rmtree(fast, ignore_errors=True)
    for bdf, text in pcisim.lspci_fast(found).items():
        _write(root, f"{pcisim.FAST_DIR}/{bdf}", text)
    _write(root, "/usr/local/bin/lspci", pcisim.lspci_wrapper(f"{GUEST_LIB}/lspci.py"), 0o755)
    # where the stand-in keeps what its parser and quantization-check children computed (standin_cache.py)
    (root / "var/cache/sandbox-standin").mkdir(mode=0o700, parents=True, exist_ok=True)
    _write(
        root,
        "/etc/sandbox-gpu/SIMULATED",
        "The GPUs of this host are simulated (sglang-converge sandbox): "
        f"{GUEST_LIB}/gpusim.py + /usr/local/bin/nvidia-smi stand-in"
        " + libnvidia-ml.so.1 (NVML stand-in, sandbox/nvml); their PCIe tree too: "
        f"{pcisim.TREE_DIR} bound over /sys and /proc/cmdline, {pcisim.MODEL_PATH} + /usr/local/bin/lspci stand-in.\n",
    )
    # NVML over the same state (built with the machine's gcc, cached by source digest)
    from .nvml import build as nvml_build

    try:
        nvml_build.install_into(root)
    except (nvml_build.NvmlBuildError, OSError) as err:
        _log(f"{name}: NVML stand-in (libnvidia-ml.so.1) not installed: {err}")
    # for hosts that run the real SGLang server (group_data/sandbox_real.py): the libcuda.so.1 stub
    # and the GPU shim, both loaded only by a unit whose environment names them
    try:
        nvml_build.install_cuda_stub_into(root)
    except (nvml_build.NvmlBuildError, OSError) as err:
        _log(f"{name}: libcuda.so.1 stub not installed: {err}")
    shim = SRC_DIR / "realshim" / "sitecustomize.py"
    _write(root, f"{GUEST_LIB}/realshim/sitecustomize.py", shim.read_bytes(), 0o644)


def _prepare_root(root: Path, name: str, layout: dict) -> None:
    key_pub = Path(str(rootfs.SSH_KEY) + ".pub").read_text()
    (root / "root/.ssh").mkdir(mode=0o700, parents=True, exist_ok=True)
    _write(root, "/root/.ssh/authorized_keys", key_pub, 0o600)
    _write(root, "/etc/hostname", name + "\n")
    _write(root, "/etc/hosts", rootfs.ETC_HOSTS + f"127.0.1.1\t{name}\n")
    _write(root, "/etc/resolv.conf", _guest_resolv_conf())
    if rootfs.APT_SOURCES.exists():
        _write(root, str(rootfs.APT_SOURCES), rootfs.APT_SOURCES.read_text())
    _install_machine_cas(root)
    pip_conf, extra = _guest_pip_conf()
    _write(root, "/etc/pip.conf", pip_conf)
    for path in extra:
        _write(root, str(path), path.read_bytes())
    install_guest_files(root, name, layout)


# ------------------------------------------------------------------ lifecycle


def _host_dir(name: str) -> Path:
    return VAR_DIR / name


def _is_mountpoint(path: Path) -> bool:
    """Also true for a bind mount of the same filesystem (os.path.ismount is not)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return os.path.ismount(path)
    return any(line.split()[4].replace("\\040", " ") == str(path) for line in lines)


def _mounts_under(path: Path) -> list[str]:
    out = []
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return out
    prefix = str(path).rstrip("/") + "/"
    for line in lines:
        target = line.split()[1].replace("\\040", " ")
        if target == str(path) or target.startswith(prefix):
            out.append(target)
    return sorted(set(out), key=len, reverse=True)


def _lowerdirs(base: Path, snapshot: Path | None) -> str:
    """overlayfs lowerdir=: the snapshot layer (if any) above the rootfs."""
    return f"{snapshot}:{base}" if snapshot else str(base)


def _start_guest(index: int, base: Path, layout: dict, snapshot: Path | None = None) -> SandboxHost:
    """Set up one guest and launch its nspawn (does not wait for the boot).

    snapshot: a layer made by snapshot() (another host's converged changes),
    mounted between the rootfs and this host's own upper dir."""
    name = host_name(index)
    hdir = _host_dir(name)
    _teardown(name, index, pids=[])  # leftovers of a crashed run
    for sub in ("upper", "work", "merged"):
        (hdir / sub).mkdir(parents=True, exist_ok=True)
    merged = hdir / "merged"
    _sh("mount", "-t", "overlay", f"{PREFIX}-{name}",
        "-o", f"lowerdir={_lowerdirs(base, snapshot)},upperdir={hdir / 'upper'},workdir={hdir / 'work'}",
        str(merged))  # fmt: skip
    _prepare_root(merged, name, layout)
    _setup_network(index)
    return _launch_guest(index, merged, layout)


def _launch_guest(index: int, merged: Path, layout: dict) -> SandboxHost:
    """Launch the nspawn supervisor of guest ``index`` on its mounted root, in its network namespace."""
    name = host_name(index)
    hdir = _host_dir(name)
    cgdirs = _cgroup_dirs(name)
    for d in cgdirs:
        d.mkdir(exist_ok=True)
    nspawn = [
        "systemd-nspawn", "--quiet", "--boot",
        "--directory", str(merged),
        "--machine", name,
        "--register=no", "--keep-unit",
        f"--network-namespace-path={NETNS_DIR / netns_name(index)}",
        "--console=passive",
        "--resolv-conf=off",
        "--timezone=off",
        "--link-journal=no",
    ]  # fmt: skip
    for d in WHEEL_DIRS:
        if os.path.isdir(d):
            nspawn.append(f"--bind-ro={d}")
    cache = machine_pip_cache()
    if cache is not None:  # every guest's pip downloads a wheel only if no guest (nor the checkout) has
        nspawn.append(f"--bind={cache}:{GUEST_PIP_CACHE}")
    binds, left_out = pcisim.nspawn_binds(merged)  # the simulated GPUs' PCIe tree over the kernel's
    nspawn += binds
    if left_out:
        _log(f"{name}: the simulated PCIe tree not bound in full: {left_out}")
    # own cgroup (else all --keep-unit guests share the caller's) and own session
    script = _supervisor_script(merged, cgdirs, nspawn)
    log = open(hdir / "nspawn.log", "ab")  # a killed host booted again: its earlier boots' lines kept
    try:
        proc = subprocess.Popen(
            [SUPERVISOR_ARGV0, "-c", script],
            executable="/bin/sh",
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        log.close()
    return SandboxHost(
        name=name,
        index=index,
        address=guest_address(index),
        ssh_key=str(rootfs.SSH_KEY),
        machine_address=machine_address(index),
        netns=netns_name(index),
        nspawn_pid=proc.pid,
        root=str(merged),
        gpus=_layout_summary(layout),
    )


KILLED = "killed"  # a state entry's mark: kill() cut its power, its disk is kept for up()


def _boot_kept_disk(entry: dict, layout: dict) -> SandboxHost:
    """Launch a killed guest again on the disk it had (its overlay still mounted), with its address."""
    name, index = entry["name"], int(entry["index"])
    merged = _host_dir(name) / "merged"
    if not _is_mountpoint(merged) or not (NETNS_DIR / netns_name(index)).exists():
        raise RuntimeError(f"{name}: killed, but its disk ({merged}) or its network namespace is gone: "
                           f"remove it and up it again")
    install_guest_files(merged, name, layout)  # the simulator scripts and GPU layout, as for a running host
    return _launch_guest(index, merged, layout)


def kill(name: str) -> None:
    """Cut the power of host ``name``: its supervisor, systemd-nspawn and every process in the guest are
    SIGKILLed at once (nothing in it is told or stops in order, like a machine that dies). Its disk (the
    overlay, all written in the guest), its address (network namespace, veth) and its state entry stay,
    the entry marked killed: status() says "stopped", the inventories still list it (unreachable), and
    up() boots it again on the same disk (remove() throws it away)."""
    with _state_lock():
        state = _read_state()
        entry = state["hosts"].get(name)
        if entry is None:
            raise KeyError(f"no sandbox host {name!r} is up (python -m sandbox status)")
        pids = {int(entry.get("nspawn_pid") or 0), *_scan_nspawn_pids().get(name, [])}
        _stop_pids([pid for pid in pids if pid and _is_our_nspawn(pid, name)], name)
        for d in _cgroup_dirs(name):  # the next boot makes them afresh
            _rmdir_tree(d)
        _remove_propagate_dir(name)
        entry[KILLED] = True
        _write_state(state)
    _log(f"{name}: killed (disk kept; up() boots it again)")


def _supervisor_script(merged: Path, cgdirs: list[Path], nspawn: list[str]) -> str:
    """sh that runs nspawn, and again on the same root each time the guest reboots.

    systemd-nspawn exits with NSPAWN_REBOOT_EXIT when the guest asked for a
    reboot: the supervisor then clears the simulated GPUs (gpusim's
    BOOT_CLEARED_PATHS; /run is a fresh tmpfs anyway) and starts it again in the
    same network namespace. Any other exit ends the host. SIGTERM is passed on
    to nspawn once: an orderly poweroff of the guest, no restart (remove and down
    kill the guest instead: _stop_pids).
    """
    cleared = " ".join(shlex.quote(str(merged / p.lstrip("/"))) for p in gpusim.BOOT_CLEARED_PATHS)
    say = f"echo {SUPERVISOR_ARGV0}:"
    return "\n".join([
        *(f"echo $$ > {shlex.quote(str(d / 'cgroup.procs'))} || exit 1" for d in cgdirs),
        "stop= child= rc=0 boot=0",
        """trap 'stop=1; [ -z "$child" ] || kill -TERM "$child" 2>/dev/null' TERM""",
        'while [ -z "$stop" ]; do',
        f"  rm -rf -- {cleared}",
        "  boot=$((boot + 1))",
        f'  {say} "boot $boot: starting systemd-nspawn"',
        f"  {shlex.join(nspawn)} &",
        "  child=$!",
        # wait returns early when the trap ran; a zombie still answers kill -0
        '  while :; do wait "$child"; rc=$?; kill -0 "$child" 2>/dev/null || break; done',
        "  child=",
        f'  [ "$rc" = {NSPAWN_REBOOT_EXIT} ] || break',
        f'  {say} "the guest rebooted (systemd-nspawn exit $rc): starting it again on the same root"',
        "done",
        f'{say} "systemd-nspawn exited $rc: the host is down"',
        'exit "$rc"',
    ])  # fmt: skip


def _system_state(host: SandboxHost, timeout: float = 10) -> str:
    try:
        proc = host.run("systemctl is-system-running", check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "unreachable"
    if proc.returncode == 255:
        return "unreachable"
    return proc.stdout.strip() or "unknown"


class _Aborted(Exception):
    pass


def _wait_booted(host: SandboxHost, timeout: float = BOOT_TIMEOUT_S, abort: threading.Event | None = None) -> str:
    deadline = time.monotonic() + timeout
    abort = abort or threading.Event()
    # first: sshd listening (cheap), then: systemd done booting
    while True:
        if abort.is_set():
            raise _Aborted(host.name)
        if not _alive(host.nspawn_pid):
            raise RuntimeError(f"{host.name}: systemd-nspawn exited during boot:\n{_log_tail(host.name)}")
        try:
            with socket.create_connection((host.address, 22), timeout=0.5):
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{host.name}: sshd not reachable after {timeout:.0f} s:\n{_log_tail(host.name)}")
        time.sleep(0.05)
    while True:
        if abort.is_set():
            raise _Aborted(host.name)
        state = _system_state(host, timeout=5)
        if state in ("running", "degraded"):
            return state
        if not _alive(host.nspawn_pid):
            raise RuntimeError(f"{host.name}: systemd-nspawn exited during boot:\n{_log_tail(host.name)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{host.name}: still {state!r} after {timeout:.0f} s:\n{_log_tail(host.name)}")
        time.sleep(0.1)


def _log_tail(name: str, lines: int = 30) -> str:
    try:
        text = (_host_dir(name) / "nspawn.log").read_text(errors="replace")
    except OSError:
        return "(no nspawn log)"
    return "\n".join(text.splitlines()[-lines:])


def inotify_instances_needed(guests: int, current: int) -> int:
    """max_user_instances for `guests` sandbox guests (never lower than the current limit)."""
    return max(current, guests * INOTIFY_PER_GUEST + INOTIFY_SLACK)


def _ensure_inotify(guests: int) -> None:
    """Raise fs.inotify.max_user_instances so `guests` guests can boot (it is never lowered)."""
    try:
        current = int(INOTIFY_LIMIT.read_text())
        wanted = inotify_instances_needed(guests, current)
        if wanted > current:
            INOTIFY_LIMIT.write_text(f"{wanted}\n")
    except (OSError, ValueError) as err:
        _log(f"could not raise {INOTIFY_LIMIT} for {guests} guests: {err}")


def _is_running(entry: dict) -> bool:
    pid = int(entry.get("nspawn_pid") or 0)
    return pid > 0 and _alive(pid) and _is_our_nspawn(pid, entry["name"])


def up(
    count: int = 1, indexes: list[int] | None = None, snapshot: Path | None = None,
    boot_timeout: float = BOOT_TIMEOUT_S, **layout_opts
) -> list[SandboxHost]:
    """Ensure sandbox hosts sgc1..sgc<count> run; returns them in index order.

    layout_opts: gpus=8, gpu_mib=97887, compute_cap="12.0", p2p="OK",
    gpu_name=..., driver_version=... (default: ct200). Running hosts are
    kept; their GPU layout and simulator scripts are rewritten in place. A
    host kill() stopped boots again on its own disk (all written in it kept).
    snapshot: hosts started here boot on that layer (snapshot()) over the
    rootfs: clones of a converged host, with their own identity.
    boot_timeout: seconds each started host has to become reachable (clones
    that start a server at boot take longer on a loaded machine).
    """
    if not 1 <= count <= MAX_HOSTS:
        raise ValueError(f"count must be 1..{MAX_HOSTS}, got {count}")
    unknown = set(layout_opts) - set(DEFAULT_LAYOUT)
    if unknown:
        raise TypeError(f"unknown layout options {sorted(unknown)}; allowed: {sorted(DEFAULT_LAYOUT)}")
    opts = {**DEFAULT_LAYOUT, **{k: v for k, v in layout_opts.items() if v is not None}}
    if os.geteuid() != 0:
        raise PermissionError("the sandbox needs root (namespaces, mounts, cgroups)")
    rootfs.ensure_tools()
    rootfs.ensure_ssh_key()
    base = rootfs.ensure_rootfs()
    with _state_lock():
        state = _read_state()
        _ensure_inotify(len(_scan_nspawn_pids()) + len(indexes or range(count)))
        hosts: dict[int, SandboxHost] = {}
        started: list[SandboxHost] = []
        abort = threading.Event()
        pending: int | None = None
        try:
            for index in indexes or range(1, count + 1):
                name = host_name(index)
                layout = _layout_for(index, opts)
                entry = state["hosts"].get(name)
                if entry and _is_running(entry):
                    host = _host_from_entry(entry)
                    # refresh the simulator scripts and the layout (cheap, no reboot)
                    install_guest_files(Path(host.root), name, layout)
                    host.gpus = _layout_summary(layout)
                    hosts[index] = host
                    continue
                pending = index
                host = (_boot_kept_disk(entry, layout) if entry and entry.get(KILLED)
                        else _start_guest(index, base, layout, snapshot))
                pending = None
                hosts[index] = host
                started.append(host)
                state["hosts"][name] = asdict(host)
                _write_state(state)  # a crash from here on is still cleaned by down()
            if started:
                pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(started))
                try:
                    futures = {pool.submit(_wait_booted, h, boot_timeout, abort): h for h in started}
                    errors = []
                    for fut in concurrent.futures.as_completed(futures):
                        try:
                            fut.result()
                        except Exception as err:  # noqa: BLE001
                            errors.append(str(err))
                    if errors:
                        raise RuntimeError("sandbox boot failed:\n" + "\n".join(errors))
                finally:
                    abort.set()
                    pool.shutdown(wait=True, cancel_futures=True)
        except BaseException:
            # do not leave half-started guests behind
            abort.set()
            for host in started:
                _teardown(host.name, host.index, pids=[host.nspawn_pid])
                state["hosts"].pop(host.name, None)
            if pending is not None:  # interrupted while setting it up
                _teardown(host_name(pending), pending, pids=[])
            _write_state(state)
            if not state["hosts"]:
                _cleanup_globals()
            raise
        for host in hosts.values():
            state["hosts"][host.name] = asdict(host)
        _write_state(state)
        # the Hub stand-in listens on the machine side of every guest's veth
        from sandbox import hubd

        hubd.start()
    return [hosts[i] for i in sorted(hosts)]


def _stop_pids(pids: list[int], name: str) -> None:
    """Kill a guest that is being thrown away (remove, down), as a test harness may:
    an orderly poweroff would stop its services first, and an SGLang server takes
    up to its watchdog's 5 s tick to stop (sandbox/sglang_sigterm.py), per host,
    for nothing anyone reads. A deploy never sees this (an in-guest reboot or
    poweroff still stops everything in order)."""
    pids = [p for p in pids if _alive(p)]
    # the supervisor first, so it cannot start nspawn again; then nspawn, then the guest's cgroups
    for pid in sorted(pids, key=lambda p: _ppid(p) in pids):
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    _reap(pids)
    # whatever is left in the guest's cgroups (the guest itself if nspawn was killed)
    for _ in range(100):
        left = set()
        for d in _cgroup_dirs(name):
            left |= _cgroup_pids(d)
        left.discard(os.getpid())
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap(list(left))
        time.sleep(0.05)


def _reap(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        except OSError:
            pass


def guest_cpu_seconds(name: str) -> float | None:
    """CPU time the guest's processes used since its cgroup was made (cgroup2's cpu.stat usage_usec;
    None where no hierarchy has it, e.g. a cgroup v1-only machine)."""
    for d in _cgroup_dirs(name):
        try:
            for line in (d / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
        except (OSError, ValueError):
            continue
    return None


def _record_cpu(name: str) -> None:
    """One "name<TAB>core-seconds" line per removed guest to $SANDBOX_CPU_LOG (make test sets it: CI's
    report sums them per host), so where a run's CPU went is in every run's output."""
    log = os.environ.get("SANDBOX_CPU_LOG")
    seconds = guest_cpu_seconds(name) if log else None  # read only where a run asks for it
    if log and seconds is not None:
        with suppress(OSError), open(log, "a") as f:
            f.write(f"{name}\t{seconds:.1f}\n")


def _teardown(name: str, index: int | None, pids: list[int]) -> None:
    """Remove everything of one guest; each step tolerates it being gone."""
    pids = sorted(set(pids) | set(_scan_nspawn_pids().get(name, [])))
    _stop_pids([p for p in pids if _is_our_nspawn(p, name)], name)
    hdir = _host_dir(name)
    for target in _mounts_under(hdir):
        if _sh("umount", target, check=False).returncode != 0:
            _sh("umount", "-l", target, check=False)
    if hdir.exists():
        shutil.rmtree(hdir, ignore_errors=True)
    if index is not None:
        ns = netns_name(index)
        if (NETNS_DIR / ns).exists():
            _sh("ip", "netns", "del", ns, check=False)
        if Path(f"/sys/class/net/{veth_host(index)}").exists():
            _sh("ip", "link", "del", veth_host(index), check=False)
    for table, rule in _our_iptables_rules(name):
        _iptables("-t", table, "-D", *rule, check=False)
    for d in _cgroup_dirs(name):
        _rmdir_tree(d)
    _remove_propagate_dir(name)


def _remove_propagate_dir(name: str) -> None:
    """nspawn's per-machine mount propagation dir: nspawn removes it when it exits, not when it is
    killed (remove and down kill it: _stop_pids)."""
    path = NSPAWN_PROPAGATE_DIR / name
    if not path.exists():
        return
    for target in _mounts_under(path):
        if _sh("umount", target, check=False).returncode != 0:
            _sh("umount", "-l", target, check=False)
    shutil.rmtree(path, ignore_errors=True)


def _scan_names() -> dict[str, int | None]:
    """Every sandbox host name something of ours is left for (state or not)."""
    names: dict[str, int | None] = {}
    for entry in _read_state()["hosts"].values():
        names[entry["name"]] = int(entry["index"])
    for name in _scan_nspawn_pids():
        names.setdefault(name, _index_of(name))
    if VAR_DIR.is_dir():
        for d in VAR_DIR.iterdir():
            if _index_of(d.name) is not None:
                names.setdefault(d.name, _index_of(d.name))
    if NETNS_DIR.is_dir():
        for ns in NETNS_DIR.iterdir():
            m = re.fullmatch(rf"{PREFIX}-ns(\d+)", ns.name)
            if m:
                names.setdefault(host_name(int(m.group(1))), int(m.group(1)))
    for dev in Path("/sys/class/net").iterdir():
        m = re.fullmatch(rf"{PREFIX}-h(\d+)", dev.name)
        if m:
            names.setdefault(host_name(int(m.group(1))), int(m.group(1)))
    for root in cgroup_roots():
        for d in root.glob(f"{PREFIX}-{PREFIX}*"):
            name = d.name[len(PREFIX) + 1 :]
            if _index_of(name) is not None:
                names.setdefault(name, _index_of(name))
    return names


def _cleanup_globals() -> None:
    """Undo what up() changed beyond single guests (once no guest is left)."""
    for table, rule in _our_iptables_rules():
        _iptables("-t", table, "-D", *rule, check=False)
    orig = STATE_DIR / "ip_forward.orig"
    if orig.exists():
        Path("/proc/sys/net/ipv4/ip_forward").write_text(orig.read_text())
        orig.unlink()
    marker = STATE_DIR / "netns-mount.created"
    if marker.exists():
        if NETNS_DIR.is_dir() and not any(NETNS_DIR.iterdir()):
            for _ in range(4):  # concurrent `ip netns add` may have stacked it
                if not _is_mountpoint(NETNS_DIR):
                    break
                _sh("umount", str(NETNS_DIR), check=False)
            if marker.read_text().strip() == "dir-created":
                try:
                    NETNS_DIR.rmdir()
                except OSError:
                    pass
        marker.unlink()
    if VAR_DIR.is_dir() and not any(VAR_DIR.iterdir()):
        VAR_DIR.rmdir()


def remove(name: str) -> None:
    """Stop one sandbox host and remove all it used (the others keep running)."""
    with _state_lock():
        state = _read_state()
        entry = state["hosts"].pop(name, None)
        index = int(entry["index"]) if entry else _index_of(name)
        if entry:
            _record_cpu(name)
        _teardown(name, index, [int(entry.get("nspawn_pid") or 0)] if entry else [])
        _write_state(state)
        if not state["hosts"]:
            _cleanup_globals()
            # under the lock: a concurrent up() (another test process) starts the hub after this, not before
            from sandbox import hubd

            hubd.stop()


def down() -> list[str]:
    """Remove every sandbox guest and all it used; returns the names removed."""
    from sandbox import hubd

    hubd.stop()
    with _state_lock():
        state = _read_state()
        names = _scan_names()
        pids = {n: [int(e.get("nspawn_pid") or 0)] for n, e in state["hosts"].items()}
        for name in state["hosts"]:
            _record_cpu(name)
        if names:
            with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(names))) as pool:
                list(pool.map(lambda n: _teardown(n, names[n], [p for p in pids.get(n, []) if p]), names))
        # and those of guests killed before their teardown removed them (a crashed run)
        if NSPAWN_PROPAGATE_DIR.is_dir():
            for path in NSPAWN_PROPAGATE_DIR.iterdir():
                if _index_of(path.name) is not None:
                    _remove_propagate_dir(path.name)
        _cleanup_globals()
        STATE_FILE.unlink(missing_ok=True)
    return sorted(names, key=lambda n: _index_of(n) or 0)


def status() -> list[dict]:
    """Each host of the state file: name, address, state, gpus summary."""
    hosts = load_hosts()
    entries = {e["name"]: e for e in _read_state()["hosts"].values()}

    def one(host: SandboxHost) -> dict:
        if not _is_running(entries[host.name]):
            st = "stopped"
        else:
            st = _system_state(host, timeout=5)
        return {"name": host.name, "index": host.index, "address": host.address, "state": st,
                "gpus": host.gpus, "summary": host.gpu_summary()}  # fmt: skip

    if not hosts:
        return []
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        return list(pool.map(one, hosts))


def wait_booted(name: str, timeout: float = BOOT_TIMEOUT_S) -> str:
    """Wait until host `name` is booted (sshd answers, systemd running/degraded).

    Returns the systemd state; raises RuntimeError (the host, the last lines of
    its log) after `timeout` s or when its nspawn supervisor has exited. Right
    after an in-guest reboot the old boot may still answer: wait for a new
    boot id first.
    """
    return _wait_booted(get_host(name), timeout)


def reboot(name: str, timeout: float = REBOOT_TIMEOUT_S) -> SandboxHost:
    """Reboot host `name` like `systemctl reboot` in it; returns once it is booted again.

    The guest's systemd shuts it down cleanly; the supervisor starts it again on
    the same overlay (files written in the guest are kept, /run is a fresh tmpfs,
    the simulated GPUs hold no memory), in the same network namespace (same
    address), with the same GPU layout. Raises RuntimeError naming the host and
    the last lines of its log when it is not down and booted again within
    `timeout` s.
    """
    host = get_host(name)
    if not _is_running(asdict(host)):
        raise RuntimeError(f"{name}: not running, nothing to reboot (python -m sandbox status)")
    if not _is_supervised(host):
        raise RuntimeError(f"{name}: started without a reboot supervisor (an older sandbox): "
                           f"remove it and up it again")  # fmt: skip
    deadline = time.monotonic() + timeout
    old_nspawn, init = guest_nspawn_pid(host), guest_init_pid(host)
    if old_nspawn is None or init is None:
        raise RuntimeError(f"{name}: no guest init to reboot (still starting?):\n{_log_tail(name)}")
    # systemd: SIGRTMIN+5 starts reboot.target, like `systemctl reboot`
    os.kill(init, signal.SIGRTMIN + 5)
    while _alive(old_nspawn):  # the old boot's nspawn exits (133) once the guest went down
        if not _alive(host.nspawn_pid):
            raise RuntimeError(f"{name}: the nspawn supervisor exited during the reboot:\n{_log_tail(name)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: did not go down within {timeout:.1f} s of the reboot request:\n"
                               f"{_log_tail(name)}")  # fmt: skip
        time.sleep(0.05)
    try:
        _wait_booted(host, max(deadline - time.monotonic(), 1.0))
    except RuntimeError as err:
        raise RuntimeError(f"{name}: not booted again within {timeout:.1f} s of the reboot request: {err}") from err
    return host


def get_host(name: str) -> SandboxHost:
    for host in load_hosts():
        if host.name == name or host.address == name:
            return host
    raise KeyError(f"no sandbox host {name!r} is up (run: python -m sandbox up)")


# ------------------------------------------------------------------ disks


def set_disk(host: SandboxHost, path: str, size_mib: int) -> None:
    """Mount a fresh size-limited filesystem (tmpfs) at `path` in the guest.

    `df path` then reports size_mib total; what was at path is hidden (not
    deleted) while it is mounted. Lasts until the guest stops.
    """
    size_mib = int(size_mib)
    p = shlex.quote(path)
    host.run(
        f"mkdir -p {p} && if mountpoint -q {p}; then umount {p}; fi && "
        f"mount -t tmpfs -o size={size_mib}m,mode=0755 {PREFIX}-disk {p}"
    )


def grow_disk(host: SandboxHost, path: str, size_mib: int) -> None:
    """Resize the filesystem set_disk made at `path`, keeping its content."""
    size_mib = int(size_mib)
    p = shlex.quote(path)
    proc = host.run(f"findmnt -n -o FSTYPE,SOURCE --target {p}", check=False)
    if proc.stdout.split() != ["tmpfs", f"{PREFIX}-disk"] or host.run(f"mountpoint -q {p}", check=False).returncode:
        set_disk(host, path, size_mib)
        return
    host.run(f"mount -o remount,size={size_mib}m {p}")


def free_bytes(host: SandboxHost, path: str) -> int:
    out = host.run(f"df -B1 --output=avail {shlex.quote(path)} | tail -n1").stdout
    return int(out.strip())
