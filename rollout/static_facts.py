"""The fleet preflight's hardware facts reused by every batch of the same rollout.

The fleet preflight reads each server's GPUs (``NvidiaGpus``: index, uuid,
name, memory size, compute capability, driver, PCI bus; ``GpuP2P``;
``SimulatedGpus``); each batch would read them again, twice (deploy.py's
resolved spec while preparing, the preflight step while executing). They
describe the hardware, which the deploy never changes, so one rollout reads
them once per host: the first non-empty answer is kept (an empty or failed
one is asked again). Facts that change as the deploy runs (GPU memory in use,
processes, files, packages, units) are never kept.

    facts = StaticFacts()
    facts.attach(host)     # after State.init: this host's get_fact answers kept facts from memory
                           # (and deploy.py's prefetch does not read them: host.answers_from_memory)
"""

from __future__ import annotations

from typing import Any

from facts.gpu import GpuP2P, NvidiaGpus, SimulatedGpus

STATIC_FACTS: tuple[type, ...] = (NvidiaGpus, GpuP2P, SimulatedGpus)


def _key(host_name: str, cls: type, args: tuple, kwargs: dict) -> tuple:
    """A kept value's key: one host's fact with these arguments."""
    return host_name, cls, repr(args), repr(sorted(kwargs.items()))


class StaticFacts:
    """Kept hardware facts by (host, fact, arguments), for every State of one rollout."""

    def __init__(self) -> None:
        self.values: dict[tuple, Any] = {}
        self.hits = 0

    def attach(self, host) -> None:
        """``host.get_fact`` answers the static facts from memory once it has read them."""
        def original(cls, *args, **kwargs):
            # the class's get_fact when called, not when attached: core/factcache.py may wrap it later
            # (deploy.py installs it when first loaded, after the fleet preflight attached its hosts)
            return type(host).get_fact(host, cls, *args, **kwargs)

        def get_fact(cls, *args, **kwargs):
            if cls not in STATIC_FACTS:
                return original(cls, *args, **kwargs)
            key = _key(host.name, cls, args, kwargs)
            if key in self.values:
                self.hits += 1
                return self.values[key]
            value = original(cls, *args, **kwargs)
            if value:
                self.values[key] = value
            return value

        host.get_fact = get_fact
        # deploy.py's prefetch (core/factcache.py) leaves out what is answered from memory here
        host.answers_from_memory = lambda cls, kwargs: _key(host.name, cls, (), kwargs) in self.values
