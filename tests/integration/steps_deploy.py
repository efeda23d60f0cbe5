"""deploy.py's steps, only those named in $SGC_STEPS (comma-separated), in deploy.py's order.

For the per-step integration test: converge step by step and check each one
is idempotent on its own.
"""

import os

from pyinfra import host, inventory

from tasks import model, preflight, python_env, quant_deps, readiness, service, stale_gpu
from tasks.spec import host_spec, validate_inventory

ORDER = {
    "preflight": preflight.preflight,
    "python_env": python_env.python_env,
    "model": model.model,
    "quant_deps": quant_deps.quant_deps,
    "stale_gpu": stale_gpu.stale_gpu,
    "service": service.service,
    "readiness": readiness.readiness,
}

validate_inventory(inventory)
spec = preflight.resolved_spec(host_spec(host))
wanted = os.environ["SGC_STEPS"].split(",")
for name, step in ORDER.items():
    if name in wanted:
        step(spec)
