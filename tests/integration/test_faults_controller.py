"""Faults of the controller side on one sandbox host (sgc260), and a crashing server.

The controller dies (os.killpg of the pyinfra process group) or its ssh
connection drops (the guest's sshd session processes killed) while the host
(a) pip-installs the pinned packages, (b) upgrades compressed-tensors, (c)
restarts the server. The server crashes after it was ready, with systemd's
Restart= bringing it back, and with no restart (failed). After each fault:
the state on the host (the venv imports and holds no half-installed
distribution, no half-written file, what runs), then a run that converges,
then a run that changes nothing and restarts nothing.

A pip whose session died goes on running on the host (until it next writes to
its closed stdout): the first fault kills the controller while pip silently
unpacks torch on a fresh host, and the next run has to wait for that pip (the
venv's pip lock, core/venv_ops.py). The other pip faults freeze the guest's
pip (SIGSTOP) once it runs, pull the plug, then let it go on (SIGCONT). The
restart faults pull the plug while `systemctl restart` waits for the old
server to drain a slow generation request: systemd finishes the restart
alone, and the next run records it instead of restarting again
(tasks/service.py's pending stamp).

About 7 minutes, most of it the first install on the fresh host.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
import uuid

import pytest

from tests.integration.fleet_helpers import sandbox_group_value
from tests.integration.helpers import (sandbox_server_venv, BackgroundDeploy, boot_extra_host, grand_total, pyinfra, remove_host,
                                       wait_until)

pytestmark = pytest.mark.sandbox

INDEX = 260  # this module's hosts: 260-264 (test_faults_fleet.py: 265-269)
VENV = sandbox_server_venv()  # the venv of the sandbox's package set (Spec.server_venv)
PIP = f"{VENV}/bin/python -m pip"
UNIT = "sglang.service"
URL = "http://127.0.0.1:30000"
GEN_DELAY_S = "20"  # a generation request takes that long: a draining restart waits for it
MANAGED_DIRS = "/etc/sglang /etc/systemd/system /var/lib/sglang-converge"
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def host():
    """sgc260, fresh (SGC_FAULTS_KEEP=1 while working on one test: keep it, and reuse it if up)."""
    keep = os.environ.get("SGC_FAULTS_KEEP") == "1"
    if not keep:
        from sandbox import hosts as sandbox_api

        sandbox_api.remove(sandbox_api.host_name(INDEX))  # leftovers of an interrupted run
    h = boot_extra_host(INDEX)
    try:
        yield h
    finally:
        print("\nfault timings: " + ", ".join(f"{k} {v:.0f} s" for k, v in TIMINGS.items()))
        if not keep:
            remove_host(h)


@pytest.fixture(scope="module")
def settings(tmp_path_factory):
    """The --group-data dir of every run here: generations take GEN_DELAY_S, so a restart
    drains one that long (the window to pull the plug in); restart_due rewrites it."""
    folder = tmp_path_factory.mktemp("faults")
    write_settings(folder, {})
    return folder


# --------------------------------------------------------------------------- helpers


def controller_run(host, settings) -> BackgroundDeploy:
    """`pyinfra deploy.py` in its own process group; its output read as it comes."""
    return BackgroundDeploy("deploy.py", "--group-data", str(settings), limit=host.name,
                            env={"PYINFRA_PROGRESS": "off"})


def guest_pips(host, marker: str) -> list[int]:
    """PIDs of the venv's pip processes on the guest whose command line has ``marker``."""
    out = host.run("ps -eo pid=,args=", check=False).stdout
    return [int(line.split(None, 1)[0]) for line in out.splitlines()
            if line.split(None, 1)[-1].startswith(PIP) and marker in line]


def drop_ssh(host) -> None:
    """The controller's connection drops: SIGKILL to the guest's sshd session processes
    (found by PID with ps), all but the one running this command."""
    script = ("for pid in $(ps -eo pid=,args= | awk '$2 ~ /^sshd:/ && /@notty/ {print $1}'); do "
              '[ "$pid" = "$PPID" ] || kill -KILL "$pid"; done')
    host.run(script)


def pull_the_plug(host, controller: BackgroundDeploy, how: str) -> None:
    if how == "killed":
        controller.kill()
    else:
        drop_ssh(host)
        controller.finish(timeout=120)  # the controller notices and ends by itself
        assert controller.proc.returncode != 0, controller.out[-3000:]


def during_pip(host, controller: BackgroundDeploy, marker: str, how: str) -> list[int]:
    """Freeze the guest's pip (``marker`` in its command line) once it runs, pull the plug,
    let the pip go on: it is still running, the next run has to wait for it."""
    pids = wait_until(lambda: guest_pips(host, marker), 600, f"a pip with {marker!r} on {host.name}", every=0.2)
    host.run(f"kill -STOP {' '.join(map(str, pids))}")
    try:
        pull_the_plug(host, controller, how)
    finally:
        host.run(f"kill -CONT {' '.join(map(str, pids))}", check=False)
    return pids


