"""Runs ON a server host, as the SGLang unit's ExecStart: SGLang's server, its
API key kept out of everything it logs.

    VENV/bin/python server_launch.py sglang.launch_server --model-path ... --config /etc/sglang/sglang.yaml

SGLang 0.5.23 logs ``server_args={...}`` at INFO at every start
(sglang/srt/entrypoints/engine.py, ``_server_args_for_logging``), which
redacts only the watermark fields: ``api_key`` from ``--config`` reaches the
journal in clear. This launcher (standard library only; it runs the venv's
own server module) therefore:

1. reads the key from the root-only options file named by ``--config``
   (the ``api-key:`` line the deploy writes, templates/sglang-options.yaml.j2),
   never from argv or the environment; only the file's *path* goes into the
   environment (``SGLANG_CONVERGE_OPTIONS_FILE``), for the TP rank processes;
2. installs a log record factory (``logging.setLogRecordFactory``) that
   replaces the key by ``<redacted>`` in every record's message, exception
   text and stack, whichever logger made it. Not a filter on the handlers:
   SGLang's ``configure_logger`` (sglang/srt/utils/common.py) calls
   ``logging.basicConfig(force=True)`` in every process, which throws the
   root handlers (and their filters) away, and uvicorn installs its own with
   dictConfig; the record factory is process-wide and survives both;
3. wraps ``sys.stdout`` / ``sys.stderr`` so that prints, warnings and
   uncaught tracebacks are redacted too;
4. runs the server module in this process:
   ``runpy.run_module(module, run_name="__main__")`` with ``sys.argv`` set.

The TP ranks: SGLang starts its schedulers (one process per TP rank) and the
detokenizer with multiprocessing's "spawn" (engine.py sets it), and a spawned
child first re-runs the parent's ``__main__`` module by its path as
``__mp_main__`` (multiprocessing/spawn.py: ``get_preparation_data`` ->
``init_main_from_path``). ``run_module`` leaves ``sys.modules["__main__"]``
as this file, so every spawned child runs this module's top level - the
``_install_from_environment()`` call below - before it imports SGLang and
configures its logging. Chosen over patching ``configure_logger`` (imported by
name into many SGLang modules, and skipped for SGLANG_LOGGING_CONFIG_PATH) and
over a sitecustomize on PYTHONPATH (would touch every Python the unit starts).
"""

from __future__ import annotations

import json
import logging
import os
import runpy
import sys
import traceback
from typing import Any

REDACTED = "<redacted>"
OPTIONS_ENV = "SGLANG_CONVERGE_OPTIONS_FILE"  # the options file's path (never the key)
KEY_NAMES = ("api-key", "admin-api-key")


def read_secrets(path: str) -> list[str]:
    """The key values of a --config file (``api-key: "KEY"`` lines, YAML scalars)."""
    secrets = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            name, sep, value = line.partition(":")
            if not sep or name.strip() not in KEY_NAMES:
                continue
            value = value.strip()
            if value[:1] == '"':
                value = json.loads(value)
            elif value[:1] == "'":
                value = value[1:-1].replace("''", "'")
            if value:
                secrets.append(value)
    return secrets


def _variants(secrets: list[str]) -> list[str]:
    """Each secret as it may be printed: plain, inside repr() and inside JSON; longest first."""
    out: set[str] = set()
    for secret in secrets:
        out.update({secret, repr(secret)[1:-1], json.dumps(secret)[1:-1]})
    return sorted((s for s in out if s), key=len, reverse=True)


class Redactor:
    def __init__(self, secrets: list[str]):
        self.secrets = _variants(secrets)

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text

    def record(self, record: logging.LogRecord) -> None:
        """Redact one log record in place: its message (args merged), exception and stack text."""
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is logging's to report
            message = str(record.msg)
        clean = self(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
            text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
            if self(text) != text:
                record.exc_text = self(text)  # Formatter.format uses exc_text when set
        if record.stack_info:
            record.stack_info = self(record.stack_info)


class RedactingStream:
    """A text stream that redacts what is written through it; the rest is the wrapped stream's."""

    def __init__(self, stream: Any, redactor: Redactor):
        self._stream = stream
        self._redactor = redactor

    def write(self, text: str) -> int:
        self._stream.write(self._redactor(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def install(secrets: list[str]) -> Redactor | None:
    """Redact these values from every log record and from stdout/stderr of this process."""
    if not secrets:
        return None
    redactor = Redactor(secrets)
    base = logging.getLogRecordFactory()
    if getattr(base, "sglang_converge_redactor", None) is None:

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = base(*args, **kwargs)
            redactor.record(record)
            return record

        factory.sglang_converge_redactor = redactor  # type: ignore[attr-defined]
        logging.setLogRecordFactory(factory)
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, RedactingStream):
            setattr(sys, name, RedactingStream(stream, redactor))
    return redactor


def _install_from_environment() -> None:
    """In a spawned TP rank (or any process re-running this module): the parent's options file."""
    path = os.environ.get(OPTIONS_ENV)
    if path:
        try:
            install(read_secrets(path))
        except OSError as error:
            raise SystemExit(f"server_launch: cannot read {path}: {error}") from error


def config_path(argv: list[str]) -> str | None:
    """The --config file of a server command line (``--config F`` or ``--config=F``)."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def main(argv: list[str]) -> None:
    if not argv or argv[0].startswith("-"):
        raise SystemExit("usage: server_launch.py SERVER_MODULE SERVER-ARGS... (e.g. sglang.launch_server ...)")
    module, server_args = argv[0], argv[1:]
    path = config_path(server_args)
    if path:
        os.environ[OPTIONS_ENV] = os.path.abspath(path)
        _install_from_environment()
    sys.argv = [module, *server_args]
    runpy.run_module(module, run_name="__main__")


# Runs in the launched server and again in every process it spawns (see above).
_install_from_environment()

if __name__ == "__main__":
    main(sys.argv[1:])
