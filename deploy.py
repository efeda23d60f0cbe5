"""Converge GPU hosts into ready SGLang servers.

    pyinfra inventory/ct200.py deploy.py              # converge
    pyinfra inventory/ct200.py deploy.py --dry --diff # show what would change

Every host's settings are validated before any host is touched; then each
step below runs in order, each idempotent (a second run changes nothing).
"""

from pyinfra import host, inventory

from rollout.record import ready_recorded
from tasks import model, preflight, python_env, quant_deps, readiness, router, service, stale_gpu
from tasks.spec import host_spec, validate_inventory

validate_inventory(inventory)
spec = host_spec(host)

if spec.role == "router":  # SGLang's router in front of the servers (group_data/routers.py)
    router.router(spec)
else:
    spec = preflight.resolved_spec(spec)
    preflight.preflight(spec)
    python_env.python_env(spec)
    model.model(spec)
    quant_deps.quant_deps(spec)
    stale_gpu.stale_gpu(spec)
    router.drain(spec)  # out of its router (router_url) before a restart
    service.service(spec)
    readiness.readiness(spec)
    router.register(spec)  # back in its router once ready
    ready_recorded(spec=spec, name="time to ready recorded")
