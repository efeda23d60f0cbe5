"""Converge GPU hosts into ready SGLang servers.

    pyinfra inventory/ct200.py deploy.py              # converge
    pyinfra inventory/ct200.py deploy.py --dry --diff # show what would change

Every host's settings are validated before any host is touched (config.py);
then each step of tasks/pipeline.py runs in order, each idempotent (a second
run changes nothing): a router host runs the router's step, a server the
server pipeline, a rank of a multi-node TP group the group's pipeline.
"""

from pyinfra import host, inventory

from core import factcache, opstack, ssh
from core.checks import resolved_spec
from tasks.pipeline import pipeline_for
from tasks.spec import RouterSpec, host_spec, validate_inventory

opstack.known_to_inspect(__file__)  # pyinfra's per-operation stack walk, kept cheap (core/opstack.py)
ssh.nodelay(host)  # each command sent at once, not after the host's delayed ACK (core/ssh.py)
factcache.start(host)  # each fact read once per host until something changes there
validate_inventory(inventory)
spec = host_spec(host)
if not isinstance(spec, RouterSpec):
    factcache.prefetch(host, factcache.server_reads(spec))  # the facts every run reads, in one round trip
    spec = resolved_spec(spec)  # attention backend and NCCL env from the host's GPUs
for step in pipeline_for(spec):
    step(spec)
