"""Python environment: the venv SGLang runs from, with a working pip and the pinned packages.

The operations live in core/venv_ops.py (the router's step uses them too).
"""

from __future__ import annotations

from pyinfra.api import deploy

from core.venv_ops import packages, pip_bootstrapped, venv
from tasks.spec import Spec


@deploy("Python environment")
def python_env(spec: Spec) -> None:
    """The venv SGLang runs from, pip working in it, the pinned packages."""
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
