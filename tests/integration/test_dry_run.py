"""`--dry` changes nothing on the host, and exits non-zero naming the failure
in its last lines when planning already knows the real run would fail
(core/dry_run.py): here the pinned repo is missing on the Hub (HTTP 404).

Every file under the directories the deploy writes (path, size, mtime) is
listed before and after each dry run: on a fresh sandbox host of this module's
own (sgc245) and on the session's shared converged
host (sgc280, tests/integration/helpers.py), which the profile-switch test
puts back on the sandbox's default profile before it ends. The Hub without the
repo is this module's own HubServer (`--data hf_endpoint=...`), so no other
test's Hub changes.

    .venv/bin/python -m pytest -q tests/integration/test_dry_run.py
"""

from __future__ import annotations

import shlex

import pytest

from sandbox import hubd
from sandbox.hub import HubServer
from tests.integration.helpers import SHARED_CONVERGED_GROUP, boot_extra_host, grand_total, pyinfra, remove_host, shared_converged_host

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group(SHARED_CONVERGED_GROUP)]

INDEX = 245  # this module's host
# what the deploy writes (units, config, venv, models, state, caches); /srv/models may be a disk of its own
WATCHED = ("/etc", "/opt", "/srv", "/srv/models", "/usr/local", "/var/lib", "/var/cache", "/root")
# the guest's own housekeeping, which its timers may touch at any time (the deploy writes none of it)
HOUSEKEEPING = ("/var/lib/systemd/", "/var/lib/apt/", "/var/cache/apt/", "/var/lib/logrotate/", "/var/cache/man/",
                "/var/lib/man-db/")
TIMINGS: dict[str, float] = {}
HEADER = "dry run: nothing was changed; planning already knows the real run would fail on 1 host(s):"


@pytest.fixture(scope="module")
def host():
    booted = boot_extra_host(INDEX)
    try:
        yield booted
    finally:
        remove_host(booted)


@pytest.fixture(scope="module")
def converged(request):
    return shared_converged_host(request, TIMINGS)


@pytest.fixture(scope="module")
def hub_without_the_repo():
    with HubServer({}, [hubd.HUB_ADDRESS]) as hub:  # answers every repo with 404 RepoNotFound
        yield hub


def listing(host) -> dict[str, str]:
    """{path: "size mtime"} of every file and directory under WATCHED (one filesystem each)."""
    starts = " ".join(shlex.quote(path) for path in WATCHED)
    out = host.run(f"for d in {starts}; do [ -e \"$d\" ] && find \"$d\" -xdev -printf '%p\\t%s %T@\\n'; done "
                   "2>/dev/null; true", timeout=300).stdout
    found = dict(line.rsplit("\t", 1) for line in out.splitlines() if "\t" in line)
    assert "/etc/hostname" in found, out[-2000:]  # positive control: the listing sees the host's files
    return {path: what for path, what in found.items() if not path.startswith(HOUSEKEEPING)}


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What differs: '+ path', '- path', '~ path: before -> after'."""
    out = [f"+ {p}" for p in sorted(after.keys() - before.keys())]
    out += [f"- {p}" for p in sorted(before.keys() - after.keys())]
    out += [f"~ {p}: {before[p]} -> {after[p]}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]]
    return out


def dry_run_changing_nothing(host, *args: str):
    """`pyinfra ... deploy.py --dry ARGS` against ``host``; asserts it changed no file there."""
    before = listing(host)
    proc = pyinfra("deploy.py", "--dry", *args, limit=host.name)
    assert changes(before, listing(host)) == [], proc.out[-3000:]
    return proc


def test_a_dry_run_that_knows_the_repo_is_missing_exits_non_zero_naming_it_last(host, hub_without_the_repo):
    repo = hubd.profile()["repo"]
    proc = dry_run_changing_nothing(host, "--data", f"hf_endpoint={hub_without_the_repo.url()}")
    assert proc.returncode != 0, proc.out[-3000:]
    lines = proc.stderr.strip().splitlines()  # pyinfra's log lines and the verdict are on stderr
    assert HEADER in lines, proc.out[-3000:]
    verdict = lines[len(lines) - lines[::-1].index(HEADER):]  # everything after the header: the last lines
    assert verdict and all(line.startswith((f"dry run: the real run would fail on {host.name}: ", "    "))
                           for line in verdict), verdict
    assert any(line.startswith(f"dry run: the real run would fail on {host.name}: model: {repo}@")
               and f"repo {repo} not found on the Hub" in line and "HTTP 404" in line for line in verdict), verdict


def test_a_plain_dry_run_on_the_fresh_host_exits_0_and_changes_nothing(host):
    proc = dry_run_changing_nothing(host)
    assert proc.returncode == 0, proc.out[-3000:]
    assert "plan: download " in proc.out  # positive control: it planned the whole converge
    assert "the real run would fail" not in proc.out


def test_a_plain_dry_run_on_the_converged_host_exits_0_and_changes_nothing(converged):
    proc = dry_run_changing_nothing(converged)
    assert proc.returncode == 0, proc.out[-3000:]
    assert "the real run would fail" not in proc.out
    assert "ready: sglang.service serves tiny at " in converged.converge_out  # it is converged (positive control)


def test_the_converged_host_switched_to_the_nvfp4_profile_plans_converges_and_stays(converged):
    """Issue 22 item 2: a profile the repo ships works in the sandbox it ships (the Hub stand-in
    serves every sandbox profile's repo at its revision). The host is shared: switched back after."""
    host = converged
    switch = ("--data", "model=sandbox-tiny-nvfp4")
    dry = dry_run_changing_nothing(host, *switch)
    assert dry.returncode == 0, dry.out[-4000:]
    assert "plan: download sandbox/tiny-kimi-nvfp4@89abcdef0123" in dry.out, dry.out[-4000:]
    assert "plan: restart sglang.service: " in dry.out, dry.out[-4000:]  # and why
    # and what ready will mean for it (README: What ready means)
    assert "plan: then: SGLang's KV pool holds at least 0.5 x " in dry.out, dry.out[-4000:]
    assert "plan: then: decode speed (concurrency 1 and 4, 128 tokens) at least 0.1 x this host's last good tok/s" \
        in dry.out, dry.out[-4000:]
    proc = pyinfra("deploy.py", *switch, limit=host.name)
    assert proc.returncode == 0, proc.out[-4000:]
    assert "ready: sglang.service serves tiny-nvfp4" in proc.out
    again = pyinfra("deploy.py", *switch, limit=host.name)
    assert again.returncode == 0 and grand_total(again.out)[:2] == (0, 0), again.out[-4000:]
    back = pyinfra("deploy.py", limit=host.name)  # the shared host's later users expect the default profile
    assert back.returncode == 0 and "ready: sglang.service serves tiny at " in back.out, back.out[-4000:]