def props(host) -> dict[str, str]:
    out = host.run(f"systemctl show {UNIT} --property=InvocationID,NRestarts,MainPID,ActiveState,SubState").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


_VENV_CHECK = """
import importlib, json, pathlib, sys
site = pathlib.Path(sys.argv[1])
broken = sorted(p.name for p in site.glob("*.dist-info") if not (p / "RECORD").is_file())
errors = {}
for name in sys.argv[2:]:
    try:
        importlib.import_module(name)
    except Exception as err:
        errors[name] = repr(err)
print(json.dumps({"half_installed": broken, "import_errors": errors}))
"""


def venv_check(host, site: str = f"{VENV}/lib/python3.11/site-packages") -> dict:
    """Distributions without a RECORD (pip stopped half-way) and modules that do not import."""
    modules = ["torch", "yaml", "numpy", "sglang.srt.server_args"]
    cmd = shlex.join([f"{VENV}/bin/python", "-c", _VENV_CHECK, site, *modules])
    return json.loads(host.run(cmd).stdout)


def leftovers(host) -> list[str]:
    """Temp files of the atomic writes (managed files, stamps) that no rename consumed, and
    the announcement of a restart that no run recorded."""
    out = host.run(f"find {MANAGED_DIRS} \\( -name '*.sgc-new' -o -name '*.tmp' -o -name '*.pending.json' \\) "
                   "2>/dev/null; true").stdout
    return out.split()


def serving(host) -> bool:
    code = host.run(f"curl -s -o /dev/null -w '%{{http_code}}' {URL}/health", check=False).stdout
    return code == "200"


def deploy(host, settings) -> subprocess.CompletedProcess:
    return pyinfra("deploy.py", "--group-data", str(settings), limit=host.name, env={"PYINFRA_PROGRESS": "off"})


def converges_then_is_a_no_op(host, label: str, settings) -> subprocess.CompletedProcess:
    """The run after a fault converges (ready, venv sound, no leftovers, no pip left running);
    the run after that changes nothing and restarts nothing."""
    started = time.monotonic()
    again = deploy(host, settings)
    TIMINGS[f"{label}: converge"] = time.monotonic() - started
    assert again.returncode == 0, again.out[-6000:]
    assert serving(host)  # the readiness step passed (rc 0) and the server answers
    assert venv_check(host) == {"half_installed": [], "import_errors": {}}
    assert leftovers(host) == []
    assert guest_pips(host, "") == []
    before = props(host)
    assert before["ActiveState"] == "active", before
    started = time.monotonic()
    noop = deploy(host, settings)
    TIMINGS[f"{label}: no-op"] = time.monotonic() - started
    assert noop.returncode == 0, noop.out[-6000:]
    assert grand_total(noop.out)[:2] == (0, 0), noop.out[-6000:]
    assert props(host) == before  # same InvocationID, NRestarts, MainPID: nothing restarted
    return again


def write_settings(folder, env: dict[str, str]) -> None:
    base = sandbox_group_value("extra_env") or {}
    # generations of GEN_DELAY_S: the speed gate would measure (and wait for) them; it is off here
    (folder / "sandbox.py").write_text(f"extra_env = {({**base, 'SANDBOX_GEN_DELAY_S': GEN_DELAY_S, **env})!r}\n"
                                       "perf_tolerance = 0\n")


def restart_due(settings, label: str) -> str:
    """Settings that change the env file: the next run restarts the server. The new value."""
    value = f"{label}-{uuid.uuid4().hex[:6]}"
    write_settings(settings, {"SGC_FAULT": value})
    return value


def generation_in_flight(host) -> None:
    """A generation request that takes GEN_DELAY_S, running when this returns: a stop of
    the server that drains (KillMode=mixed, see test_fault_during_a_restart) waits for it."""
    key = "key=$(sed -n 's/^api-key: *//p' /etc/sglang/sglang.yaml 2>/dev/null | tr -d \"\\\"'\"); "
    auth = '${key:+-H "Authorization: Bearer $key"}'
    host.run(f"{key}setsid curl -s -m 120 {auth} -H 'Content-Type: application/json' "
             f"-d '{{\"text\": \"hi\", \"sampling_params\": {{\"max_new_tokens\": 1}}}}' {URL}/generate "
             ">/dev/null 2>&1 </dev/null &")
    wait_until(lambda: '"num_running_reqs": 1' in host.run(f"{key}curl -s {auth} {URL}/v1/loads", check=False).stdout,
               10, "the generation request to be in flight")


# --------------------------------------------------------------------------- checks of the checks


