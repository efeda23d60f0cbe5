"""The sandbox's simulated PCIe tree (sandbox/pcisim.py) and its lspci stand-in (sandbox/lspci.py),
read by the host-fitness facts' own commands (facts/pci.py, facts/kernel.py) run here by bash on the
tree written to a temporary directory (their /sys/ and /proc/cmdline pointed at it, the stand-in on
PATH), then judged as the preflight judges (core/host_fitness.py): the default host is good and
judged, the bad variants are refused naming the GPUs, the bridge or setting and the fix."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from core.host_fitness import judge
from facts.gpu import Gpu
from facts.gpu_topology import GpuTopology
from facts.kernel import KernelCmdline
from facts.pci import IommuGroups, PciAcsPaths
from sandbox import gpusim, lspci, pcisim
from tests.unit.test_preflight_capability import ct200_spec

ROOT = Path(__file__).resolve().parents[2]
# the ACSCtl line of a real lspci -vvv (the fixture's, from ROCm/rccl#547): tabs, seven flags
REAL_ACSCTL = json.loads((ROOT / "tests/fixtures/facts/pci.PciAcsPaths/switch_acs_redirect_on.json").read_text())[
    "output"][-1]
GPU_IDS = " ".join(f"0000:{0x18 + 0x10 * i:02x}:00.0" for i in range(8))


class Tree:
    """A sandbox host's tree written under tmp_path, read with the facts' commands."""

    def __init__(self, tmp_path: Path, iommu: str = "pt", acs_redirect: str = "", count: int = 8,
                 script: Path = ROOT / "sandbox" / "lspci.py", python: str = sys.executable):
        self.layout = gpusim.make_layout(count=count) | {"pci": pcisim.settings(iommu, acs_redirect)}
        self.base = tmp_path / "pci"
        self.found = pcisim.write_tree(self.base, self.layout)
        (tmp_path / "pci.json").write_text(pcisim.model(self.layout, self.found))
        (tmp_path / "layout.json").write_text(json.dumps(self.layout))
        (tmp_path / "bin").mkdir(exist_ok=True)
        (tmp_path / "fast").mkdir(exist_ok=True)
        for bdf, text in pcisim.lspci_fast(self.found).items():
            (tmp_path / "fast" / bdf).write_text(text)
        wrapper = tmp_path / "bin" / "lspci"  # as hosts.install_guest_files installs it, at these paths
        wrapper.write_text(pcisim.lspci_wrapper(str(script), str(tmp_path / "fast"), python))
        wrapper.chmod(0o755)
        self.env = {**os.environ, "SANDBOX_PCI_MODEL": str(tmp_path / "pci.json"),
                    "SANDBOX_GPU_LAYOUT": str(tmp_path / "layout.json"), "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}

    def run(self, command: str, as_user: tuple[str, ...] = ()) -> list[str]:
        command = command.replace("/sys/", f"{self.base}/sys/").replace("/proc/cmdline", f"{self.base}/proc/cmdline")
        proc = subprocess.run([*as_user, "bash", "-c", command], capture_output=True, text=True, env=self.env,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.splitlines()

    def fact(self, cls, as_user: tuple[str, ...] = (), **kwargs):
        command = cls().command(**kwargs)
        return cls().process(self.run(command if isinstance(command, str) else command.get_raw_value(), as_user))

    def lspci(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["lspci", *args], capture_output=True, text=True, env=self.env, timeout=60)

    def topology(self):
        smi = subprocess.run([sys.executable, str(ROOT / "sandbox" / "nvidia_smi.py"), "topo", "-m"],
                             capture_output=True, text=True, env=self.env, timeout=60)
        return GpuTopology().process(smi.stdout.splitlines())

    def gpus(self) -> list[Gpu]:
        return [Gpu(g["index"], g["uuid"], g["name"], g["memory_total_mib"], 0, "12.0", "580.95.05", g["pci_bus_id"])
                for g in self.layout["gpus"]]

    def judged(self, spec=None):
        spec = spec or ct200_spec()
        return judge(spec, self.gpus(), self.fact(KernelCmdline), None, self.fact(IommuGroups, bus_ids=GPU_IDS),
                     self.fact(PciAcsPaths, bus_ids=GPU_IDS), self.topology(), 2)


def test_the_default_host_is_in_sysfs_through_its_bridges_passthrough_and_no_acs_redirect(tmp_path):
    tree = Tree(tmp_path)
    paths = tree.fact(PciAcsPaths, bus_ids=GPU_IDS)
    assert paths.lspci and paths.missing == ()
    # readlink -f as on a real host: /sys/devices/pci0000:00/<root port>/<switch up>/<switch down>/<gpu>
    line = tree.run(f"readlink -f /sys/bus/pci/devices/{GPU_IDS.split()[4]}")[0]
    assert line == f"{tree.base}/sys/devices/pci0000:00/0000:00:03.1/0000:50:00.0/0000:51:00.0/0000:58:00.0"
    assert paths.paths["0000:18:00.0"] == ("0000:00:01.1", "0000:10:00.0", "0000:11:00.0")
    assert paths.bridges["0000:10:00.0"].acs_control is None  # a switch's upstream port has no ACS capability
    assert not [b for b in paths.bridges.values() if b.acs_control and b.acs_control["ReqRedir"]]
    assert "[SIMULATED]" in paths.bridges["0000:11:00.0"].description
    view = tree.fact(IommuGroups, bus_ids=GPU_IDS)
    assert view.units == ("ivhd0",)
    assert {d.domain_type for d in view.devices.values()} == {"identity"} and len(view.devices) == 8
    assert tree.fact(KernelCmdline)["iommu"] == "pt" and tree.fact(KernelCmdline)["sandbox"] == "SIMULATED"
    fitness = tree.judged()
    assert fitness.findings == [] and fitness.notes == []
    assert fitness.p2p_level == "SYS"  # the halves nvidia-smi topo -m puts on two sockets: not held back


def test_iommu_off_is_good_too_no_unit_no_group(tmp_path):
    tree = Tree(tmp_path, iommu="off")
    view = tree.fact(IommuGroups, bus_ids=GPU_IDS)
    assert view.units == () and {(d.present, d.group) for d in view.devices.values()} == {(True, None)}
    assert tree.fact(KernelCmdline)["iommu"] == "off"
    assert tree.judged().findings == []


def test_a_translating_iommu_and_acs_redirect_above_gpu_0_are_refused_naming_them_and_the_fixes(tmp_path):
    fitness = Tree(tmp_path, iommu="dma-fq", acs_redirect="0").judged()
    assert len(fitness.findings) == 2, fitness.findings
    iommu, acs = fitness.findings
    assert iommu.startswith("IOMMU translation on for GPUs 0, 1, 2, 3, 4, 5, 6, 7 (IOMMU domain type DMA-FQ; kernel "
                            "command line: no iommu option)")
    assert "fix: add iommu=pt to the kernel command line" in iommu and "amd_iommu=off" in iommu
    assert acs.startswith("ACS redirect on PCIe bridge 0000:11:00.0 (PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 "
                          "Switch [SIMULATED] (rev b0) (prog-if 00 [Normal decode])) above GPU 0 (ACSCtl ReqRedir+ "
                          "CmpltRedir+)")
    assert "fix: setpci -s 0000:11:00.0 ECAP_ACS+0x6.w=0000 at every boot" in acs and "pci=noacs" in acs
    assert fitness.p2p_level is None and "held back" in fitness.p2p_why


def test_acs_redirect_on_all_bridges_as_a_kernel_sets_it_isolates_each_gpu_in_its_group(tmp_path):
    tree = Tree(tmp_path, acs_redirect="all")
    bridges = [f for f in tree.judged().findings if f.startswith("ACS redirect on PCIe bridge")]
    assert len(bridges) == 10  # 2 root ports, 8 downstream ports; the switches' upstream ports have no ACS
    groups = [d.group for d in tree.fact(IommuGroups, bus_ids=GPU_IDS).devices.values()]
    assert len(set(groups)) == 8
    shared = Tree(tmp_path / "good").fact(IommuGroups, bus_ids=GPU_IDS)  # no ACS: a switch's GPUs share one group
    assert len({d.group for d in shared.devices.values()}) == 2


def test_lspci_prints_the_real_format(tmp_path):
    tree = Tree(tmp_path, acs_redirect="0")
    out = tree.lspci("-vvv", "-s", "0000:11:00.0")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == ("11:00.0 PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch [SIMULATED] (rev b0) "
                        "(prog-if 00 [Normal decode])")
    acsctl = [line for line in lines if "ACSCtl:" in line]
    shape = re.compile(r"^\t\tACSCtl:\t(\w+[+-] ){6}\w+[+-]$")
    assert shape.match(REAL_ACSCTL) and acsctl == [REAL_ACSCTL]  # the real sample's line, to the byte
    assert "\tIOMMU group: 3" in lines and "\tKernel driver in use: pcieport" in lines
    # the fact's own filter over it, then its parser
    grep = subprocess.run(["grep", "-E", "^[0-9a-f]|ACSCtl:"], input=out.stdout, capture_output=True, text=True)
    parsed = PciAcsPaths().process(["bridge 0000:11:00.0", *grep.stdout.splitlines()])
    assert parsed.bridges["0000:11:00.0"].acs_control["ReqRedir"] is True
    # -s's forms select as pciutils' do; -D shows the domain; plain lspci one line a device
    assert tree.lspci("-s", "11:00.0").stdout == tree.lspci("-s", "0000:11:00").stdout
    assert len(tree.lspci("-s", "11:").stdout.splitlines()) == 4
    assert tree.lspci("-D", "-s", "18:00.0").stdout.startswith("0000:18:00.0 VGA compatible controller: NVIDIA")
    assert len(tree.lspci().stdout.splitlines()) == len(tree.found) == 22
    assert tree.lspci("-s", "ee:1f.7").stdout == ""
    bad = tree.lspci("-x")
    assert bad.returncode == 2 and "invalid option -- 'x'" in bad.stderr


def test_the_wrappers_rendered_output_is_the_stand_ins_own(tmp_path):
    """lspci -vvv -s BDF (the fact's call, once per bridge) is served from the files rendered at install:
    byte for byte what the stand-in prints; other calls run the stand-in."""
    tree = Tree(tmp_path, iommu="dma-fq", acs_redirect="all")
    for device in tree.found:
        fast = tree.lspci("-vvv", "-s", device["bdf"]).stdout
        slow = subprocess.run([sys.executable, str(ROOT / "sandbox" / "lspci.py"), "-vvv", "-s", device["bdf"]],
                              capture_output=True, text=True, env=tree.env, timeout=60).stdout
        assert fast == slow and fast.startswith(device["bdf"][5:] + " ")
    assert tree.lspci("-vvv", "-s", "../pci.json").returncode == 2  # not a file name: the stand-in's -s error


def test_lspci_as_an_unprivileged_user_is_denied_the_capabilities(tmp_path, monkeypatch, capsys):
    tree = Tree(tmp_path, acs_redirect="all")
    monkeypatch.setattr(lspci, "MODEL_PATH", tree.env["SANDBOX_PCI_MODEL"])
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert lspci.main(["-vvv", "-s", "00:01.1"]) == 0
    out = capsys.readouterr().out
    assert "\tCapabilities: <access denied>" in out and "ACSCtl" not in out


def test_the_fact_read_without_root_says_the_bridges_unchecked_instead_of_passing_them():
    """The bad host (ACS redirect everywhere) read by a user who is not root: the stand-in prints
    "<access denied>" as pciutils does, and the verdict says the ACS was not checked."""
    system_python = "/usr/bin/python3"  # this venv's interpreter may sit below root's home (0700)
    if not os.access(system_python, os.X_OK):
        pytest.fail(f"{system_python} is needed to run the lspci stand-in as nobody")
    with tempfile.TemporaryDirectory(prefix="pcisim-nobody-") as name:  # pytest's tmp_path is root's alone (0700)
        shared = Path(name)
        shared.chmod(0o755)
        script = shared / "lspci.py"
        script.write_bytes((ROOT / "sandbox" / "lspci.py").read_bytes())
        tree = Tree(shared, acs_redirect="all", script=script, python=system_python)
        nobody = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
        assert tree.fact(PciAcsPaths, bus_ids=GPU_IDS).bridges["0000:11:00.0"].acs_control["ReqRedir"]  # as root
        paths = tree.fact(PciAcsPaths, nobody, bus_ids=GPU_IDS)
        assert paths.lspci and paths.missing == () and len(paths.bridges) > 8
        assert all(b.capabilities_denied and b.acs_control is None for b in paths.bridges.values())
        fitness = judge(ct200_spec(), tree.gpus(), tree.fact(KernelCmdline), None,
                        tree.fact(IommuGroups, bus_ids=GPU_IDS), paths, tree.topology(), 2)
    assert not [f for f in fitness.findings if "ACS" in f]
    assert [n for n in fitness.notes if n.startswith("host fitness: ACS not checked on PCIe bridge(s) 0000:00:01.1")]


def test_rewritten_in_place_a_bound_guest_sees_the_new_state(tmp_path):
    """nspawn binds the directories and the command line file: a rewrite keeps their inodes (a bind
    follows the inode) and leaves nothing of the state before."""
    tree = Tree(tmp_path, iommu="dma-fq", acs_redirect="all")
    bound = [tree.base / part for part in (*pcisim.SYSFS_PARTS, pcisim.CMDLINE)]
    inodes = [path.stat().st_ino for path in bound]
    good = gpusim.make_layout() | {"pci": pcisim.settings("off")}
    pcisim.write_tree(tree.base, good)
    assert [path.stat().st_ino for path in bound] == inodes
    assert not list((tree.base / "sys/class/iommu").iterdir()) and not list((tree.base / "sys/kernel/iommu_groups")
                                                                               .iterdir())
    assert "amd_iommu=off iommu=off" in (tree.base / pcisim.CMDLINE).read_text()


def test_nspawn_binds_each_part_over_the_kernels_and_leaves_out_what_this_machine_lacks(tmp_path):
    root = tmp_path / "root"
    pcisim.write_tree(root / pcisim.TREE_DIR.lstrip("/"), gpusim.make_layout())
    machine = tmp_path / "machine-sys"
    for part in pcisim.SYSFS_PARTS:
        (machine / part.removeprefix("sys/")).mkdir(parents=True)
    args, left_out = pcisim.nspawn_binds(root, sysfs=machine)
    assert args == [
        "--bind-ro=+/etc/sandbox-gpu/pci/sys/devices/pci0000\\:00:/sys/devices/pci0000\\:00",
        "--bind-ro=+/etc/sandbox-gpu/pci/sys/bus/pci/devices:/sys/bus/pci/devices",
        "--bind-ro=+/etc/sandbox-gpu/pci/sys/kernel/iommu_groups:/sys/kernel/iommu_groups",
        "--bind-ro=+/etc/sandbox-gpu/pci/sys/class/iommu:/sys/class/iommu",
        "--bind-ro=/etc/sandbox-gpu/pci/proc/cmdline:/proc/cmdline",  # below /proc: the guest's path
    ] and left_out == ""
    (machine / "class/iommu").rmdir()  # a kernel without IOMMU support
    args, left_out = pcisim.nspawn_binds(root, sysfs=machine)
    assert len(args) == 4 and left_out == "/sys/class/iommu (not in this machine's sysfs)"
    (machine / "devices/pci0000:00").rmdir()  # no PCI root to bind over: no GPU in sysfs at all
    args, left_out = pcisim.nspawn_binds(root, sysfs=machine)
    assert args == ["--bind-ro=/etc/sandbox-gpu/pci/proc/cmdline:/proc/cmdline"]
    assert "without the devices and their links no GPU is in sysfs" in left_out


def test_the_sandbox_host_layout_is_good_by_default_and_settable():
    from sandbox import hosts

    opts = dict(hosts.DEFAULT_LAYOUT)
    assert hosts._layout_for(5, opts)["pci"] == {"iommu": "pt", "acs_redirect": []}
    bad = hosts._layout_for(5, opts | {"iommu": "dma-fq", "acs_redirect": "0,3"})
    assert bad["pci"] == {"iommu": "dma-fq", "acs_redirect": [0, 3]}
    with pytest.raises(ValueError, match="iommu 'on'"):
        pcisim.settings("on")


@pytest.mark.parametrize("bad", [False, True])
def test_the_preflight_on_a_sandbox_host_judges_its_simulated_gpus_and_says_so(tmp_path, bad):
    """Through the preflight on a fake host with the sandbox's outputs: the default host passes, judged
    (said SIMULATED, the P2P level kept); the bad one is refused before anything changes."""
    from tests.unit.test_preflight_capability import facts, run

    tree = Tree(tmp_path, iommu="dma-fq" if bad else "pt", acs_redirect="0" if bad else "")
    host_facts = {**facts(tree.gpus()), "gpu.SimulatedGpus": True, "gpu_topology.GpuTopology": tree.topology(),
                  "cpu.CpuSockets": 2, "kernel.KernelCmdline": tree.fact(KernelCmdline),
                  "pci.IommuGroups": {f"bus_ids={GPU_IDS}": tree.fact(IommuGroups, bus_ids=GPU_IDS)},
                  "pci.PciAcsPaths": {f"bus_ids={GPU_IDS}": tree.fact(PciAcsPaths, bus_ids=GPU_IDS)}}
    report, _commands, _host = run(ct200_spec(), host_facts)
    judged = [n for n in report.notes if "judged on the sandbox's SIMULATED PCIe tree" in n]
    assert judged == [f"host fitness: GPUs 0, 1, 2, 3, 4, 5, 6, 7 judged on the sandbox's SIMULATED PCIe tree (IOMMU "
                      f"domain {'DMA-FQ' if bad else 'identity'}; the 12 bridge(s) above them read by its lspci "
                      "stand-in)"]
    assert not [n for n in report.notes if "not checked" in n]
    if bad:
        assert [p for p in report.problems if p.startswith("IOMMU translation on for GPUs 0, 1, 2")]
        assert [p for p in report.problems if p.startswith("ACS redirect on PCIe bridge 0000:11:00.0")]
    else:
        assert not [p for p in report.problems if "IOMMU" in p or "ACS" in p], report.problems
        assert [n for n in report.notes if n.startswith("NCCL_P2P_LEVEL=SYS: 16 pair(s) of TP GPUs")], report.notes
