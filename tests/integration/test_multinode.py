"""A 2-node TP group (TP 16 over 2 x 8 simulated GPUs) on sandbox hosts sgc20 + sgc21,
described once in inventory/sandbox_tp_group.py. The hosts boot staged (the venv and the
revision built by stage.py on the run's template: tests/integration/templates.py), as after
`stage.py`; the group's own unit files, start and readiness are this module's:

the group converges and comes up (the stand-in's ranks really rendezvous over
TCP at rank 0's dist init address; rank 0 is ready only when rank 1 joined);
a second run changes nothing and restarts nothing; with rank 1's venv broken
and only rank 1 due for a restart, the whole group restarts and is reported
failed with rank 1's journal within a couple of seconds (not at rank 0's
timeout); once the venv is repaired the group comes back.

The hosts are converged once and reused by the tests, in order.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import pytest

from sandbox import hosts as sandbox_api
from tests.integration.helpers import ROOT, grand_total, server_venv, unit_props
from tests.integration.templates import staged_hosts

pytestmark = pytest.mark.sandbox

INDEXES = [20, 21]
INVENTORY = "inventory/sandbox_tp_group.py"
GROUP = "sandbox-tp16"


def site(host) -> str:
    """site-packages of the venv the host's server runs from."""
    return f"{server_venv(host)}/lib/python3.11/site-packages"
FIGURES: dict[str, float] = {}


@pytest.fixture(scope="module")
def group():
    names = [sandbox_api.host_name(i) for i in INDEXES]
    for name in names:  # leftovers of an interrupted run: start from fresh hosts
        sandbox_api.remove(name)
    try:
        hosts = staged_hosts(INDEXES)
        yield hosts
    finally:
        for name in names:
            sandbox_api.remove(name)
        print("\nmulti-node figures: " + ", ".join(f"{k} {v:.2f} s" for k, v in FIGURES.items()))


