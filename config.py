# pyinfra loads this file (from the directory it is run in) before it loads the
# inventory. It makes `pyinfra INVENTORY deploy.py` validate every targeted
# host's settings before the first ssh connection, so bad settings stop the
# run even when some host is unreachable, and no host is touched.
import sys

from pyinfra.context import ctx_state

from tasks.spec_gate import runs_this_deploy, validate_before_connect

if runs_this_deploy(sys.argv):
    validate_before_connect(ctx_state.get())
