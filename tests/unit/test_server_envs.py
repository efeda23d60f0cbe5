"""Venvs by content (core/server_envs.py, Spec.server_venv): one venv per package set, the
restart switches the unit to it, a rollback switches back, old ones are removed after a good
restart beyond keep_envs."""

from __future__ import annotations

import json

import pytest

from core import last_good
from core.render import packages_digest
from core.server_envs import envs_to_remove
from facts.server_envs import EnvsDir, ServerEnv, ServerEnvs
from tests.unit.test_spec_machines import B, inventory_of
from tests.unit.test_step_operations import sandbox_spec
from tasks import spec as S


def test_the_venv_is_named_by_the_package_set_and_only_by_it():
    spec = sandbox_spec()
    assert spec.server_venv == f"/opt/sglang/venv-envs/{spec.env_digest}" and len(spec.env_digest) == 12
    assert spec.python_bin == f"{spec.server_venv}/bin/python"
    assert spec.server_argv[0] == spec.python_bin  # the unit's ExecStart: a new venv is a new unit file
    # what the server runs from: the same settings elsewhere give the same venv
    for same in ({"gpu_ids": [0, 1, 2, 3], "tp_size": 4}, {"listen_port": 30001}, {"model_dir": "/srv/m/x"},
                 {"packages": list(reversed(spec.packages))}):
        assert sandbox_spec(**same).server_venv == spec.server_venv, same
    # what the packages are: each one a venv of its own
    others = [sandbox_spec(packages=[*spec.packages, "six==1.17.0"]), sandbox_spec(packages_no_deps=["sglang==0.5.22"]),
              sandbox_spec(venv_python="/usr/local/bin/python3.12"), sandbox_spec(compressed_tensors_hold=["torch"]),
              sandbox_spec(model="sandbox-tiny-nvfp4")]  # its format needs compressed-tensors >= 0.10.0
    # formats every release has (and models without compressed-tensors) share one venv
    assert sandbox_spec(model="sandbox-tiny-tools").server_venv == spec.server_venv
    assert len({spec.server_venv, *(other.server_venv for other in others)}) == 1 + len(others)
    assert sandbox_spec(venv_path="/data/venv").server_venv == f"/data/venv-envs/{spec.env_digest}"


def test_two_servers_of_one_machine_with_other_packages_share_venv_path_in_venvs_of_their_own(tmp_path):
    specs = S.validate_inventory(inventory_of(tmp_path, {**B, "packages": ["sglang==0.5.22"]}))
    a, b = specs["sgc240-a"], specs["sgc240-b"]
    assert a.venv_path == b.venv_path and a.server_venv != b.server_venv
    assert a.envs_dir == b.envs_dir == "/opt/sglang/venv-envs"


def E(path, switched, size=1000):
    return ServerEnv(path, switched, size)


@pytest.mark.parametrize("envs, referenced, keep, removed", [
    ([E("/e/a", 10), E("/e/b", 30), E("/e/c", 20)], set(), 2, ["/e/a"]),  # serving c, newest other b
    ([E("/e/a", 10), E("/e/b", 30), E("/e/c", 20)], set(), 1, ["/e/b", "/e/a"]),
    ([E("/e/a", 10), E("/e/b", 30), E("/e/c", 20)], set(), 3, []),
    ([E("/e/a", 10), E("/e/b", 30), E("/e/c", 20)], {"/e/a"}, 1, ["/e/b"]),  # another unit runs from a
    ([E("/e/a", None), E("/e/b", 30), E("/e/c", 20)], set(), 1, ["/e/b"]),  # a: staged, not switched to yet
    ([E("/e/c", None)], set(), 1, []),  # the serving one, before its switch was marked
], ids=["keep 2", "keep 1", "keep 3", "referenced", "never switched", "alone"])
def test_old_venvs_beyond_keep_envs_are_removed_newest_switch_first_kept(envs, referenced, keep, removed):
    assert envs_to_remove(EnvsDir(tuple(envs), frozenset(referenced)), "/e/c", keep) == removed


def test_the_envs_fact_reads_each_venv_its_switch_and_size_and_the_units_running_from_them():
    fact = ServerEnvs()
    found = fact.process(["env 1764790000 812000 /opt/sglang/venv-envs/aaa", "ref - - /opt/sglang/venv-envs/aaa",
                          "env - 9 /opt/sglang/venv-envs/bbb", "removing - - /opt/sglang/venv-envs/ccc.removing"])
    assert found == EnvsDir((E("/opt/sglang/venv-envs/aaa", 1764790000, 812000), E("/opt/sglang/venv-envs/bbb", None, 9)),
                            frozenset({"/opt/sglang/venv-envs/aaa"}), ("/opt/sglang/venv-envs/ccc.removing",))
    assert fact.process([]) == EnvsDir((), frozenset()) == fact.default()  # pyinfra: no output -> default()
    command = fact.command(root="/opt/sglang/venv-envs/").get_raw_value()
    assert command.endswith(" - /opt/sglang/venv-envs /etc/systemd/system")


OLD = {"sglang": "0.5.22", "torch": "2.13.0"}
NEW = {"sglang": "0.5.23", "torch": "2.13.0"}


