"""Host fitness on a sandbox host made bad (issue 37): its simulated PCIe tree (sandbox/pcisim.py,
bound over the guest's /sys and /proc/cmdline by nspawn, lspci a stand-in) says the IOMMU translates
for the GPUs (domain type DMA-FQ, no iommu option on the kernel command line) and the switch port
above GPU 0 redirects peer traffic (ACSCtl ReqRedir+ CmpltRedir+).

- The guest reads that state where a real host has it (readlink -f through the bridges, the
  iommu_group link and its type, /sys/class/iommu, /proc/cmdline, lspci -vvv).
- deploy.py refuses the host in the preflight, exit 1, naming the GPUs, the bridge or setting and
  the fix, before anything is downloaded or installed (every file under the deploy's directories
  listed before and after: no change); the dry run exits 1 naming the fix; with host_fitness="warn"
  the findings are WARNING lines and the dry run plans the whole converge.
- Made good again in place (up() with the default layout, no reboot) the guest reads passthrough
  and no redirect at once.

The good default host is judged, not "not checked", on the shared converged host's converge output
(tests/integration/test_nccl_check.py). No converge here: one fresh host (sgc250), three pyinfra runs
that stop at the preflight or plan.

    .venv/bin/python -m pytest -p no:cacheprovider -q tests/integration/test_host_fitness_faults.py
"""

from __future__ import annotations

import time

import pytest

from sandbox import hosts as sandbox_api
from tests.conftest import _sandbox_unavailable
from tests.integration.helpers import pyinfra
from tests.integration.test_dry_run import changes, listing

pytestmark = pytest.mark.sandbox  # its own host group (the module)

INDEX = 250  # this module's host
GPUS = "GPUs 0, 1, 2, 3, 4, 5, 6, 7"
BRIDGE = "0000:11:00.0"  # the switch downstream port above GPU 0 (bus 0x18)
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def host():
    reason = _sandbox_unavailable()
    if reason:
        pytest.skip(reason)
    started = time.monotonic()
    booted = sandbox_api.up(indexes=[INDEX], iommu="dma-fq", acs_redirect="0")[0]
    TIMINGS["boot"] = time.monotonic() - started
    try:
        yield booted
    finally:
        sandbox_api.remove(booted.name)
        print("\nhost fitness fault timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in TIMINGS.items()))


def timed(name: str, *args: str, **kwargs):
    started = time.monotonic()
    proc = pyinfra(*args, **kwargs)
    TIMINGS[name] = time.monotonic() - started
    return proc


def guest_view(host) -> str:
    """What the facts read, read in the guest as a real host's would be."""
    return host.run("readlink -f /sys/bus/pci/devices/0000:18:00.0; g=$(readlink /sys/bus/pci/devices/0000:18:00.0/"
                    "iommu_group); echo group ${g##*/} $(cat /sys/kernel/iommu_groups/${g##*/}/type); ls /sys/class/iommu; "
                    f"cat /proc/cmdline; lspci -vvv -s {BRIDGE} | grep -E '^[0-9a-f]|ACSCtl:'", timeout=60).stdout


def test_the_guest_reads_the_bad_state_where_a_real_host_has_it(host):
    out = guest_view(host).splitlines()
    assert out[0] == "/sys/devices/pci0000:00/0000:00:01.1/0000:10:00.0/0000:11:00.0/0000:18:00.0", out
    assert out[1].startswith("group ") and out[1].endswith(" DMA-FQ"), out
    assert out[2] == "ivhd0"
    assert "iommu=" not in out[3] and "sandbox=SIMULATED" in out[3], out
    assert out[4] == "11:00.0 PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch [SIMULATED] (rev b0) (prog-if 00 " \
                     "[Normal decode])"
    assert out[5] == "\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"
    # the rest of the guest's /sys is the kernel's (a positive control of "only those parts are bound")
    assert host.run("test -d /sys/fs/cgroup/unified && test -e /sys/devices/system/cpu/cpu0/topology/"
                    "physical_package_id", check=False).returncode == 0


def test_deploy_refuses_the_host_in_the_preflight_before_anything_changes(host):
    before = listing(host)
    proc = timed("refused deploy", "deploy.py", limit=host.name)
    assert proc.returncode == 1, proc.out[-5000:]
    assert (f"preflight: IOMMU translation on for {GPUS} (IOMMU domain type DMA-FQ; kernel command line: no iommu "
            "option)") in proc.out, proc.out[-5000:]
    assert "fix: add iommu=pt to the kernel command line" in proc.out
    assert (f"preflight: ACS redirect on PCIe bridge {BRIDGE} (PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch "
            "[SIMULATED] (rev b0) (prog-if 00 [Normal decode])) above GPU 0 (ACSCtl ReqRedir+ CmpltRedir+)") in proc.out
    assert f"fix: setpci -s {BRIDGE} ECAP_ACS+0x6.w=0000 at every boot" in proc.out and "pci=noacs" in proc.out
    # stopped at the preflight: no later step started, nothing downloaded or installed
    assert "Starting operation: Preflight" in proc.out and proc.out.count("--> Starting operation:") == 1
    assert changes(before, listing(host)) == [], proc.out[-3000:]
    assert host.run("test ! -e /opt/sglang && test ! -e /etc/systemd/system/sglang.service").returncode == 0


def test_the_dry_run_exits_1_naming_the_fix(host):
    proc = timed("dry run", "deploy.py", "--dry", "--diff", limit=host.name)
    assert proc.returncode == 1, proc.out[-5000:]
    verdict = f"dry run: the real run would fail on {host.name}: preflight: IOMMU translation on for {GPUS}"
    assert verdict in proc.stderr, proc.out[-5000:]
    assert "iommu=pt" in proc.stderr.split(verdict, 1)[1] and f"setpci -s {BRIDGE} ECAP_ACS+0x6.w=0000" in proc.stderr
    assert ("plan: preflight: host fitness: GPUs 0, 1, 2, 3, 4, 5, 6, 7 judged on the sandbox's SIMULATED PCIe tree "
            "(IOMMU domain DMA-FQ; the 12 bridge(s) above them read by its lspci stand-in)") in proc.out


def test_host_fitness_warn_prints_the_findings_and_plans_the_whole_converge(host):
    proc = timed("warn dry run", "deploy.py", "--dry", "--data", "host_fitness=warn", limit=host.name)
    assert proc.returncode == 0, proc.out[-5000:]
    assert f"preflight: WARNING: IOMMU translation on for {GPUS} (IOMMU domain type DMA-FQ" in proc.out, proc.out[-5000:]
    assert f"preflight: WARNING: ACS redirect on PCIe bridge {BRIDGE}" in proc.out
    assert "plan: download " in proc.out and "the real run would fail" not in proc.out  # not refused
    assert "NCCL_P2P_LEVEL=SYS" not in proc.out  # held back while the findings stand (P2P would hang)


def test_made_good_in_place_the_guest_reads_passthrough_and_no_redirect_at_once(host):
    sandbox_api.up(indexes=[INDEX])  # the default layout: the tree rewritten under the running guest
    out = guest_view(host).splitlines()
    assert out[1].endswith(" identity") and "iommu=pt" in out[3].split(), out
    assert out[5] == "\t\tACSCtl:\tSrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-"
