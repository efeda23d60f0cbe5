"""Settings that would damage a host are refused before any connection
(tasks/spec/fields.py: OwnDir, HostAddress, service_unit), and on the host a
file of someone else's is never overwritten (core/ops.py managed_file)."""

from __future__ import annotations

import hashlib
import runpy
import shutil
from pathlib import Path

import pytest
import yaml
from pyinfra.api import FunctionCommand, StringCommand
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.util import FakeState, create_host

from core.ops import MANAGED_MARKER, claims, managed_file
from core.paths import SYSTEMD_DIR
from core.render import render, render_router_unit
from tasks import spec as S
from tests.unit.test_spec_gate import run_deploy

ROOT = Path(__file__).resolve().parents[2]
ENV = {"SGLANG_API_KEY": "sk-dangerous-test"}


def server_data(**overrides) -> dict:
    """A sandbox server's data (group_data/all.py + sandbox.py) with ``overrides``."""
    data: dict = {}
    for group in ("all", "sandbox"):
        data.update({k: v for k, v in runpy.run_path(str(ROOT / "group_data" / f"{group}.py")).items()
                     if not k.startswith("_")})
    data.update(overrides)
    return data


def server(**overrides) -> S.Spec:
    spec = S.build_spec("sgc1", server_data(**overrides), environ=ENV)
    assert isinstance(spec, S.Spec)
    return spec


def router(**overrides) -> S.RouterSpec:
    spec = S.build_spec("r1", {"role": "router", **overrides}, environ=ENV)
    assert isinstance(spec, S.RouterSpec)
    return spec


def refusal(field: str, value, host: str = "sgc1") -> str:
    """The SpecError line about ``field`` (the error must be a SpecError and name the host)."""
    with pytest.raises(S.SpecError) as e:
        if host == "r1":
            router(**{field: value})
        else:
            server(**{field: value})
    lines = [line for line in e.value.lines if line.startswith(f"{host}: {field} = {value!r}: ")]
    assert len(lines) == 1, e.value.lines
    return lines[0]


# ---------------------------------------------------------------- directories the deploy writes into

DIR_FIELDS = [("venv_path", "sgc1", "/opt/sglang/venv"), ("model_dir", "sgc1", "/srv/models/kimi-k2.6"),
              ("router_venv_path", "r1", "/opt/sglang-router/venv")]
# (value, what it normalises to, why it is refused)
BAD_DIRS = [
    ("/", "/", "the root directory"),
    ("//", "/", "the root directory"),
    ("/..", "/", "the root directory"),
    ("/usr", "/usr", "a system directory"),
    ("/usr/", "/usr", "a system directory"),
    ("/usr/../etc", "/etc", "a system directory"),
    ("/etc", "/etc", "a system directory"),
    ("/bin", "/bin", "a system directory"),
    ("/sbin", "/sbin", "a system directory"),
    ("/lib", "/lib", "a system directory"),
    ("/lib64", "/lib64", "a system directory"),
    ("/var", "/var", "a system directory"),
    ("/boot", "/boot", "a system directory"),
    ("/proc", "/proc", "a system directory"),
    ("/sys", "/sys", "a system directory"),
    ("/dev", "/dev", "a system directory"),
    ("/run", "/run", "a system directory"),
    ("/home", "/home", "a system directory"),
    ("/root", "/root", "a system directory"),
    ("/tmp", "/tmp", "a system directory"),
    ("/opt", "/opt", "a top-level directory (directly under /)"),
    ("/srv", "/srv", "a top-level directory (directly under /)"),
    ("/srv/", "/srv", "a top-level directory (directly under /)"),
    ("/data", "/data", "a top-level directory (directly under /)"),
    ("/usr/lib", "/usr/lib", "directly under the system directory /usr"),
    ("//usr//local", "/usr/local", "directly under the system directory /usr"),
    ("/usr/./bin", "/usr/bin", "directly under the system directory /usr"),
    ("/etc/systemd", "/etc/systemd", "directly under the system directory /etc"),
    ("/var/lib", "/var/lib", "directly under the system directory /var"),
    ("/home/alice", "/home/alice", "directly under the system directory /home"),
    ("/root/venv", "/root/venv", "directly under the system directory /root"),
    ("/tmp/models", "/tmp/models", "directly under the system directory /tmp"),
    ("/opt/../boot/grub", "/boot/grub", "directly under the system directory /boot"),
    ("/srv/models/../../dev/shm", "/dev/shm", "directly under the system directory /dev"),
]


