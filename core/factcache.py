"""Each fact read once per host until something changes there.

pyinfra runs every operation's body twice (once to see whether it changes
anything, once to run it) and our steps read the same facts in several
operations (the restart stamp's inputs: venv packages, model marker, stamp
file), so a no-op run read some facts six or seven times, each a round trip
and often a python start on the host. ``install()`` (deploy.py, rollback.py)
keeps each value of the facts in ``CACHED`` per host, keyed by the fact's
arguments, and drops a host's values as soon as that host runs anything that
is not a fact read (an operation's command, a FunctionCommand's own command,
an upload): a fact read after a change is read again. The venv facts of
facts/venv_batch.py are read together, by one python run on the host.

Only facts that nothing but a deploy changes are kept; those that change on
their own (the unit's state, /health, the GPUs' memory and processes, ports,
the router's workers) are read each time.
"""

from __future__ import annotations

import copy
from typing import Any

from pyinfra.api.host import Host

from facts.compressed_tensors import CompressedTensorsRequirers, CompressionFormatReferences, CompressionFormats
from facts.files import FileDigest, FileText
from facts.gpu import GpuP2P, NvidiaGpus, SimulatedGpus
from facts.interpreter import PythonInterpreter
from facts.model_dir import ModelConfig, ModelDirState
from facts.venv import ExactPins, VenvPackages, VenvState
from facts.venv_batch import MEMBERS, VenvFacts, member_values

CACHED: frozenset[type] = frozenset({
    VenvState, VenvPackages, ExactPins, PythonInterpreter,
    CompressionFormats, CompressionFormatReferences, CompressedTensorsRequirers,
    ModelDirState, ModelConfig, FileDigest, FileText,
    NvidiaGpus, GpuP2P, SimulatedGpus,  # the GPUs' model, driver and topology (memory is read by NVML each time)
})  # fmt: skip

# read together, by one python run of the venv (facts/venv_batch.py): fact -> its arguments besides path
BATCHED: dict[type, dict[str, str]] = {fact: kwargs for fact, _code, _args, kwargs, _absent in MEMBERS}

_VALUES = "_sgc_fact_cache"
_DEPTH = "_sgc_fact_depth"


def _key(cls: type, args: tuple, kwargs: dict) -> tuple:
    return cls, repr(args), repr(sorted(kwargs.items()))


def _values(host: Host) -> dict:
    values = host.__dict__.get(_VALUES)
    if values is None:
        values = host.__dict__[_VALUES] = {}
    return values


def forget(host: Host) -> None:
    """Drop the host's kept facts (it changed, or may have)."""
    host.__dict__[_VALUES] = {}


def install() -> None:
    """Wrap pyinfra's Host (once): fact reads kept, anything else run on a host drops its kept facts."""
    if getattr(Host, "_sgc_fact_cache_installed", False):
        return
    get_fact, run_shell_command, put_file = Host.get_fact, Host.run_shell_command, Host.put_file

    def cached_get_fact(self: Host, cls: Any, *args: Any, **kwargs: Any) -> Any:
        if cls not in CACHED:
            return _reading(self, get_fact, cls, *args, **kwargs)
        key, values = _key(cls, args, kwargs), _values(self)
        if key not in values and _batched(cls, args, kwargs):
            outputs = _reading(self, get_fact, VenvFacts, path=kwargs["path"])
            if self.__dict__.get(_VALUES) is values:
                for fact, fact_kwargs, value in member_values(kwargs["path"], outputs):
                    values.setdefault(_key(fact, (), fact_kwargs), value)
        if key not in values:
            value = _reading(self, get_fact, cls, *args, **kwargs)
            if self.__dict__.get(_VALUES) is values:  # nothing changed on the host meanwhile
                values[key] = value
            return copy.deepcopy(value)
        return copy.deepcopy(values[key])

    def changing_run_shell_command(self: Host, *args: Any, **kwargs: Any) -> Any:
        if not self.__dict__.get(_DEPTH):
            forget(self)
        return run_shell_command(self, *args, **kwargs)

    def changing_put_file(self: Host, *args: Any, **kwargs: Any) -> Any:
        forget(self)
        return put_file(self, *args, **kwargs)

    Host.get_fact = cached_get_fact  # type: ignore[method-assign,assignment]
    Host.run_shell_command = changing_run_shell_command  # type: ignore[method-assign]
    Host.put_file = changing_put_file  # type: ignore[method-assign]
    Host._sgc_fact_cache_installed = True  # type: ignore[attr-defined]


def _batched(cls: type, args: tuple, kwargs: dict) -> bool:
    """A read of a venv fact with the arguments facts/venv_batch.py reads it with."""
    extra = BATCHED.get(cls)
    return (extra is not None and not args and set(kwargs) == {"path", *extra}
            and all(kwargs[name] == value for name, value in extra.items()))


def _reading(host: Host, get_fact: Any, cls: Any, *args: Any, **kwargs: Any) -> Any:
    host.__dict__[_DEPTH] = host.__dict__.get(_DEPTH, 0) + 1
    try:
        return get_fact(host, cls, *args, **kwargs)
    finally:
        host.__dict__[_DEPTH] -= 1
