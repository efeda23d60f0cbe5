"""Several facts about one venv from a single python run on the host.

Each venv fact (facts/venv.py, facts/compressed_tensors.py) runs its own code
with the venv's python; on a busy host most of each read is that python's
start-up and its import of importlib.metadata. ``VenvFacts`` runs the code of
all the ``MEMBERS`` in one process, each as its own fact would (its argv, its
stdout, its ``sys.exit``), and returns every member's output; core/factcache.py
keeps each one as the value of that member fact, so the steps that read them
one by one cost one round trip and one python start between them.

    outputs = host.get_fact(VenvFacts, path="/opt/sglang/venv")
    values = member_values(outputs)   # {(VenvPackages, {"path": ...}): {...}, ...}
"""

from __future__ import annotations

import json
from typing import Any

from pyinfra.api import FactBase, StringCommand

from facts import compressed_tensors as ct
from facts import venv
from facts.venv import venv_python_command

LOADER = "sglang"  # the package whose references CompressionFormatReferences reads (tasks/quant_deps.LOADER)

# (fact, its python code, argv after the code, the fact's keyword arguments besides path, its output without a venv)
MEMBERS: tuple[tuple[type[FactBase], str, tuple[str, ...], dict[str, str], str], ...] = (
    (venv.VenvState, venv._VENV_STATE_PY, (), {}, "absent"),
    (venv.VenvPackages, venv._VENV_PACKAGES_PY, (), {}, "{}"),
    (ct.CompressionFormats, ct._FORMATS_PY, (), {}, '{"version": null, "members": []}'),
    (ct.CompressionFormatReferences, ct._REFERENCES_PY, (LOADER,), {"package": LOADER},
     json.dumps({"package": LOADER, "version": None, "files": 0, "members": {}})),
    (ct.CompressedTensorsRequirers, ct._REQUIRERS_PY, (), {}, "{}"),
)

# Runs each member's code as `python -c CODE ARGS` would: a member that raises or exits non-zero gives None
# (its own fact is then read alone, and fails as it would have).
_RUNNER = """
import contextlib, io, json, sys
out = []
for code, args in json.loads(sys.argv[1]):
    sys.argv = ["-c", *args]
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            exec(compile(code, "<fact>", "exec"), {"__name__": "__main__"})
    except SystemExit as stop:
        if stop.code not in (None, 0):
            buffer = None
    except Exception:
        buffer = None
    out.append(None if buffer is None else buffer.getvalue())
print(json.dumps(out))
"""


class VenvFacts(FactBase[list[str | None] | None]):
    """
    The output of each of ``MEMBERS``' code, run by one python process of the
    venv at ``path``; None when the venv has no python.

    .. code:: python

        host.get_fact(VenvFacts, path="/opt/sglang/venv")
    """

    def command(self, path: str) -> StringCommand:
        payload = json.dumps([[code, list(args)] for _fact, code, args, _kwargs, _absent in MEMBERS])
        return venv_python_command(path, _RUNNER, "absent", payload)

    def process(self, output: list[str]) -> list[str | None] | None:
        lines = [line for line in output if line.strip()]
        if not lines or lines[-1].strip() == "absent":
            return None
        outputs: list[str | None] = json.loads(lines[-1])
        return outputs


def member_values(path: str, outputs: list[str | None] | None) -> list[tuple[type[FactBase], dict[str, str], Any]]:
    """(fact, its keyword arguments, its value) for each member whose code ran; every member when the venv is absent."""
    if outputs is not None and len(outputs) != len(MEMBERS):
        return []
    values = []
    for index, (fact, _code, _args, kwargs, absent) in enumerate(MEMBERS):
        text = absent if outputs is None else outputs[index]
        if text is None:
            continue
        lines = text.splitlines()
        values.append((fact, {"path": path, **kwargs}, fact().process(lines) if lines else fact().default()))
    return values
