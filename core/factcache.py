"""Each fact read once per host until something changes there.

pyinfra runs every operation's body twice (once to see whether it changes
anything, once to run it) and our steps read the same facts in several
operations (the restart stamp's inputs: venv packages, model marker, stamp
file), so a no-op run read some facts six or seven times, each a round trip
and often a python start on the host. ``install()`` (deploy.py, rollback.py)
keeps each value of the facts in ``CACHED`` per host, keyed by the fact's
arguments, and drops a host's values as soon as that host runs anything that
is not a fact read (an operation's command, a FunctionCommand's own command,
an upload): a fact read after a change is read again. A command that says
what it changes (``changing(command, *paths)``: a file written, a router
call, a restart, a wait) drops only the kept facts read at, above or under
those paths; an upload drops those of its destination. The venv facts of
facts/venv_batch.py are read together, by one python run on the host, and
``prefetch`` reads the facts a server's steps read (``server_reads``), the
venv batch among them, in one round trip.

Only facts that nothing but a deploy changes are kept; those that change on
their own (the unit's state, /health, the GPUs' memory and processes, ports,
the router's workers) are read each time, except that the prefetch answers
the first read of those in ``FIRST_READ`` when nothing ran on the host since:
the value it read a moment before, used once.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from pyinfra.api import StringCommand
from pyinfra.api.host import Host

from core.changes import CHANGES, changing  # noqa: F401 - changing: here too, where the cache is
from facts.compressed_tensors import CompressedTensorsRequirers, CompressionFormatReferences, CompressionFormats
from facts.files import FileDigest, FileText
from facts.gpu import GpuP2P, NvidiaGpus, SimulatedGpus
from facts.interpreter import PythonInterpreter
from facts.model_dir import ModelConfig, ModelDirState
from facts.nvml import NvmlGpuUsage
from facts.ports import PortListener
from facts.systemd import SystemdUnitState
from facts.venv import ExactPins, VenvPackages, VenvState
from facts.venv_batch import MEMBERS, VenvFacts, member_values

if TYPE_CHECKING:
    from tasks.spec import Spec

CACHED: frozenset[type] = frozenset({
    VenvState, VenvPackages, ExactPins, PythonInterpreter,
    CompressionFormats, CompressionFormatReferences, CompressedTensorsRequirers,
    ModelDirState, ModelConfig, FileDigest, FileText,
    NvidiaGpus, GpuP2P, SimulatedGpus,  # the GPUs' model, driver and topology (memory is read by NVML each time)
})  # fmt: skip

# facts that change on their own whose first read in a deploy the prefetch answers (see prefetch); not
# /health: the readiness check reads it right after the unit's state, both as they are then
FIRST_READ: frozenset[type] = frozenset({SystemdUnitState, NvmlGpuUsage, PortListener})

# read together, by one python run of the venv (facts/venv_batch.py): fact -> its arguments besides path
BATCHED: dict[type, dict[str, str]] = {fact: kwargs for fact, _code, _args, kwargs, _absent in MEMBERS}

_VALUES = "_sgc_fact_cache"
_FIRST = "_sgc_fact_first"  # FIRST_READ values from the prefetch, each used once
_DEPTH = "_sgc_fact_depth"


HARDWARE: frozenset[type] = frozenset({NvidiaGpus, GpuP2P, SimulatedGpus})  # no command of the deploy changes them


def _key(cls: type, args: tuple, kwargs: dict) -> tuple:
    """(fact, arguments, where it reads: its file path, "" for the hardware, None when unknown)."""
    where = kwargs.get("path", kwargs.get("python")) if not args else None
    if cls in HARDWARE and not args and not kwargs:
        where = ""
    return cls, repr(args), repr(sorted(kwargs.items())), where if isinstance(where, str) else None


def _related(path: str, changed: str) -> bool:
    """``path`` is ``changed``, a directory above it or a path under it."""
    if changed == "/" or path == "/":
        return True
    return path == changed or changed.startswith(path.rstrip("/") + "/") or path.startswith(changed + "/")


def _forget_paths(host: Any, paths: tuple[str, ...]) -> None:
    """Drop the host's kept facts of these paths, and those whose path is unknown; the prefetched
    first reads (FIRST_READ: unit state, ports, GPU memory) always, whatever the command changes."""
    host.__dict__[_FIRST] = {}
    values = _values(host)
    # a new dict, as forget(): a read in flight meanwhile does not store into it
    host.__dict__[_VALUES] = {key: value for key, value in values.items()
                              if key[3] == "" or (key[3] and not any(_related(key[3], p) for p in paths))}


def _values(host: Any) -> dict:
    values = host.__dict__.get(_VALUES)
    if values is None:
        values = host.__dict__[_VALUES] = {}
    return values


def forget(host: Any) -> None:
    """Drop the host's kept facts (it changed, or may have)."""
    host.__dict__[_VALUES] = {}
    host.__dict__[_FIRST] = {}


