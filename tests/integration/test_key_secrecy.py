"""The API key stays secret on a converged host (the shared sgc280, deployed with a key): the server is the
stand-in that logs its start arguments like SGLang 0.5.23 (`server_args={...}`,
api_key in clear), run through the unit's launcher (remote/server_launch.py)
like the real one. The key appears 0 times in the journal of this boot, in any
process's cmdline or environ, in the unit file and in every world-readable
file under /etc /var/log /run /srv /opt /usr/local. Positive controls: the key
is in the root-only options file; a marker logged on purpose is in the
journal; the server_args line is there with the key's field redacted; the
file search finds a world-readable file planted with the key; the server
demands the key."""

from __future__ import annotations

import json
import runpy
import shlex
import time

import pytest

from tests.integration.helpers import ROOT, SHARED_CONVERGED_GROUP, grand_total, pyinfra, shared_converged_host, unit_props

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group(SHARED_CONVERGED_GROUP)]

KEY = "sk-secrecy-4c1d9e7a2b"
# The key as a grep pattern that does not match itself: grep's own /proc/PID/cmdline holds the pattern
KEY_PATTERN = shlex.quote(KEY[:-1] + f"[{KEY[-1]}]")
TIMINGS: dict[str, float] = {}
WORLD_READABLE_DIRS = "/etc /var/log /run /srv /opt /usr/local"


