"""Python environment: the venv SGLang runs from, with a working pip and the pinned packages.

The operations live in core/venv_ops.py (the router's step uses them too).
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy

from core.seeding import seed_source
from core.venv_ops import packages, pip_bootstrapped, venv
from core.venv_seeding import venv_seeded
from tasks.spec import Spec


@deploy("Python environment")
def python_env(spec: Spec) -> None:
    """The venv SGLang runs from (copied from a peer a rollout offers, else built), pip working in it,
    the pinned packages."""
    seed = seed_source(host.name)
    if seed is not None and seed.venv_for(spec.env_digest):
        venv_seeded(path=spec.server_venv, python=spec.venv_python, seed=seed, digest=spec.env_digest,
                    owner=spec.unit_stem, name=f"venv {spec.server_venv} from the peer {seed.peer}")
    venv(path=spec.server_venv, python=spec.venv_python, name=f"venv {spec.server_venv}")
    pip_bootstrapped(
        path=spec.server_venv,
        get_pip_url=spec.get_pip_url,
        pip_wheel=spec.pip_wheel,
        name="pip works in the venv",
    )
    if spec.packages:
        packages(path=spec.server_venv, requirements=list(spec.packages), name="pinned packages")
    no_deps = list(getattr(spec, "packages_no_deps", []) or [])
    if no_deps:
        packages(path=spec.server_venv, requirements=no_deps, no_deps=True, name="pinned packages (--no-deps)")
