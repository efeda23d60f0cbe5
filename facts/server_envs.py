"""The server's venvs of one envs dir (``<venv_path>-envs/<digest>``): each one's
last switch (when a restart last switched a unit to it) and size, and which of
them the host's systemd units run from."""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api import FactBase, QuoteString, StringCommand

from core.paths import SWITCHED, SYSTEMD_DIR


@dataclass(frozen=True)
class ServerEnv:
    path: str
    switched: int | None  # epoch seconds of its last switch; None: never switched to (staged, or cut off)
    size_kb: int | None  # du -sk (ServerEnvs(sizes=True)); None when not asked or unreadable


@dataclass(frozen=True)
class EnvsDir:
    envs: tuple[ServerEnv, ...]
    referenced: frozenset[str]  # envs some unit file in the systemd dir runs from
    half_removed: tuple[str, ...] = ()  # <env>.removing: a removal cut off (core/server_envs.py)


class ServerEnvs(FactBase[EnvsDir]):
    """
    The venvs in ``root`` and the ones a unit file names (``ExecStart=<env>/bin/python``).

    .. code:: python

        host.get_fact(ServerEnvs, root="/opt/sglang/venv-envs")              # sizes: sizes=True
    """

    @staticmethod
    def default() -> EnvsDir:
        return EnvsDir((), frozenset())  # no envs dir yet: no output

    def command(self, root: str, sizes: bool = False) -> StringCommand:
        # du walks ~100k files per venv: only when a size is wanted (the disk check, a removal)
        size = 'k=$(du -sk "$d" 2>/dev/null | cut -f1); ' if sizes else "k=-; "
        script = (
            'r=$1; u=$2; [ -d "$r" ] || exit 0; for d in "$r"/*/; do d=${d%/}; [ -d "$d" ] || continue; '
            'case "$d" in *.removing) echo "removing - - $d"; continue;; esac; '
            f's=$(stat -c %Y "$d/{SWITCHED}" 2>/dev/null || echo -); {size}'
            'echo "env ${s} ${k:--} $d"; '
            'if grep -qsF "$d/" "$u"/*.service; then echo "ref - - $d"; fi; done'
        )
        return StringCommand("sh -c", QuoteString(script), "-", QuoteString(root.rstrip("/")), QuoteString(SYSTEMD_DIR))

    def process(self, output) -> EnvsDir:
        envs, referenced, half_removed = [], set(), []
        for line in output:
            kind, switched, size, path = (line.split(" ", 3) + ["", "", ""])[:4]
            if kind == "env" and path:
                envs.append(ServerEnv(path, int(switched) if switched.isdigit() else None,
                                      int(size) if size.isdigit() else None))
            elif kind == "ref" and path:
                referenced.add(path)
            elif kind == "removing" and path:
                half_removed.append(path)
        return EnvsDir(tuple(envs), frozenset(referenced), tuple(half_removed))
