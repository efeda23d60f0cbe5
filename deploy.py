"""Converge GPU hosts into ready SGLang servers.

    pyinfra inventory/ct200.py deploy.py              # converge
    pyinfra inventory/ct200.py deploy.py --dry --diff # show what would change

Every host's settings are validated before any host is touched; then each
step below runs in order, each idempotent (a second run changes nothing).
"""

from pyinfra import host, inventory

from tasks import model, preflight, python_env, quant_deps, readiness, service, stale_gpu
from tasks.spec import host_spec, validate_inventory

validate_inventory(inventory)
spec = preflight.resolved_spec(host_spec(host))

preflight.preflight(spec)
python_env.python_env(spec)
model.model(spec)
quant_deps.quant_deps(spec)
stale_gpu.stale_gpu(spec)
service.service(spec)
readiness.readiness(spec)
