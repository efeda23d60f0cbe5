"""The readiness gates on demand, on a server as it serves (`python -m rollout INVENTORY --verify`,
or `pyinfra INVENTORY verify.py`): nothing of its configuration changes, nothing restarts, its
router membership stays. The wait reads SGLang's /server_info afresh (a server that does not serve
fails at once, with the journal), then every gate runs (core/gates.py: the launch fingerprint
against the plan, the decode speed against the host's last good figure and the profile's floor,
the draft's accept length, the smoke checks), also after one failed, and one line gives each
verdict. The measurements replace the last ones under /var/lib/sglang-converge/launch/; the last
good configuration's copies (last-good/) are never written.

A multi-node group is verified at rank 0 (where it serves); its other ranks, and routers, are skipped.

    gates_verified(spec=spec)
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, operation

from core.fingerprint import LaunchPlan, fingerprint_path, planned_launch
from core.gates import run_gates, took
from core.last_good import last_good_dir
from core.ops import plan, stream
from core.server import wait_command
from facts.gpu import NvidiaGpus
from tasks.spec import Spec

WAIT_S = 60  # a server that serves answers at once; one that does not fails with its journal


def _verify(state, host, spec: Spec, plan_: LaunchPlan) -> bool:
    if not stream(state, host, wait_command(spec, WAIT_S), WAIT_S + 60, step="verify",
                  changes=(fingerprint_path(spec),)):
        return False
    verdicts = run_gates(state, host, spec, plan_, last_good_dir(spec), every=True)
    passed = all(ok for _, ok, _ in verdicts)
    line = f"verify: {'every gate passed' if passed else 'FAILED'} in {took(verdicts)}"
    if passed:
        host.log(line, logger.warning)
    else:
        host.log_styled(line, fg="red", log_func=logger.error)
    return passed


@operation(is_idempotent=False)
def gates_verified(spec: Spec):
    """
    Run every readiness gate on the server as it serves (read-only: no restart, no file of its
    configuration written).

    .. code:: python

        gates_verified(spec=spec)
    """
    if spec.is_multinode and spec.node_rank != 0:
        host.noop(f"rank {spec.node_rank} of node group {spec.group_label}: verified at rank 0")
        return
    plan(f"verify {spec.unit_name} as it serves: the launch fingerprint, the decode speed, the draft, the smoke "
         "checks (nothing restarts)")
    plan_ = planned_launch(spec, host.get_fact(NvidiaGpus))
    yield FunctionCommand(_verify, (spec, plan_), {})
