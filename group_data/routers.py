# Router hosts: SGLang's router (PyPI `sglang-router`, a Rust binary in a
# manylinux wheel) in its own venv, run by a systemd unit, in front of the
# servers whose router_url names it. Servers register themselves through the
# router's runtime API (POST /workers) once ready and leave it (DELETE) before
# a restart; the router's own deploy re-registers the ready ones after a
# router restart (the list lives in the router's memory). The servers' keys of
# group_data/all.py (model, gpu_ids, ...) do not apply here; tasks/spec/
# (RouterSettings) validates these.
role = "router"
router_url = None                       # URL servers and clients reach this router at (set per host in the inventory)
router_package = "sglang-router==0.3.2"  # pinned; `smg` is its successor (another module/CLI: set router_module too)
router_module = "sglang_router.launch_router"  # run as `venv/bin/python -m <router_module>`
router_venv_path = "/opt/sglang-router/venv"
router_listen_host = "0.0.0.0"          # --host
router_listen_port = 30000              # --port
router_prometheus_host = "127.0.0.1"    # --prometheus-host (the router always serves /metrics: keep it local)
router_prometheus_port = 29000          # --prometheus-port
router_policy = "round_robin"           # round_robin, cache_aware, random, power_of_two
router_extra_args = []                  # more router flags (not --host/--port/--policy/--prometheus-*/--worker-urls)
router_unit_name = "sglang-router.service"
router_readiness_timeout_s = 120        # seconds until the router must answer /liveness
# The router and its servers share one API key: clients present it to the
# router, the router gives it to the servers, the servers' deploys use it on
# the router's /workers API. It reaches the router through a root-only file
# and our launcher (remote/router_launch.py), never argv.
api_key_env = "SGLANG_API_KEY"          # NAME of the controller env var (None: an open router, keyless servers)
api_key_required = True                 # False: a missing variable means "run without a key"
