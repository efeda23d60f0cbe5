"""tasks/spec/: settings across the hosts of an inventory (tasks/spec/inventory.py): every
targeted host validated at once, node groups (multi-node TP), routers and their servers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pyinfra.api import Config, State

from tasks import spec as S
from tests.unit.test_spec import ENV, KEY, REPO, check_message, load_inventory, write_sandbox_inventory


@pytest.fixture(scope="module")
def ct200_data() -> dict:
    return load_inventory(REPO / "inventory" / "ct200.py").get_host("ct200").data.dict()


# ---------------------------------------------------------------- pyinfra integration


def test_host_spec_memoized(tmp_path, monkeypatch):
    path = write_sandbox_inventory(tmp_path, 'sandbox = [("sb1", {"ssh_hostname": "10.77.0.11"})]\n')
    host = load_inventory(path).get_host("sb1")
    monkeypatch.delenv("SGLANG_API_KEY", raising=False)
    first = S.host_spec(host)
    assert S.host_spec(host) is first
    assert first.host_name == "sb1"


def test_specs_are_kept_on_the_host_and_inventory_objects(tmp_path, monkeypatch):
    """Nothing module-wide: a fresh inventory (or host) of the same name is built afresh from its data."""
    path = write_sandbox_inventory(tmp_path, 'sandbox = [("sb1", {"ssh_hostname": "10.77.0.11"})]\n')
    monkeypatch.delenv("SGLANG_API_KEY", raising=False)
    first, second = load_inventory(path), load_inventory(path)
    specs = S.validate_inventory(first)
    assert S.validate_inventory(first) is specs and S.host_spec(first.get_host("sb1")) is specs["sb1"]
    again = S.host_spec(second.get_host("sb1"))
    assert again is not specs["sb1"] and again == specs["sb1"]
    assert S.validate_inventory(second) is not specs
    monkeypatch.setenv("SGLANG_API_KEY", KEY)  # changed inputs reach a fresh inventory, not the built one
    assert S.host_spec(load_inventory(path).get_host("sb1")).api_key is not None
    assert S.host_spec(first.get_host("sb1")).api_key is None


def test_validate_inventory_lists_every_bad_host(tmp_path):
    path = write_sandbox_inventory(
        tmp_path,
        """
        sandbox = [
            ("sb1", {"ssh_hostname": "10.77.0.11"}),
            ("sb2", {"ssh_hostname": "10.77.0.12", "tp_size": 4}),
            ("sb3", {"ssh_hostname": "10.77.0.13", "listen_port": 0, "tp_sise": 8}),
        ]
        """,
    )
    inventory = load_inventory(path)
    with pytest.raises(S.SpecError) as e:
        S.validate_inventory(inventory)
    msg = str(e.value)
    assert msg.splitlines()[0] == "invalid settings for 2 host(s): sb2, sb3"
    assert "sb2: tp_size = 4 does not match gpu_ids" in msg
    assert "sb3: listen_port = 0" in msg and "sb3: tp_sise = 8" in msg
    assert "sb1" not in msg


def test_validate_inventory_ok_and_memoized(tmp_path):
    path = write_sandbox_inventory(
        tmp_path,
        """
        sandbox = [
            ("sb1", {"ssh_hostname": "10.77.0.11"}),
            ("sb2", {"ssh_hostname": "10.77.0.12", "gpu_ids": [4, 5, 6, 7], "tp_size": 4}),
        ]
        """,
    )
    inventory = load_inventory(path)
    specs = S.validate_inventory(inventory)
    assert set(specs) == {"sb1", "sb2"}
    assert specs["sb2"].unit_env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert S.validate_inventory(inventory) is specs
    assert S.host_spec(inventory.get_host("sb2")) is specs["sb2"]


def test_validate_inventory_respects_limit(tmp_path):
    path = write_sandbox_inventory(
        tmp_path,
        """
        sandbox = [
            ("sb1", {"ssh_hostname": "10.77.0.11"}),
            ("sb2", {"ssh_hostname": "10.77.0.12", "tp_size": 4}),
        ]
        """,
    )
    inventory = load_inventory(path)
    State(inventory, Config(), initial_limit=[inventory.get_host("sb1")])
    assert set(S.validate_inventory(inventory)) == {"sb1"}


# ---------------------------------------------------------------- node groups (multi-node TP)

GROUP = {"hosts": ["ct200", "ct201"], "dist_init_port": 20000}
ADDRESSES = {"ct200": "10.0.0.1", "ct201": "10.0.0.2"}


def group_spec(ct200_data, name="ct200", addresses=ADDRESSES, **changes):
    data = {**ct200_data, "tp_size": 16, "node_group": dict(GROUP), **changes}
    return S.build_spec(name, data, environ=ENV, addresses=addresses)


def test_node_group_derives_ranks_and_rank0s_address(ct200_data):
    rank0, rank1 = group_spec(ct200_data), group_spec(ct200_data, name="ct201")
    assert (rank0.nnodes, rank0.node_rank, rank0.dist_init_addr) == (2, 0, "10.0.0.1:20000")
    assert (rank1.nnodes, rank1.node_rank, rank1.dist_init_addr) == (2, 1, "10.0.0.1:20000")
    assert "--tp-size 16" in " ".join(rank1.server_argv)
    assert "--nnodes 2 --node-rank 1 --dist-init-addr 10.0.0.1:20000" in " ".join(rank1.server_argv)
    assert rank0.group_key == rank1.group_key == rank0.group_label == "ct200+ct201"


def test_node_group_address_override_ipv6_name_and_derived_tp(ct200_data):
    group = dict(GROUP, dist_init_host="fd00::1", name="kimi-tp16")
    spec = S.build_spec("ct201", dict(ct200_data, tp_size=None, node_group=group), environ=ENV, addresses=ADDRESSES)
    assert spec.dist_init_addr == "[fd00::1]:20000"
    assert spec.tp_size == 16  # 8 GPUs x 2 nodes
    assert spec.group_key == "kimi-tp16"
    # without addresses (no inventory at hand): rank 0's name
    assert group_spec(ct200_data, addresses=None).dist_init_addr == "ct200:20000"


# (id, node_group (None: GROUP), other changes to ct200's data, substrings of the message)
INVALID_NODE_GROUP = [
    ("one_host", {"hosts": ["ct200"], "dist_init_port": 20000}, {},
     ["node_group.hosts = ['ct200']", "at least 2 hosts", "a single host needs no node_group"]),
    ("host_twice", {"hosts": ["ct200", "ct201", "ct201"], "dist_init_port": 20000}, {"tp_size": 24},
     ["node_group.hosts = ['ct200', 'ct201', 'ct201']", "'ct201' is listed 2 times (ranks 1, 2)",
      "each rank 0..2 needs exactly one host"]),
    ("not_listed", {"hosts": ["ct201", "ct202"], "dist_init_port": 20000}, {},
     ["node_group.hosts = ['ct201', 'ct202']", "does not list this host 'ct200'"]),
    ("port_missing", {"hosts": ["ct200", "ct201"]}, {}, ["node_group.dist_init_port is required", "1..65535"]),
    ("port_range", {"hosts": ["ct200", "ct201"], "dist_init_port": 0}, {},
     ["node_group.dist_init_port = 0", "greater than or equal to 1"]),
    ("port_is_listen_port", {"hosts": ["ct200", "ct201"], "dist_init_port": 30000}, {},
     ["node_group.dist_init_port = 30000", "already serves HTTP on listen_port 30000", "a free port other than 30000"]),
    ("unknown_key", {"hosts": ["ct200", "ct201"], "dist_port": 20000}, {},
     ["node_group.dist_port is not a known key", "did you mean 'dist_init_port'"]),
    ("bad_dist_host", {"hosts": ["ct200", "ct201"], "dist_init_port": 20000, "dist_init_host": "not a host!"}, {},
     ["node_group.dist_init_host = 'not a host!'", "IP address or hostname"]),
    ("bad_name", {"hosts": ["ct200", "ct201"], "dist_init_port": 20000, "name": "tp 16"}, {},
     ["node_group.name = 'tp 16'", "short label"]),
    ("not_a_dict", ["ct200", "ct201"], {}, ["node_group = ['ct200', 'ct201']"]),
    ("nnodes_contradicts", None, {"nnodes": 3},
     ["nnodes = 3: contradicts node group 'ct200+ct201', which derives nnodes = 2", "leave nnodes unset"]),
    ("rank_contradicts", None, {"node_rank": 1},
     ["node_rank = 1: contradicts node group 'ct200+ct201', which derives node_rank = 0"]),
    ("addr_contradicts", None, {"dist_init_addr": "10.0.0.9:20000"},
     ["dist_init_addr = '10.0.0.9:20000': contradicts", "derives dist_init_addr = '10.0.0.1:20000'"]),
    ("tp_not_gpus_x_nodes", None, {"tp_size": 8},
     ["tp_size = 8 does not match gpu_ids", "x nnodes 2", "GPUs per node x nnodes = 16"]),
]


@pytest.mark.parametrize("group, changes, expected", [c[1:] for c in INVALID_NODE_GROUP],
                         ids=[c[0] for c in INVALID_NODE_GROUP])
def test_invalid_node_group(ct200_data, group, changes, expected):
    data = {**ct200_data, "tp_size": 16, "node_group": dict(GROUP) if group is None else group, **changes}
    with pytest.raises(S.SpecError) as e:
        S.build_spec("ct200", data, environ=ENV, addresses=ADDRESSES)
    check_message(str(e.value), "ct200", expected)


def test_only_rank0_of_a_node_group_joins_a_router(ct200_data):
    router = {"router_url": "http://10.0.0.9:30000"}
    rank0 = group_spec(ct200_data, **router, worker_url="http://10.0.0.1:30000")
    assert rank0.router_url == "http://10.0.0.9:30000"  # rank 0 registers the group as one worker
    with pytest.raises(S.SpecError) as e:
        group_spec(ct200_data, name="ct201", **router, worker_url="http://10.0.0.2:30000")
    check_message(str(e.value), "ct201", ["router_url = 'http://10.0.0.9:30000'", "node_rank 1 of a 2-node group",
                                          "serves no HTTP", "set router_url and worker_url on rank 0 only"])


def write_group_inventory(tmp_path: Path, hosts: str, group: str = "") -> Path:
    """Sandbox hosts (group_data/sandbox.py applies) plus, after them, a group with node_group data."""
    return write_sandbox_inventory(tmp_path, hosts + group)


GROUP_HOSTS = """
sandbox = [
    ("sb1", {"ssh_hostname": "10.77.0.11"}),
    ("sb2", {"ssh_hostname": "10.77.0.12"}),
]
"""
TP16 = """
tp16 = (["sb1", "sb2"], {"node_group": {"hosts": ["sb1", "sb2"], "dist_init_port": 20000}, "tp_size": 16})
"""


def test_validate_inventory_node_group(tmp_path):
    inventory = load_inventory(write_group_inventory(tmp_path, GROUP_HOSTS, TP16))
    specs = S.validate_inventory(inventory)
    assert [(s.host_name, s.node_rank, s.dist_init_addr) for s in S.node_groups(specs)["sb1+sb2"]] == [
        ("sb1", 0, "10.77.0.11:20000"), ("sb2", 1, "10.77.0.11:20000")]


def invalid_inventory(tmp_path, text: str, limit: list[str] | None = None) -> str:
    folder = tmp_path / f"inventory{len(list(tmp_path.iterdir()))}"  # a new file each time (pyinfra caches by path)
    folder.mkdir()
    inventory = load_inventory(write_sandbox_inventory(folder, text))
    if limit:
        State(inventory, Config(), initial_limit=[inventory.get_host(name) for name in limit])
    with pytest.raises(S.SpecError) as e:
        S.validate_inventory(inventory)
    msg = str(e.value)
    assert msg.splitlines()[0].startswith("invalid settings for ")
    return msg


def test_node_group_ranks_need_the_same_gpu_count(tmp_path):
    msg = invalid_inventory(tmp_path, GROUP_HOSTS.replace('"10.77.0.12"}', '"10.77.0.12", "gpu_ids": [0, 1, 2, 3]}')
                            + TP16.replace('"tp_size": 16', '"tp_size": None'))
    assert "sb2: gpu_ids = [0, 1, 2, 3] (4 GPUs): rank 0 (sb1) of node group 'sb1+sb2' uses 8" in msg, msg
    assert "allowed: 8 GPUs on every rank" in msg


def test_node_group_must_be_the_same_on_every_rank(tmp_path):
    hosts = GROUP_HOSTS.replace(
        '"10.77.0.12"}', '"10.77.0.12", "node_group": {"hosts": ["sb1", "sb2"], "dist_init_port": 20001}}')
    msg = invalid_inventory(tmp_path, hosts + TP16)
    assert "sb2: node_group = {'hosts': ['sb1', 'sb2'], 'dist_init_port': 20001}" in msg, msg
    assert "differs from sb1's" in msg and "set it once, in the group's data" in msg


def test_node_group_host_not_in_inventory(tmp_path):
    msg = invalid_inventory(tmp_path, GROUP_HOSTS + TP16.replace('"hosts": ["sb1", "sb2"]', '"hosts": ["sb1", "sb2", "sb3"]')
                            .replace('"tp_size": 16', '"tp_size": 24'))
    assert "sb1: node_group.hosts = ['sb1', 'sb2', 'sb3']: rank 2 'sb3' is not a host of the inventory" in msg, msg
    assert "allowed: the inventory's host names (sb1, sb2)" in msg


def test_node_group_is_targeted_whole(tmp_path):
    msg = invalid_inventory(tmp_path, GROUP_HOSTS + TP16, limit=["sb1"])
    assert "sb1: node group 'sb1+sb2': rank 1 (sb2) is not targeted (--limit)" in msg, msg
    assert "target all of its hosts or none" in msg


def test_node_group_lists_a_host_without_it(tmp_path):
    text = GROUP_HOSTS + TP16.replace('(["sb1", "sb2"],', '(["sb1"],')
    msg = invalid_inventory(tmp_path, text)
    assert "sb2: node_group = None: node group 'sb1+sb2' lists sb2 as rank 1" in msg, msg


PLAIN = """
sandbox = [
    ("sb1", {"ssh_hostname": "10.77.0.11", "tp_size": 16, "nnodes": 2, "node_rank": 0, "dist_init_addr": "10.77.0.11:20000"}),
    ("sb2", {"ssh_hostname": "10.77.0.12", "tp_size": 16, "nnodes": 2, "node_rank": 1, "dist_init_addr": "10.77.0.11:20000"}),
]
"""


def test_plain_fields_form_a_group_too(tmp_path):
    specs = S.validate_inventory(load_inventory(write_sandbox_inventory(tmp_path, PLAIN)))
    assert [s.host_name for s in S.node_groups(specs)["10.77.0.11:20000"]] == ["sb1", "sb2"]


def test_plain_fields_each_rank_exactly_once(tmp_path):
    msg = invalid_inventory(tmp_path, PLAIN.replace('"node_rank": 1', '"node_rank": 0'))
    assert "sb2: node_rank = 0: sb1 has node_rank 0 too in the group at dist_init_addr '10.77.0.11:20000'" in msg, msg
    assert "sb1: dist_init_addr = '10.77.0.11:20000': no targeted host has node_rank 1 of nnodes = 2" in msg
    assert "allowed: each rank 0..1" in msg


def test_plain_fields_same_nnodes_and_model(tmp_path):
    text = PLAIN.replace('"tp_size": 16, "nnodes": 2, "node_rank": 1', '"tp_size": 24, "nnodes": 3, "node_rank": 1')
    msg = invalid_inventory(tmp_path, text)
    assert "sb1: nnodes = 2: other hosts with dist_init_addr '10.77.0.11:20000' say nnodes = 3" in msg, msg
    assert "sb2: tp_size = 24: rank 0 (sb1) of node group 'at 10.77.0.11:20000' has tp_size 16" in msg
    text = PLAIN.replace('"node_rank": 1,', '"node_rank": 1, "model": "kimi-k2.6",')
    msg = invalid_inventory(tmp_path, text)
    assert "sb2: model = 'kimi-k2.6': rank 0 (sb1) of node group 'at 10.77.0.11:20000' runs 'sandbox-tiny'" in msg, msg


# ---------------------------------------------------------------- fleets: servers behind a router, router hosts

ROUTER = "http://10.0.0.9:30000"
WORKER = "http://10.0.0.5:30000"


def test_server_behind_a_router(ct200_data):
    spec = S.build_spec("ct200", dict(ct200_data, router_url=ROUTER + "/", worker_url=WORKER, drain_timeout_s=30,
                                      min_driver_version="570.86"), environ=ENV)
    assert (spec.role, spec.router_url, spec.worker_url, spec.drain_timeout_s) == ("server", ROUTER, WORKER, 30.0)
    assert spec.min_driver_version == "570.86"


FLEET_INVALID = [
    ("router_url_scheme", {"router_url": "10.0.0.9:30000", "worker_url": WORKER},
     ["router_url = '10.0.0.9:30000'", "http:// or https://"]),
    ("router_url_path", {"router_url": ROUTER + "/v1", "worker_url": WORKER},
     ["router_url = 'http://10.0.0.9:30000/v1'", "without a path"]),
    ("router_url_port", {"router_url": "http://10.0.0.9:99999", "worker_url": WORKER},
     ["router_url = 'http://10.0.0.9:99999'", "invalid port", "1..65535"]),
    ("worker_url_missing", {"router_url": ROUTER}, ["worker_url = None: required when router_url", "e.g. 'http://"]),
    ("worker_url_port", {"router_url": ROUTER, "worker_url": "http://10.0.0.5:8000"},
     ["worker_url = 'http://10.0.0.5:8000'", "port 8000 is not listen_port 30000"]),
    ("drain_timeout_zero", {"drain_timeout_s": 0}, ["drain_timeout_s = 0", "greater than 0", "> 0"]),
    ("min_driver_text", {"min_driver_version": "latest"}, ["min_driver_version = 'latest'", "e.g. '570.86'"]),
    ("role_unknown", {"role": "gateway"}, ["role = 'gateway'", "'server'", "'router'"]),
    ("router_key_on_server", {"router_policy": "random"},
     ["router_policy = 'random'", "a router setting, for router hosts only", "role = 'router'"]),
]


@pytest.mark.parametrize("changes, expected", [c[1:] for c in FLEET_INVALID], ids=[c[0] for c in FLEET_INVALID])
def test_invalid_fleet_settings(ct200_data, changes, expected):
    with pytest.raises(S.SpecError) as e:
        S.build_spec("ct200", dict(ct200_data, **changes), environ=ENV)
    check_message(str(e.value), "ct200", expected)


def test_router_host_ignores_server_keys(ct200_data):
    spec = S.build_spec("r1", dict(ct200_data, role="router", router_url=ROUTER, ssh_hostname="10.0.0.9"), environ=ENV)
    assert isinstance(spec, S.RouterSpec)
    assert (spec.router_package, spec.router_policy, spec.router_listen_port) == ("sglang-router==0.3.2", "round_robin", 30000)
    assert (spec.router_prometheus_host, spec.router_prometheus_port) == ("127.0.0.1", 29000)
    assert spec.is_multinode is False and spec.group_key is None


def test_router_defaults_match_group_data_routers():
    source = (REPO / "group_data" / "routers.py").read_text()
    values = {node.targets[0].id: ast.literal_eval(node.value) for node in ast.parse(source).body
              if isinstance(node, ast.Assign)}
    assert set(values) == set(S.RouterSettings.model_fields) - {"venv_python", "get_pip_url", "pip_wheel"}
    for key, value in values.items():
        field = S.RouterSettings.model_fields[key]
        if not field.is_required():
            assert value == field.get_default(call_default_factory=True), key


ROUTER_INVALID = [
    ("policy", {"router_policy": "fastest"}, ["router_policy = 'fastest'", "'round_robin'", "'cache_aware'"]),
    ("package_unpinned", {"router_package": "sglang-router"}, ["router_package = 'sglang-router'", "not pinned"]),
    ("package_garbage", {"router_package": "sglang-router=="}, ["router_package = 'sglang-router=='", "not a pip requirement"]),
    ("managed_flag", {"router_extra_args": ["--port", "8000"]},
     ["router_extra_args = ['--port', '8000']", "--port is set by router_listen_port"]),
    ("worker_urls_flag", {"router_extra_args": ["--worker-urls", WORKER]}, ["--worker-urls is set by", "/workers API"]),
    ("same_ports", {"router_prometheus_port": 30000}, ["router_prometheus_port = 30000", "same port as router_listen_port"]),
    ("port_range", {"router_listen_port": 0}, ["router_listen_port = 0", "1..65535"]),
    ("listen_host", {"router_listen_host": "not a host"}, ["router_listen_host = 'not a host'", "IP address or hostname"]),
    ("venv_relative", {"router_venv_path": "venv"}, ["router_venv_path = 'venv'", "absolute path"]),
    ("module", {"router_module": "sglang_router/launch_router.py"}, ["router_module = ", "dotted Python module"]),
    ("unit", {"router_unit_name": "router"}, ["router_unit_name = 'router'", "ending in '.service'"]),
    ("readiness", {"router_readiness_timeout_s": -1}, ["router_readiness_timeout_s = -1", "greater than 0"]),
    ("router_url", {"router_url": "ftp://x"}, ["router_url = 'ftp://x'", "http:// or https://"]),
    ("typo", {"router_polcy": "random"}, ["router_polcy = 'random'", "did you mean 'router_policy'", "allowed for a router host"]),
    ("literal_secret", {"api_key": KEY}, ["api_key = <hidden>", "literal secret"]),
]


@pytest.mark.parametrize("changes, expected", [c[1:] for c in ROUTER_INVALID], ids=[c[0] for c in ROUTER_INVALID])
def test_invalid_router_settings(changes, expected):
    with pytest.raises(S.SpecError) as e:
        S.build_spec("r1", {"role": "router", **changes}, environ=ENV)
    check_message(str(e.value), "r1", expected)


# (id, changes, environ, substrings)
ROUTER_KEY_INVALID = [
    ("key_unset", {}, {}, ["api_key_env = 'SGLANG_API_KEY'", "SGLANG_API_KEY is not set",
                           "set api_key_env = None to run the router without a key"]),
    ("key_is_a_secret", {"api_key_env": KEY}, ENV, ["api_key_env = <hidden>", "NAME of an environment variable"]),
    ("key_with_space", {}, {"SGLANG_API_KEY": "sk two words"},
     ["the value of SGLANG_API_KEY holds spaces", "printable ASCII characters without spaces"]),
    ("key_other_module", {"router_module": "smg.launch"}, ENV,
     ["router_module = 'smg.launch'", "through our launcher", "or api_key_env = None"]),
]


@pytest.mark.parametrize("changes, environ, expected", [c[1:] for c in ROUTER_KEY_INVALID],
                         ids=[c[0] for c in ROUTER_KEY_INVALID])
def test_invalid_router_key(changes, environ, expected):
    with pytest.raises(S.SpecError) as e:
        S.build_spec("r1", {"role": "router", "router_url": ROUTER, **changes}, environ=environ)
    check_message(str(e.value), "r1", expected)
    assert KEY not in str(e.value)


def test_router_key_reaches_the_router_through_a_root_only_file_not_argv():
    keyed = S.build_spec("r1", {"role": "router", "router_url": ROUTER}, environ=ENV)
    assert keyed.router_argv[:5] == ["/opt/sglang-router/venv/bin/python", S.ROUTER_LAUNCHER,
                                     "--auth-file", "/etc/sglang/sglang-router.auth", "--"]
    assert keyed.router_argv[5:7] == ["--host", "0.0.0.0"]
    assert KEY not in " ".join(keyed.router_argv)
    assert keyed.auth_header() == f"Authorization: Bearer {KEY}\n"
    assert KEY not in repr(keyed)
    # without a key: the router's own module, no launcher, no file
    open_router = S.build_spec("r1", {"role": "router", "router_url": ROUTER, "api_key_env": None}, environ={})
    assert open_router.router_argv[1:3] == ["-m", "sglang_router.launch_router"]
    assert open_router.auth_header() == ""
    optional = S.build_spec("r1", {"role": "router", "api_key_required": False}, environ={})
    assert optional.api_key is None


def _router_and_server(ct200_data, router_environ, server_environ, **server_changes):
    router = S.build_spec("r1", {"role": "router", "router_url": ROUTER, "api_key_required": False},
                          environ=router_environ)
    server = S.build_spec("ct200", dict(ct200_data, router_url=ROUTER, worker_url=WORKER, api_key_required=False,
                                        **server_changes), environ=server_environ)
    return {"r1": router, "ct200": server}


@pytest.mark.parametrize("router_environ, server_environ, expected", [
    ({}, ENV, "this server demands an API key but its router r1 at http://10.0.0.9:30000 runs without one"),
    (ENV, {}, "its router r1 at http://10.0.0.9:30000 demands an API key (its api_key_env = 'SGLANG_API_KEY') "
              "and this server has none"),
    ({"SGLANG_API_KEY": "sk-other-key"}, ENV, "the key differs from the one of its router r1"),
], ids=["keyless_router", "keyless_server", "different_keys"])
def test_a_router_and_its_servers_share_one_key(ct200_data, router_environ, server_environ, expected):
    lines = S.router_key_problems(_router_and_server(ct200_data, router_environ, server_environ))
    assert len(lines) == 1
    check_message(lines[0], "ct200", [expected, "allowed: the same key on a router and its servers"])
    assert "sk-other-key" not in lines[0]


def test_same_key_or_none_on_router_and_servers_is_fine(ct200_data):
    assert S.router_key_problems(_router_and_server(ct200_data, ENV, ENV)) == []
    assert S.router_key_problems(_router_and_server(ct200_data, {}, {})) == []


def test_validate_inventory_checks_router_and_server_keys(tmp_path, monkeypatch):
    path = write_sandbox_inventory(tmp_path, f"""
        routers = [("r1", {{"ssh_hostname": "10.77.10.2", "router_url": "{ROUTER}", "api_key_env": None}})]
        sandbox = [("sb1", {{"ssh_hostname": "10.77.0.11", "router_url": "{ROUTER}", "worker_url": "{WORKER}"}})]
    """)
    monkeypatch.setenv("SGLANG_API_KEY", KEY)
    with pytest.raises(S.SpecError) as e:
        S.validate_inventory(load_inventory(path))
    msg = str(e.value)
    assert msg.splitlines()[0] == "invalid settings for 1 host(s): sb1"
    assert "sb1: api_key_env = 'SGLANG_API_KEY': this server demands an API key but its router r1" in msg
    monkeypatch.delenv("SGLANG_API_KEY")  # the sandbox servers then run without a key, like the router
    assert set(S.validate_inventory(load_inventory(path))) == {"r1", "sb1"}  # a fresh inventory: built afresh
