"""core/factcache.py: facts kept per host until the host runs anything else; the venv facts
read by one python run (facts/venv_batch.py) give what each fact reads alone; prefetch splits
one round trip's output per fact. A stand-in Host class, so pyinfra's own Host is not touched."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

from pyinfra.api import StringCommand

from core import factcache
from facts import compressed_tensors as ct
from facts import venv
from facts.files import FileText
from facts.gpu import SimulatedGpus
from facts.http import HttpStatus
from facts.model_dir import ModelConfig
from facts.ports import PortListener
from facts.venv_batch import MEMBERS, VenvFacts, member_values


def _sh(command) -> list[str]:
    text = command.get_raw_value() if isinstance(command, StringCommand) else command
    return subprocess.run(["sh", "-c", text], capture_output=True, text=True, check=True).stdout.splitlines()


class FakeHost:
    """Reads facts by running their command locally; counts what ran."""

    connected = True

    def __init__(self) -> None:
        self.ran: list[str] = []

    def get_fact(self, cls, *args, **kwargs):
        lines = self.run_shell_command(cls().command(*args, **kwargs))[1].stdout_lines
        return cls().process(lines) if lines else cls().default()

    def run_shell_command(self, command, **_kwargs):
        self.ran.append(command.get_raw_value() if isinstance(command, StringCommand) else command)
        return True, SimpleNamespace(stdout_lines=_sh(command))

    def put_file(self, *_args, **_kwargs):
        self.ran.append("put_file")
        return True


factcache.install(FakeHost)


def test_a_kept_fact_is_read_once_until_the_host_runs_something_else(tmp_path):
    host = FakeHost()
    (tmp_path / "config.json").write_text('{"a": 1}')
    assert host.get_fact(ModelConfig, path=str(tmp_path)) == {"a": 1}
    (tmp_path / "config.json").write_text('{"a": 2}')
    first = host.get_fact(ModelConfig, path=str(tmp_path))
    assert first == {"a": 1} and len(host.ran) == 1  # kept: nothing ran on the host since
    first["a"] = 3  # a caller's change to its copy does not reach the kept value
    assert host.get_fact(ModelConfig, path=str(tmp_path)) == {"a": 1}
    host.run_shell_command("true")  # an operation's command: the host may have changed
    assert host.get_fact(ModelConfig, path=str(tmp_path)) == {"a": 2}
    host.put_file("x", str(tmp_path / "config.json.tmp"))  # an upload into the dir it reads
    host.get_fact(ModelConfig, path=str(tmp_path))
    assert len(host.ran) == 5
    factcache.forget(host)  # what factcache.start does when a deploy file begins on the host
    host.get_fact(ModelConfig, path=str(tmp_path))
    assert len(host.ran) == 6


def test_a_command_that_says_what_it_changes_drops_only_the_facts_of_those_paths(tmp_path):
    host = FakeHost()
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"a": 1}')
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "env").write_text("A=1\n")
    model, env = str(tmp_path / "model"), str(tmp_path / "etc" / "env")

    def reads() -> tuple:
        return (host.get_fact(ModelConfig, path=model), host.get_fact(FileText, path=env),
                host.get_fact(SimulatedGpus))

    first = reads()
    assert len(host.ran) == 3
    (tmp_path / "etc" / "env").write_text("A=2\n")
    host.run_shell_command(factcache.changing(StringCommand("true")))  # a router call, a restart, a wait
    assert reads() == first and len(host.ran) == 4  # nothing read again
    host.run_shell_command(factcache.changing(StringCommand("true"), env))  # that file written
    assert reads() == (first[0], "A=2\n", first[2]) and len(host.ran) == 6  # that file's fact read again
    host.run_shell_command(factcache.changing(StringCommand("true"), str(tmp_path)))  # a directory above both
    reads()
    assert len(host.ran) == 9  # both read again; the GPUs (hardware) stay kept
    host.put_file("x", env + ".tmp")  # an upload: its destination only
    reads()
    assert len(host.ran) == 10
    host.run_shell_command(StringCommand("true"))  # a command that does not say: everything may have changed
    reads()
    assert len(host.ran) == 14


def test_facts_that_change_on_their_own_are_read_every_time():
    host = FakeHost()
    for _ in range(2):
        host.get_fact(HttpStatus, url="http://127.0.0.1:9/health")
    assert len(host.ran) == 2 and HttpStatus not in factcache.CACHED


def test_the_venv_facts_read_together_match_each_read_alone():
    """The local venv's python: every member's value, from one run, is what its own command gives."""
    path = sys.prefix
    alone = {fact: fact().process(_sh(fact().command(path, **kwargs))) for fact, _c, _a, kwargs, _x in MEMBERS}
    together = member_values(path, VenvFacts().process(_sh(VenvFacts().command(path))))
    assert {fact: value for fact, _kwargs, value in together} == alone
    assert len(together) == len(MEMBERS)


def test_a_venv_fact_read_seeds_the_others_and_an_absent_venv_seeds_their_absent_values(tmp_path):
    host = FakeHost()
    packages = host.get_fact(venv.VenvPackages, path=sys.prefix)
    assert "pyinfra" in packages
    host.get_fact(venv.VenvState, path=sys.prefix)
    host.get_fact(ct.CompressedTensorsRequirers, path=sys.prefix)
    assert len(host.ran) == 1
    missing = str(tmp_path / "none")
    assert host.get_fact(venv.VenvState, path=missing) == venv.Venv(exists=False)
    assert host.get_fact(ct.CompressionFormats, path=missing) == ct.CompressedTensors(version=None, members=[])
    assert host.get_fact(ct.CompressionFormatReferences, path=missing, package="sglang").version is None
    assert len(host.ran) == 2


def test_prefetch_reads_several_facts_in_one_command_and_skips_the_ones_that_fail(tmp_path):
    host = FakeHost()
    (tmp_path / "config.json").write_text('{"b": 1}')
    reads = [(ModelConfig, {"path": str(tmp_path)}), (SimulatedGpus, {}),
             (ModelConfig, {"path": "/nonexistent/'quoted"})]
    factcache.prefetch(host, reads)
    assert len(host.ran) == 1
    assert host.get_fact(ModelConfig, path=str(tmp_path)) == {"b": 1}
    assert host.get_fact(SimulatedGpus) in (True, False)
    assert host.get_fact(ModelConfig, path="/nonexistent/'quoted") is None
    assert len(host.ran) == 1


def test_split_keeps_only_facts_that_exited_zero():
    mark = factcache._MARK
    lines = [f"{mark} 0", "a", "", f"{mark} rc 0", f"{mark} 1", "b", "", f"{mark} rc 2", f"{mark} 2", "",
             f"{mark} rc 0", f"{mark} 3", "c", f"{mark} rc 0", f"{mark} 4", "d", "", "", f"{mark} rc 0"]
    assert factcache._split(lines) == {0: ["a"], 2: [], 3: ["c"], 4: ["d", ""]}


def test_prefetch_answers_the_first_read_of_a_fact_that_changes_on_its_own_once(tmp_path):
    """A FIRST_READ fact: the prefetch's value serves its next read only, and only while nothing ran."""
    host = FakeHost()
    (tmp_path / "config.json").write_text("{}")
    port = {"port": 9}
    reads = [(ModelConfig, {"path": str(tmp_path)}), (PortListener, port)]
    factcache.prefetch(host, reads)
    assert host.get_fact(PortListener, **port) is None and len(host.ran) == 1  # the prefetch's value
    host.get_fact(PortListener, **port)
    assert len(host.ran) == 2  # read again: that value was for one read
    factcache.prefetch(host, reads)  # ModelConfig is kept: only PortListener to read, not worth a round trip
    assert len(host.ran) == 2
    factcache.prefetch(host, [*reads, (PortListener, {"port": 10})])
    host.run_shell_command("true")  # an operation's command: the host may have changed
    host.get_fact(PortListener, **port)
    assert len(host.ran) == 5  # the prefetched value was dropped with the change
    factcache.prefetch(host, [(SimulatedGpus, {}), (HttpStatus, {"url": "http://127.0.0.1:9/health"})])
    host.get_fact(HttpStatus, url="http://127.0.0.1:9/health")
    assert len(host.ran) == 6  # /health is not one of them: read when the readiness check reads it


