"""Several servers on one machine (tasks/spec/machines.py): inventory entries with one ssh address are
servers of one machine; the settings check allows them on disjoint GPUs, ports and units (the same model
included) and refuses any overlap naming both hosts, the field and the values; each knows the others'
units as siblings (never stale)."""

from __future__ import annotations

import pytest
from pyinfra.api import Config, State

from tasks import spec as S
from tests.unit.test_spec import load_inventory, write_sandbox_inventory

A = {"ssh_hostname": "10.77.240.2", "gpu_ids": [0, 1, 2, 3], "tp_size": 4, "unit_name": "sglang-a.service",
     "listen_port": 30000}
B = {**A, "gpu_ids": [4, 5, 6, 7], "unit_name": "sglang-b.service", "listen_port": 30001}


def inventory_of(tmp_path, b: dict, a: dict = A, extra: str = ""):
    folder = tmp_path / f"inventory{len(list(tmp_path.iterdir()))}"  # a new file each time (pyinfra caches by path)
    folder.mkdir()
    text = f"sandbox = [('sgc240-a', {a!r}), ('sgc240-b', {b!r}){extra}]\n"
    return load_inventory(write_sandbox_inventory(folder, text))


def refused(tmp_path, b: dict, limit: list[str] | None = None) -> list[str]:
    inventory = inventory_of(tmp_path, b)
    if limit:
        State(inventory, Config(), initial_limit=[inventory.get_host(name) for name in limit])
    with pytest.raises(S.SpecError) as e:
        S.validate_inventory(inventory)
    return str(e.value).splitlines()


def test_two_servers_of_one_machine_on_disjoint_gpus_ports_and_units_pass_and_know_each_other(tmp_path):
    inventory = inventory_of(tmp_path, B, extra=", ('sgc241', {'ssh_hostname': '10.77.241.2'})")
    specs = S.validate_inventory(inventory)
    assert specs["sgc240-a"].model_dir == specs["sgc240-b"].model_dir  # same model: one dir, one download
    assert S.sibling_units(inventory.get_host("sgc240-a")) == {"sglang-b.service": "sgc240-b"}
    assert S.sibling_units(inventory.get_host("sgc240-b")) == {"sglang-a.service": "sgc240-a"}
    assert S.sibling_units(inventory.get_host("sgc241")) == {}  # another machine


@pytest.mark.parametrize("change, expected", [
    ({"gpu_ids": [3, 4, 5, 6]}, "sgc240-b: gpu_ids = [3, 4, 5, 6]: sgc240-b and sgc240-a (gpu_ids = [0, 1, 2, 3]) "
                                "share GPU(s) [3] on the same machine (10.77.240.2:22): allowed: disjoint gpu_ids"),
    ({"listen_port": 30000}, "sgc240-b: listen_port = 30000: sgc240-b and sgc240-a (listen_port) both listen on "
                             "port 30000 on the same machine (10.77.240.2:22): allowed: a port of its own"),
    ({"unit_name": "sglang-a.service"}, "sgc240-b: unit_name = 'sglang-a.service': sgc240-b and sgc240-a both use "
                                        "it on the same machine (10.77.240.2:22): allowed: a unit_name of its own"),
    ({"model": "sandbox-tiny-nvfp4", "model_dir": "/srv/models/tiny/"},
     "sgc240-b: model_dir = '/srv/models/tiny': sgc240-b wants sandbox/tiny-kimi-nvfp4@"),
])
def test_an_overlap_on_one_machine_is_refused_naming_both_hosts_the_field_and_the_values(tmp_path, change, expected):
    lines = refused(tmp_path, {**B, **change})
    assert lines[0] == "invalid settings for 1 host(s): sgc240-b", lines
    assert any(expected in line for line in lines), lines


def test_the_default_unit_twice_is_refused_and_another_ssh_port_is_another_machine(tmp_path):
    defaults = [{k: v for k, v in entry.items() if k != "unit_name"} for entry in (A, B)]
    with pytest.raises(S.SpecError) as e:
        S.validate_inventory(inventory_of(tmp_path, defaults[1], a=defaults[0]))
    assert "sgc240-b: unit_name = 'sglang.service': sgc240-b and sgc240-a both use it" in str(e.value)
    assert "e.g. 'sglang-b.service'" in str(e.value)
    elsewhere = inventory_of(tmp_path, {**A, "ssh_port": 2222})  # the same values, but another sshd: another machine
    assert set(S.validate_inventory(elsewhere)) == {"sgc240-a", "sgc240-b"}


def test_a_server_left_out_by_limit_still_counts(tmp_path):
    # b is not targeted but still holds GPU 3 on that machine: a's run is refused, naming a
    lines = refused(tmp_path, {**B, "gpu_ids": [3, 4, 5, 6]}, limit=["sgc240-a"])
    assert lines[0] == "invalid settings for 1 host(s): sgc240-a", lines
    assert any(line.strip().startswith("sgc240-a: gpu_ids = [0, 1, 2, 3]: sgc240-a and sgc240-b (gpu_ids = "
                                       "[3, 4, 5, 6]) share GPU(s) [3]") for line in lines), lines
