"""A Python interpreter on the host: its version, and whether it has
ensurepip (without it, a venv made with it gets pip from get-pip.py or an
uploaded wheel). Read before the venv exists, from the interpreter that will
make it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyinfra.api import FactBase, QuoteString, StringCommand

from facts._value import FactValue

_VERSION = re.compile(r"^\((\d+), (\d+), (\d+)\)$")

# line 1 exactly `print(sys.version_info[:3])`; line 2 ensurepip or not
_PY = 'import sys, importlib.util; print(sys.version_info[:3]); print(importlib.util.find_spec("ensurepip") is not None)'


@dataclass(frozen=True)
class Interpreter(FactValue):
    version: tuple[int, int, int]
    has_ensurepip: bool

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))


class PythonInterpreter(FactBase[Interpreter | None]):
    """
    The version of the interpreter at ``python`` (``PY -c 'import sys;
    print(sys.version_info[:3])'`` prints ``(3, 11, 2)``) and whether it has
    ensurepip (second line, ``True``/``False``). None when there is no
    executable at that path or it does not run.

    .. code:: python

        py = host.get_fact(PythonInterpreter, python="/usr/bin/python3")
        py.version >= (3, 11) if py else "no python"
    """

    def command(self, python: str) -> StringCommand:
        return StringCommand("set --", QuoteString(python), QuoteString(_PY),
                             '; [ -x "$1" ] && "$1" -c "$2" 2>/dev/null || echo absent')

    def process(self, output: list[str]) -> Interpreter | None:
        lines = [line.strip() for line in output if line.strip()]
        if not lines or lines[0] == "absent" or lines[-1] == "absent":
            return None
        match = _VERSION.match(lines[0])
        if not match:
            raise ValueError(f"unexpected python version line: {lines[0]!r}")
        major, minor, micro = (int(part) for part in match.groups())
        return Interpreter(version=(major, minor, micro), has_ensurepip=len(lines) > 1 and lines[1] == "True")
