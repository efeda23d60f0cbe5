"""deploy.py's server steps, only those named in $SGC_STEPS (comma-separated), in the
pipeline's order (tasks/pipeline.py).

For the per-step integration test: converge step by step and check each one
is idempotent on its own.
"""

import os

from pyinfra import host, inventory

from core import factcache, ssh
from core.checks import resolved_spec
from tasks.pipeline import SERVER_PIPELINE
from tasks.spec import Spec, host_spec, validate_inventory

ssh.nodelay(host)  # each command sent at once, not after the host's delayed ACK (core/ssh.py)
factcache.start(host)  # each fact read once per host until something changes there
validate_inventory(inventory)
spec = host_spec(host)
assert isinstance(spec, Spec), "the step test deploys servers only"
spec = resolved_spec(spec)
wanted = os.environ["SGC_STEPS"].split(",")
for step in SERVER_PIPELINE:
    if step.__name__ in wanted:
        step(spec)
