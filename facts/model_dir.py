"""A model dir on the host: its files, the marker of the last verified
download, partial downloads, and the model's config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand

from core.paths import MODEL_MARKER
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
            f"find . -path ./.cache -prune -o -type f ! -name '{MODEL_MARKER}*' -printf 'file: %s %P\\n'; "
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
