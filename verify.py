"""Run the readiness gates on every server as it serves, read-only.

    pyinfra inventory/ct200.py verify.py      # or: python -m rollout INVENTORY --verify [--limit HOST]

Per server (rank 0 of a multi-node group): /server_info read afresh, then every gate of README's
"What ready means" (tasks/verify.py); nothing restarts, no configuration file is written, router
membership stays. Router hosts are skipped. Settings are validated before any host is touched.
"""

from pyinfra import host, inventory

from core import factcache, opstack, ssh
from core.checks import resolved_spec
from tasks.spec import RouterSpec, host_spec, validate_inventory
from tasks.verify import gates_verified

opstack.known_to_inspect(__file__)  # pyinfra's per-operation stack walk, kept cheap (core/opstack.py)
ssh.nodelay(host)  # each command sent at once, not after the host's delayed ACK (core/ssh.py)
factcache.start(host)  # each fact read once per host until something changes there
validate_inventory(inventory)
spec = host_spec(host)
if not isinstance(spec, RouterSpec):  # a router: no gates
    gates_verified(spec=resolved_spec(spec), name=f"{spec.unit_name} verified as it serves")