def start(host: Any) -> None:
    """A deploy file begins on ``host``: the cache installed, nothing kept from before (a rollout's
    fleet preflight, an earlier batch in the same process) - each deploy reads its facts afresh."""
    install()
    forget(host._get_module() if hasattr(host, "_get_module") else host)


def install(host_class: Any = Host) -> None:
    """Wrap pyinfra's Host (once): fact reads kept, anything else run on a host drops its kept facts."""
    if host_class.__dict__.get("_sgc_fact_cache_installed", False):
        return
    get_fact, run_shell_command, put_file = host_class.get_fact, host_class.run_shell_command, host_class.put_file

    def cached_get_fact(self: Any, cls: Any, *args: Any, **kwargs: Any) -> Any:
        if cls not in CACHED:
            first = self.__dict__.get(_FIRST)
            if first and (key := _key(cls, args, kwargs)) in first:
                return first.pop(key)
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

    def changing_run_shell_command(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.__dict__.get(_DEPTH):
            paths = getattr(args[0] if args else kwargs.get("command"), CHANGES, None)
            if paths is None:
                forget(self)
            else:
                _forget_paths(self, paths)
        return run_shell_command(self, *args, **kwargs)

    def changing_put_file(self: Any, *args: Any, **kwargs: Any) -> Any:
        dest = args[1] if len(args) > 1 else kwargs.get("remote_filename")
        if isinstance(dest, str) and dest.startswith("/"):
            _forget_paths(self, (dest,))
        else:
            forget(self)
        return put_file(self, *args, **kwargs)

    host_class.get_fact = cached_get_fact
    host_class.run_shell_command = changing_run_shell_command
    host_class.put_file = changing_put_file
    host_class._sgc_fact_cache_installed = True


def _batched(cls: type, args: tuple, kwargs: dict) -> bool:
    """A read of a venv fact with the arguments facts/venv_batch.py reads it with."""
    extra = BATCHED.get(cls)
    return (extra is not None and not args and set(kwargs) == {"path", *extra}
            and all(kwargs[name] == value for name, value in extra.items()))


def _reading(host: Any, get_fact: Any, cls: Any, *args: Any, **kwargs: Any) -> Any:
    host.__dict__[_DEPTH] = host.__dict__.get(_DEPTH, 0) + 1
    try:
        return get_fact(host, cls, *args, **kwargs)
    finally:
        host.__dict__[_DEPTH] -= 1


_MARK = "##SGC-FACT##"
_MISSING = "##PYINFRA_NOCMD##"  # pyinfra's output for a fact whose requires_command is not there


def server_reads(spec: Spec) -> list[tuple[type, dict[str, Any]]]:
    """The facts a server's steps read on every run, with the arguments they read them with: the
    kept ones, the venv batch, and the first read of those of ``FIRST_READ`` that every run reads."""
    from core.last_good import last_good_stamp_path
    from core.stamps import pending_stamp_path, stamp_path
    from tasks.spec.built import SERVER_LAUNCHER

    reads: list[tuple[type, dict[str, Any]]] = [(NvidiaGpus, {}), (GpuP2P, {}), (SimulatedGpus, {}),
                                                (ModelConfig, {"path": spec.model_path})]
    reads += [(ModelDirState, {"path": path}) for path in (spec.model_path, spec.draft_path, spec.model_dir, spec.draft_dir if spec.draft else None)
              if path]
    reads += [(FileText, {"path": path}) for path in (stamp_path(spec), last_good_stamp_path(spec),
                                                      pending_stamp_path(spec))]
    reads += [(FileDigest, {"path": path})
              for path in (spec.unit_path, spec.options_path, spec.env_path, SERVER_LAUNCHER)]
    reads += [(VenvFacts, {"path": spec.server_venv}), (PortListener, {"port": spec.listen_port}),
              (NvmlGpuUsage, {"python": spec.python_bin}), (SystemdUnitState, {"unit": spec.unit_name})]
    return reads


def _shell(cls: type, kwargs: dict[str, Any]) -> str:
    """The fact's command as pyinfra runs it (with its requires_command guard)."""
    fact = cls()
    command = fact.command(**kwargs) if callable(fact.command) else fact.command
    required = fact.requires_command(**kwargs) if callable(fact.requires_command) else fact.requires_command
    if required:
        command = StringCommand("if command -v", required, ">/dev/null 2>&1; then (", command, "); else echo",
                                f"'{_MISSING}'; fi")
    return command.get_raw_value() if isinstance(command, StringCommand) else str(command)


def _wanted(cls: type, kwargs: dict[str, Any], values: dict) -> bool:
    """A read the prefetch does: a kept fact not kept yet (the venv batch: one of its members), or a FIRST_READ."""
    if cls is VenvFacts:
        return any(_key(fact, (), {"path": kwargs["path"], **extra}) not in values for fact, extra in BATCHED.items())
    return cls in FIRST_READ or (cls in CACHED and _key(cls, (), kwargs) not in values)


def prefetch(host: Any, reads: list[tuple[type, dict[str, Any]]]) -> None:
    """Read these facts in one round trip: each kept fact not kept yet is kept, the venv batch gives its
    members' values, and the value of a ``FIRST_READ`` fact answers its next read if nothing runs on the
    host before it (then it is read again, as always). One that fails is left for its own read."""
    if hasattr(host, "_get_module"):  # pyinfra's context proxy (`from pyinfra import host`): the host it stands for
        host = host._get_module()
    values = _values(host)
    known = getattr(host, "answers_from_memory", None)  # a rollout's GPU facts (rollout/static_facts.py)
    todo = [(cls, kwargs) for cls, kwargs in reads if _wanted(cls, kwargs, values)
            and not (known is not None and known(cls, kwargs))]
    if len(todo) < 2 or not getattr(type(host), "_sgc_fact_cache_installed", False) or not host.connected:
        return
    # an echo ends an output without a last newline; _split drops the empty line it adds after one with it
    script = "".join(f"echo '{_MARK} {index}'; ( {_shell(cls, kwargs)} ) </dev/null 2>/dev/null; "
                     f"rc=$?; echo; echo \"{_MARK} rc $rc\"; " for index, (cls, kwargs) in enumerate(todo))
    host.__dict__[_DEPTH] = host.__dict__.get(_DEPTH, 0) + 1
    try:
        ok, output = host.run_shell_command(StringCommand(script), print_output=False, print_input=False)
    finally:
        host.__dict__[_DEPTH] -= 1
    if not ok or host.__dict__.get(_VALUES) is not values:
        return
    first = host.__dict__.setdefault(_FIRST, {})
    for index, lines in _split(output.stdout_lines).items():
        cls, kwargs = todo[index]
        if lines == [_MISSING]:
            continue
        try:
            value = cls().process(lines) if lines else cls().default()
        except Exception:  # noqa: BLE001, S112 - left for its own read, which reports it as pyinfra does
            continue
        if cls is VenvFacts:
            for fact, fact_kwargs, member in member_values(kwargs["path"], value):
                values.setdefault(_key(fact, (), fact_kwargs), member)
        elif cls in FIRST_READ:
            first[_key(cls, (), kwargs)] = value
        else:
            values.setdefault(_key(cls, (), kwargs), value)


def _split(lines: list[str]) -> dict[int, list[str]]:
    """Each fact's output lines, by its index, for those that exited 0."""
    out: dict[int, list[str]] = {}
    index: int | None = None
    current: list[str] = []
    for line in lines:
        if line.startswith(f"{_MARK} rc "):
            if index is not None and line.strip() == f"{_MARK} rc 0":
                out[index] = current[:-1] if current and current[-1] == "" else current
            index, current = None, []
        elif line.startswith(f"{_MARK} "):
            index, current = int(line.split()[1]), []
        elif index is not None:
            current.append(line)
    return out
