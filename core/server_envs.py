"""The server's venvs by content: one per package set, ``<venv_path>-envs/<digest>``
(tasks/spec/built.py: ``Spec.server_venv``, ``env_inputs``).

A new package set is built into a venv of its own while the server keeps
running from its venv; the restart switches the unit to it (the unit's
ExecStart names it), and a rollback switches back (core/last_good.py). After a
good restart the older venvs beyond ``keep_envs`` are removed:

    yield switch_marked(spec)                       # right before the restart
    old_envs_removed(spec=spec)                     # after readiness passed

What is kept: the serving venv, then the ones switched to most recently, up
to ``keep_envs`` in all; never one a unit file of the host runs from (another
server sharing the dir), and never one no restart has switched to yet (a
staged venv waits for its switch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from core.changes import changing
from core.model_revisions import removal_command
from core.ops import gb, plan, report
from facts.files import FreeBytes
from facts.server_envs import SWITCHED, EnvsDir, ServerEnvs

if TYPE_CHECKING:
    from tasks.spec import Spec


def switch_marked(spec: Spec) -> StringCommand:
    """Before a restart onto ``spec.server_venv`` and the model's revision dirs: their switch time (what
    pruning orders by, core/model_revisions.py for the model's)."""
    markers = [f"{path}/{SWITCHED}" for path in (spec.server_venv, spec.model_path, spec.draft_path) if path]
    # a revision dir exists once downloaded; the venv always does by now
    return changing(StringCommand("sh -c", QuoteString('for m; do [ -d "${m%/*}" ] && touch "$m"; done; true'), "-",
                                  *map(QuoteString, markers)), *markers)


def envs_to_remove(envs: EnvsDir, serving: str, keep: int) -> list[str]:
    """The venvs to remove: beyond ``keep`` (the serving one first, then by last switch,
    newest first), never a referenced or never-switched one.

    >>> from facts.server_envs import ServerEnv
    >>> found = EnvsDir((ServerEnv("/e/a", 10, 1), ServerEnv("/e/b", 30, 1), ServerEnv("/e/c", 20, 1),
    ...                  ServerEnv("/e/d", None, 1), ServerEnv("/e/old", 5, 1)), frozenset({"/e/old"}))
    >>> envs_to_remove(found, "/e/c", 2)
    ['/e/a']
    """
    switched = sorted((env for env in envs.envs if env.switched is not None and env.path != serving),
                      key=lambda env: env.switched or 0, reverse=True)
    kept = 1  # the serving one
    remove = []
    for env in switched:
        if env.path in envs.referenced:
            continue
        if kept < keep:
            kept += 1
        else:
            remove.append(env.path)
    return remove


def venv_disk_problem(spec: Spec) -> str | None:
    """A new venv is built beside the kept ones: about as big as the largest of them, it must fit
    in the free space of their filesystem (None: it fits, exists already, or no size is known yet)."""
    found = host.get_fact(ServerEnvs, root=spec.envs_dir)
    if not found.envs or any(env.path == spec.server_venv for env in found.envs):
        return None
    sized = host.get_fact(ServerEnvs, root=spec.envs_dir, sizes=True)
    sizes = [env.size_kb * 1024 for env in sized.envs if env.size_kb]
    if not sizes:  # the first venv: no size to go by (pip says so if the disk fills)
        return None
    space = host.get_fact(FreeBytes, path=spec.envs_dir)
    if space is None or space.free_bytes >= max(sizes):
        return None
    return (f"venv: not enough disk for the new venv {spec.server_venv}: need ~{gb(max(sizes))} (the largest of "
            f"the {len(sizes)} venv(s) kept in {spec.envs_dir}, {gb(sum(sizes))} in all); {space.mount} has "
            f"{gb(space.free_bytes)} free: allowed: free space there, or remove old venvs by hand or with a lower "
            f"keep_envs (now {spec.keep_envs}; the serving venv is always kept)")


@operation()
def old_envs_removed(spec: Spec):
    """
    Remove the server's venvs beyond ``keep_envs`` (after a good restart: the serving one
    and the newest rollback points stay).

    .. code:: python

        old_envs_removed(spec=spec)
    """
    found = host.get_fact(ServerEnvs, root=spec.envs_dir)
    remove = envs_to_remove(found, spec.server_venv, spec.keep_envs)
    for path in found.half_removed:
        plan(f"finish removing {path} (a removal cut off)")
        yield changing(StringCommand("rm -rf", QuoteString(path)), path)
    if not remove:
        if found.half_removed:
            return
        host.noop(f"{len(found.envs)} venv(s) in {spec.envs_dir}, keep_envs = {spec.keep_envs}: none to remove")
        return
    sized = host.get_fact(ServerEnvs, root=spec.envs_dir, sizes=True).envs
    sizes = {env.path: gb(env.size_kb * 1024) for env in sized if env.size_kb}
    message = (f"remove {len(remove)} old venv(s) beyond keep_envs = {spec.keep_envs}: "
               + ", ".join(f"{path} ({sizes.get(path, 'size unknown')})" for path in remove))
    plan(message)
    report(f"venv: {message}")
    for path in remove:
        yield changing(removal_command(path), path, path + ".removing")
