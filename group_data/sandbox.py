# The local sandbox hosts (inventory/sandbox.py sets their ssh_* keys, the Hub
# stand-in's URL and the offline pip wheel): 8 simulated GPUs like ct200, the
# tiny model in Kimi K2.6's INT4 pack-quantized (models/sandbox-tiny.yaml; an
# NVFP4 one is models/sandbox-tiny-nvfp4.yaml), the SGLang stand-in run from
# the same kind of venv.
model = "sandbox-tiny"
gpu_ids = [0, 1, 2, 3, 4, 5, 6, 7]
tp_size = 8
attention_backend = "auto"   # exercises the resolution: SM120 + MLA -> triton
size_margin_gb = 0.005       # 5 MB: the model is ~40 MB, its disk a few tens of MB

# The venv holds what SGLang's real argument parser needs (the deploy checks a
# new command line with it, and the stand-in parses with it): the CPU torch
# that lies on these machines, sglang itself without its CUDA dependencies,
# and the light packages its server_args module imports.
packages = [
    "torch==2.13.0",
    "huggingface_hub==1.33.0",  # what transformers 5.19.0 (pinned by sglang 0.5.23) accepts
    "pyyaml==6.0.4",
    "msgspec==0.23.0",
    "numpy==2.4.6",
    "orjson==3.13.0",
    "psutil==7.2.2",
    "pybase64==1.5.1",
    "requests==2.34.2",
    "packaging==26.4",
    "pillow==13.0.0",
    "zstandard==0.25.0",
    "starlette==1.10.0",
    "pydantic==2.14.4",
    "pyzmq==27.3.0",
    "tqdm==4.70.1",
    "ipython==9.18.1",
    "aiohttp==3.14.5",
    "triton==3.9.0",
    "nvidia-ml-py==13.615.71",  # pynvml, as sglang 0.5.23 requires it: the GPU facts read NVML through it
]
packages_no_deps = ["sglang==0.5.23"]
# the scenario's vllm-stub pins compressed-tensors==0.8.1, like vllm 0.6.5 on ct200
compressed_tensors_allow_conflicts = ["vllm-stub"]

server_module = "sglang_standin"
extra_env = {"PYTHONPATH": "/usr/local/lib/sandbox-gpu", "SANDBOX_LOAD_SECONDS": "3"}
readiness_timeout_s = 120
stale_grace_s = 5
# The NCCL check (tasks/nccl_check.py) spawns one gloo process per simulated GPU, each importing torch:
# ~30 s of CPU per TP 8 host on the sandbox's 2 shared cores, on every fresh host of every test. Off here;
# tests/integration/test_nccl_check.py turns it on for its own host.
allreduce_check = False
api_key_env = "SGLANG_API_KEY"  # used when exported on the controller...
api_key_required = False        # ...and the sandbox serves without a key when it is not
# The stand-in decodes its 21-token reply in ~0.05 s, so its tok/s is mostly CPU scheduling on the
# sandbox's 2 shared cores: within one rollout of 2 hosts at once the same configuration measured
# 20-40% of its last good figure. 0.1 still fails a server 10x slower; the speed gate's own test
# (tests/integration/test_start_gates.py) restarts alone and holds it to the default 0.8.
perf_tolerance = 0.1
