"""The get-pip.py bootstrap on a sandbox host without ensurepip and without an
uploaded wheel: the deploy fetches get-pip.py from get_pip_url (here the
sandbox Hub's stand-in for bootstrap.pypa.io, sandbox/getpip.py) and runs it
with the venv's python; the second run changes nothing."""

import pytest

from sandbox import hubd
from tests.integration.helpers import boot_extra_host, grand_total, pyinfra, remove_host

pytestmark = pytest.mark.sandbox

VENV = "/opt/getpip/venv"
URL = hubd.ENDPOINT + "/get-pip.py"
ENV = {"SGC_VENV": VENV, "SGC_GET_PIP_URL": URL}


@pytest.fixture(scope="module")
def bare_host():
    host = boot_extra_host(7)
    try:
        # the incident's host: no ensurepip, and a venv made without pip (as uv makes them)
        host.run(f"rm -rf /usr/lib/python3.11/ensurepip && python3 -m venv --without-pip {VENV}")
        yield host
    finally:
        remove_host(host)


def test_get_pip_bootstraps_pip_then_is_a_no_op(bare_host):
    assert bare_host.run(f"{VENV}/bin/python -m pip --version", check=False).returncode != 0
    dry = pyinfra("tests/integration/getpip_deploy.py", "--dry", limit=bare_host.name, env=ENV)
    assert f"plan: bootstrap pip in {VENV} with get-pip.py from {URL} (no ensurepip)" in dry.out, dry.out[-3000:]
    first = pyinfra("tests/integration/getpip_deploy.py", limit=bare_host.name, env=ENV)
    assert first.returncode == 0, first.out[-3000:]
    assert grand_total(first.out)[0] == 1, first.out[-3000:]
    assert bare_host.run(f"{VENV}/bin/python -m pip --version").stdout.startswith("pip ")
    assert bare_host.run("test -s /var/cache/sglang-converge/get-pip.py", check=False).returncode == 0
    second = pyinfra("tests/integration/getpip_deploy.py", limit=bare_host.name, env=ENV)
    assert second.returncode == 0 and grand_total(second.out)[0] == 0, second.out[-3000:]
