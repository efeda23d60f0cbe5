"""Only the server's files (core/server.py server_files: unit, options and env
file, the unit loaded and enabled): for test_unit_ownership.py."""

from pyinfra import host, inventory

from core.checks import resolved_spec
from core.render import render
from core.server import server_files
from tasks.spec import Spec, host_spec, validate_inventory

validate_inventory(inventory)
spec = host_spec(host)
assert isinstance(spec, Spec), "server hosts only"
spec = resolved_spec(spec)
server_files(spec, render(spec))