@pytest.mark.parametrize("field, host, example", DIR_FIELDS, ids=[f[0] for f in DIR_FIELDS])
@pytest.mark.parametrize("value, norm, why", BAD_DIRS, ids=[b[0] for b in BAD_DIRS])
def test_system_directories_are_refused(field, host, example, value, norm, why):
    line = refusal(field, value, host)
    shown = f"is {norm!r}, " if norm != value else ""
    assert line == (
        f"{host}: {field} = {value!r}: {shown}{why}: the deploy creates and deletes files in it; "
        "allowed: a directory of its own at least two levels below / and not directly under a system "
        "directory (/bin, /boot, /dev, /etc, /home, /lib, /lib32, /lib64, /libx32, /proc, /root, /run, /sbin, "
        f"/sys, /tmp, /usr, /var), e.g. {example!r}"
    )


def test_relative_directories_are_still_refused_as_such():
    assert refusal("venv_path", "opt/sglang/venv") == (
        "sgc1: venv_path = 'opt/sglang/venv': must be an absolute path on the host (starting with '/'), "
        "e.g. '/opt/sglang/venv'"
    )


GOOD_DIRS = [
    ("venv_path", "/opt/sglang/venv", "/opt/sglang/venv"),
    ("venv_path", "/opt/sglang/venv/", "/opt/sglang/venv"),
    ("venv_path", "/opt/venv", "/opt/venv"),
    ("venv_path", "/data/venvs//sglang/./", "/data/venvs/sglang"),
    ("venv_path", "/usr/local/sglang/venv", "/usr/local/sglang/venv"),
    ("model_dir", "/srv/models/kimi-k2.6", "/srv/models/kimi-k2.6"),
    ("model_dir", "/srv/models", "/srv/models"),
    ("model_dir", "/data/models/x", "/data/models/x"),
    ("model_dir", "/data/models/../models/x/", "/data/models/x"),
    ("model_dir", "/var/lib/models/kimi", "/var/lib/models/kimi"),
]


@pytest.mark.parametrize("field, value, norm", GOOD_DIRS, ids=[f"{g[0]}={g[1]}" for g in GOOD_DIRS])
def test_directories_of_their_own_pass_normalised(field, value, norm):
    assert getattr(server(**{field: value}), field) == norm


def test_the_defaults_pass():
    spec = server()
    assert (spec.venv_path, spec.model_dir) == ("/opt/sglang/venv", "/srv/models/tiny")
    assert router().router_venv_path == "/opt/sglang-router/venv"
    assert router(router_venv_path="/opt/sglang-router/venv/").router_venv_path == "/opt/sglang-router/venv"


def test_a_served_name_cannot_lead_the_default_model_dir_out_of_srv_models(tmp_path):
    models = tmp_path / "models"
    shutil.copytree(ROOT / "models", models)
    profile = yaml.safe_load((models / "sandbox-tiny.yaml").read_text())
    for served, ok in (("org/tiny", True), ("a/../../../etc", False), ("a//b", False), ("a/./b", False)):
        (models / "sandbox-tiny.yaml").write_text(yaml.safe_dump({**profile, "served_model_name": served}))
        if ok:
            spec = S.build_spec("sgc1", server_data(), environ=ENV, models_dir=models)
            assert isinstance(spec, S.Spec) and spec.model_dir == "/srv/models/org/tiny"
            continue
        with pytest.raises(S.SpecError) as e:
            S.build_spec("sgc1", server_data(), environ=ENV, models_dir=models)
        assert f"served_model_name = {served!r}" in str(e.value)
        assert "must not hold empty, '.' or '..' path parts" in str(e.value)


# ---------------------------------------------------------------- host addresses

ADDRESS_FIELDS = [("listen_host", "sgc1"), ("router_listen_host", "r1"), ("router_prometheus_host", "r1")]
BAD_ADDRESSES = ["999.1.1.1", "256.0.0.1", "10.0.0.256", "1.2.3.4.5", "1.2.3", "123", "", "a b", "host_name",
                 "-x", "x-", "a..b", ".a", "gpu-a .example.com", "10.0.0.5:30000", "http://10.0.0.5"]
ALLOWED = (
    "allowed: an IP address or hostname (an IPv4 or IPv6 address, or DNS labels of letters, digits and '-' "
    "joined by '.', none starting or ending with '-', the last not all digits), "
    "e.g. '0.0.0.0', '::1' or 'gpu-a.example.com'"
)


