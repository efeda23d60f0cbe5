"""A unit the deploy does not own is never overwritten (core/ops.py
managed_file): on a sandbox host with a foreign /etc/systemd/system/foreign.service,
a deploy with unit_name = 'foreign.service' fails naming the file and leaves it
byte for byte as it was; with a unit name of its own the same deploy writes its
files (the positive control).

The module's own host: sgc230, removed before (leftovers) and after.
"""

from __future__ import annotations

import hashlib

import pytest

from sandbox import hosts as H
from tests.integration.helpers import boot_extra_host, grand_total, pyinfra, remove_host

pytestmark = pytest.mark.sandbox

INDEX = 230
DEPLOY = "tests/integration/server_files_deploy.py"
UNIT = "/etc/systemd/system/foreign.service"
FOREIGN = "[Unit]\nDescription=a service of someone else\n[Service]\nExecStart=/bin/sleep infinity\n"


@pytest.fixture(scope="module")
def host():
    H.remove(H.host_name(INDEX))  # leftovers of an interrupted run: start from a fresh host
    host = boot_extra_host(INDEX)
    try:
        yield host
    finally:
        remove_host(host)


def sha256(host, path: str) -> str:
    return host.run(f"sha256sum {path}").stdout.split()[0]


def test_a_foreign_unit_file_is_refused_and_left_as_it_was(host):
    host.run(f"cat > {UNIT}", input=FOREIGN)
    before = sha256(host, UNIT)
    assert before == hashlib.sha256(FOREIGN.encode()).hexdigest()  # the file is there, as written

    run = pyinfra(DEPLOY, "--data", "unit_name=foreign.service", limit=host.name, timeout=120)
    assert run.returncode != 0, run.out[-3000:]
    assert (f"unit file {UNIT} exists and is not managed by sglang-converge "
            "(no '# Managed by sglang-converge' line): refusing to overwrite it; choose another unit_name") in run.out
    assert sha256(host, UNIT) == before
    # nothing else was written for it either: the unit file is checked first
    assert host.run("ls /etc/sglang/foreign.yaml /etc/sglang/foreign.env", check=False).returncode != 0


def test_a_unit_name_of_its_own_is_written(host):
    run = pyinfra(DEPLOY, "--data", "unit_name=sgc-owned.service", limit=host.name, timeout=120)
    assert run.returncode == 0, run.out[-3000:]
    assert grand_total(run.out)[1] == 0, run.out[-3000:]
    head = host.run("head -n 1 /etc/systemd/system/sgc-owned.service /etc/sglang/sgc-owned.env").stdout
    assert head.count("# Managed by sglang-converge") == 2, head
    again = pyinfra(DEPLOY, "--data", "unit_name=sgc-owned.service", limit=host.name, timeout=120)
    assert again.returncode == 0 and grand_total(again.out)[0] == 0, again.out[-3000:]
