"""The order of the steps, defined once (deploy.py runs it; tests read it).

A router host runs the router's step. A server runs the server pipeline; a
rank of a multi-node TP group runs the same pipeline with the group's own
service and readiness steps (its ranks restart together and are judged at
rank 0). Each step is a pyinfra ``@deploy`` taking the host's validated spec.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tasks import membership, model, multinode, preflight, python_env, quant_deps, readiness, rollback, router, service
from tasks import gpu_balance, nccl_check, stale_gpu
from tasks.spec import RouterSpec, Spec

Step = Callable[..., Any]

ROUTER_PIPELINE: tuple[Step, ...] = (router.router,)

SERVER_PIPELINE: tuple[Step, ...] = (
    preflight.preflight,  # GPUs, driver, disk, ports: fails before anything changes
    python_env.python_env,  # venv, pip, pinned packages
    model.model,  # the pinned revision, downloaded and verified
    quant_deps.quant_deps,  # compressed-tensors new enough for the model's format
    stale_gpu.stale_gpu,  # other services' processes off our GPUs
    nccl_check.nccl_check,  # an all-reduce over the TP GPUs passes (once; again when what it ran on changes)
    membership.drain,  # out of its router (router_url) before a restart
    service.service,  # unit, env and options files; restart only on change
    readiness.readiness,  # /health 200 and the model listed, or the journal line why not
    gpu_balance.gpu_balance,  # its GPUs hold its memory, balanced, and nothing else's (NVML)
    membership.register,  # back in its router once ready
    readiness.time_to_ready,  # for the rollout's summary
)

# the same steps for a rank of a multi-node TP group
_GROUP_STEPS: dict[Step, Step] = {service.service: multinode.group_service,
                                   readiness.readiness: multinode.group_readiness}
GROUP_PIPELINE: tuple[Step, ...] = tuple(_GROUP_STEPS.get(step, step) for step in SERVER_PIPELINE)


# stage.py (and a rollout's staging): what a restart will switch to, prepared beside what serves -
# the package set's own venv, the model revision's own dir, both verified; nothing that serves changes
STAGE_PIPELINE: tuple[Step, ...] = (
    preflight.preflight,
    python_env.python_env,
    model.model,
    quant_deps.quant_deps,
)


# rollback.py: a server's previous good configuration back (tasks/rollback.py), behind its router
ROLLBACK_PIPELINE: tuple[Step, ...] = (
    membership.drain_for_rollback,  # out of its router before the restart
    rollback.rollback,  # the previous good files and stamp back, restarted
    readiness.readiness,  # serves again (or fails, rolled forward to the last good one)
    membership.register,  # back in its router
    readiness.time_to_ready,  # for the rollout's summary
)


def pipeline_for(spec: Spec | RouterSpec) -> tuple[Step, ...]:
    """The steps this host runs, in order."""
    if isinstance(spec, RouterSpec):
        return ROUTER_PIPELINE
    return GROUP_PIPELINE if spec.is_multinode else SERVER_PIPELINE