def deploy(*args: str, timeout: float = 900):
    """`pyinfra -y inventory/sandbox_tp_group.py deploy.py ARGS`; every output
    line with the time it arrived: proc.out, proc.lines = [(time, line)].

    Raises TimeoutError (with the last output) when pyinfra runs longer than
    ``timeout`` s, also when it hangs printing nothing; it is killed first."""
    argv = [sys.executable, "-m", "pyinfra", "-y", INVENTORY, "deploy.py", *args]
    started = time.time()
    proc = subprocess.Popen(argv, cwd=ROOT, env=dict(os.environ), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[tuple[float, str]] = []
    assert proc.stdout is not None
    stdout = proc.stdout

    def read():
        for line in stdout:
            lines.append((time.time(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        reader.join(timeout=10)
        tail = "\n".join(line for _, line in lines[-80:])
        raise TimeoutError(f"pyinfra {INVENTORY} deploy.py {' '.join(args)} still ran after {timeout:.0f} s "
                           f"(killed); its last output:\n{tail}") from None
    reader.join(timeout=30)
    assert not reader.is_alive(), "pyinfra exited but its output did not end within 30 s"
    proc.lines = lines  # type: ignore[attr-defined]
    proc.out = "\n".join(line for _, line in lines)  # type: ignore[attr-defined]
    proc.seconds = time.time() - started  # type: ignore[attr-defined]
    return proc


def line_time(proc, pattern: str) -> float:
    for when, line in proc.lines:
        if re.search(pattern, line):
            return when
    raise AssertionError(f"no line matches {pattern!r}:\n{proc.out[-4000:]}")


def cmdline(host) -> list[str]:
    pid = unit_props(host, "sglang.service")["MainPID"]
    return host.run(f"tr '\\0' '\\n' < /proc/{pid}/cmdline").stdout.split("\n")


def test_group_converges_and_comes_up(group):
    rank0, rank1 = group
    proc = deploy()
    FIGURES["first run (staged hosts)"] = proc.seconds
    assert proc.returncode == 0, proc.out
    start = line_time(proc, r"\[sgc20\] service: start sglang.service \(rank 0 of node group sandbox-tp16")
    ready = line_time(proc, r"\[sgc20\] readiness: ready: sglang.service serves tiny")
    FIGURES["group start -> ready at rank 0"] = ready - start
    assert "[sgc21] service: start sglang.service (rank 1 of node group sandbox-tp16, all ranks together)" in proc.out
    assert "(node group sandbox-tp16: all 2 ranks joined)" in proc.out
    assert "[sgc21] readiness: node group sandbox-tp16 is ready at rank 0 (sgc20)" in proc.out
    # the readiness gates ran at rank 0, before rank 1 heard the group is ready (the fingerprint holds tp_size 16)
    assert "[sgc20] readiness: launch fingerprint as planned: max_total_num_tokens=" in proc.out, proc.out[-4000:]
    gates = line_time(proc, r"\[sgc20\] readiness: gates passed in [\d.]+ s \(fingerprint")
    assert gates <= line_time(proc, r"\[sgc21\] readiness: node group sandbox-tp16 is ready at rank 0")
    assert "[sgc21] readiness: launch fingerprint" not in proc.out  # (rank 1 runs none)
    # one spec, two command lines: ranks and rank 0's address derived from the node group
    argv0, argv1 = " ".join(cmdline(rank0)), " ".join(cmdline(rank1))
    for argv, rank in ((argv0, 0), (argv1, 1)):
        assert "--tp-size 16 " in argv, argv
        assert f"--nnodes 2 --node-rank {rank} --dist-init-addr {rank0.address}:20000" in argv, argv
    # the ranks really met over TCP at rank 0's address
    journal0 = rank0.run("journalctl -u sglang.service -o cat --no-pager").stdout
    journal1 = rank1.run("journalctl -u sglang.service -o cat --no-pager").stdout
    assert "Node rank 1 joined from" in journal0 and "All 2 nodes joined." in journal0
    assert f"Connecting to node rank 0 at {rank0.address}:20000 as node rank 1" in journal1
    assert "All 2 nodes joined." in journal1
    assert '"id":"tiny"' in rank0.run("curl -s http://127.0.0.1:30000/v1/models").stdout.replace(" ", "")
    # rank 1 serves only SGLang's health check
    assert rank1.run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health").stdout == "200"
    assert rank1.run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/v1/models").stdout == "404"


def test_second_run_changes_nothing_and_restarts_nothing(group):
    before = [unit_props(host, "sglang.service") for host in group]
    assert [props["ActiveState"] for props in before] == ["active", "active"], before  # something to keep
    assert all(int(props["MainPID"]) > 0 for props in before), before
    proc = deploy()
    FIGURES["no-op run"] = proc.seconds
    assert proc.returncode == 0, proc.out
    success, error, no_change = grand_total(proc.out)
    assert (success, error) == (0, 0), proc.out
    assert no_change >= 2 * 14
    assert [unit_props(host, "sglang.service") for host in group] == before


def test_broken_rank_fails_the_whole_group_with_its_journal(group):
    rank0, rank1 = group
    pid0 = unit_props(rank0, "sglang.service")["MainPID"]
    # rank 1's venv breaks in a way pip does not see (the files of a package the
    # stand-in imports are gone, its metadata is still there), and only rank 1
    # is due for a restart (what it was started with is forgotten)
    packages = site(rank1)
    rank1.run(f"mv {packages}/msgspec {packages}/msgspec.broken-by-test && rm /var/lib/sglang-converge/sglang.json")
    started = time.time()
    proc = deploy()
    assert proc.returncode != 0, proc.out
    # one rank must restart -> all do
    assert "[sgc20] service: restart sglang.service (rank 0 of node group sandbox-tp16, all ranks together): " \
           "rank 1 (sgc21): " in proc.out, proc.out
    assert unit_props(rank0, "sglang.service")["MainPID"] != pid0
    # rank 1's journal, the traceback's last line first; the group failed at rank 0 too
    assert "[sgc21] readiness: node group sandbox-tp16 failed at rank 1 (sgc21):" in proc.out
    assert "[sgc21] cause: ModuleNotFoundError: No module named 'msgspec'" in proc.out
    assert re.search(r"\[sgc21\]\s+import msgspec", proc.out), proc.out
    assert "[sgc20] readiness: node group sandbox-tp16 failed at rank 1 (sgc21): " \
           "cause: ModuleNotFoundError: No module named 'msgspec'" in proc.out
    # ...within a couple of seconds of rank 1's failure, not at rank 0's 120 s timeout
    exits = rank1.run(
        f"journalctl -u sglang.service -o short-unix --no-pager --since @{int(started) - 1} "
        "| grep 'Main process exited, code=exited, status=1'"
    ).stdout.splitlines()
    reported = line_time(proc, r"\[sgc20\] readiness: node group sandbox-tp16 failed at rank 1")
    # the new rank 1's failure: the last exit before the report (the old rank 1 may have exited 1
    # too, during the group's stop: rank 0's schedulers die at SIGTERM, no shutdown reaches it)
    times = [float(line.split()[0]) for line in exits]
    failed_at = max((t for t in times if t <= reported), default=times[0])
    FIGURES["rank 1 failure -> group reported failed"] = reported - failed_at
    # (far below rank 0's 120 s: a 1 s slice and an ssh round trip, with slack for a loaded CI machine)
    assert 0 <= reported - failed_at < 30, (failed_at, reported, proc.out)
    assert proc.seconds < 60, proc.out


def test_group_comes_back_once_the_venv_is_repaired(group):
    rank0, rank1 = group
    packages = site(rank1)
    rank1.run(f"mv {packages}/msgspec.broken-by-test {packages}/msgspec")
    proc = deploy()
    assert proc.returncode == 0, proc.out
    # rank 1 crashed since the group was started: the group restarts (systemd's restart of rank 1 alone cannot)
    assert "[sgc21] service: restart sglang.service (rank 1 of node group sandbox-tp16, all ranks together): " \
           "sglang.service crashed since it was started" in proc.out, proc.out
    assert "[sgc20] readiness: ready: sglang.service serves tiny" in proc.out, proc.out
    again = deploy()
    assert grand_total(again.out)[:2] == (0, 0), again.out
