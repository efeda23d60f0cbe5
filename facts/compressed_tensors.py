"""compressed-tensors in a venv: its version and CompressionFormat members, and
the installed distributions that pin it."""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api import FactBase, StringCommand

from core.paths import CACHE_DIR
from facts._value import FactValue
from facts.venv import last_json_line, venv_python_command

# One python run in the venv; the member list is cached per installed version,
# because importing compressed_tensors (and torch) takes seconds.
_FORMATS_PY = """
import importlib.metadata as md, json, os, sys
try:
    version = md.version("compressed-tensors")
except md.PackageNotFoundError:
    print(json.dumps({"version": None, "members": []})); sys.exit(0)
cache = "CACHE_DIR/ct-formats-%s-%s.json" % (sys.prefix.strip("/").replace("/", "_"), version)
if os.path.exists(cache):
    print(open(cache).read()); sys.exit(0)
from compressed_tensors.config import CompressionFormat
out = json.dumps({"version": version, "members": sorted(member.name for member in CompressionFormat)})
os.makedirs(os.path.dirname(cache), exist_ok=True)
with open(cache + ".tmp", "w") as handle:
    handle.write(out)
os.replace(cache + ".tmp", cache)
print(out)
""".replace("CACHE_DIR", CACHE_DIR, 1)

_REQUIRERS_PY = """
import importlib.metadata as md, json, re
out = {}
for dist in md.distributions():
    for req in dist.requires or []:
        if re.match(r"compressed[-_.]tensors\\b", req, re.I) and "extra ==" not in req:
            out.setdefault(dist.metadata["Name"], []).append(req)
print(json.dumps(out, sort_keys=True))
"""


@dataclass(frozen=True)
class CompressedTensors(FactValue):
    version: str | None
    members: list[str]  # CompressionFormat member names, e.g. "nvfp4_pack_quantized"


class CompressionFormats(FactBase[CompressedTensors]):
    """
    The venv's compressed-tensors version and its CompressionFormat members,
    imported with the venv's own python.

    .. code:: python

        ct = host.get_fact(CompressionFormats, path="/opt/sglang/venv")
        "nvfp4_pack_quantized" in ct.members
    """

    def command(self, path: str) -> StringCommand:
        return venv_python_command(path, _FORMATS_PY, """'{"version": null, "members": []}'""")

    def process(self, output: list[str]) -> CompressedTensors:
        data = last_json_line(output)
        return CompressedTensors(version=data["version"], members=list(data["members"]))


class CompressedTensorsRequirers(FactBase[dict[str, list[str]]]):
    """
    Installed distributions that require compressed-tensors, with their requirement strings.

    .. code:: python

        host.get_fact(CompressedTensorsRequirers, path="/opt/sglang/venv")
        # {"vllm": ["compressed-tensors==0.8.1"]}
    """

    def command(self, path: str) -> StringCommand:
        return venv_python_command(path, _REQUIRERS_PY, "'{}'")

    def process(self, output: list[str]) -> dict[str, list[str]]:
        requirers: dict[str, list[str]] = last_json_line(output)
        return requirers
