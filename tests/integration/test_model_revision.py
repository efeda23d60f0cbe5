"""A model revision change on a running server, on the shared converged sandbox host (sgc280:
tests/integration/helpers.py). models/sandbox-tiny-next.yaml is the next revision of the sandbox's
tiny model: the same repo, its README.md edited, every other file byte for byte the same (the
sandbox's Hub serves both: sandbox/hubd.py _next_revision). Deployed with `--data
model=sandbox-tiny-next`, the new revision goes into its own dir beside the serving one; the files
the serving revision holds with the same digest are hard-linked (same inode), neither fetched nor
counted by the disk check; one restart switches the unit to it, and the old revision's files are
not touched. A second run changes nothing; going back to the default profile downloads nothing and
restarts once; `keep_revisions = 1` then removes the next revision's dir and restarts nothing. The
host is left on the default profile (its later users expect it). Six deploy runs.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.integration.helpers import SHARED_CONVERGED_GROUP, grand_total, shared_converged_host
from tests.integration.helpers import timed as timed_run

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group(SHARED_CONVERGED_GROUP)]

NEXT = ("--data", "model=sandbox-tiny-next")
REVISIONS = "/srv/models/tiny-revisions"
OLD_DIR, NEW_DIR = f"{REVISIONS}/0123456789ab", f"{REVISIONS}/1123456789ab"
MARKER = ".sglang-converge.json"
TIMINGS: dict[str, float] = {}


def timed(name: str, *args, **kwargs):
    return timed_run(TIMINGS, name, *args, **kwargs)


def inodes(host, directory: str) -> dict[str, str]:
    """Every file of a revision dir but the step's own markers and huggingface_hub's .cache/:
    {name: "inode size mtime"}."""
    out = host.run(f"cd {directory} && find . -path ./.cache -prune -o -type f ! -name '.sg*' "
                   f"-printf '%P %i %s %T@\\n'").stdout
    return {name: rest for name, _, rest in (line.partition(" ") for line in out.splitlines())}


def starts_since(host, since: str) -> int:
    journal = host.run(f"journalctl -u sglang.service --since @{since} --no-pager -o cat", timeout=30).stdout
    return sum(1 for line in journal.splitlines() if line.startswith("Started "))


def model_path_of_the_unit(host) -> str:
    unit = host.run("cat /etc/systemd/system/sglang.service").stdout
    found = re.search(r"--model-path[ =](\S+)", unit)
    assert found, unit
    return found.group(1).rstrip("/")


@pytest.fixture(scope="module")
def host(request):
    host = shared_converged_host(request, TIMINGS)
    assert model_path_of_the_unit(host) == OLD_DIR  # the default profile serves
    host.old_files = inodes(host, OLD_DIR)
    assert "config.json" in host.old_files and "README.md" in host.old_files, host.old_files
    yield host
    # the host is shared: its later users expect the sandbox's default profile
    back = timed("back to the default profile", "deploy.py", limit=host.name)
    assert back.returncode == 0, back.out[-4000:]
    assert model_path_of_the_unit(host) == OLD_DIR
    print("\nmodel revision timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in TIMINGS.items()))


@pytest.fixture(scope="module")
def switched(host):
    """The plan, then the run that switches to the next revision (the tests below read both)."""
    invocation = host.run("systemctl show sglang.service -p InvocationID --value").stdout.strip()
    dry = timed("dry run", "--dry", "--diff", "deploy.py", *NEXT, limit=host.name)
    after_dry = {"new dir": host.run(f"test -e {NEW_DIR}", check=False).returncode == 0,
                 "invocation": host.run("systemctl show sglang.service -p InvocationID --value").stdout.strip()}
    since = host.run("date +%s").stdout.strip()
    run = timed("switch to the next revision", "deploy.py", *NEXT, limit=host.name)
    return {"dry": dry, "run": run, "since": since, "invocation": invocation, "after dry": after_dry}


def test_the_plan_shows_a_download_of_only_the_bytes_not_stored_and_changes_nothing(host, switched):
    dry = switched["dry"]
    assert dry.returncode == 0, dry.out[-4000:]
    planned = re.search(r"download sandbox/tiny-kimi-int4@1123456789ab into " + re.escape(NEW_DIR)
                        + r": 0\.000 GB \(0\.0 MB\) of 0\.040 GB \(\d+\.\d MB\) \((\d+) files, 0\.040 GB \(\d+\.\d MB\) "
                        r"shared with a kept revision hard-linked; ", dry.out)
    assert planned and int(planned.group(1)) == len(host.old_files), dry.out[-4000:]
    assert "restart sglang.service" in dry.out, dry.out[-4000:]
    # the dry run touched nothing: no dir of the new revision, the same server
    assert switched["after dry"] == {"new dir": False, "invocation": switched["invocation"]}


def test_the_switch_links_the_shared_files_fetches_the_rest_and_restarts_once(host, switched):
    run = switched["run"]
    assert run.returncode == 0, run.out[-4000:]
    assert "ready: sglang.service serves tiny at " in run.out, run.out[-4000:]
    assert model_path_of_the_unit(host) == NEW_DIR
    assert starts_since(host, switched["since"]) == 1, run.out[-4000:]
    new = inodes(host, NEW_DIR)
    assert set(new) == set(host.old_files)
    readme = int(new["README.md"].split()[1])
    shared = {name for name in new if name != "README.md"}
    for name in shared:  # the same inode: stored once
        assert new[name].split()[0] == host.old_files[name].split()[0], (name, new[name], host.old_files[name])
    assert new["README.md"].split()[0] != host.old_files["README.md"].split()[0]
    shared_bytes = sum(int(new[name].split()[1]) for name in shared)
    assert f"linked {len(shared)} files ({shared_bytes} bytes) shared with a kept revision" in run.out, run.out[-4000:]
    fetched = re.search(r"fetched (\d+) bytes of files \((\d+) bytes in all\) from the Hub", run.out)
    assert fetched and int(fetched.group(1)) == readme, run.out[-4000:]  # only the edited model card
    marker = json.loads(host.run(f"cat {NEW_DIR}/{MARKER}").stdout)
    assert marker["revision"] == "1123456789abcdef0123456789abcdef01234567"
    # the serving revision was not touched: the same files, inodes, sizes and mtimes
    assert inodes(host, OLD_DIR) == host.old_files


def test_a_second_run_changes_nothing(host, switched):
    before = host.run("systemctl show sglang.service -p InvocationID --value").stdout.strip()
    again = timed("no-op", "deploy.py", "-v", *NEXT, limit=host.name)
    assert again.returncode == 0 and grand_total(again.out)[:2] == (0, 0), again.out[-4000:]
    assert f"sandbox/tiny-kimi-int4@1123456789ab is in {NEW_DIR}, verified" in again.out, again.out[-4000:]
    assert "keep_revisions = 2: no old model revision to remove" in again.out, again.out[-4000:]
    assert host.run("systemctl show sglang.service -p InvocationID --value").stdout.strip() == before


def test_switching_back_downloads_nothing_and_keep_revisions_1_removes_the_other(host, switched):
    since = host.run("date +%s").stdout.strip()
    back = timed("switch back", "deploy.py", limit=host.name)
    assert back.returncode == 0 and "ready: sglang.service serves tiny at " in back.out, back.out[-4000:]
    assert "model: downloading" not in back.out and "download sandbox/" not in back.out, back.out[-4000:]
    assert model_path_of_the_unit(host) == OLD_DIR and starts_since(host, since) == 1
    assert inodes(host, OLD_DIR) == host.old_files
    assert host.run(f"test -d {NEW_DIR}", check=False).returncode == 0  # kept for rollback (keep_revisions = 2)

    invocation = host.run("systemctl show sglang.service -p InvocationID --value").stdout.strip()
    pruned = timed("keep_revisions = 1", "deploy.py", "--data", "keep_revisions=1", limit=host.name)
    assert pruned.returncode == 0, pruned.out[-4000:]
    assert (f"model: remove 1 old revision(s) beyond keep_revisions = 1 (only the files no kept revision shares "
            f"are freed): {NEW_DIR}") in pruned.out, pruned.out[-4000:]
    assert host.run(f"test -e {NEW_DIR}", check=False).returncode != 0
    assert host.run(f"test -e {NEW_DIR}.removing", check=False).returncode != 0
    assert inodes(host, OLD_DIR) == host.old_files  # the shared files live on in the serving revision
    assert host.run("systemctl show sglang.service -p InvocationID --value").stdout.strip() == invocation
    assert host.run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health").stdout == "200"