def kept_stamp(venv: str | None = "/opt/sglang/venv-envs/old") -> dict:
    kept = {"unit": "u1", "env": "e", "options": "o", "packages": packages_digest(OLD), "package_versions": OLD,
            "model_revision": "r1"}
    return kept if venv is None else {**kept, "venv": venv}


NOW = {"unit": "u2", "env": "e", "options": "o", "packages": packages_digest(NEW), "package_versions": NEW,
       "model_revision": "r1", "venv": "/opt/sglang/venv-envs/new"}


def test_a_rollback_after_a_package_change_brings_the_packages_back_while_their_venv_is_kept():
    venvs = {"/opt/sglang/venv-envs/old": OLD, "/opt/sglang/venv-envs/new": NEW}
    assert last_good.not_by_files_alone(kept_stamp(), NOW, lambda path: venvs.get(path, {})) is None
    # a stamp from before venvs by content: its venv was venv_path itself
    assert last_good.not_by_files_alone(kept_stamp(None), NOW, lambda path: {"/opt/sglang/venv": OLD}.get(path, {}),
                                        "/opt/sglang/venv") is None


@pytest.mark.parametrize("venvs, why", [
    ({}, " and its venv /opt/sglang/venv-envs/old is gone"),
    ({"/opt/sglang/venv-envs/old": {**OLD, "sglang": "0.5.21"}}, " and its venv /opt/sglang/venv-envs/old no longer holds them"),
], ids=["removed", "changed"])
def test_a_rollback_is_refused_when_the_kept_venv_is_gone_or_changed(venvs, why):
    assert last_good.not_by_files_alone(kept_stamp(), NOW, lambda path: venvs.get(path, {})) == (
        f"the venv's packages changed since it served (sglang 0.5.22 -> 0.5.23){why}: its files alone would not "
        "bring it back")
    # without a reader (no host): the old answer
    assert last_good.not_by_files_alone(kept_stamp(), NOW) == (
        "the venv's packages changed since it served (sglang 0.5.22 -> 0.5.23): its files alone would not "
        "bring it back")


def disk_problem(spec, envs: EnvsDir, free: int) -> str | None:
    from pyinfra.context import ctx_host, ctx_state
    from pyinfra_testing.util import FakeState, create_host

    from core.server_envs import venv_disk_problem

    listed = EnvsDir(tuple(ServerEnv(env.path, env.switched, None) for env in envs.envs), envs.referenced)
    facts = {"server_envs.ServerEnvs": {f"root={spec.envs_dir}, sizes=False": listed, f"root={spec.envs_dir}, sizes=True": envs},
             "files.FreeBytes": {f"path={spec.envs_dir}": {"path": "/opt", "mount": "/opt", "free_bytes": free,
                                                          "total_bytes": 10 * free}}}
    state = FakeState()
    with ctx_state.use(state), ctx_host.use(create_host(state, facts=facts)):
        return venv_disk_problem(spec)


def test_a_new_venv_must_fit_beside_the_kept_ones_the_size_of_the_largest():
    spec = sandbox_spec()
    kept = EnvsDir((E("/opt/sglang/venv-envs/aaaaaaaaaaaa", 10, 8_000_000), E("/opt/sglang/venv-envs/bbbbbbbbbbbb", 20,
                                                                              7_000_000)), frozenset())
    assert disk_problem(spec, kept, 9 * 10**9) is None  # 8.19 GB fits in 9 GB (positive control below)
    assert disk_problem(spec, kept, 5 * 10**9) == (
        f"venv: not enough disk for the new venv {spec.server_venv}: need ~8.19 GB (the largest of the 2 venv(s) "
        "kept in /opt/sglang/venv-envs, 15.36 GB in all); /opt has 5.00 GB free: allowed: free space there, or "
        "remove old venvs by hand or with a lower keep_envs (now 2; the serving venv is always kept)")
    built = EnvsDir((*kept.envs, E(spec.server_venv, None, 8_000_000)), frozenset())
    assert disk_problem(spec, built, 10**6) is None  # built already: nothing to add
    assert disk_problem(spec, EnvsDir((), frozenset()), 10**6) is None  # the first one: no size to go by


def test_compressed_tensors_changed_in_the_venv_a_server_was_started_from_is_said_in_the_plan(caplog):
    from tasks import quant_deps
    from tests.unit.test_step_operations import CT_0_8_1, KIMI_INT4, plans, quant_facts, run

    spec = sandbox_spec()
    serving = quant_facts(KIMI_INT4, CT_0_8_1)
    serving["files.FileText"] = {"path=/var/lib/sglang-converge/sglang.json": json.dumps({"venv": spec.server_venv})}
    for facts, said in ((quant_facts(KIMI_INT4, CT_0_8_1), False), (serving, True)):  # never started: the control
        caplog.clear()
        _host, (upgrade,) = run(quant_deps.compression_format_supported, facts, spec=spec)
        assert upgrade.args[1] == "compressed-tensors==0.18.0"
        assert any(line.startswith(f"quant deps: {spec.server_venv} is the venv sglang.service was started from: "
                                   "this changes it in place") for line in plans(caplog)) is said
