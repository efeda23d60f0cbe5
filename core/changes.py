"""What an operation's command changes on its host, said where the command is made.

core/factcache.py keeps the facts read on a host until the host runs
anything else; a command marked here drops only the kept facts of the paths
it names (a file written, a stamp) or none (a router call, a restart, a
wait). Apart from the cache so that any step can mark its commands without
importing the cache (which reads the steps' paths).

    yield changing(StringCommand("mv -f", tmp, dest), dest, tmp)
"""

from __future__ import annotations

from typing import TypeVar

CHANGES = "_sgc_changes"  # the attribute on the command: the paths it changes
C = TypeVar("C")


def changing(command: C, *paths: str) -> C:
    """Mark an operation's ``command`` (a StringCommand) as changing, of what the fact cache keeps,
    only the files at or under ``paths`` (none: no file, e.g. a router call, a restart, a wait).
    Running it then drops the kept facts read at, above or under those paths, not all of them;
    the GPU facts (hardware: rollout/static_facts.py) are kept."""
    setattr(command, CHANGES, tuple(path.rstrip("/") or "/" for path in paths))
    return command