@pytest.mark.parametrize("field, host", ADDRESS_FIELDS, ids=[f[0] for f in ADDRESS_FIELDS])
@pytest.mark.parametrize("value", BAD_ADDRESSES)
def test_bad_host_addresses_are_refused(field, host, value):
    line = refusal(field, value, host)
    numeric = value in ("999.1.1.1", "256.0.0.1", "10.0.0.256", "1.2.3.4.5", "1.2.3", "123")
    why = "looks like an IPv4 address but is not one (four numbers 0..255): " if numeric else ""
    assert line == f"{host}: {field} = {value!r}: {why}{ALLOWED}"


GOOD_ADDRESSES = ["10.0.0.5", "0.0.0.0", "127.0.0.1", "::1", "::", "fe80::1", "2001:db8::5",
                  "gpu-a.example.com", "localhost", "node01", "3com.example", "a-b.c-d.e1"]


@pytest.mark.parametrize("value", GOOD_ADDRESSES)
def test_good_host_addresses_pass(value):
    assert server(listen_host=value).listen_host == value
    assert router(router_listen_host=value, router_prometheus_host=value).router_prometheus_host == value


def test_router_and_worker_urls_need_a_real_host():
    good = server(router_url="http://gpu-r.example.com:30000", worker_url="http://10.0.0.5:30000")
    assert good.router_url == "http://gpu-r.example.com:30000"
    for field, url in (("router_url", "http://999.1.1.1:30000"), ("worker_url", "http://host_name:30000")):
        with pytest.raises(S.SpecError) as e:
            server(**{"router_url": "http://10.0.0.9:30000", "worker_url": "http://10.0.0.5:30000", field: url})
        host = url.split("//")[1].split(":")[0]
        assert e.value.lines == [
            f"sgc1: {field} = {url!r}: host {host!r} is not an IP address or DNS hostname: allowed: "
            "scheme://host[:port], e.g. 'http://10.0.0.5:30000' or 'http://gpu-a.example.com:30000'"
        ]


def test_rank0_addresses_share_the_check():
    group = {"hosts": ["sgc1", "sgc2"], "dist_init_port": 20000}
    with pytest.raises(S.SpecError) as e:
        server(node_group={**group, "dist_init_host": "999.1.1.1"}, tp_size=16)
    assert "node_group.dist_init_host = '999.1.1.1'" in str(e.value)
    assert "must be an IP address or hostname that the other ranks reach rank 0 at" in str(e.value)
    spec = server(node_group={**group, "dist_init_host": "10.0.0.1"}, tp_size=16)
    assert spec.dist_init_addr == "10.0.0.1:20000"


# ---------------------------------------------------------------- units of the system

SYSTEM_UNITS = ["ssh.service", "sshd.service", "systemd-journald.service", "systemd-logind.service",
                "systemd-networkd.service", "dbus.service", "dbus-broker.service", "getty@tty1.service",
                "cron.service", "networking.service", "NetworkManager.service", "docker.service",
                "containerd.service", "nvidia-persistenced.service", "nvidia-fabricmanager.service"]
UNIT_FIELDS = [("unit_name", "sgc1", "sglang.service"), ("router_unit_name", "r1", "sglang-router.service")]


@pytest.mark.parametrize("field, host, example", UNIT_FIELDS, ids=[f[0] for f in UNIT_FIELDS])
@pytest.mark.parametrize("value", SYSTEM_UNITS)
def test_system_units_are_refused(field, host, example, value):
    line = refusal(field, value, host)
    assert line.startswith(f"{host}: {field} = {value!r}: a unit of the system (")
    assert line.endswith(
        "): the deploy would overwrite its unit file and restart it; "
        f"allowed: a unit of our own, e.g. {example!r}"
    )


def test_own_unit_names_pass():
    for name in ("sglang.service", "sglang-kimi@0.service", "my-systemd.service", "docker-sglang.service"):
        assert server(unit_name=name).unit_path == f"{SYSTEMD_DIR}/{name}"
    assert router(router_unit_name="sglang-router.service").unit_path == f"{SYSTEMD_DIR}/sglang-router.service"


def test_every_problem_of_a_host_is_named_at_once():
    with pytest.raises(S.SpecError) as e:
        server(venv_path="/usr", listen_host="999.1.1.1", unit_name="ssh.service")
    assert [line.split(" = ")[0] for line in e.value.lines] == ["sgc1: venv_path", "sgc1: listen_host",
                                                                  "sgc1: unit_name"]


# ---------------------------------------------------------------- before pyinfra connects


