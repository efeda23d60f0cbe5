"""Put each server's previous good configuration back, on demand.

    pyinfra inventory/ct200.py rollback.py --dry     # what would be put back, and why
    pyinfra inventory/ct200.py rollback.py           # or: python -m rollout INVENTORY --rollback

Per server: out of its router, the good configuration that served before
the current one restored (unit, env and options files and restart stamp:
tasks/rollback.py), readiness, back in the router. Router hosts are left as
they are. Settings are validated before any host is touched, as for deploy.py.
"""

from pyinfra import host, inventory

from core import factcache, opstack, ssh
from core.checks import resolved_spec
from tasks.pipeline import ROLLBACK_PIPELINE
from tasks.spec import RouterSpec, host_spec, validate_inventory

opstack.known_to_inspect(__file__)  # pyinfra's per-operation stack walk, kept cheap (core/opstack.py)
ssh.nodelay(host)  # each command sent at once, not after the host's delayed ACK (core/ssh.py)
factcache.start(host)  # each fact read once per host until something changes there
validate_inventory(inventory)
spec = host_spec(host)
if not isinstance(spec, RouterSpec):  # a router host: nothing to roll back
    spec = resolved_spec(spec)  # as deploy.py renders it (the router drain checks the command line)
    for step in ROLLBACK_PIPELINE:
        step(spec)
