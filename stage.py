"""Prepare what the next restart switches to, beside what serves; restart nothing.

    pyinfra inventory/ct200.py stage.py --dry     # what would be built and downloaded
    pyinfra inventory/ct200.py stage.py           # or: python -m rollout INVENTORY --stage-only

Per server: the preflight, the package set's own venv (built and verified
while the server keeps running from its venv), the model revision's own dir
(downloaded, or copied from a peer in a rollout, and verified beside the
serving one), compressed-tensors for it (tasks/pipeline.py STAGE_PIPELINE).
The unit, its files and the server are not touched; a later deploy.py then
only switches: drain, restart, readiness, register. Router hosts are left as
they are. Settings are validated before any host is touched, as for deploy.py.
"""

from pyinfra import host, inventory

from core import factcache, opstack, ssh
from core.checks import resolved_spec
from tasks.pipeline import STAGE_PIPELINE
from tasks.spec import RouterSpec, host_spec, validate_inventory

opstack.known_to_inspect(__file__)  # pyinfra's per-operation stack walk, kept cheap (core/opstack.py)
ssh.nodelay(host)  # each command sent at once, not after the host's delayed ACK (core/ssh.py)
factcache.start(host)  # each fact read once per host until something changes there
validate_inventory(inventory)
spec = host_spec(host)
if not isinstance(spec, RouterSpec):  # a router host: nothing to stage
    factcache.prefetch(host, factcache.server_reads(spec))
    spec = resolved_spec(spec)
    for step in STAGE_PIPELINE:
        step(spec)
