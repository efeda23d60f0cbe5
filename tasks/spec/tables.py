"""SGLang's (and its router's) tables that the settings are checked against."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, get_args

from core.paths import REMOTE_DIR

# SGLang's --attention-backend choices (union over recent releases; the
# service step still checks the final command line with the installed
# SGLang's own parser). "auto" is ours: resolved per host by Spec.resolve().
ATTENTION_BACKENDS: tuple[str, ...] = (
    "triton",
    "torch_native",
    "flex_attention",
    "dsa",
    "nsa",
    "dsv4",
    "cutlass_mla",
    "fa3",
    "fa4",
    "flashinfer",
    "flashmla",
    "trtllm_mla",
    "cutedsl_mla",
    "tokenspeed_mla",
    "trtllm_mha",
    "dual_chunk_flash_attn",
    "hpc_ops",
    "aiter",
    "wave",
    "intel_amx",
    "ascend",
    "intel_xpu",
)
# Backends that only implement MLA (DeepSeek/Kimi-style latent attention)
# or only MHA: a mismatch with the model's attention type is an error.
MLA_ONLY_BACKENDS = frozenset({"cutlass_mla", "flashmla", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla"})
MHA_ONLY_BACKENDS = frozenset({"trtllm_mha"})
# The NVIDIA backends offered (with "auto") when an explicit one fails on a GPU.
NVIDIA_BACKENDS: tuple[str, ...] = (
    "triton", "flashinfer", "fa3", "fa4", "flashmla", "cutlass_mla", "trtllm_mla", "trtllm_mha", "torch_native",
)  # fmt: skip

# "auto" resolution, by (compute capability major, attention type). Sources:
#  - SM120 (RTX PRO 6000 Blackwell): triton is SGLang's own choice for MLA
#    and works; fa3 fails; trtllm_mla prefill fails; flashinfer works for MHA.
#  - SM90 (Hopper): fa3 is SGLang's default there, for MLA and MHA.
# Anything else: triton for MLA (works everywhere), flashinfer for MHA
# (SGLang's default on non-Hopper GPUs).
AUTO_BACKEND: dict[tuple[int, str], str] = {
    (12, "mla"): "triton",
    (12, "mha"): "flashinfer",
    (9, "mla"): "fa3",
    (9, "mha"): "fa3",
}
AUTO_BACKEND_FALLBACK: dict[str, str] = {"mla": "triton", "mha": "flashinfer"}

ComputeCap = tuple[int, int]  # (major, minor)

# Explicit backends known to fail on some compute capabilities:
# backend -> (predicate on (major, minor), why).
BACKEND_SUPPORT: dict[str, tuple[Callable[[ComputeCap], bool], str]] = {
    "fa3": (
        lambda cc: (8, 0) <= cc <= (9, 0),
        "FlashAttention v3 Backend requires SM>=80 and SM<=90",
    ),
    "trtllm_mla": (
        lambda cc: cc[0] == 10,
        "TRT-LLM MLA needs Blackwell SM100; on SM120 its prefill fails",
    ),
}

# compressed-tensors CompressionFormat values (dash spelling, as in a model's
# config.json) -> first compressed-tensors release that has the member.
COMPRESSED_TENSORS_FORMATS: dict[str, str] = {
    "dense": "0.4.0",
    "int-quantized": "0.4.0",
    "pack-quantized": "0.4.0",
    "marlin-24": "0.4.0",
    "float-quantized": "0.5.0",
    "naive-quantized": "0.5.0",
    "sparse-24-bitmask": "0.9.0",
    "nvfp4-pack-quantized": "0.10.0",
    "mixed-precision": "0.11.0",
    "mxfp4-pack-quantized": "0.13.0",
    "mxfp8-quantized": "0.15.0",
}

# Speculative decoding algorithms a model profile's draft may name (SGLang's
# --speculative-algorithm): EAGLE3 draft models (e.g. AQ-MedAI/Kimi-K26-eagle3), a
# separate checkpoint downloaded beside the model. SGLang 0.5.23 knows more (EAGLE,
# NEXTN, NGRAM, STANDALONE, DFLASH, ...); they are refused until the deploy handles them.
SPECULATIVE_ALGORITHMS = ("EAGLE3",)

# Server flags that the spec itself sets: in extra_server_args they would
# contradict (or duplicate) a setting, so they are refused with the key to use.
MANAGED_FLAGS: dict[str, str] = {
    "--model-path": "model_dir",
    "--model": "model_dir",
    "--served-model-name": "the model profile's served_model_name",
    "--tp-size": "tp_size",
    "--tp": "tp_size",
    "--tensor-parallel-size": "tp_size",
    "--attention-backend": "attention_backend",
    "--host": "listen_host",
    "--port": "listen_port",
    "--trust-remote-code": "the model profile's trust_remote_code",
    "--nnodes": "nnodes",
    "--node-rank": "node_rank",
    "--dist-init-addr": "dist_init_addr",
    "--config": "(the spec writes the options file itself)",
    "--speculative-algorithm": "the model profile's draft.algorithm",
    "--speculative-draft-model-path": "draft_dir (where the model profile's draft is downloaded)",
    "--speculative-draft-model": "draft_dir (where the model profile's draft is downloaded)",
    "--speculative-num-steps": "the model profile's draft.num_steps",
    "--speculative-eagle-topk": "the model profile's draft.eagle_topk",
    "--speculative-num-draft-tokens": "the model profile's draft.num_draft_tokens",
}
# Flags whose value is a secret: refused in extra args, hidden in messages.
SECRET_FLAGS = frozenset({"--api-key", "--admin-api-key"})

# Environment variables extra_env may not set, and why.
FORBIDDEN_ENV: dict[str, str] = {
    "NCCL_SHM_DISABLE": (
        "shared memory is NCCL's fallback transport when P2P is off; disabling it "
        "too leaves only slow or hanging paths (P2P is handled by NCCL_P2P_DISABLE/"
        "NCCL_P2P_LEVEL, derived from the host's P2P topology)"
    ),
    "CUDA_VISIBLE_DEVICES": "it is derived from gpu_ids: set gpu_ids instead",
    "HF_TOKEN": "a secret never goes in the repo: set hf_token_env to the NAME of a controller environment variable",
    "HUGGING_FACE_HUB_TOKEN": "a secret never goes in the repo: set hf_token_env to the NAME of a controller environment variable",
}

# host.data keys that would hold a literal secret -> the key to use instead.
LITERAL_SECRET_KEYS: dict[str, str] = {
    "api_key": "api_key_env",
    "sglang_api_key": "api_key_env",
    "hf_token": "hf_token_env",
}

# Keys of pyinfra's own that live in host.data: connection settings and
# global operation arguments (_sudo, ...). They are not ours to validate.
IGNORED_PREFIXES = ("ssh_", "_")

# ---------------------------------------------------------------- SGLang's router

# The router module whose Python API our launcher (remote/router_launch.py) drives to give it the API key.
ROUTER_KEY_MODULE = "sglang_router.launch_router"
# Where the launcher is installed on a router host.
ROUTER_LAUNCHER = f"{REMOTE_DIR}/router_launch.py"

# SGLang router (sglang-router / smg) policies.
RouterPolicy = Literal["round_robin", "cache_aware", "random", "power_of_two"]
ROUTER_POLICIES: tuple[str, ...] = get_args(RouterPolicy)
# Router flags the router settings set: in router_extra_args they are refused.
ROUTER_MANAGED_FLAGS: dict[str, str] = {
    "--host": "router_listen_host",
    "--port": "router_listen_port",
    "--policy": "router_policy",
    "--prometheus-host": "router_prometheus_host",
    "--prometheus-port": "router_prometheus_port",
    "--worker-urls": "the servers' router_url/worker_url (they register through the router's /workers API)",
}
ROUTER_SECRET_FLAGS = frozenset({"--api-key"})

# ---------------------------------------------------------------- what the pinned stack needs of the host

# Requires-Python and the CUDA-relevant requirements of known pinned releases,
# as each release's metadata states them (PyPI: https://pypi.org/pypi/NAME/VERSION/json,
# info.requires_python and info.requires_dist; the same lines as the wheel's
# *.dist-info/METADATA, which is where these were read). A pin not listed here
# is not checked (the preflight says so) rather than guessed.
#   sglang 0.5.23 METADATA: Requires-Python: >=3.11; Requires-Dist: torch==2.14.1, nvidia-ml-py
#   torch 2.14.1 (manylinux_2_28_x86_64 wheel) METADATA: Requires-Python: >=3.10;
#     Requires-Dist: cuda-toolkit[...]==13.0.3, nvidia-nccl-cu13==2.30.7, nvidia-cudnn-cu13==9.24.0.43
#   torch 2.13.0+cpu (download.pytorch.org/whl/cpu): Requires-Python: >=3.10, no CUDA requirement
#   nvidia-ml-py 13.615.71: Requires-Python: none (pure Python)
PINNED_METADATA: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {
    ("sglang", "0.5.23"): (">=3.11", ("torch==2.14.1", "nvidia-ml-py")),
    ("torch", "2.14.1"): (">=3.10", ("cuda-toolkit==13.0.3", "nvidia-nccl-cu13==2.30.7", "nvidia-cudnn-cu13==9.24.0.43")),
    ("torch", "2.13.0+cpu"): (">=3.10", ()),
    ("nvidia-ml-py", "13.615.71"): ("", ()),
}

# CUDA major version -> the oldest NVIDIA driver (Linux) that runs it, with
# minor version compatibility: NVIDIA, "CUDA Compatibility", Table 1 "CUDA
# Toolkit 11.x, 12.x, and 13.x Minimum and Maximum Required Driver Versions"
# (https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html):
# CUDA 13.x >= 580, CUDA 12.x >= 525, CUDA 11.x >= 450.
CUDA_MIN_DRIVER: dict[int, str] = {13: "580", 12: "525", 11: "450"}
