"""The reference incident (DESIGN.md) as the acceptance test, on a sandbox host
prepared by `python -m sandbox up --scenario ct200-incident`:

run 1 stops at the disk check before touching anything; after the disk is
grown, run 2 converges: the server's venv of its package set is built beside
the incident's uv venv, which is left as it was (sglang 0.5.23 beside
compressed-tensors 0.8.1 and the vllm-like pin, no pip); pip bootstrapped
offline in the new venv (no ensurepip); model downloaded and verified;
compressed-tensors installed at what the installed SGLang requires - SGLang
0.5.23 pins 0.18.0 and references nvfp4_pack_quantized; the other service
stopped, server ready. Run 3 changes nothing and restarts nothing; a
typo in an extra server arg stops at SGLang's parser with the server still up;
an API key reaches the server only through the root-only options file.
"""

import json
import re
import time

import pytest

from sandbox import hosts as sandbox_api
from sandbox import scenario
from tests.integration.helpers import boot_extra_host, grand_total, pyinfra, remove_host, unit_props

pytestmark = pytest.mark.sandbox

API_KEY = "sk-sandbox-test-9f8e7d6c5b4a"
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def incident():
    host = boot_extra_host(3)
    try:
        scenario.ct200_incident(host, log=lambda line: None)
        yield host
    finally:
        remove_host(host)
        print("\nacceptance story timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in TIMINGS.items()))


LEGACY = "/opt/sglang/venv"  # the incident's uv venv (venv_path): left as it is
ENV = re.compile(r"/opt/sglang/venv-envs/[0-9a-f]{12}")  # the server's venv of its package set


def installed(host, *packages: str, venv: str = LEGACY) -> list[str]:
    code = "import importlib.metadata as m, sys; print(*(m.version(p) for p in sys.argv[1:]))"
    return host.run(f"{venv}/bin/python -c '{code}' {' '.join(packages)}").stdout.split()


def server_venv(host) -> str:
    found = ENV.findall(host.run("grep ^ExecStart= /etc/systemd/system/sglang.service").stdout)
    assert len(found) == 1, found
    return found[0]


def timed(name, *args, **kwargs):
    started = time.monotonic()
    proc = pyinfra(*args, **kwargs)
    TIMINGS[name] = time.monotonic() - started
    return proc


def test_run1_stops_at_the_disk_check_before_touching_anything(incident):
    proc = timed("run 1", "deploy.py", limit=incident.name)
    assert proc.returncode != 0, proc.out
    assert "preflight: not enough disk for sandbox/tiny-kimi-int4@0123456789ab: need 0.040 GB" in proc.out, proc.out
    assert "/srv/models has 0.021 GB (21.0 MB) free and 0.005 GB (5.0 MB) must stay free" in proc.out
    assert "Starting operation: Python environment" not in proc.out  # stopped before any change
    # the host is exactly as the scenario left it
    assert incident.run("/opt/sglang/venv/bin/python -m pip --version", check=False).returncode != 0
    assert incident.run("ls -A /srv/models").stdout.strip() == ""
    assert incident.run("systemctl is-active embedder.service", check=False).stdout.strip() == "active"
    assert incident.run("test -e /etc/systemd/system/sglang.service", check=False).returncode != 0
    assert installed(incident, "compressed-tensors", "sglang") == ["0.8.1", "0.5.23"]


def test_dry_run_plans_the_whole_fix_and_changes_nothing(incident):
    sandbox_api.grow_disk(incident, scenario.MODEL_DISK, scenario.GROWN_DISK_MIB)
    proc = pyinfra("deploy.py", "--dry", "--diff", limit=incident.name)
    out = proc.out
    venv = ENV.search(out)
    assert venv, out
    venv = venv.group(0)
    assert f"plan: create venv {venv} with /usr/bin/python3" in out, out
    assert f"plan: bootstrap pip in the new venv {venv} (ensurepip, else the uploaded pip wheel)" in out, out
    assert "plan: download sandbox/tiny-kimi-int4@0123456789ab into /srv/models/tiny-revisions/0123456789ab: 0.040 GB" in out
    # the new venv holds no sglang yet: what it requires is read when the step runs, and the plan says so
    assert (f"plan: quant deps: sglang is not installed in {venv} yet (python_env installs sglang==0.5.23): what it "
            "requires of compressed-tensors") in out
    assert "(python3 of embedder.service) holds 56320 MiB on GPU 0 -> systemctl stop embedder.service" in out
    assert (f"+ExecStart={venv}/bin/python /usr/local/lib/sglang-converge/server_launch.py sglang_standin "
            "--model-path /srv/models/tiny-revisions/0123456789ab") in out
    assert "plan: start sglang.service" in out
    assert incident.run("ls -A /srv/models").stdout.strip() == ""
    assert incident.run("systemctl is-active embedder.service", check=False).stdout.strip() == "active"


def test_run2_converges_the_incident_host(incident):
    proc = timed("run 2", "deploy.py", limit=incident.name)
    out = proc.out
    assert proc.returncode == 0, out
    assert "model: verified 10 files" in out
    assert "quant deps: sglang 0.5.23 requires compressed-tensors==0.18.0; installed none" in out
    assert "quant deps: pip install compressed-tensors==0.18.0 because sglang 0.5.23 requires" in out
    assert "quant deps: compressed-tensors is now 0.18.0: it satisfies compressed-tensors==0.18.0" in out
    assert "stale GPU processes: systemctl stop embedder.service" in out
    assert "ready: sglang.service serves tiny at http://127.0.0.1:30000" in out
    # pip bootstrapped the offline way, in the server's new venv (made without pip, like uv makes them)
    venv = server_venv(incident)
    assert incident.run(f"{venv}/bin/python -m pip --version").stdout.startswith("pip ")
    members = incident.run(
        f"{venv}/bin/python -c 'from compressed_tensors.config import CompressionFormat as F;"
        " print(F.nvfp4_pack_quantized.value)'"
    ).stdout
    assert members.strip() == "nvfp4-pack-quantized"
    assert installed(incident, "compressed-tensors", "sglang", venv=venv) == ["0.18.0", "0.5.23"]
    # the incident's uv venv is as the scenario left it: no pip, compressed-tensors 0.8.1
    assert "uv =" in incident.run(f"cat {LEGACY}/pyvenv.cfg").stdout
    assert incident.run(f"{LEGACY}/bin/python -m pip --version", check=False).returncode != 0
    assert installed(incident, "compressed-tensors", "sglang") == ["0.8.1", "0.5.23"]
    config = json.loads(incident.run("cat /srv/models/tiny-revisions/0123456789ab/config.json").stdout)["quantization_config"]
    assert (config["format"], config["config_groups"]["group_0"]["weights"]["group_size"]) == ("pack-quantized", 32)
    assert incident.run(f"{venv}/bin/python -c 'import torch; print(torch.__version__)'").stdout.strip() == "2.13.0+cpu"
    marker = json.loads(incident.run("cat /srv/models/tiny-revisions/0123456789ab/.sglang-converge.json").stdout)
    assert marker["revision"] == "0123456789abcdef0123456789abcdef01234567"
    assert incident.run("find /srv/models -name '*.incomplete'").stdout.strip() == ""
    assert incident.run("systemctl is-active embedder.service", check=False).stdout.strip() == "inactive"
    apps = incident.run("nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader").stdout
    # one TP rank process per GPU (as SGLang's schedulers), each in sglang.service's cgroup
    pids = [line.split(",")[0].strip() for line in apps.splitlines()]
    assert len(pids) == 8 and len(set(pids)) == 8, apps
    cgroups = incident.run(" ; ".join(f"cat /proc/{pid}/cgroup" for pid in pids)).stdout
    assert cgroups.count("sglang.service") >= 8, cgroups
    assert '"id":"tiny"' in incident.run("curl -s http://127.0.0.1:30000/v1/models").stdout.replace(" ", "")


def test_run3_changes_nothing_and_restarts_nothing(incident):
    before = unit_props(incident, "sglang.service")
    proc = timed("run 3 (no-op)", "deploy.py", limit=incident.name)
    assert proc.returncode == 0, proc.out
    success, error, no_change = grand_total(proc.out)
    assert (success, error) == (0, 0), proc.out
    assert no_change >= 10
    assert unit_props(incident, "sglang.service") == before


def test_typo_in_extra_args_stops_at_the_parser_and_the_server_keeps_serving(incident, tmp_path):
    before = unit_props(incident, "sglang.service")
    unit_before = incident.run("cat /etc/systemd/system/sglang.service").stdout
    (tmp_path / "sandbox.py").write_text('extra_server_args = ["--mem-fraction-statc", "0.8"]\n')
    proc = timed("typo run", "deploy.py", "--group-data", str(tmp_path), limit=incident.name)
    assert proc.returncode != 0, proc.out
    assert "SGLang's parser rejects the new command line" in proc.out
    assert "unrecognized arguments: --mem-fraction-statc 0.8" in proc.out
    assert unit_props(incident, "sglang.service") == before
    assert incident.run("cat /etc/systemd/system/sglang.service").stdout == unit_before
    assert incident.run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health").stdout == "200"


def test_api_key_only_in_the_root_only_options_file(incident):
    env = {"SGLANG_API_KEY": API_KEY}
    dry = pyinfra("deploy.py", "--dry", "--diff", limit=incident.name, env=env)
    assert "+api-key: ********" in dry.out.replace('"', ""), dry.out
    assert API_KEY not in dry.out
    proc = timed("api key run", "deploy.py", limit=incident.name, env=env)
    assert proc.returncode == 0, proc.out
    assert "restart sglang.service: unit file changed; options file changed" in proc.out
    assert API_KEY not in proc.out
    assert incident.run("stat -c '%a %U' /etc/sglang/sglang.yaml").stdout.strip() == "600 root"
    assert incident.run("stat -c '%a %U' /etc/sglang/sglang.env").stdout.strip() == "600 root"
    pattern = f"'{API_KEY[:-1]}[{API_KEY[-1]}]'"  # a regex that does not contain the key itself
    found = incident.run(
        f"grep -l {pattern} /etc/sglang/sglang.yaml /proc/[0-9]*/cmdline /etc/systemd/system/sglang.service"
        f" /etc/sglang/sglang.env 2>/dev/null; journalctl --no-pager | grep -c {pattern};"
        " journalctl --no-pager -u sglang.service | grep -c sglang.service; true"
    ).stdout.split()
    # the grep finds the key in the options file, where it belongs (positive control), and nowhere else;
    # the journal holds sglang.service's lines (so there was something to search) and no key
    assert found[:-1] == ["/etc/sglang/sglang.yaml", "0"] and int(found[-1]) > 0, found
    url = "http://127.0.0.1:30000/v1/models"
    assert incident.run(f"curl -s -o /dev/null -w '%{{http_code}}' {url}").stdout == "401"
    authorized = incident.run(f"curl -s -H @- {url}", input=f"Authorization: Bearer {API_KEY}\n").stdout
    assert '"tiny"' in authorized
    again = pyinfra("deploy.py", limit=incident.name, env=env)
    assert grand_total(again.out)[:2] == (0, 0), again.out
