"""tasks/spec/: settings are typed and validated once, before any host is touched."""

from __future__ import annotations


import ast
import re
import shutil
import textwrap
from pathlib import Path

import pytest
import yaml

from core.render import render_options
from pydantic import ValidationError
from pyinfra.api import State
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory_from_files

from tasks import spec as S

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-test-secret-4242"
TOKEN = "hf_test_token_9191"
ENV = {"SGLANG_API_KEY": KEY, "HF_TOKEN": TOKEN}
ALL_GPUS = [0, 1, 2, 3, 4, 5, 6, 7]


def load_inventory(path: Path):
    """The inventory and group data exactly as the pyinfra CLI loads them."""
    with ctx_state.use(State()):
        return make_inventory_from_files(str(path), cwd=str(REPO))


@pytest.fixture(scope="module")
def ct200_data() -> dict:
    inventory = load_inventory(REPO / "inventory" / "ct200.py")
    return inventory.get_host("ct200").data.dict()


def write_sandbox_inventory(tmp_path: Path, hosts: str) -> Path:
    # The file's stem puts every host in group "sandbox": group_data/sandbox.py applies.
    path = tmp_path / "sandbox.py"
    path.write_text(textwrap.dedent(hosts))
    return path


@pytest.fixture
def sandbox_data(tmp_path) -> dict:
    path = write_sandbox_inventory(tmp_path, 'sandbox = [("sb1", {"ssh_hostname": "10.77.0.11", "ssh_port": 22})]\n')
    return load_inventory(path).get_host("sb1").data.dict()


@pytest.fixture
def models_dir(tmp_path) -> Path:
    """A copy of models/ plus an MHA profile, to edit freely."""
    out = tmp_path / "models"
    shutil.copytree(REPO / "models", out)
    mha = yaml.safe_load((out / "sandbox-tiny.yaml").read_text())
    mha.update(served_model_name="tiny-mha", attention="mha", quantization=None)
    (out / "tiny-mha.yaml").write_text(yaml.safe_dump(mha))
    return out


def edit_profile(models_dir: Path, name: str, **changes) -> None:
    path = models_dir / f"{name}.yaml"
    raw = yaml.safe_load(path.read_text())
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    path.write_text(yaml.safe_dump(raw))


# ---------------------------------------------------------------- valid settings


def test_ct200_builds(ct200_data):
    spec = S.build_spec("ct200", ct200_data, environ=ENV)
    assert spec.host_name == "ct200"
    assert spec.model == "kimi-k2.6"
    assert spec.profile.repo == "moonshotai/Kimi-K2.6"
    assert spec.profile.quantization.format == "pack-quantized"
    assert spec.profile.quantization.compressed_tensors_member == "pack_quantized"
    assert spec.profile.attention == "mla"
    assert spec.gpu_ids == ALL_GPUS
    assert spec.tp_size == 8
    assert spec.model_dir == "/srv/models/kimi-k2.6"
    assert spec.model_bytes == 595_000_000_000
    assert spec.margin_bytes == 50 * 10**9
    assert spec.unit_path == "/etc/systemd/system/sglang.service"
    assert spec.options_path == "/etc/sglang/sglang.yaml"
    assert spec.env_path == "/etc/sglang/sglang.env"
    # the venv of this package set: venv_path-envs/<12 hex digits of its inputs' digest>
    assert re.fullmatch(r"/opt/sglang/venv-envs/[0-9a-f]{12}/bin/python", spec.python_bin), spec.python_bin
    assert spec.compressed_tensors_hold == ["torch", "sglang", "flashinfer-python"]
    assert not spec.resolved


def test_ct200_argv(ct200_data):
    spec = S.build_spec("ct200", ct200_data, environ=ENV)
    argv = spec.server_argv
    assert argv[:3] == [spec.python_bin, "/usr/local/lib/sglang-converge/server_launch.py",
                        "sglang.launch_server"]
    joined = " ".join(argv)
    for part in (
        "--model-path /srv/models/kimi-k2.6",
        "--served-model-name kimi-k2.6",
        "--tp-size 8",
        "--attention-backend triton",
        "--host 0.0.0.0",
        "--port 30000",
        "--trust-remote-code",
        "--tool-call-parser kimi_k2",
        "--reasoning-parser kimi_k2",
    ):
        assert part in joined
    assert argv[-2:] == ["--config", "/etc/sglang/sglang.yaml"]
    assert KEY not in joined and "--api-key" not in argv
    assert "--nnodes" not in argv


