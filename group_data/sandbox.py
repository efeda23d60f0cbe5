# The local sandbox hosts (inventory/sandbox.py sets only their ssh_* keys):
# 8 simulated GPUs like ct200, the tiny nvfp4 model, the SGLang stand-in.
model = "sandbox-tiny"
gpu_ids = [0, 1, 2, 3, 4, 5, 6, 7]
tp_size = 8
attention_backend = "auto"   # exercises the resolution: SM120 + MLA -> triton
size_margin_gb = 1           # the model is ~40 MB; the sandbox shares the controller's disk
packages = ["pyyaml==6.0.2"]  # the stand-in reads --config YAML; compressed-tensors comes from the scenario
server_module = "sglang_standin"
extra_env = {"PYTHONPATH": "/usr/local/lib/sandbox-gpu"}  # where the stand-in lives on the sandbox host
readiness_timeout_s = 120
stale_grace_s = 5
api_key_env = "SGLANG_API_KEY"  # used when exported on the controller...
api_key_required = False        # ...and the sandbox serves without a key when it is not
