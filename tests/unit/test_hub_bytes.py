"""remote/hub_bytes.py: the "fetched ..." line is honest about bytes the counter did not see (a
Xet-backed file: hf_xet moves it outside huggingface_hub's httpx client), and the transfer knobs
leave a library that no longer has them alone."""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests.unit.test_fetch_model_faults import (  # noqa: F401 (fixtures)
    FAST, PYTHON, ROOT, fetch, fetched, hub, model, out)

sys.path.insert(0, str(ROOT / "remote"))  # as on the host: the script's modules from its directory
import hub_bytes  # noqa: E402

SANDBOX_PYTHON = str(ROOT / ".sandbox" / "sglang-venv" / "bin" / "python")  # the hosts' venv (hub 1.x)

# fetch_model.py run with one file landing as hf_xet lands a Xet-backed file: written into local_dir by
# something other than huggingface_hub's HTTP client, while the library fetches the others
XET_RUN = """
import glob, shutil, sys
from pathlib import Path
sys.path.insert(0, {remote!r})
import fetch_model, huggingface_hub
real = huggingface_hub.snapshot_download
xet, source = {xet!r}, Path({source!r})

def snapshot_download(*args, allow_patterns, local_dir, **kwargs):
    if glob.escape(xet) in allow_patterns:
        shutil.copyfile(source / xet, Path(local_dir) / xet)
    rest = [p for p in allow_patterns if p != glob.escape(xet)]
    return real(*args, allow_patterns=rest, local_dir=local_dir, **kwargs)

huggingface_hub.snapshot_download = snapshot_download
sys.exit(fetch_model.main(sys.argv[1:]))
"""


def test_a_file_that_landed_without_the_http_client_is_reported_by_its_size_not_as_zero(hub, model, tmp_path):
    xet = max(model.files, key=lambda f: f.size)  # the big shard: on the real Hub the Xet-backed kind
    wrapper = tmp_path / "xet_run.py"
    wrapper.write_text(XET_RUN.format(remote=str(ROOT / "remote"), xet=xet.path, source=str(model.root)))
    proc = fetch(hub, model, tmp_path, *FAST, python_argv=[PYTHON, str(wrapper)])
    assert proc.returncode == 0, out(proc)
    stats = hub.stats(settle_s=5)
    assert fetched(proc)[0] == stats["file_bytes"] == model.total_bytes - xet.size  # what passed httpx
    line = next(line for line in proc.stdout.splitlines() if line.startswith("fetched "))
    assert re.search(rf"\) plus {xet.size} bytes in 1 file not counted on the wire \(Xet", line), line
    assert "verified " in proc.stdout.splitlines()[-1]  # the digests vouch for it like for the others


def test_a_plain_http_run_has_no_uncounted_part(hub, model, tmp_path):
    proc = fetch(hub, model, tmp_path, *FAST)
    assert proc.returncode == 0, out(proc)
    assert fetched(proc)[0] == model.total_bytes
    assert "not counted on the wire" not in proc.stdout


def test_a_resumed_file_is_counted_on_the_wire_and_a_file_seen_nowhere_is_not(tmp_path):
    counter = hub_bytes.ByteCounter()
    counter.installed = True
    (tmp_path / "resumed").write_bytes(b"x" * 30)
    (tmp_path / "xet").write_bytes(b"y" * 50)
    (tmp_path / "empty").write_bytes(b"")
    counter.add(0, "resumed", first=True)
    counter.add(10, "resumed")  # the body stalled after 10 bytes ...
    counter.add(0, "resumed", first=True)
    counter.add(20, "resumed")  # ... and the Range request brought the other 20
    line = hub_bytes.fetched_bytes(counter, tmp_path, {"resumed": 30, "xet": 50, "empty": 0, "missing": 7})
    assert line == ("30 bytes of files (30 bytes in all) plus 50 bytes in 1 file not counted on the wire "
                    "(Xet storage: hf_xet fetched them, outside the HTTP client)")
    assert counter.received["resumed"] == 20  # the latest body, for a failure's "in flight" report


def _http11(read_num_bytes):
    """A stand-in for httpcore's _sync.http11 module."""
    return types.SimpleNamespace(HTTP11Connection=types.SimpleNamespace(READ_NUM_BYTES=read_num_bytes))


def test_the_transfer_knobs_are_set_where_the_library_has_them():
    http11 = _http11(64 * 1024)
    constants = types.SimpleNamespace(DOWNLOAD_CHUNK_SIZE=10 << 20)
    assert hub_bytes.tune_transfer(constants, http11) == ["DOWNLOAD_CHUNK_SIZE=None", f"READ_NUM_BYTES={1 << 20}"]
    assert constants.DOWNLOAD_CHUNK_SIZE is None and http11.HTTP11Connection.READ_NUM_BYTES == 1 << 20


def test_the_transfer_knobs_are_left_alone_where_a_library_no_longer_has_them():
    http11 = _http11("64k")
    constants = types.SimpleNamespace(DOWNLOAD_CHUNK_SIZE="10M")
    assert hub_bytes.tune_transfer(constants, http11) == []
    assert constants.DOWNLOAD_CHUNK_SIZE == "10M" and http11.HTTP11Connection.READ_NUM_BYTES == "64k"
    assert hub_bytes.tune_transfer(types.SimpleNamespace(), types.SimpleNamespace()) == []  # neither: nothing


@pytest.mark.parametrize("python", [PYTHON, SANDBOX_PYTHON], ids=["hub-venv", "host-venv"])
def test_the_installed_libraries_have_both_knobs(python):
    """huggingface_hub 2.x (httpx2) here, 1.x (httpx) in the hosts' venv: both knobs found and set."""
    if not Path(python).exists():
        pytest.skip(f"{python} is not there (make test-venvs)")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import hub_bytes; "
            "from huggingface_hub import constants; print(hub_bytes.tune_transfer(constants))")
    got = subprocess.run([python, "-c", code, str(ROOT / "remote")], capture_output=True, text=True, timeout=60)
    assert got.stdout.strip() == str(["DOWNLOAD_CHUNK_SIZE=None", f"READ_NUM_BYTES={1 << 20}"]), got.stderr
