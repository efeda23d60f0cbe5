"""A stand-in for https://bootstrap.pypa.io/get-pip.py, served by the sandbox
Hub stand-in at /get-pip.py (the sandbox has no internet but the package
registries, and bootstrap.pypa.io is not one of them).

Like the real script it is one self-contained Python file carrying pip's own
wheel, base85-encoded, and it installs pip into the interpreter that runs it
with that pip (arguments are passed on to `pip install`, e.g.
--disable-pip-version-check). Unlike it, it installs only pip and never asks
an index. The deploy's get-pip path (core/venv_ops.py: curl the URL, run it
with the venv's python) is the production one.
"""

from __future__ import annotations

import base64
from pathlib import Path

from sandbox.inventory_data import WHEELS  # where the sandbox keeps pip's wheel (sandbox/scenario.py)

_TEMPLATE = '''#!/usr/bin/env python3
# sglang-converge sandbox: a stand-in for https://bootstrap.pypa.io/get-pip.py.
# DATA is {wheel} (base85); it installs pip from it, offline.
import base64
import os
import shutil
import sys
import tempfile

DATA = b"""
{data}
"""


def main():
    folder = tempfile.mkdtemp(prefix="get-pip-")
    wheel = os.path.join(folder, "{wheel}")
    with open(wheel, "wb") as handle:
        handle.write(base64.b85decode(DATA.replace(b"\\n", b"")))
    sys.path.insert(0, wheel)  # run pip from its own wheel, as get-pip.py does
    from pip._internal.cli.main import main as pip_main

    try:
        code = pip_main(["install", "--no-index", "--upgrade", "--force-reinstall", *sys.argv[1:], wheel])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
'''


def newest_wheel(folder: Path | None = None) -> Path | None:
    found = sorted((folder or WHEELS).glob("pip-*.whl"))
    return found[-1] if found else None


def script(wheel: Path) -> str:
    """The stand-in get-pip.py carrying ``wheel``."""
    encoded = base64.b85encode(wheel.read_bytes()).decode()
    lines = "\n".join(encoded[i : i + 79] for i in range(0, len(encoded), 79))
    return _TEMPLATE.format(wheel=wheel.name, data=lines)
