"""What the SGLang stand-in's parser child computed, kept per guest and replayed.

Every stand-in start spawns children that import torch (and, through compressed-tensors,
transformers): SGLang's real argument parser (sglang_standin.parse_in_child) and SGLang's own
compressed-tensors check (check_quantization_in_child). In a sandbox guest they took ~5 s of CPU
each, most of a TP 8 restart's 10-14 s (measured with ps in a guest, 2026-12-07), and the test
bed restarts servers hundreds of times on 2 shared cores. Both outcomes are kept here.

The parser's result is a function of what it reads, and that is the key: its argv, its environment
(less what systemd sets per start), the Python it runs, the --config file's bytes,
the model dir's top-level JSON files and the simulated GPUs' layout.
Same key, same result, as long as every file the parser imported (and every site-packages directory
on its sys.path) is as it was: the record lists them with their sizes and mtimes, and a record whose
files changed is not used. Then its output and reply are replayed and the stand-in logs that it
reused them. A change of any input (a fault test's bad flag, a corrupted config.json, a package's
files moved away behind pip's back) runs the parser again. Only a parse is kept: a refusal or a
crash always runs the parser, which says why.

The compressed-tensors check's key is the model's quantization_config, the Python and the sglang
sources' directory; its record lists every module it imported and the two SGLang source files it
runs. Only a passed check is kept: a refusal runs again and fails with its own traceback.

On only where the sandbox made CACHE_DIR (sandbox/hosts.py, in every guest): the unit tests'
stand-ins always run their parser. Secrets (the --config file's api-key values, the
environment's *KEY*/*TOKEN* values) are stored as placeholders and put back when read; the
directory is root's alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

CACHE_DIR = Path(os.environ.get("SANDBOX_STANDIN_CACHE", "/var/cache/sandbox-standin"))
# what systemd (or the shell) sets anew for each start of the same unit: not an input of the parser
PER_START_ENV = ("INVOCATION_ID", "JOURNAL_STREAM", "SYSTEMD_EXEC_PID", "NOTIFY_SOCKET", "MANAGERPID",
                 "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", "WATCHDOG_PID", "WATCHDOG_USEC", "MONITOR_")
_KEY_LINE = re.compile(r"^\s*(?:admin-)?api-key:\s*['\"]?([^'\"\n]+?)['\"]?\s*$", re.M)


def enabled() -> bool:
    return CACHE_DIR.is_dir()


def _stat(path: Path | str) -> list:
    try:
        st = os.stat(path)
    except OSError:
        return [str(path), None]
    return [str(path), st.st_size, st.st_mtime_ns]


def _bytes_digest(path: str | None) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None
    except OSError:
        return None


def _arg(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _digest(parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def parser_key(argv: list[str], gpu_layout: Path) -> str | None:
    """The parser's inputs as a digest; None where the model dir is not on the command line. The sglang
    and packages it runs are not in it: load() holds a record to every file the parser imported."""
    model = _arg(argv, "--model-path")
    config = _arg(argv, "--config")
    if model is None:
        return None
    env = {k: v for k, v in os.environ.items() if not k.startswith(PER_START_ENV)}
    model_json = sorted(_stat(p) for p in Path(model).glob("*.json")) if Path(model).is_dir() else [model]
    return _digest({"argv": argv, "env": env, "python": sys.executable, "config": _bytes_digest(config),
                    "model_json": model_json, "gpus": _bytes_digest(str(gpu_layout))})


def quant_key(quantization_config: dict, sglang_dir: Path | None) -> str:
    """The compressed-tensors check's inputs as a digest: the model's quantization_config, the Python and
    the sglang sources it runs (the packages it imports are held by the record's imported files)."""
    return _digest({"kind": "quant", "config": quantization_config, "python": sys.executable,
                    "sglang": str(sglang_dir)})


def secrets(argv: list[str]) -> list[str]:
    """Values that must not be written down: the --config file's keys, the environment's keys and tokens."""
    found = []
    config = _arg(argv, "--config")
    try:
        found += _KEY_LINE.findall(Path(config).read_text()) if config else []
    except OSError:
        pass
    found += [v for k, v in os.environ.items() if ("KEY" in k.upper() or "TOKEN" in k.upper()) and len(v) >= 8]
    found += [v for flag in ("--api-key", "--admin-api-key") if (v := _arg(argv, flag))]
    return sorted(set(found), key=len, reverse=True)


def _swap(value: object, pairs: list[tuple[str, str]]) -> object:
    text = json.dumps(value)
    for old, new in pairs:
        text = text.replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1])
    return json.loads(text)


def imported_files(also: tuple[str, ...] | list[str] = ()) -> dict[str, list]:
    """What this process imported from (every module's file, and ``also``: files it ran otherwise; every
    site-packages directory on sys.path, whose mtime changes when pip or anyone adds, removes or renames
    a package in it), with sizes and mtimes. Not the working directory: the files a server writes there
    change its mtime."""
    files = {f: _stat(f)[1:] for m in list(sys.modules.values()) if isinstance(f := getattr(m, "__file__", None), str)}
    files.update({f: _stat(f)[1:] for f in also})
    files.update({d: _stat(d)[1:] for d in sys.path if d.endswith(("site-packages", "dist-packages")) and os.path.isdir(d)})
    return files


def unchanged(files: dict[str, list]) -> bool:
    return all(_stat(path)[1:] == list(seen) for path, seen in files.items())


def load(key: str | None, hidden: list[str]) -> dict | None:
    """The record kept for ``key`` if every file its child imported is unchanged, else None."""
    if key is None or not enabled():
        return None
    try:
        record = json.loads((CACHE_DIR / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record.get("imported"), dict) or not unchanged(record["imported"]):
        return None
    return _swap(record, [(f"@@sandbox-secret-{i}@@", s) for i, s in enumerate(hidden)])  # type: ignore[return-value]


def store(key: str | None, record: dict, hidden: list[str]) -> None:
    if key is None or not enabled():
        return
    os.chmod(CACHE_DIR, 0o700)
    tmp = CACHE_DIR / f".{key}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(_swap(record, [(s, f"@@sandbox-secret-{i}@@") for i, s in enumerate(hidden)]), f)
    os.replace(tmp, CACHE_DIR / f"{key}.json")