@pytest.fixture(scope="module")
def keyed_host(request):
    host = shared_converged_host(request, TIMINGS)  # a converged host, then deployed with the key
    started = time.monotonic()
    proc = pyinfra("deploy.py", limit=host.name, env={"SGLANG_API_KEY": KEY})
    TIMINGS["deploy"] = time.monotonic() - started
    yield host, proc
    print("\nkey secrecy timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in TIMINGS.items()))


def count(host, command: str) -> int:
    """How many lines a shell pipeline prints on the host."""
    out = host.run(command, check=False).stdout
    return len([line for line in out.splitlines() if line.strip()])


def files_with_key(host) -> list[str]:
    """World-readable regular files under the directories that hold the deploy's and the server's files."""
    find = (f"find {WORLD_READABLE_DIRS} -xdev -type f -perm -o=r -print0 2>/dev/null "
            f"| xargs -0 -r grep -l -e {KEY_PATTERN} 2>/dev/null; true")
    return [line for line in host.run(find, timeout=300).stdout.splitlines() if line.strip()]


def test_converged_with_the_key(keyed_host):
    host, proc = keyed_host
    assert proc.returncode == 0, proc.out[-6000:]
    assert KEY not in proc.out
    # the server demands the key (it reached SGLang's options)
    url = "http://127.0.0.1:30000/v1/models"
    assert host.run(f"curl -s -o /dev/null -w '%{{http_code}}' {url}").stdout == "401"
    header = "/run/sgc-secrecy.hdr"  # 0600, the key read from the options file (never argv)
    host.run(f"install -m 600 /dev/null {header} && sed -n 's/^api-key: \"\\(.*\\)\"$/"
             f"Authorization: Bearer \\1/p' /etc/sglang/sglang.yaml > {header}")
    try:
        answer = host.run(f"curl -s -H @{header} {url}").stdout
    finally:
        host.run(f"rm -f {header}")
    assert json.loads(answer)["data"][0]["owned_by"] == "sglang", answer


def test_key_not_in_the_journal(keyed_host):
    host, _ = keyed_host
    marker = f"sgc-secrecy-marker-{time.time_ns()}"
    host.run(f"logger -t sgc-secrecy {marker}")
    deadline = time.time() + 10
    while count(host, f"journalctl -b --no-pager | grep -F {marker}") == 0 and time.time() < deadline:
        time.sleep(0.2)
    assert count(host, f"journalctl -b --no-pager | grep -F {marker}") == 1  # the grep sees the journal
    journal = host.run("journalctl -b --no-pager -u sglang.service").stdout
    # SGLang's start line is there, its api_key field redacted by the launcher ...
    assert "server_args={" in journal and "'api_key': '<redacted>'" in journal, journal[-4000:]
    assert " TP7] Load weight end" in journal  # ... and the TP ranks' lines went through it too
    assert count(host, f"journalctl -b --no-pager | grep -e {KEY_PATTERN}") == 0


def test_key_not_in_any_process_cmdline_or_environ(keyed_host):
    host, _ = keyed_host
    pids = host.run("systemctl show -p MainPID --value sglang.service").stdout.strip()
    ranks = host.run(f"pgrep -P {pids}").stdout.split()
    assert len(ranks) >= 8, ranks  # one process per TP rank
    cmdline = host.run(f"tr '\\0' ' ' < /proc/{pids}/cmdline").stdout
    assert "server_launch.py sglang_standin" in cmdline and "--config /etc/sglang/sglang.yaml" in cmdline
    # positive control: the grep reads environ (the ranks carry the options file's path, never the key)
    assert count(host, "grep -l -a SGLANG_CONVERGE_OPTIONS_FILE /proc/[0-9]*/environ 2>/dev/null") >= 8
    # positive control: the same grep finds a process that has the key in its cmdline
    decoy = host.run(f"sh -c 'sleep 60' {shlex.quote(KEY)} >/dev/null 2>&1 & echo $!").stdout.strip()
    try:
        assert count(host, f"grep -l -a -e {KEY_PATTERN} /proc/[0-9]*/cmdline 2>/dev/null") == 1
    finally:
        host.run(f"kill {decoy}; sleep 0.2")  # by the PID it printed
    for kind in ("cmdline", "environ"):
        assert count(host, f"grep -l -a -e {KEY_PATTERN} /proc/[0-9]*/{kind} 2>/dev/null") == 0, kind


def test_key_only_in_the_root_only_options_file(keyed_host):
    host, _ = keyed_host
    options = "/etc/sglang/sglang.yaml"
    assert host.run(f"stat -c '%a %U' {options}").stdout.strip() == "600 root"
    assert count(host, f"grep -e {KEY_PATTERN} {options}") == 1  # positive control: the pattern finds the key
    unit = host.run("cat /etc/systemd/system/sglang.service").stdout
    assert "server_launch.py" in unit and KEY not in unit
    # positive control for the file search: a planted world-readable file is found
    planted = "/run/sgc-secrecy-planted.txt"
    host.run(f"printf %s {shlex.quote(KEY)} > {planted} && chmod 644 {planted}")
    started = time.monotonic()
    try:
        assert files_with_key(host) == [planted]
    finally:
        host.run(f"rm -f {planted}")
    TIMINGS["file search"] = time.monotonic() - started
    assert files_with_key(host) == []


def test_a_second_deploy_keeps_the_launcher_and_the_server(keyed_host):
    """The launcher is uploaded once; its sha256 in the unit keeps the unit (and so the server) as it is."""
    host, _ = keyed_host
    before = unit_props(host, "sglang.service")["MainPID"]
    started = time.monotonic()
    again = pyinfra("deploy.py", limit=host.name, env={"SGLANG_API_KEY": KEY})
    TIMINGS["second deploy"] = time.monotonic() - started
    assert again.returncode == 0, again.out[-4000:]
    assert grand_total(again.out)[:2] == (0, 0), again.out[-4000:]
    # the launcher's operation ran (and changed nothing, per the totals above)
    assert "launcher /usr/local/lib/sglang-converge/server_launch.py (keeps the API key out" in again.out
    assert unit_props(host, "sglang.service")["MainPID"] == before
    sha = host.run("sha256sum /usr/local/lib/sglang-converge/server_launch.py").stdout.split()[0]
    assert f"(sha256 {sha})" in host.run("cat /etc/systemd/system/sglang.service").stdout


def test_a_rollback_to_the_keyed_configuration_is_checked_with_its_key(keyed_host, tmp_path, monkeypatch):
    """A deploy without the key whose start fails a gate (the stand-in's KV pool a tenth of the plan) rolls
    back to the last good configuration, the keyed one: its options file comes back with the key, and the
    rollback's readiness asks with it (core/server.py script_command). Seen with the real server (`make demo
    REAL=1` after a keyed deploy): the wait asked without it, got 401, and a healthy rollback was reported
    failed. The host ends keyed and serving, as this module found it."""
    host, _ = keyed_host
    monkeypatch.delenv("SGLANG_API_KEY", raising=False)  # this run's settings hold no key
    before = unit_props(host, "sglang.service")["MainPID"]
    extra = {**runpy.run_path(str(ROOT / "group_data" / "sandbox.py"))["extra_env"], "SANDBOX_KV_FRACTION": "0.1"}
    (tmp_path / "sandbox.py").write_text(f"extra_env = {extra!r}\n")
    proc = pyinfra("deploy.py", "--group-data", str(tmp_path), limit=host.name)
    assert proc.returncode != 0, proc.out[-4000:]
    assert "readiness: launch fingerprint: the KV pool holds" in proc.out, proc.out[-4000:]  # the rollback's cause
    assert "readiness: rolled back: sglang.service serves the last good configuration again" in proc.out, \
        proc.out[-4000:]
    assert "rollback failed" not in proc.out and "is refused" not in proc.out, proc.out[-4000:]
    assert unit_props(host, "sglang.service")["MainPID"] != before
    url = "http://127.0.0.1:30000/v1/models"
    assert host.run(f"curl -s -o /dev/null -w '%{{http_code}}' {url}").stdout == "401"  # keyed again
    assert KEY not in proc.out
    again = pyinfra("deploy.py", limit=host.name, env={"SGLANG_API_KEY": KEY})
    assert again.returncode == 0 and grand_total(again.out)[:2] == (0, 0), again.out[-4000:]