def test_the_checks_see_what_they_look_for(host):
    """Positive controls of the "nothing there" checks below: a planted leftover, a
    distribution without RECORD and a missing module are seen."""
    host.run("install -d /etc/sglang && touch /etc/sglang/planted.sgc-new")
    try:
        assert leftovers(host) == ["/etc/sglang/planted.sgc-new"]
    finally:
        host.run("rm -f /etc/sglang/planted.sgc-new")
    host.run("mkdir -p /tmp/site/fake-1.0.dist-info")
    found = json.loads(host.run(shlex.join(["python3", "-c", _VENV_CHECK, "/tmp/site", "no_such_module"])).stdout)
    assert found["half_installed"] == ["fake-1.0.dist-info"] and "no_such_module" in found["import_errors"]


# --------------------------------------------------------------------------- (a) pinned packages


def test_controller_killed_during_the_pinned_install(host, settings):
    """The first run on a fresh host dies while pip installs torch & co.: the pip goes on,
    holding the venv's lock; the next run waits for it, then converges."""
    started = time.monotonic()
    controller = controller_run(host, settings)
    controller.wait_for("Starting operation: Python environment | pinned packages", timeout=300)
    wait_until(lambda: host.run(f"test -d {VENV}/lib/python3.11/site-packages/torch", check=False).returncode == 0,
               600, "pip to be installing torch")
    controller.kill()
    TIMINGS["(a) killed: fault"] = time.monotonic() - started
    assert guest_pips(host, "install"), "the orphaned pip still runs on the host"
    assert host.run(f"test -e /etc/systemd/system/{UNIT}", check=False).returncode != 0  # not that far
    again = converges_then_is_a_no_op(host, "(a) killed", settings)
    assert f"another pip is changing {VENV}" in again.out, again.out[-6000:]


def test_ssh_dropped_during_the_pinned_install(host, settings):
    """Pinned packages gone from a serving host; the connection drops while pip puts them
    back: the server keeps serving, the next run converges without a restart."""
    host.run(f"{PIP} uninstall -q -y pyyaml tqdm zstandard")
    before = props(host)
    controller = controller_run(host, settings)
    during_pip(host, controller, "install", "dropped")
    assert "pinned packages" in controller.out
    assert props(host)["InvocationID"] == before["InvocationID"] and serving(host)
    converges_then_is_a_no_op(host, "(a) dropped", settings)
    assert props(host)["InvocationID"] == before["InvocationID"]  # same versions again: no restart


# --------------------------------------------------------------------------- (b) compressed-tensors


@pytest.mark.parametrize("how", ["killed", "dropped"])
def test_fault_during_the_compressed_tensors_upgrade(host, settings, how):
    """compressed-tensors gone (the model needs it): the quant deps step installs it
    again; the plug is pulled while its pip runs. The orphaned pip ends at its next
    output line (its stdout is gone) with compressed-tensors whole or absent; the next
    run installs it, the server keeps running (same versions in the end: no restart)."""
    host.run(f"{PIP} uninstall -q -y compressed-tensors")
    before = props(host)
    controller = controller_run(host, settings)
    started = time.monotonic()
    during_pip(host, controller, "compressed-tensors", how)
    TIMINGS[f"(b) {how}: fault"] = time.monotonic() - started
    assert "quant deps: pip install compressed-tensors" in controller.out, controller.out[-3000:]
    wait_until(lambda: not guest_pips(host, ""), 120, "the orphaned pip to end")
    assert venv_check(host)["half_installed"] == []
    assert props(host)["InvocationID"] == before["InvocationID"] and serving(host)
    converges_then_is_a_no_op(host, f"(b) {how}", settings)
    assert "compressed-tensors" in host.run(f"{PIP} list 2>/dev/null").stdout
    assert props(host)["InvocationID"] == before["InvocationID"]


# --------------------------------------------------------------------------- (c) a restart


@pytest.mark.parametrize("how", ["killed", "dropped"])
def test_fault_during_a_restart(host, settings, how):
    """New settings restart the server while it drains a generation request, and the
    plug is pulled right then. systemd finishes the restart on its own: the server runs
    the new settings, whole files, nobody recorded it. The next run sees that and records
    it instead of restarting a second time.

    SGLang drains only when SIGTERM reaches its main process alone: under the unit's
    KillMode=control-group its schedulers get SIGTERM too and die at once, and the stop
    takes about a second (sandbox/sglang_sigterm.py). A runtime drop-in (KillMode=mixed,
    which the deploy does not read) gives this restart SGLang's drain: its watchdog's
    5 s tick, then the generation, a window to pull the plug in."""
    value = restart_due(settings, how)
    before = props(host)
    with_drop_in(host, "KillMode=mixed")
    try:
        _fault_during_a_restart(host, settings, how, value, before)
    finally:
        with_drop_in(host, None)