def test_ct200_secrets(ct200_data):
    spec = S.build_spec("ct200", ct200_data, environ=ENV)
    assert spec.server_options == {"api-key": KEY}
    assert yaml.safe_load(render_options(spec.server_options)) == {"api-key": KEY}  # the file production writes
    assert spec.api_key.get_secret_value() == KEY
    assert spec.hf_token.get_secret_value() == TOKEN
    for text in (repr(spec), str(spec), repr(spec.resolve("12.0", True))):
        assert KEY not in text and TOKEN not in text


def test_ct200_unit_env(ct200_data):
    env = S.build_spec("ct200", ct200_data, environ=ENV).unit_env
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["NCCL_IB_DISABLE"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert "NCCL_SHM_DISABLE" not in env
    assert all(isinstance(v, str) for v in env.values())
    assert KEY not in env.values() and TOKEN not in env.values()


def test_sandbox_builds(sandbox_data):
    assert sandbox_data["ssh_port"] == 22  # pyinfra's keys pass through untouched
    spec = S.build_spec("sb1", sandbox_data, environ={})
    assert spec.profile.quantization.format == "pack-quantized"  # Kimi K2.6's INT4
    assert spec.profile.quantization.compressed_tensors_min_version == "0.4.0"
    assert spec.model_dir == "/srv/models/tiny"
    assert spec.server_module == "sglang_standin"
    assert spec.attention_backend == "auto"
    assert spec.tp_size == 8 and spec.gpu_ids == ALL_GPUS
    assert spec.readiness_timeout_s < 3600
    assert spec.unit_env["PYTHONPATH"] == "/usr/local/lib/sandbox-gpu"
    # api_key_required = False: no key exported -> served without one, no options file
    assert spec.api_key is None and spec.server_options == {}
    assert "--config" not in spec.server_argv
    assert "--attention-backend" not in spec.server_argv  # unresolved auto: SGLang chooses
    resolved = spec.resolve("12.0", True)
    assert resolved.server_argv[:3] == [spec.python_bin, "/usr/local/lib/sglang-converge/server_launch.py",
                                        "sglang_standin"]
    assert "--attention-backend triton" in " ".join(resolved.server_argv)


def test_sandbox_with_key(sandbox_data):
    spec = S.build_spec("sb1", sandbox_data, environ={"SGLANG_API_KEY": KEY})
    assert spec.server_options == {"api-key": KEY}
    assert spec.server_argv[-2:] == ["--config", "/etc/sglang/sglang.yaml"]
    assert KEY not in " ".join(spec.server_argv)


def test_pyinfra_keys_are_ignored(ct200_data):
    data = dict(ct200_data, _sudo=True, _env={"A": "b"}, ssh_port=2222, ssh_key="/root/.ssh/id", fake_responses={})
    S.build_spec("ct200", data, environ=ENV)


def test_defaults_match_group_data_all():
    """group_data/all.py and HostSettings agree, and every key is documented there."""
    source = (REPO / "group_data" / "all.py").read_text()
    tree = ast.parse(source)
    values = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
    }
    assert not any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in tree.body)
    for key, field in S.HostSettings.model_fields.items():
        if field.is_required():
            assert f"#   {key}" in source, f"required key {key} undocumented in all.py"
            continue
        assert key in values, f"{key} has no default in group_data/all.py"
        default = field.get_default(call_default_factory=True)
        assert values[key] == default, key
    assert set(values) <= S.DATA_KEYS


