"""Host fitness (core/host_fitness.py): what hangs NCCL on PCIe GPU hosts, judged from the facts'
fixtures (tests/fixtures/facts/: real outputs of an 8x RTX PRO 6000 host and of public issues, their
sources in each file), and the P2P level from the topology."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from core.host_fitness import judge
from facts.gpu import Gpu
from facts.gpu_topology import GpuTopology
from facts.pci import IommuGroups, IommuView, PciAcsPaths, PciPaths
from tests.unit.test_preflight_capability import ct200_spec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"


def fact(folder: str, case: str, cls):
    return cls().process(json.loads((FIXTURES / folder / f"{case}.json").read_text())["output"])


ASUS_TOPO = fact("gpu_topology.GpuTopology", "asus_8x_rtx_pro_6000_dual_socket", GpuTopology)
PASSTHROUGH = fact("pci.IommuGroups", "passthrough", IommuGroups)
TRANSLATED = fact("pci.IommuGroups", "translated", IommuGroups)
ACS_OFF = fact("pci.PciAcsPaths", "switch_acs_redirect_off", PciAcsPaths)
ACS_ON = fact("pci.PciAcsPaths", "switch_acs_redirect_on", PciAcsPaths)
SIMULATED = fact("pci.PciAcsPaths", "simulated_gpus", PciAcsPaths)
NOT_ROOT = fact("pci.PciAcsPaths", "switch_not_root", PciAcsPaths)


def gpus(*buses: str) -> list[Gpu]:
    return [Gpu(i, f"GPU-{i}", "NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887, 0, "12.0", "580.95.05", bus)
            for i, bus in enumerate(buses)]


TWO = gpus("00000000:06:00.0", "00000000:07:00.0")


def spec(**overrides):
    return ct200_spec(gpu_ids=[0, 1], tp_size=2, **overrides)


def test_a_good_host_has_no_finding_and_gpus_across_sockets_get_p2p_level_sys():
    fitness = judge(spec(), TWO, {"iommu": "pt"}, True, PASSTHROUGH, ACS_OFF, ASUS_TOPO, 2)
    assert fitness.findings == [] and fitness.notes == []
    assert fitness.p2p_level is None  # GPU 0 and 1 of the ASUS host: PIX, one switch
    eight = gpus(*[f"00000000:{b}:00.0" for b in ("06", "07", "75", "76", "84", "85", "f4", "f5")])
    wide = judge(ct200_spec(), eight, {}, True, PASSTHROUGH, ACS_OFF, ASUS_TOPO, 2)
    assert wide.p2p_level == "SYS"
    assert wide.p2p_why.startswith("16 pair(s) of TP GPUs meet only across the CPU interconnect (nvidia-smi topo -m: "
                                   "SYS, e.g. GPU 0 and GPU 4; 2 CPU sockets)")


def test_iommu_translation_fails_naming_the_gpus_the_domain_type_and_iommu_pt():
    fitness = judge(spec(), TWO, {"intel_iommu": "on"}, True, TRANSLATED, ACS_OFF, ASUS_TOPO, 2)
    assert fitness.findings == [
        "IOMMU translation on for GPUs 0, 1 (IOMMU domain type DMA-FQ; kernel command line: intel_iommu=on): their "
        "peer traffic goes through the IOMMU and NCCL's first all-reduce can hang while nvidia-smi reports P2P OK "
        "(NVIDIA/nccl#2079, #1999, local-inference-lab/rtx6kpro#15); fix: add iommu=pt to the kernel command line "
        "(GRUB_CMDLINE_LINUX in /etc/default/grub, update-grub, reboot), or turn the IOMMU off (intel_iommu=off)"]


def test_acs_redirect_fails_naming_each_bridge_its_gpus_and_the_setpci_fix():
    fitness = judge(spec(), TWO, {}, True, PASSTHROUGH, ACS_ON, ASUS_TOPO, 2)
    assert len(fitness.findings) == 2
    first = fitness.findings[0]
    assert first.startswith("ACS redirect on PCIe bridge 0000:02:01.0 (PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 "
                            "Switch (rev b0) (prog-if 00 [Normal decode])) above GPU 0 (ACSCtl ReqRedir+ CmpltRedir+)")
    assert "fix: setpci -s 0000:02:01.0 ECAP_ACS+0x6.w=0000 at every boot" in first
    assert "0000:02:02.0" in fitness.findings[1] and "above GPU 1" in fitness.findings[1]
    # the root port above both (ReqRedir- there) is not named: a positive control for "not in the findings"
    assert not [f for f in fitness.findings if "0000:00:01.1" in f]


def test_bridges_lspci_could_not_read_are_said_unchecked_not_passed_as_without_acs():
    # the host of the test above, read without root: its redirect is there, lspci cannot show it
    fitness = judge(spec(), TWO, {}, True, PASSTHROUGH, NOT_ROOT, ASUS_TOPO, 2)
    assert fitness.findings == []
    assert fitness.notes == [
        "host fitness: ACS not checked on PCIe bridge(s) 0000:00:01.1, 0000:01:00.0, 0000:02:01.0, 0000:02:02.0: "
        "lspci printed 'Capabilities: <access denied>' (it ran without root); run the deploy as root (ssh_user "
        "root, or _sudo=True)"]
    # only the bridges above the TP GPUs are named (here GPU 0 hangs off the root port directly)
    one_side = judge(spec(), TWO, {}, True, PASSTHROUGH,
                     replace(NOT_ROOT, paths={**NOT_ROOT.paths, "0000:06:00.0": ("0000:00:01.1",)}), ASUS_TOPO, 2)
    assert "0000:02:01.0" not in one_side.notes[0] and "0000:02:02.0" in one_side.notes[0]


def test_p2p_level_is_held_back_while_a_finding_stands_set_by_hand_or_p2p_broken():
    eight = gpus(*[f"00000000:{b}:00.0" for b in ("06", "07", "75", "76", "84", "85", "f4", "f5")])
    held = judge(ct200_spec(), eight, {}, True, TRANSLATED, ACS_OFF, ASUS_TOPO, 2)
    assert held.findings and held.p2p_level is None and "held back" in held.p2p_why
    by_hand = judge(ct200_spec(extra_env={"NCCL_P2P_LEVEL": "PHB"}), eight, {}, True, PASSTHROUGH, ACS_OFF, ASUS_TOPO, 2)
    assert by_hand.p2p_level is None and "NCCL_P2P_LEVEL" in by_hand.p2p_why
    broken = ct200_unresolved_p2p_broken()
    assert judge(broken, eight, {}, True, PASSTHROUGH, ACS_OFF, ASUS_TOPO, 2).p2p_level is None


def ct200_unresolved_p2p_broken():
    return ct200_spec().model_copy(update={"p2p_ok": False})


def test_hmm_on_warns_and_simulated_gpus_are_said_not_judged():
    fitness = judge(spec(), gpus("00000000:18:00.0", "00000000:28:00.0"), {}, False, IommuView(units=()), SIMULATED,
                    None, None)
    assert fitness.findings == []
    assert fitness.notes[0] == "host fitness: GPUs 0, 1 not in sysfs (simulated GPUs?): IOMMU and ACS not checked for them"
    assert fitness.notes[1].startswith("host fitness: lspci is not installed (apt install pciutils)")
    assert fitness.notes[2].startswith("WARNING: nvidia_uvm's HMM is on (uvm_disable_hmm=N)")
    assert "'options nvidia_uvm uvm_disable_hmm=1'" in fitness.notes[2]
    assert fitness.p2p_level is None and "topology is unknown" in fitness.p2p_why


def test_one_gpu_has_no_peer_traffic_to_judge():
    fitness = judge(ct200_spec(gpu_ids=[0], tp_size=1), TWO, {}, False, TRANSLATED, ACS_ON, ASUS_TOPO, 2)
    assert (fitness.findings, fitness.notes, fitness.p2p_level) == ([], [], None)


@pytest.mark.parametrize("cls", [IommuGroups, PciAcsPaths])
def test_the_sysfs_commands_run_on_this_machine(cls):
    """The facts' shell run by bash on this machine's real sysfs: its first PCI device is found (a
    positive control), an address no device has is missing."""
    real = sorted(p.name for p in Path("/sys/bus/pci/devices").iterdir())[0]
    command = cls().command(bus_ids=f"{real} 0000:ee:1f.7").get_raw_value()
    value = cls().process(subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60,
                                         check=True).stdout.splitlines())
    if cls is IommuGroups:
        assert value.devices[real].present and not value.devices["0000:ee:1f.7"].present
    else:
        assert real in value.paths and value.missing == ("0000:ee:1f.7",)
        assert isinstance(value, PciPaths)


@pytest.mark.parametrize("setting", ["fail", "warn", "off"])
def test_the_preflight_refuses_warns_or_reads_nothing_per_host_fitness(setting):
    """Through the preflight on a fake host: "fail" makes the IOMMU finding a problem (the host is
    refused before anything changes), "warn" a WARNING note, "off" reads no IOMMU or ACS fact."""
    from tests.unit.test_preflight_capability import facts, run
    from tests.unit.test_step_operations import NO_FITNESS

    ids = "0000:06:00.0 0000:07:00.0"
    host_facts = {**facts(TWO), **NO_FITNESS, "gpu_topology.GpuTopology": ASUS_TOPO,
                  "pci.IommuGroups": {f"bus_ids={ids}": TRANSLATED}, "pci.PciAcsPaths": {f"bus_ids={ids}": ACS_OFF}}
    if setting == "off":
        host_facts = {k: v for k, v in host_facts.items() if not k.startswith("pci.")}  # asked: a KeyError
    report, _commands, _host = run(spec(host_fitness=setting), host_facts)
    translation = [line for line in report.problems + report.notes if "IOMMU translation on for GPUs 0, 1" in line]
    if setting == "fail":
        assert len(translation) == 1 and translation[0] in report.problems
    elif setting == "warn":
        assert len(translation) == 1 and translation[0].startswith("WARNING: IOMMU translation on")
    else:
        assert translation == []


# the sandbox's simulated GPUs are judged on its simulated PCIe tree: tests/unit/test_pcisim.py
