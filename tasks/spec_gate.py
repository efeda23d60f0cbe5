"""Settings are validated before pyinfra connects to any host.

pyinfra's CLI loads config.py, then the inventory (and group_data), calls
``State.init`` (which applies ``--limit``), connects to every host and only
then runs deploy.py. ``config.py`` wraps that ``State.init`` so the whole
targeted inventory is validated right after it: a bad value stops the run
before the first ssh connection, and an unreachable host does not hide it
behind a connection error. deploy.py validates again through the same
``validate_inventory``, which keeps its result on the inventory object (a
no-op there), for pyinfra API users.

    # config.py
    from pyinfra.context import ctx_state
    if runs_this_deploy(sys.argv):
        validate_before_connect(ctx_state.get())
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.paths import REPO_ROOT
from tasks.spec import validate_inventory

DEPLOY_FILE = REPO_ROOT / "deploy.py"


def runs_this_deploy(argv: list[str]) -> bool:
    """True when a pyinfra command line runs this project's deploy.py
    (not an ad-hoc `exec`/`fact` against some other inventory)."""
    return any(arg.endswith(".py") and Path(arg).resolve() == DEPLOY_FILE for arg in argv[1:])


def validate_before_connect(state: Any) -> None:
    """Make ``state`` validate its targeted hosts' settings as soon as it
    knows them (end of ``State.init``), raising SpecError before connecting."""
    init = state.init

    def init_then_validate(inventory: Any, *args: Any, **kwargs: Any) -> None:
        init(inventory, *args, **kwargs)
        validate_inventory(inventory)

    state.init = init_then_validate
