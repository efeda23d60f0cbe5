# Defaults for every host: each module-level name is a host.data key that
# tasks/spec/ validates into a Spec (unknown keys are errors, so a typo such
# as `tp_sise` fails before any host is touched). Hosts and groups override
# these in inventory/*.py and group_data/<group>.py. pyinfra's own keys
# (ssh_*, _sudo, ...) are not ours and pass through untouched.
#
# Required per host or group (no default here):
#   model    - name of a profile in models/ (models/<model>.yaml): repo,
#              pinned revision, served name, quantization, attention type
#   gpu_ids  - the GPU indexes this server uses (nvidia-smi order), e.g. [0, 1]

# --- model on disk
model_dir = None          # absolute path on the host; None: /srv/models/<served_model_name>
draft_dir = None          # the profile's draft model (speculative decoding), if any; None: <model_dir>-draft
keep_revisions = 2        # model revisions kept in <model_dir>-revisions after a good restart (rollback points)
model_update = "side-by-side"  # a new revision beside the serving one; "in-place": stop the server for it
size_margin_gb = 50       # GB that must stay free on that disk after the download (>= 0)
download_attempts = 5     # tries per download phase before giving up on a failing Hub (5xx, 429, stalls)
download_backoff_s = 5.0  # first wait between those tries, doubling up to 60 s (or the Hub's Retry-After)
download_read_timeout_s = 30  # seconds without a byte before a file's transfer counts as stalled

# --- python environment
venv_path = "/opt/sglang/venv"    # names the server's venvs: each package set in <venv_path>-envs/<digest>
keep_envs = 2             # venvs kept there after a good restart: the serving one and the newest other (rollback)
venv_python = "/usr/bin/python3"  # interpreter that creates the venv
packages = ["sglang==0.5.23"]     # pip requirements, each pinned (name==version)
get_pip_url = "https://bootstrap.pypa.io/get-pip.py"  # when the venv has no pip and no ensurepip
pip_wheel = None          # controller path of a pip-*.whl to upload to offline hosts instead

# --- quantization dependencies (compressed-tensors upgrade policy)
compressed_tensors_allow_conflicts = []  # package names whose `pip check` conflict is tolerated (e.g. "vllm")
compressed_tensors_hold = ["torch", "sglang", "flashinfer-python"]  # held at installed versions

# --- parallelism and attention
tp_size = None            # tensor parallel size; None: len(gpu_ids) x nnodes (must equal that)
attention_backend = "auto"  # "auto" (by compute capability and attention type) or an SGLang backend

# --- listening and secrets
listen_host = "0.0.0.0"   # --host
listen_port = 30000       # --port (1..65535)
api_key_env = None        # NAME of a controller env var holding the API key (never the key itself)
api_key_required = True   # False: a missing api_key_env variable means "serve without a key"
hf_token_env = "HF_TOKEN"  # NAME of a controller env var holding the HF token (optional)
hf_endpoint = None        # Hub mirror URL (HF_ENDPOINT), None for huggingface.co

# --- the server process
extra_env = {}            # server environment, str -> str (NCCL_*, PYTHONPATH...); wins over derived values
extra_server_args = []    # SGLang flags appended after the model profile's
unit_name = "sglang.service"            # systemd unit (ends .service)
server_module = "sglang.launch_server"  # run as `venv/bin/python -m <server_module>`
readiness_timeout_s = 3600  # seconds to wait for /health 200 (big models load for tens of minutes)
start_stall_s = 900         # a start with no progress this long fails (no new SGLang log line on any rank and
                            # no change of GPU memory; a 595 GB load moves GPU memory throughout, and the
                            # longest silent step, a first start's kernel JIT, takes minutes); None: no check
kv_plan_tolerance = 0.5     # once it serves, SGLang's KV pool (max_total_num_tokens) must hold at least this
                            # fraction of the memory fit's tokens, or readiness fails (0: not checked)
perf_tolerance = 0.8        # after a restart, a short decode measurement (concurrency 1 and 4, speed_check_tokens,
                            # <= speed_check_max_s each) must reach this fraction of the host's last good tok/s (0: off)
speed_check_max_s = 30      # the measurement's bound per concurrency (a GPU decodes 128 tokens in seconds)
speed_check_tokens = 128    # tokens each measured request decodes (a last good figure counts only at the same count)
rollback_on_failure = True  # a restart that fails readiness puts the last good config back (files, its venv and
                            # its model revision while kept), restarts it, and still fails the run ("rolled back:")

# --- stale GPU processes on our GPUs
stale_policy = "stop"     # "stop" them, "fail" the deploy, or "ignore" them

# --- host fitness (core/host_fitness.py): what hangs NCCL on PCIe GPU hosts, seen before the launch
host_fitness = "fail"     # IOMMU translation or ACS redirect between the TP GPUs (NCCL's first all-reduce
                          # can hang there while nvidia-smi says P2P OK): "fail" the preflight, "warn", or "off"
allreduce_check = True    # before the first start (and after the driver, the kernel command line, the TP GPUs or
                          # the NCCL env change), an all-reduce over the TP GPUs with the unit's env
                          # (tasks/nccl_check.py); a pass is kept, a hang or a slow one fails the run
allreduce_timeout_s = 120  # seconds the all-reduces may take once every rank is up (a hang fails after this)
allreduce_min_busbw_gbs = None  # bus bandwidth floor in GB/s (None: any): e.g. well below what your host measured
stale_grace_s = 30        # seconds between SIGTERM and SIGKILL (>= 0)
protect_units = []        # systemd units never stopped (full names, e.g. "nvidia-persistenced.service")
protect_process_names = []  # process names never signalled

# --- multi-node tensor parallelism
nnodes = 1                # number of nodes in the TP group
node_rank = 0             # this host's rank, 0..nnodes-1
dist_init_addr = None     # "host:port" of rank 0, required when nnodes > 1
node_group = None         # or, once for the whole group (its group data): {"hosts": [rank 0, rank 1, ...],
                          #   "dist_init_port": 20000, "dist_init_host": None, "name": None}; derives the 3 above
packages_no_deps = []     # pinned requirements installed with --no-deps (sglang beside a CPU torch in the sandbox)

# --- fleets (python -m rollout; SGLang's router: group_data/routers.py, tasks/router.py)
role = "server"           # "server" (this pipeline) or "router" (SGLang's router host, group_data/routers.py)
router_url = None         # URL of the router this server registers with (POST /workers), e.g. "http://10.0.0.9:30000"
worker_url = None         # URL at which that router reaches this server (required with router_url)
drain_timeout_s = 600     # seconds a server taken out of its router may take to finish its requests
min_driver_version = None  # lowest NVIDIA driver the fleet preflight accepts, e.g. "570.86"