def test_dangerous_settings_stop_pyinfra_before_it_connects(tmp_path):
    bad = run_deploy(tmp_path, '"venv_path": "/usr/", "listen_host": "999.1.1.1", "unit_name": "ssh.service"')
    out = bad.stdout + bad.stderr
    assert bad.returncode != 0
    assert "gpu-x: venv_path = '/usr/': is '/usr', a system directory" in out
    assert "gpu-x: listen_host = '999.1.1.1': looks like an IPv4 address but is not one" in out
    assert "gpu-x: unit_name = 'ssh.service': a unit of the system ('ssh.service')" in out
    assert "Connecting to hosts" not in out
    # positive control: the same inventory with good values of these fields goes on to connect
    good = run_deploy(tmp_path, '"venv_path": "/data/venvs/sglang", "listen_host": "::1", '
                                '"unit_name": "sglang-kimi.service"')
    out = good.stdout + good.stderr
    assert "invalid settings" not in out and "venv_path" not in out
    assert "Connecting to hosts" in out


# ---------------------------------------------------------------- on the host: never someone else's file

UNIT = f"{SYSTEMD_DIR}/foreign.service"
FOREIGN = "[Unit]\nDescription=not ours\n[Service]\nExecStart=/usr/bin/true\n"
OURS = f"{MANAGED_MARKER} (deploy.py): edits are overwritten by the next deploy.\n[Unit]\nDescription=ours\n"


def write(dest: str, content: str, on_host: str | None):
    """managed_file's commands with ``on_host`` at ``dest`` (None: no file there)."""
    digest = None if on_host is None else {
        "sha256": hashlib.sha256(on_host.encode()).hexdigest(), "mode": "644", "owner": "root"}
    facts = {"files.FileDigest": {f"path={dest}": digest}, "files.FileText": {f"path={dest}": on_host or None}}
    state = FakeState()
    host = create_host(state, facts=facts)
    with ctx_state.use(state), ctx_host.use(host):
        commands = list(managed_file._inner(dest=dest, content=content, mode="644", setting="unit_name"))
    return host, commands


def shell(commands) -> list[str]:
    return [str(c) for c in commands if isinstance(c, StringCommand)]


def test_a_foreign_unit_file_is_refused():
    _, commands = write(UNIT, OURS, on_host=FOREIGN)
    assert len(commands) == 1 and isinstance(commands[0], FunctionCommand)
    assert commands[0].function.__name__ == "_fail"
    assert commands[0].args[0] == (
        "unit file /etc/systemd/system/foreign.service exists and is not managed by sglang-converge "
        "(no '# Managed by sglang-converge' line): refusing to overwrite it; choose another unit_name"
    )


def test_an_empty_foreign_file_is_refused_too():
    _, commands = write("/etc/sglang/foreign.env", OURS, on_host="")
    assert len(commands) == 1 and commands[0].args[0].startswith(
        "file /etc/sglang/foreign.env exists and is not managed by sglang-converge")


def test_our_own_unit_file_is_rewritten_when_it_differs():
    _, commands = write(UNIT, OURS, on_host=OURS.replace("ours", "ours, older"))
    assert not any(isinstance(c, FunctionCommand) for c in commands)
    assert shell(commands)[-1] == f"mv -f {UNIT}.sgc-new {UNIT}"


def test_our_own_unit_file_unchanged_is_a_noop():
    host, commands = write(UNIT, OURS, on_host=OURS)
    assert commands == []
    assert host.noop_description == f"{UNIT} is up to date"


def test_an_absent_unit_file_is_created():
    _, commands = write(UNIT, OURS, on_host=None)
    assert shell(commands)[0] == f"install -d -m 755 {SYSTEMD_DIR}"
    assert shell(commands)[-1] == f"mv -f {UNIT}.sgc-new {UNIT}"


def test_files_without_our_marker_overwrite_as_before():
    # the router's auth file and launcher carry no marker: they claim nothing and are written as before
    _, commands = write("/etc/sglang/sglang-router.auth", "Authorization: Bearer x\n", on_host="old\n")
    assert shell(commands)[-1] == "mv -f /etc/sglang/sglang-router.auth.sgc-new /etc/sglang/sglang-router.auth"


def test_every_file_the_server_and_router_write_from_templates_carries_the_marker():
    rendered = render(server().resolve(compute_cap="12.0", p2p_ok=True))
    for text in (rendered.unit, rendered.env, rendered.options, render_router_unit(router())):
        assert text.splitlines()[0].startswith(MANAGED_MARKER) and claims(text)
    assert not claims(FOREIGN)
