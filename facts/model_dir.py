"""A model dir on the host: its files, the marker of the last verified
download, partial downloads, and the model's config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand

from core.paths import MODEL_MARKER, SWITCHED, SYSTEMD_DIR
from facts._value import FactValue


@dataclass(frozen=True)
class ModelDir(FactValue):
    marker: dict[str, Any] | None  # what the last verified download recorded
    files: dict[str, int]  # relative path -> size, outside .cache/
    partial_bytes: int  # bytes in huggingface_hub's *.incomplete files


class ModelDirState(FactBase[ModelDir]):
    """
    The files in a model dir, its marker, and partial downloads.

    .. code:: python

        state = host.get_fact(ModelDirState, path="/srv/models/kimi-k2.6")
        state.marker["revision"] if state.marker else None
    """

    @staticmethod
    def default() -> ModelDir:
        return ModelDir(marker=None, files={}, partial_bytes=0)

    def command(self, path: str) -> StringCommand:
        return StringCommand(
            "set --",
            QuoteString(path),
            '; [ -d "$1" ] || exit 0; cd "$1" || exit 1; '
            f'[ -f {MODEL_MARKER} ] && printf "marker: %s\\n" "$(tr -d "\\n" < {MODEL_MARKER})"; '
            f"find . -path ./.cache -prune -o -type f ! -name '{MODEL_MARKER}*' ! -name {SWITCHED} -printf 'file: %s %P\\n'; "
            "find ./.cache -type f -name '*.incomplete' -printf 'partial: %s %P\\n' 2>/dev/null; true",
        )

    def process(self, output: list[str]) -> ModelDir:
        marker, files, partial = None, {}, 0
        for line in output:
            if line.startswith("marker: "):
                try:
                    marker = json.loads(line[8:])
                except ValueError:
                    marker = None
            elif line.startswith("file: "):
                size, name = line[6:].split(" ", 1)
                files[name] = int(size)
            elif line.startswith("partial: "):
                partial += int(line[9:].split(" ", 1)[0])
        return ModelDir(marker=marker, files=files, partial_bytes=partial)


class ModelConfig(FactBase[dict[str, Any] | None]):
    """
    The model's config.json on the host, or None before it is downloaded.

    .. code:: python

        host.get_fact(ModelConfig, path="/srv/models/kimi-k2.6")["quantization_config"]
    """

    def command(self, path: str) -> StringCommand:
        return StringCommand("set --", QuoteString(path), '; [ -f "$1/config.json" ] && cat "$1/config.json" || true')

    def process(self, output: list[str]) -> dict[str, Any] | None:
        text = "\n".join(output).strip()
        config: dict[str, Any] | None = json.loads(text) if text else None
        return config


@dataclass(frozen=True)
class Revision(FactValue):
    path: str
    marker: dict[str, Any] | None  # its verified download's marker (None: none yet, or a download cut off)
    switched: int | None  # epoch seconds of the last restart onto it; None: never switched to


@dataclass(frozen=True)
class Revisions(FactValue):
    revisions: tuple[Revision, ...]
    referenced: tuple[str, ...]  # revision dirs some unit file of the host names (another server serving it)
    half_removed: tuple[str, ...] = ()  # <dir>.removing: a removal cut off
    legacy: str | None = None  # the model dir itself, holding a revision (the layout before revision dirs)


class ModelRevisions(FactBase[Revisions]):
    """
    The revision dirs of a model (``<model_dir>-revisions/<revision[:12]>``): each one's marker and
    last switch, and which of them a unit file names.

    .. code:: python

        host.get_fact(ModelRevisions, root="/srv/models/kimi-k2.6-revisions")
    """

    @staticmethod
    def default() -> Revisions:
        return Revisions((), ())

    def command(self, root: str) -> StringCommand:
        # a unit names a dir as an argument (--model-path DIR ...) or a path in it
        referenced = ('for f in "$u"/*.service; do [ -f "$f" ] && awk -v d="$d" \'{ for (i = 1; i <= NF; i++) '
                      'if ($i == d || index($i, d "/") == 1) found = 1 } END { exit !found }\' "$f" && '
                      '{ echo "ref - $d"; break; }; done; ')
        script = (
            'r=$1; u=$2; l=${r%-revisions}; '
            # the layout before revision dirs: the revision's files in the model dir itself
            f'if [ "$l" != "$r" ] && [ -f "$l/{MODEL_MARKER}" ]; then d=$l; echo "legacy - $d"; {referenced}fi; '
            '[ -d "$l.removing" ] && echo "removing - $l.removing"; '
            '[ -d "$r" ] || exit 0; for d in "$r"/*/; do d=${d%/}; [ -d "$d" ] || continue; '
            'case "$d" in *.removing) echo "removing - $d"; continue;; esac; '
            f's=$(stat -c %Y "$d/{SWITCHED}" 2>/dev/null || echo -); echo "rev $s $d"; '
            f'[ -f "$d/{MODEL_MARKER}" ] && printf "marker %s %s\\n" "$d" "$(tr -d "\\n" < "$d/{MODEL_MARKER}")"; '
            f'{referenced}done; true'
        )
        return StringCommand("sh -c", QuoteString(script), "-", QuoteString(root.rstrip("/")), QuoteString(SYSTEMD_DIR))

    def process(self, output: list[str]) -> Revisions:
        switched: dict[str, int | None] = {}
        markers: dict[str, dict[str, Any] | None] = {}
        referenced, half_removed = set(), []
        legacy = None
        for line in output:
            kind, rest = (line.split(" ", 1) + [""])[:2]
            if kind == "marker":
                path, _, text = rest.partition(" ")
                try:
                    markers[path] = json.loads(text)
                except ValueError:
                    markers[path] = None
                continue
            stamp, _, path = rest.partition(" ")
            if kind == "rev" and path:
                switched[path] = int(stamp) if stamp.isdigit() else None
            elif kind == "ref" and path:
                referenced.add(path)
            elif kind == "removing" and path:
                half_removed.append(path)
            elif kind == "legacy" and path:
                legacy = path
        return Revisions(tuple(Revision(path, markers.get(path), at) for path, at in switched.items()),
                         tuple(sorted(referenced)), tuple(half_removed), legacy)


# Reads each *.safetensors file's header (8 bytes of length, then JSON) and prints one JSON list of
# [name, dtype, shape] per tensor: a few MB for a 600 GB checkpoint, no tensor data read.
_HEADERS_SCRIPT = r"""
import glob, json, os, struct, sys
rows = []
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.safetensors"))):
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    rows += [[name, info["dtype"], info["shape"]] for name, info in header.items() if name != "__metadata__"]
print(json.dumps(rows))
"""


class CheckpointTensors(FactBase[list[tuple[str, str, list[int]]] | None]):
    """
    Every tensor's (name, dtype, shape) from the headers of the model dir's *.safetensors files
    (no tensor data is read); None when the dir has none or a header is unreadable.

    .. code:: python

        tensors = host.get_fact(CheckpointTensors, path="/srv/models/kimi-k2.6")
    """

    def command(self, path: str) -> StringCommand:
        return StringCommand("set --", QuoteString(path), '; ls "$1"/*.safetensors >/dev/null 2>&1 || exit 0; '
                             "python3 -c", QuoteString(_HEADERS_SCRIPT), '"$1" 2>/dev/null || true')

    def process(self, output: list[str]) -> list[tuple[str, str, list[int]]] | None:
        text = "\n".join(output).strip()
        try:
            rows = json.loads(text) if text else None
        except ValueError:
            return None
        return [(str(n), str(d), [int(x) for x in s]) for n, d, s in rows] if rows else None
