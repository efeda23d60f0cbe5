"""The running kernel's command line and the nvidia_uvm module's HMM switch: what decides whether
GPU peer traffic goes through IOMMU translation or ACS redirect (core/host_fitness.py)."""

from __future__ import annotations

from pyinfra.api import FactBase


class KernelCmdline(FactBase[dict[str, str]]):
    """
    The kernel command line (``/proc/cmdline``) as {option: value}; a bare flag maps to "".
    The last of a repeated option wins, as the kernel's own parsing does for these.

    .. code:: python

        host.get_fact(KernelCmdline).get("iommu")     # "pt", "off", None
    """

    def command(self) -> str:
        return "cat /proc/cmdline"

    def process(self, output: list[str]) -> dict[str, str]:
        options: dict[str, str] = {}
        for word in " ".join(output).split():
            key, _, value = word.partition("=")
            options[key] = value
        return options


class NvidiaUvmHmm(FactBase[bool | None]):
    """
    Whether nvidia_uvm's HMM is disabled (``uvm_disable_hmm``: "Y"/"N", or 1/0 on older drivers);
    None when the module is not loaded (or has no such parameter).

    .. code:: python

        host.get_fact(NvidiaUvmHmm)     # True: options nvidia_uvm uvm_disable_hmm=1 is in effect
    """

    def command(self) -> str:
        return "cat /sys/module/nvidia_uvm/parameters/uvm_disable_hmm 2>/dev/null || true"

    def process(self, output: list[str]) -> bool | None:
        value = "".join(output).strip().upper()
        return {"Y": True, "1": True, "N": False, "0": False}.get(value)
