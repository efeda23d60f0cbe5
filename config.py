# pyinfra loads this file (from the directory it is run in) before it loads the
# inventory. It makes `pyinfra INVENTORY deploy.py` validate every targeted
# host's settings before the first ssh connection, so bad settings stop the
# run even when some host is unreachable, and no host is touched. A --dry run
# whose plan already knows a failure exits 1 and names it last (core/dry_run.py).
import atexit
import gc
import sys

from pyinfra.context import ctx_state

from core.dry_run import dry_run_requested, exit_nonzero_on_known_failures
from core.ssh import nodelay_on_connect
from tasks.spec_gate import runs_this_deploy, validate_before_connect

nodelay_on_connect(ctx_state.get())  # ssh without Nagle's ~40 ms waits (core/ssh.py)
if runs_this_deploy(sys.argv):
    validate_before_connect(ctx_state.get())
if dry_run_requested(sys.argv):
    exit_nonzero_on_known_failures(ctx_state.get())

# What is loaded by now (pyinfra, gevent, paramiko, pydantic and our spec code:
# ~65,000 objects) lives until the CLI exits: the cyclic GC need not walk it at
# each full collection, nor again several times while the interpreter exits
# (0.15-0.3 s of a 2 s no-op run). Python does not promise to finalize what is
# left at exit anyway, so freezing it then changes nothing but the time.
gc.freeze()
atexit.register(gc.freeze)