def test_prefetch_reads_the_venv_batch_with_the_shell_facts(tmp_path):
    host = FakeHost()
    (tmp_path / "config.json").write_text("{}")
    factcache.prefetch(host, [(ModelConfig, {"path": str(tmp_path)}), (VenvFacts, {"path": sys.prefix})])
    assert "pyinfra" in host.get_fact(venv.VenvPackages, path=sys.prefix)
    host.get_fact(ct.CompressionFormatReferences, path=sys.prefix, package="sglang")
    assert len(host.ran) == 1
    factcache.prefetch(host, [(ModelConfig, {"path": str(tmp_path)}), (VenvFacts, {"path": sys.prefix})])
    assert len(host.ran) == 1  # all kept: nothing to read


def test_prefetch_leaves_out_the_facts_a_rollout_answers_from_memory(tmp_path):
    host = FakeHost()
    (tmp_path / "config.json").write_text('{"c": 1}')
    host.answers_from_memory = lambda cls, kwargs: cls is SimulatedGpus  # rollout/static_facts.py
    factcache.prefetch(host, [(SimulatedGpus, {}), (ModelConfig, {"path": str(tmp_path)}),
                              (FileText, {"path": str(tmp_path / "config.json")})])
    assert len(host.ran) == 1 and "simulated" not in host.ran[0].lower()
    assert host.get_fact(ModelConfig, path=str(tmp_path)) == {"c": 1} and len(host.ran) == 1


def test_a_command_that_names_its_paths_still_drops_the_prefetched_first_reads(tmp_path):
    """A restart or router call names what it changes; the unit's state and the ports change with it."""
    from core.changes import changing

    host = FakeHost()
    (tmp_path / "config.json").write_text("{}")
    port = {"port": 9}
    factcache.prefetch(host, [(ModelConfig, {"path": str(tmp_path)}), (PortListener, port)])
    assert len(host.ran) == 1
    host.run_shell_command(changing(StringCommand("true"), "/etc/elsewhere"))
    host.get_fact(ModelConfig, path=str(tmp_path))
    assert len(host.ran) == 2  # ModelConfig kept (another path changed); the command ran
    host.get_fact(PortListener, **port)
    assert len(host.ran) == 3  # read again: the prefetched value went with the command