def test_tp_size_derived(ct200_data):
    data = dict(ct200_data, tp_size=None, gpu_ids=[2, 3])
    spec = S.build_spec("ct200", data, environ=ENV)
    assert spec.tp_size == 2
    assert spec.unit_env["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_multinode(ct200_data):
    data = dict(ct200_data, tp_size=16, nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:20000", extra_env={})
    spec = S.build_spec("ct200", data, environ=ENV)
    assert spec.is_multinode
    joined = " ".join(spec.server_argv)
    assert "--tp-size 16" in joined
    assert "--nnodes 2 --node-rank 1 --dist-init-addr 10.0.0.1:20000" in joined
    assert "NCCL_IB_DISABLE" not in spec.resolve("12.0", True).unit_env  # IB is wanted across nodes


def test_unit_name_paths(ct200_data):
    spec = S.build_spec("ct200", dict(ct200_data, unit_name="sglang-kimi@0.service"), environ=ENV)
    assert spec.unit_path == "/etc/systemd/system/sglang-kimi@0.service"
    assert spec.options_path == "/etc/sglang/sglang-kimi@0.yaml"
    assert spec.env_path == "/etc/sglang/sglang-kimi@0.env"


def test_spec_is_frozen(ct200_data):
    spec = S.build_spec("ct200", ct200_data, environ=ENV)
    with pytest.raises(ValidationError, match="frozen"):
        spec.tp_size = 4


# ---------------------------------------------------------------- host-dependent resolution


@pytest.mark.parametrize(
    "compute_cap, model, requested, expected",
    [
        ("12.0", "sandbox-tiny", "auto", "triton"),  # SM120 MLA
        ("12.0", "tiny-mha", "auto", "flashinfer"),  # SM120 MHA
        ("9.0", "sandbox-tiny", "auto", "fa3"),  # Hopper
        ("9.0", "tiny-mha", "auto", "fa3"),
        ("8.0", "sandbox-tiny", "auto", "triton"),  # fallback MLA
        ("8.6", "tiny-mha", "auto", "flashinfer"),  # fallback MHA
        ("10.0", "sandbox-tiny", "auto", "triton"),
        ("12.0", "sandbox-tiny", "triton", "triton"),  # explicit, compatible
        ("9.0", "sandbox-tiny", "fa3", "fa3"),
        ("10.0", "sandbox-tiny", "trtllm_mla", "trtllm_mla"),
    ],
)
def test_resolve_backend(sandbox_data, models_dir, compute_cap, model, requested, expected):
    data = dict(sandbox_data, model=model, attention_backend=requested)
    spec = S.build_spec("sb1", data, environ={}, models_dir=models_dir)
    resolved = spec.resolve(compute_cap, True)
    assert resolved.attention_backend == expected
    assert resolved.attention_backend_requested == requested
    assert resolved.compute_cap == compute_cap and resolved.resolved
    assert spec.attention_backend == requested  # the original is untouched


def test_resolve_again_uses_requested(sandbox_data):
    spec = S.build_spec("sb1", sandbox_data, environ={})
    assert spec.resolve("12.0", True).resolve("9.0", True).attention_backend == "fa3"


@pytest.mark.parametrize(
    "compute_cap, backend, why",
    [
        ("12.0", "fa3", "SM>=80 and SM<=90"),
        ("10.0", "fa3", "SM>=80 and SM<=90"),
        ("12.0", "trtllm_mla", "SM120"),
        ("9.0", "trtllm_mla", "SM100"),
    ],
)
def test_resolve_refuses_backend_that_fails(ct200_data, compute_cap, backend, why):
    spec = S.build_spec("ct200", dict(ct200_data, attention_backend=backend), environ=ENV)
    with pytest.raises(S.SpecError) as e:
        spec.resolve(compute_cap, True)
    msg = str(e.value)
    assert msg.startswith("ct200: ")
    assert f"attention_backend = {backend!r}" in msg
    assert f"compute capability {compute_cap}" in msg and why in msg
    assert "allowed: 'auto'" in msg and f"'{backend}'," not in msg.split("allowed:")[1]


def test_resolve_bad_compute_cap(ct200_data):
    spec = S.build_spec("ct200", ct200_data, environ=ENV)
    with pytest.raises(S.SpecError, match=r"ct200: compute_cap = 'sm120': expected 'MAJOR.MINOR'"):
        spec.resolve("sm120", True)


def test_resolve_nccl_env(ct200_data):
    data = dict(ct200_data, extra_env={})
    spec = S.build_spec("ct200", data, environ=ENV)
    p2p = spec.resolve("12.0", True).unit_env
    assert "NCCL_P2P_LEVEL" not in p2p and "NCCL_P2P_DISABLE" not in p2p  # P2P OK: NCCL picks the level
    assert p2p["SGLANG_ENABLE_JIT_DEEPGEMM"] == "0"
    no_p2p = spec.resolve("12.0", False).unit_env
    assert no_p2p["NCCL_P2P_DISABLE"] == "1" and "NCCL_P2P_LEVEL" not in no_p2p
    for env in (p2p, no_p2p):
        assert "NCCL_SHM_DISABLE" not in env
    hopper = spec.resolve("9.0", True).unit_env
    assert "SGLANG_ENABLE_JIT_DEEPGEMM" not in hopper
    assert "NCCL_P2P_LEVEL" not in spec.unit_env  # unresolved: no P2P guess


def test_resolve_explicit_env_wins(ct200_data):
    data = dict(ct200_data, extra_env={"NCCL_P2P_DISABLE": "1", "SGLANG_ENABLE_JIT_DEEPGEMM": "1"})
    env = S.build_spec("ct200", data, environ=ENV).resolve("12.0", True).unit_env
    assert env["NCCL_P2P_DISABLE"] == "1" and "NCCL_P2P_LEVEL" not in env
    assert env["SGLANG_ENABLE_JIT_DEEPGEMM"] == "1"


def test_resolve_single_gpu_has_no_p2p_env(ct200_data):
    data = dict(ct200_data, gpu_ids=[3], tp_size=1, extra_env={})
    env = S.build_spec("ct200", data, environ=ENV).resolve("12.0", False).unit_env
    assert "NCCL_P2P_DISABLE" not in env and "NCCL_P2P_LEVEL" not in env


# ---------------------------------------------------------------- invalid settings

# (id, changes to ct200's data (None removes a key), environ, substrings the message must hold)
INVALID = [
    ("tp_size_mismatch", {"tp_size": 4}, ENV,
     ["tp_size = 4 does not match gpu_ids [0, 1, 2, 3, 4, 5, 6, 7] (8 GPUs)", "tp_size must equal the number of GPUs"]),
    ("tp_size_bool", {"tp_size": True}, ENV, ["tp_size = True", "valid integer", "an integer >= 1"]),
    ("tp_size_string", {"tp_size": "8"}, ENV, ["tp_size = '8'", "valid integer", "an integer >= 1"]),
    ("backend_unknown", {"attention_backend": "tritonn"}, ENV,
     ["attention_backend = 'tritonn'", "did you mean 'triton'", "allowed: 'auto', 'triton'", "'flashinfer'"]),
    ("port_zero", {"listen_port": 0}, ENV, ["listen_port = 0", "greater than or equal to 1", "1..65535"]),
    ("port_big", {"listen_port": 70000}, ENV, ["listen_port = 70000", "less than or equal to 65535", "1..65535"]),
    ("port_text", {"listen_port": "abc"}, ENV, ["listen_port = 'abc'", "valid integer", "1..65535"]),
    ("listen_host", {"listen_host": "not a host!"}, ENV, ["listen_host = 'not a host!'", "IP address or hostname"]),
    ("model_dir_relative", {"model_dir": "models/kimi"}, ENV, ["model_dir = 'models/kimi'", "absolute path"]),
    ("venv_path_relative", {"venv_path": "venv"}, ENV, ["venv_path = 'venv'", "absolute path"]),
    ("venv_python_relative", {"venv_python": "python3"}, ENV, ["venv_python = 'python3'", "absolute path"]),
    ("inline_api_key", {"api_key": KEY}, ENV, ["api_key = <hidden>", "literal secret", "set api_key_env to the NAME"]),
    ("inline_hf_token", {"hf_token": TOKEN}, ENV, ["hf_token = <hidden>", "set hf_token_env"]),
    ("api_key_env_is_a_key", {"api_key_env": KEY}, ENV, ["api_key_env = <hidden>", "NAME of an environment variable"]),
    ("api_key_env_missing", {}, {"HF_TOKEN": TOKEN},
     ["api_key_env = 'SGLANG_API_KEY'", "SGLANG_API_KEY is not set", "export SGLANG_API_KEY", "api_key_env = None"]),
    ("margin_negative", {"size_margin_gb": -1}, ENV, ["size_margin_gb = -1", "greater than or equal to 0", ">= 0"]),
    ("nnodes_zero", {"nnodes": 0}, ENV, ["nnodes = 0", "greater than or equal to 1"]),
    ("multinode_no_addr", {"nnodes": 2, "tp_size": 16}, ENV,
     ["dist_init_addr = None: required when nnodes = 2", "'host:port' of rank 0"]),
    ("multinode_tp", {"nnodes": 2, "tp_size": 8, "dist_init_addr": "10.0.0.1:20000"}, ENV,
     ["tp_size = 8 does not match", "x nnodes 2", "GPUs per node x nnodes = 16"]),
    ("node_rank_out_of_range", {"nnodes": 2, "node_rank": 2, "tp_size": 16, "dist_init_addr": "h:1"}, ENV,
     ["node_rank = 2 is out of range for nnodes = 2", "allowed: 0..1"]),
    ("dist_addr_no_port", {"dist_init_addr": "10.0.0.1"}, ENV, ["dist_init_addr = '10.0.0.1'", "'host:port'"]),
    ("dist_addr_bad_port", {"dist_init_addr": "10.0.0.1:99999"}, ENV, ["dist_init_addr = '10.0.0.1:99999'", "1..65535"]),
    ("gpu_ids_duplicate", {"gpu_ids": [0, 1, 1], "tp_size": 3}, ENV,
     ["gpu_ids = [0, 1, 1]", "GPU 1 listed twice", "may appear once"]),
    ("gpu_id_negative", {"gpu_ids": [0, -1], "tp_size": 2}, ENV, ["gpu_ids[1] = -1", "greater than or equal to 0", ">= 0"]),
    ("gpu_ids_empty", {"gpu_ids": [], "tp_size": None}, ENV, ["gpu_ids = []", "at least one GPU"]),
    ("gpu_ids_string", {"gpu_ids": "0,1"}, ENV, ["gpu_ids = '0,1'", "valid list", "distinct GPU indexes"]),
    ("gpu_ids_missing", {"gpu_ids": None}, ENV, ["gpu_ids is required", "distinct GPU indexes"]),
    ("unit_no_suffix", {"unit_name": "sglang"}, ENV, ["unit_name = 'sglang'", "ending in '.service'"]),
    ("unit_slash", {"unit_name": "a/b.service"}, ENV, ["unit_name = 'a/b.service'", "no '/'"]),
    ("unit_protected", {"protect_units": ["sglang.service"]}, ENV,
     ["protect_units = ['sglang.service']", "our own unit_name 'sglang.service'"]),
    ("protect_unit_bad", {"protect_units": ["vllm"]}, ENV, ["protect_units = ['vllm']", "not a full systemd unit name"]),
    ("typo_key", {"tp_sise": 8}, ENV, ["tp_sise = 8", "unknown data key", "did you mean 'tp_size'", "allowed: "]),
    ("profile_key_in_data", {"revision": "main"}, ENV, ["revision = 'main'", "model profile key", "models/<model>.yaml"]),
    ("model_unknown", {"model": "kimi"}, ENV, ["model = 'kimi'", "not a model profile", "allowed: kimi-k2.6, sandbox-real-llama-ct, sandbox-real-smollm2,"]),
    ("model_missing", {"model": None}, ENV, ["model is required", "models/<model>.yaml"]),
    ("stale_policy", {"stale_policy": "kill"}, ENV, ["stale_policy = 'kill'", "'stop', 'fail' or 'ignore'"]),
    ("stale_grace_negative", {"stale_grace_s": -1}, ENV, ["stale_grace_s = -1", ">= 0"]),
    ("readiness_negative", {"readiness_timeout_s": -5}, ENV, ["readiness_timeout_s = -5", "greater than 0", "> 0"]),
    ("readiness_zero", {"readiness_timeout_s": 0}, ENV, ["readiness_timeout_s = 0", "greater than 0"]),
    ("package_unpinned", {"packages": ["sglang"]}, ENV, ["packages[0] = 'sglang'", "not pinned", "'name==version'"]),
    ("package_range", {"packages": ["torch", "sglang>=0.5"]}, ENV,
     ["packages[0] = 'torch'", "packages[1] = 'sglang>=0.5'", "not pinned"]),
    ("package_wildcard", {"packages": ["sglang==0.5.*"]}, ENV, ["packages[0] = 'sglang==0.5.*'", "not pinned"]),
    ("package_garbage", {"packages": ["sglang=="]}, ENV, ["packages[0] = 'sglang=='", "not a pip requirement"]),
    ("env_not_string", {"extra_env": {"NCCL_P2P_DISABLE": 1}}, ENV,
     ["extra_env['NCCL_P2P_DISABLE'] = 1", "must be strings", "write '1'"]),
    ("env_shm_disable", {"extra_env": {"NCCL_SHM_DISABLE": "1"}}, ENV,
     ["extra_env['NCCL_SHM_DISABLE'] = '1'", "not allowed", "fallback transport when P2P is off"]),
    ("env_cuda_visible", {"extra_env": {"CUDA_VISIBLE_DEVICES": "0"}}, ENV,
     ["extra_env['CUDA_VISIBLE_DEVICES'] = '0'", "set gpu_ids"]),
    ("env_hf_token", {"extra_env": {"HF_TOKEN": TOKEN}}, ENV, ["extra_env['HF_TOKEN'] = <hidden>", "hf_token_env"]),
    ("env_bad_name", {"extra_env": {"A-B": "1"}}, ENV, ["extra_env key 'A-B'", "environment variable name"]),
    ("env_not_dict", {"extra_env": ["NCCL_IB_DISABLE=1"]}, ENV, ["extra_env = ['NCCL_IB_DISABLE=1']", "valid dictionary"]),
    ("args_managed_flag", {"extra_server_args": ["--tp-size", "4"]}, ENV,
     ["extra_server_args = ['--tp-size', '4']", "--tp-size is set by tp_size"]),
    ("args_api_key", {"extra_server_args": ["--api-key", KEY]}, ENV,
     ["extra_server_args = ['--api-key', '<hidden>']", "set api_key_env"]),
    ("args_api_key_eq", {"extra_server_args": [f"--api-key={KEY}"]}, ENV,
     ["extra_server_args = ['--api-key=<hidden>']", "set api_key_env"]),
    ("args_not_strings", {"extra_server_args": ["--context-length", 131072]}, ENV,
     ["extra_server_args[1] = 131072", "valid string"]),
    ("hf_endpoint_scheme", {"hf_endpoint": "ftp://mirror"}, ENV, ["hf_endpoint = 'ftp://mirror'", "http:// or https://"]),
    ("get_pip_url", {"get_pip_url": "bootstrap.pypa.io/get-pip.py"}, ENV,
     ["get_pip_url = 'bootstrap.pypa.io/get-pip.py'", "http:// or https://"]),
    ("pip_wheel_missing", {"pip_wheel": "/nonexistent/pip-26.3-py3-none-any.whl"}, ENV,
     ["pip_wheel = '/nonexistent/pip-26.3-py3-none-any.whl'", "no such file on the controller"]),
    ("pip_wheel_not_pip", {"pip_wheel": "/tmp/torch.whl"}, ENV, ["pip_wheel = '/tmp/torch.whl'", "pip-<version>"]),
    ("server_module", {"server_module": "sglang/launch_server.py"}, ENV,
     ["server_module = 'sglang/launch_server.py'", "dotted Python module"]),
    ("hold_compressed_tensors", {"compressed_tensors_hold": ["torch", "compressed-tensors"]}, ENV,
     ["compressed_tensors_hold = ['torch', 'compressed-tensors']", "cannot hold compressed-tensors"]),
    ("allow_conflicts_bad_name", {"compressed_tensors_allow_conflicts": ["vllm==0.6.5"]}, ENV,
     ["compressed_tensors_allow_conflicts = ['vllm==0.6.5']", "not a package name"]),
    ("mla_only_backend_on_mha", {"model": "tiny-mha", "attention_backend": "flashmla"}, ENV,
     ["attention_backend = 'flashmla'", "only MLA", "uses mha", "allowed: 'auto'"]),
    ("mha_only_backend_on_mla", {"attention_backend": "trtllm_mha"}, ENV,
     ["attention_backend = 'trtllm_mha'", "only MHA", "uses mla"]),
]

# (id, changes to models/kimi-k2.6.yaml (None removes a key), substrings)
INVALID_PROFILE = [
    ("revision_branch", {"revision": "main"}, ["revision = 'main'", "40 lowercase hex", "'main' moves"]),
    ("revision_short", {"revision": "3f1c2a9"}, ["revision = '3f1c2a9'", "40 lowercase hex"]),
    ("revision_upper", {"revision": "3F1C2A9B8D7E6F5A4B3C2D1E0F9A8B7C6D5E4F3A"}, ["revision = '3F1C", "lowercase hex"]),
    ("repo_no_org", {"repo": "Kimi-K2.6"}, ["repo = 'Kimi-K2.6'", "'org/name'"]),
    ("repo_url", {"repo": "https://huggingface.co/moonshotai/Kimi-K2.6"}, ["repo = 'https://", "'org/name'"]),
    ("attention_type", {"attention": "gqa"}, ["attention = 'gqa'", "'mla' or 'mha'"]),
    ("size_zero", {"size_bytes": 0}, ["size_bytes = 0", "greater than 0"]),
    ("quant_format", {"quantization": {"quant_method": "compressed-tensors", "format": "nvfp5-pack-quantized"}},
     ["quantization.format = 'nvfp5-pack-quantized'", "CompressionFormat", "nvfp4-pack-quantized"]),
    ("quant_extra_key", {"quantization": {"quant_method": "compressed-tensors", "format": "pack-quantized", "bits": 4}},
     ["quantization.bits is not a known key", "allowed: quant_method, format"]),
    ("profile_typo", {"revison": "x"}, ["revison is not a known key", "did you mean 'revision'"]),
    ("profile_missing_revision", {"revision": None}, ["revision is required", "40 lowercase hex"]),
    ("profile_managed_arg", {"extra_server_args": ["--port", "8000"]}, ["extra_server_args = ['--port', '8000']", "listen_port"]),
    ("trust_remote_code_text", {"trust_remote_code": "yes"}, ["trust_remote_code = 'yes'", "valid boolean"]),
]


def check_message(msg: str, host: str, expected: list[str]) -> None:
    for line in msg.splitlines():
        assert line.startswith(f"{host}: "), line
    for part in expected:
        assert part in msg, f"{part!r} not in:\n{msg}"
    assert KEY not in msg and TOKEN not in msg


@pytest.mark.parametrize("changes, environ, expected", [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_settings(ct200_data, models_dir, changes, environ, expected):
    data = dict(ct200_data)
    for key, value in changes.items():
        if value is None and key in ("gpu_ids", "model"):
            data.pop(key)
        else:
            data[key] = value
    with pytest.raises(S.SpecError) as e:
        S.build_spec("ct200", data, environ=environ, models_dir=models_dir)
    check_message(str(e.value), "ct200", expected)


@pytest.mark.parametrize("changes, expected", [c[1:] for c in INVALID_PROFILE], ids=[c[0] for c in INVALID_PROFILE])
def test_invalid_profile(ct200_data, models_dir, changes, expected):
    edit_profile(models_dir, "kimi-k2.6", **changes)
    with pytest.raises(S.SpecError) as e:
        S.build_spec("ct200", ct200_data, environ=ENV, models_dir=models_dir)
    msg = str(e.value)
    check_message(msg, "ct200", expected)
    assert "model 'kimi-k2.6' (kimi-k2.6.yaml)" in msg


def test_profile_not_yaml_mapping(ct200_data, models_dir):
    (models_dir / "kimi-k2.6.yaml").write_text("- just\n- a list\n")
    with pytest.raises(S.SpecError, match=r"ct200: model 'kimi-k2.6' \(kimi-k2.6.yaml\): must be a YAML mapping"):
        S.build_spec("ct200", ct200_data, environ=ENV, models_dir=models_dir)


def test_all_errors_of_a_host_in_one_message(ct200_data):
    data = dict(ct200_data, listen_port=0, venv_path="venv", tp_sise=8, api_key=KEY, stale_policy="kill")
    with pytest.raises(S.SpecError) as e:
        S.build_spec("ct200", data, environ=ENV)
    assert isinstance(e.value, PyinfraError)
    lines = e.value.lines
    assert len(lines) == 5, lines
    fields = ["listen_port", "venv_path", "tp_sise", "api_key", "stale_policy"]
    for field in fields:
        assert any(line.startswith(f"ct200: {field} ") for line in lines), field
    assert str(e.value) == "\n".join(lines)
