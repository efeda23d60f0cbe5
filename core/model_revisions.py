"""The model's revisions side by side: one dir per revision, ``<model_dir>-revisions/<revision[:12]>``
(``Spec.model_path``), files shared between revisions hard-linked, so they are stored once.

A new revision is downloaded beside the serving one (tasks/model.py: fetch_model links what a kept
revision holds with the same digest, fetches the rest, verifies it), the restart switches the unit
to it, and a rollback switches back. After a good restart the revisions beyond ``keep_revisions``
are removed (the model's and the draft model's):

    old_revisions_removed(spec=spec)                # after readiness passed

A rollback is a good restart too: once the last good configuration serves again, what lies
beyond ``keep_revisions`` by what it serves goes the same way (core/last_good.py), so the next
run of the good configuration finds nothing to remove.

What is kept: the serving revision, then the ones switched to most recently, up to
``keep_revisions`` in all; never one a unit file of the host names (another server serving it),
never one no restart has switched to yet (staged). The model dir itself, when it holds a revision
(the layout before revision dirs), counts as the oldest. Removing a revision frees only the bytes
no kept revision shares with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from core.changes import changing
from core.ops import plan, report
from core.paths import revisions_root
from facts.model_dir import ModelRevisions, Revisions

if TYPE_CHECKING:
    from tasks.spec import Spec


def revisions_to_remove(found: Revisions, serving: str, keep: int) -> list[str]:
    """The revision dirs to remove: beyond ``keep`` (the serving one first, then by last switch,
    newest first, the model dir's own revision last), never a referenced or never-switched one.

    >>> from facts.model_dir import Revision
    >>> found = Revisions((Revision("/m-revisions/a", None, 10), Revision("/m-revisions/b", None, 30),
    ...                    Revision("/m-revisions/c", None, None)), (), (), "/m")
    >>> revisions_to_remove(found, "/m-revisions/b", 2)
    ['/m']
    """
    switched = sorted((rev for rev in found.revisions if rev.switched is not None and rev.path != serving),
                      key=lambda rev: rev.switched or 0, reverse=True)
    candidates = [rev.path for rev in switched] + ([found.legacy] if found.legacy else [])
    kept, remove = 1, []  # the serving one
    for path in candidates:
        if path in found.referenced:
            continue
        if kept < keep:
            kept += 1
        else:
            remove.append(path)
    return remove


def _served(spec: Spec) -> list[tuple[str, str, str]]:
    """(label, model dir setting, serving revision dir) of the model and its draft."""
    out = [("model", spec.model_dir, spec.model_path)]
    if spec.draft_dir is not None and spec.draft_path is not None:
        out.append(("draft", spec.draft_dir, spec.draft_path))
    return out


def removal_command(path: str) -> StringCommand:
    """Remove a revision dir or a venv, renamed first: one half removed is never one a unit could be
    switched back to (the facts list ``*.removing`` as half removed: the next run finishes it)."""
    return StringCommand("sh -c", QuoteString('mv "$1" "$1.removing" && rm -rf "$1.removing"'), "-", QuoteString(path))


def revisions_beyond_keep(on_host: Any, spec: Spec, model_path: str | None, draft_path: str | None) -> list[str]:
    """The revision dirs beyond ``keep_revisions`` on ``on_host`` when ``model_path`` / ``draft_path`` serve."""
    out = []
    for root, serving in ((spec.model_dir, model_path), (spec.draft_dir, draft_path)):
        if root is not None and serving:
            out += revisions_to_remove(on_host.get_fact(ModelRevisions, root=revisions_root(root)), serving,
                                       spec.keep_revisions)
    return out


@operation()
def old_revisions_removed(spec: Spec):
    """
    Remove the model's (and the draft model's) revisions beyond ``keep_revisions`` (after a
    good restart: the serving one and the newest rollback points stay).

    .. code:: python

        old_revisions_removed(spec=spec)
    """
    removed = False
    for label, root, serving in _served(spec):
        found = host.get_fact(ModelRevisions, root=revisions_root(root))
        for path in found.half_removed:
            plan(f"{label}: finish removing {path} (a removal cut off)")
            removed = True
            yield changing(StringCommand("rm -rf", QuoteString(path)), path)
        remove = revisions_to_remove(found, serving, spec.keep_revisions)
        if not remove:
            continue
        removed = True
        message = (f"{label}: remove {len(remove)} old revision(s) beyond keep_revisions = {spec.keep_revisions} "
                   f"(only the files no kept revision shares are freed): {', '.join(remove)}")
        plan(message)
        report(message)
        for path in remove:
            yield changing(removal_command(path), path, path + ".removing")
    if not removed:
        host.noop(f"keep_revisions = {spec.keep_revisions}: no old model revision to remove")
