"""Files and filesystems: a file's digest and text, free bytes where a path is."""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api import FactBase, QuoteString, StringCommand

from facts._value import FactValue


class FileDigest(FactBase[dict[str, str] | None]):
    """
    sha256, octal mode and owner of a file, or None when it does not exist.

    .. code:: python

        host.get_fact(FileDigest, path="/etc/sglang/sglang.env")
        # {"sha256": "...", "mode": "600", "owner": "root"}
    """

    def command(self, path: str) -> StringCommand:
        return StringCommand(
            "set --",
            QuoteString(path),
            '; if [ -f "$1" ]; then stat -c "%a %U" "$1" && sha256sum "$1" | cut -d" " -f1;'
            " else echo absent; fi",
        )

    def process(self, output: list[str]) -> dict[str, str] | None:
        lines = [line.strip() for line in output if line.strip()]
        if not lines or lines[0] == "absent":
            return None
        mode, owner = lines[0].split()
        return {"mode": mode, "owner": owner, "sha256": lines[1]}


class FileText(FactBase[str | None]):
    """
    A text file's content (for diffs), or None when it does not exist.

    .. code:: python

        host.get_fact(FileText, path="/etc/systemd/system/sglang.service")
    """

    def command(self, path: str) -> StringCommand:
        return StringCommand("set --", QuoteString(path), '; [ -f "$1" ] && cat "$1" || true')

    def process(self, output: list[str]) -> str | None:
        return "\n".join(output) + "\n" if output else None


@dataclass(frozen=True)
class DiskSpace(FactValue):
    path: str  # the nearest existing parent that was measured
    mount: str
    free_bytes: int
    total_bytes: int


class FreeBytes(FactBase[DiskSpace | None]):
    """
    Free bytes on the filesystem that holds ``path``, measured at its nearest
    existing parent, so it works before the path (e.g. a model dir) exists.

    .. code:: python

        space = host.get_fact(FreeBytes, path="/srv/models/kimi-k2.6")
        space.free_bytes
    """

    def command(self, path: str) -> StringCommand:
        return StringCommand(
            "set --",
            QuoteString(path),
            '; p="$1"; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; '
            'echo "path: $p"; df -P -B1 "$p" | tail -n 1',
        )

    def process(self, output: list[str]) -> DiskSpace | None:
        path = None
        for line in output:
            if line.startswith("path: "):
                path = line[6:]
            elif path is not None and line.strip():
                # Filesystem 1-blocks Used Available Capacity Mounted-on
                fields = line.split()
                return DiskSpace(
                    path=path,
                    mount=fields[5],
                    free_bytes=int(fields[3]),
                    total_bytes=int(fields[1]),
                )
        return None
