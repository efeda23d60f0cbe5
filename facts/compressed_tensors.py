"""compressed-tensors in a venv: its version and CompressionFormat members, the
installed distributions that require it (with their versions), and the
CompressionFormat members the code of a package (SGLang) references."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase, StringCommand

from core.paths import CACHE_DIR
from facts._value import FactValue
from facts.venv import last_json_line, venv_python_command

# One python run in the venv; the member list is cached per installed version,
# because importing compressed_tensors (and torch) takes seconds. The caches are
# written to a temp file of the process's own, then renamed: the servers of one
# host read these facts at the same moment.
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
with open(cache + ".%d.tmp" % os.getpid(), "w") as handle:
    handle.write(out)
os.replace(cache + ".%d.tmp" % os.getpid(), cache)
print(out)
""".replace("CACHE_DIR", CACHE_DIR, 1)

# Requires-Dist naming compressed-tensors (not a longer name, not an extra's), per distribution.
_REQUIRERS_PY = """
import importlib.metadata as md, json, re
out = {}
for dist in md.distributions():
    for req in dist.requires or []:
        if re.match(r"compressed[-_.]tensors(?![-_.a-z0-9])", req, re.I) and "extra ==" not in req:
            entry = out.setdefault(dist.metadata["Name"], {"version": dist.version, "requires": []})
            entry["requires"].append(req)
print(json.dumps(out, sort_keys=True))
"""

# The CompressionFormat.<member> names a package's own .py files mention
# (regex on the source text: importing SGLang would pull torch and CUDA). The
# files are those of the distribution's RECORD (else its top-level packages).
# Cached per venv, version and RECORD digest: a scan reads thousands of files.
_REFERENCES_PY = """
import hashlib, importlib.metadata as md, json, os, re, sys
name = sys.argv[1]
try:
    dist = md.distribution(name)
except md.PackageNotFoundError:
    print(json.dumps({"package": name, "version": None, "files": 0, "members": {}})); sys.exit(0)
record = dist.read_text("RECORD") or ""
digest = hashlib.sha256(record.encode()).hexdigest()[:16]
cache = "CACHE_DIR/ct-refs-%s-%s-%s-%s.json" % (sys.prefix.strip("/").replace("/", "_"), name, dist.version, digest)
if record and os.path.exists(cache):
    print(open(cache).read()); sys.exit(0)
paths = [str(f) for f in dist.files or [] if str(f).endswith(".py")]
if not paths:
    for top in (dist.read_text("top_level.txt") or name.replace("-", "_")).split():
        base = str(dist.locate_file(""))
        for folder, _dirs, names in os.walk(os.path.join(base, top)):
            paths += [os.path.relpath(os.path.join(folder, n), base) for n in names if n.endswith(".py")]
pattern = re.compile(r"\\bCompressionFormat\\.([A-Za-z][A-Za-z0-9_]*)")
members, scanned = {}, 0
for rel in sorted(paths):
    try:
        with open(dist.locate_file(rel), encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        continue
    scanned += 1
    if "CompressionFormat." in text:
        for line in text.splitlines():
            if not line.lstrip().startswith("#"):
                for member in pattern.findall(line):
                    members.setdefault(member, set()).add(rel)
out = json.dumps({"package": name, "version": dist.version, "files": scanned,
                  "members": {m: sorted(f) for m, f in sorted(members.items())}}, sort_keys=True)
if record:
    try:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        with open(cache + ".%d.tmp" % os.getpid(), "w") as handle:
            handle.write(out)
        os.replace(cache + ".%d.tmp" % os.getpid(), cache)
    except OSError:
        pass
print(out)
""".replace("CACHE_DIR", CACHE_DIR, 1)


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


@dataclass(frozen=True)
class Requirer(FactValue):
    version: str  # the installed version of the distribution that requires compressed-tensors
    requires: list[str]  # its Requires-Dist strings naming compressed-tensors, e.g. "compressed-tensors==0.18.0"


class CompressedTensorsRequirers(FactBase[dict[str, Requirer]]):
    """
    Installed distributions that require compressed-tensors (their metadata's
    Requires-Dist, read with importlib.metadata; an extra's requirements left
    out), with their versions.

    .. code:: python

        host.get_fact(CompressedTensorsRequirers, path="/opt/sglang/venv")
        # {"sglang": Requirer("0.5.23", ["compressed-tensors==0.18.0"]),
        #  "vllm": Requirer("0.6.5", ["compressed-tensors==0.8.1"])}
    """

    def command(self, path: str) -> StringCommand:
        return venv_python_command(path, _REQUIRERS_PY, "'{}'")

    def process(self, output: list[str]) -> dict[str, Requirer]:
        data = last_json_line(output)
        return {name: Requirer(version=entry["version"], requires=list(entry["requires"]))
                for name, entry in data.items()}


@dataclass(frozen=True)
class FormatReferences(FactValue):
    package: str
    version: str | None  # None: the package is not installed in the venv
    files: int  # how many of its .py files were read
    members: dict[str, list[str]]  # CompressionFormat member -> the package's files that mention it


class CompressionFormatReferences(FactBase[FormatReferences]):
    """
    The CompressionFormat members the installed ``package``'s code references
    (``CompressionFormat.<name>`` in any of its .py files, found by a regex on
    the source, without importing it), and where.

    .. code:: python

        refs = host.get_fact(CompressionFormatReferences, path="/opt/sglang/venv", package="sglang")
        refs.members["nvfp4_pack_quantized"]
        # ["sglang/srt/layers/quantization/compressed_tensors/utils.py"]
    """

    def command(self, path: str, package: str = "sglang") -> StringCommand:
        absent = shlex.quote(json.dumps({"package": package, "version": None, "files": 0, "members": {}}))
        return venv_python_command(path, _REFERENCES_PY, absent, package)

    def process(self, output: list[str]) -> FormatReferences:
        data = last_json_line(output)
        return FormatReferences(package=data["package"], version=data["version"], files=int(data["files"]),
                                members={name: list(files) for name, files in data["members"].items()})