def _fault_during_a_restart(host, settings, how: str, value: str, before: dict) -> None:
    generation_in_flight(host)
    controller = controller_run(host, settings)
    controller.wait_for(f"service: restart {UNIT}", timeout=300)
    wait_until(lambda: props(host)["ActiveState"] == "deactivating", 30, "the old server to drain")
    started = time.monotonic()
    pull_the_plug(host, controller, how)
    assert props(host)["InvocationID"] == before["InvocationID"]  # the plug was pulled during the restart
    wait_until(lambda: props(host)["InvocationID"] != before["InvocationID"] and serving(host), 120,
               "systemd to finish the restart without the controller")
    environ = host.run(f"tr '\\0' '\\n' < /proc/{props(host)['MainPID']}/environ").stdout
    assert f"SGC_FAULT={value}" in environ  # the new server runs the new settings
    assert [path for path in leftovers(host) if not path.endswith(".pending.json")] == []
    restarted = props(host)
    again = converges_then_is_a_no_op(host, f"(c) {how}", settings)
    TIMINGS[f"(c) {how}: fault to no-op"] = time.monotonic() - started
    assert f"service: restart {UNIT}" not in again.out, again.out[-6000:]
    assert "was restarted with the wanted config by a run that ended before recording it" in again.out
    assert props(host)["InvocationID"] == restarted["InvocationID"]


# --------------------------------------------------------------------------- 2. the server crashes


DROP_IN = f"/run/systemd/system/{UNIT}.d/fault.conf"


def with_drop_in(host, text: str | None) -> None:
    """A runtime drop-in (a slower or no Restart=, KillMode=mixed) for a test; None removes it."""
    if text is None:
        host.run(f"rm -f {DROP_IN} && systemctl daemon-reload")
    else:
        host.run(f"mkdir -p {DROP_IN.rsplit('/', 1)[0]} && printf '[Service]\\n{text}\\n' > {DROP_IN} "
                 "&& systemctl daemon-reload")


def test_crash_brought_back_by_systemd(host, settings):
    """SIGKILL on a ready server: the unit's Restart=on-failure brings it back; the next run
    restarts nothing, says it crashed, and readiness passes."""
    assert "Restart=on-failure" in host.run(f"systemctl cat {UNIT}").stdout
    assert deploy(host, settings).returncode == 0  # as the settings say (a no-op after the tests above)
    before = props(host)
    assert before["NRestarts"] == "0", before  # a restart by hand (the deploy's) starts the count again
    host.run(f"systemctl kill -s KILL {UNIT}")
    wait_until(lambda: props(host)["NRestarts"] != before["NRestarts"] and serving(host), 60,
               "systemd to restart the server and it to serve")
    back = props(host)
    proc = deploy(host, settings)
    assert proc.returncode == 0, proc.out[-6000:]
    assert grand_total(proc.out)[:2] == (0, 0), proc.out[-6000:]
    assert f"{UNIT} exited on its own {back['NRestarts']} time(s) since it was last started; systemd restarted it" \
        in proc.out, proc.out[-6000:]
    assert props(host) == back


def test_crash_caught_before_systemd_restarts_it(host, settings):
    """The next run comes while the crashed unit waits out RestartSec=: it starts the
    server at once, says why, and readiness passes (instead of judging a dead process)."""
    with_drop_in(host, "RestartSec=300")
    try:
        before = props(host)
        host.run(f"systemctl kill -s KILL {UNIT}")
        wait_until(lambda: props(host)["SubState"] == "auto-restart", 30, "the unit to wait for its restart")
        proc = deploy(host, settings)
        assert proc.returncode == 0, proc.out[-6000:]
        assert f"{UNIT} crashed (exited on its own) and waits for systemd's automatic restart" in proc.out
        after = props(host)
        assert after["ActiveState"] == "active" and after["InvocationID"] != before["InvocationID"]
    finally:
        with_drop_in(host, None)
    assert serving(host)
    converges_then_is_a_no_op(host, "crash, auto-restart pending", settings)


def test_crash_that_leaves_it_failed(host, settings):
    """No automatic restart (Restart=no): the killed server stays failed; the next run
    starts it, saying the unit is failed."""
    with_drop_in(host, "Restart=no")
    try:
        host.run(f"systemctl kill -s KILL {UNIT}")
        wait_until(lambda: props(host)["ActiveState"] == "failed", 30, "the unit to be failed")
        assert not serving(host)
        proc = deploy(host, settings)
        assert proc.returncode == 0, proc.out[-6000:]
        assert f"service: start {UNIT}: {UNIT} is failed" in proc.out, proc.out[-6000:]
        assert serving(host)
    finally:
        with_drop_in(host, None)
    converges_then_is_a_no_op(host, "crash, failed", settings)
