"""The model step when its download does not finish, end to end on a sandbox host: the
deploy runs preflight, python_env and model (tests/integration/steps_deploy.py).

- the download unit killed (`systemctl kill -s KILL sglang-model-fetch-tiny-<digest>.service`): the run
  fails naming SIGKILL, the host holds no marker and no download process; the next run
  converges and fetches again only the file that was in flight (and says how many bytes);
  the run after changes nothing;
- the host rebooted mid-download: the run fails (the host is lost); after the reboot a
  re-run converges and the next one changes nothing;
- a revision the Hub does not have: refused by the preflight before any change (the venv as
  it was, no model dir), naming the repo and the revision.
The host boots staged and its models are removed (tests/integration/templates.py): the venv is
built, as on a host where stage.py ran, and the download is this module's.

The Hub is this module's own instance of the sandbox's Hub stand-in (sandbox.hub.HubServer,
the code hubd runs) on the sandbox's hub address at a port of its own, given to the host
as `--data hf_endpoint=...`: its throttle, faults and byte counts are this module's alone
(hubd's throttle file would slow every other test's downloads), and it does not restart
when someone changes the sandbox profile. Its throttle is set for the length of a test and
taken off in a finally. The host is sgc220 (this module's indexes: 220-229), removed at the
end; when a CI run removes every host meanwhile, run the module again.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import time
from collections.abc import Iterator

import pytest
from huggingface_hub import HfApi
from huggingface_hub.errors import RevisionNotFoundError

from core.paths import fetch_unit_name
from facts.model_dir import ModelDir, ModelDirState
from sandbox import hosts as sandbox_api
from sandbox import hubd
from sandbox.hub import HubServer
from sandbox.tinymodel import ModelInfo, generate
from tests.integration.helpers import (BackgroundDeploy, grand_total, pyinfra, remove_host,
                                       wait_until)
from tests.integration.templates import staged_hosts

pytestmark = pytest.mark.sandbox

INDEX = 220
STEPS = "preflight,python_env,model"
# the pinned revision's own dir (beside other revisions, under <model_dir>-revisions) and its download unit
MODEL_PATH = f"/srv/models/{hubd.profile()['served_model_name']}-revisions/{hubd.profile()['revision'][:12]}"
FETCH_UNIT = fetch_unit_name(MODEL_PATH)
VENV = "/opt/sglang/venv-envs"  # where group_data/all.py's venv_path builds the server's venvs
MISSING = "fedcba9876543210fedcba9876543210fedcba98"  # a revision the Hub does not have
FETCHED_RE = re.compile(r"model: fetched (\d+) bytes of files \((\d+) bytes in all\)")
FIGURES: dict[str, float] = {}


@dataclasses.dataclass
class Bed:
    host: sandbox_api.SandboxHost
    hub: HubServer
    model: ModelInfo
    repo: str
    revision: str
    model_dir: str  # the revision's dir the server reads

    @property
    def sizes(self) -> dict[str, int]:
        return {f.path: f.size for f in self.model.files}


@pytest.fixture(scope="module")
def bed(tmp_path_factory) -> Iterator[Bed]:
    sandbox_api.remove(sandbox_api.host_name(INDEX))  # leftovers of an interrupted run
    t0 = time.monotonic()
    host = staged_hosts([INDEX])[0]
    host.run("find /srv/models -mindepth 1 -maxdepth 1 -exec rm -rf {} +")  # the venv staged, no model
    FIGURES["boot"] = time.monotonic() - t0
    try:
        prof = hubd.profile()
        model = generate(tmp_path_factory.mktemp("hub") / "model", 40, 3, prof["quantization"]["format"],
                         repo_name=prof["repo"], commit=prof["revision"])
        with HubServer({prof["repo"]: model}, [hubd.HUB_ADDRESS]) as hub:
            yield Bed(host, hub, model, prof["repo"], prof["revision"], MODEL_PATH)
    finally:
        remove_host(host)
        print("\ntest_download_faults figures: " + ", ".join(f"{k} {v:.1f}" for k, v in FIGURES.items()))


# --------------------------------------------------------------------------- runs


def deploy(bed: Bed, endpoint: str | None = None, what: str = "") -> subprocess.CompletedProcess:
    t0 = time.monotonic()
    proc = pyinfra("tests/integration/steps_deploy.py", "--data", f"hf_endpoint={endpoint or bed.hub.url()}",
                   limit=bed.host.name, env={"SGC_STEPS": STEPS}, timeout=400)
    if what:
        FIGURES[what] = time.monotonic() - t0
    return proc


def background_deploy(bed: Bed) -> BackgroundDeploy:
    """The steps deploy against this module's hub, its output read as it comes."""
    return BackgroundDeploy("tests/integration/steps_deploy.py", "--data", f"hf_endpoint={bed.hub.url()}",
                            limit=bed.host.name, env={"SGC_STEPS": STEPS})


# --------------------------------------------------------------------------- the host's state


def model_dir(bed: Bed) -> ModelDir:
    """The model dir on the host, read with the ModelDirState fact's own command."""
    fact = ModelDirState()
    out = bed.host.run(fact.command(bed.model_dir).get_raw_value()).stdout
    return fact.process(out.splitlines())


def show(what: str, out: str) -> None:
    """The step's lines of a run, for the log (pytest -s)."""
    lines = [line.strip() for line in out.splitlines() if re.search(r"\b(model|preflight):|Error|error", line)]
    print(f"\n--- {what}:\n" + "\n".join(lines[-25:]))


def boot_id(bed: Bed) -> str:
    return bed.host.run("cat /proc/sys/kernel/random/boot_id").stdout.strip()


def exists(bed: Bed, path: str) -> bool:
    return bed.host.run(f"test -e {path}", check=False).returncode == 0


def tree(bed: Bed, path: str) -> str:
    """Every file and directory under ``path`` with its size and mtime ('' when there is none)."""
    return bed.host.run(f"find {path} -printf '%p %s %T@\\n' 2>/dev/null | sort; true", timeout=120).stdout


def unit_state(bed: Bed) -> str:
    return bed.host.run(f"systemctl show {FETCH_UNIT} --property=ActiveState --value").stdout.strip()


def fetch_processes(bed: Bed) -> list[str]:
    return bed.host.run("pgrep -af 'fetch_model[.]py'", check=False).stdout.splitlines()


def complete_files(bed: Bed) -> set[str]:
    state = model_dir(bed)
    return {name for name, size in bed.sizes.items() if state.files.get(name) == size}


def assert_converged(bed: Bed) -> None:
    state = model_dir(bed)
    assert state.marker is not None, state
    assert (state.marker["repo"], state.marker["revision"]) == (bed.repo, bed.revision)
    assert state.marker["files"] == bed.sizes
    for shard in bed.model.shard_names:  # every shard at its size (the marker lists them all)
        assert state.files.get(shard) == bed.sizes[shard], (shard, state.files)
    assert state.files == bed.sizes and state.partial_bytes == 0, state
    assert unit_state(bed) in ("inactive", ""), unit_state(bed)  # the transient unit is gone
    assert fetch_processes(bed) == []


def host_bytes(bed: Bed, reset: bool = True) -> int:
    """File bytes the hub served to the host since the last reset."""
    stats = bed.hub.stats(reset=reset, settle_s=5)
    return int(stats["clients"].get(bed.host.address, {}).get("file_bytes", 0))


def assert_no_change(bed: Bed, what: str) -> None:
    host_bytes(bed)
    again = deploy(bed, what=what)
    assert again.returncode == 0, again.out
    assert grand_total(again.out)[:2] == (0, 0), again.out
    assert host_bytes(bed) == 0
    assert_converged(bed)


def reported_fetch(out: str) -> int:
    found = FETCHED_RE.findall(out)
    assert len(found) == 1, out[-4000:]
    return int(found[0][0])


# --------------------------------------------------------------------------- tests (in this order)


def test_a_revision_the_hub_does_not_have_is_refused_before_any_change(bed):
    # a Hub that has the repo at another commit only: the profile's revision does not exist there
    other = dataclasses.replace(bed.model, commit=MISSING)
    assert exists(bed, "/etc/hostname")  # positive control of exists()
    venv = tree(bed, VENV)
    assert f"{VENV} " in venv and "/bin/python " in venv  # staged: the venv is there (the comparison's control)
    assert not exists(bed, bed.model_dir)
    with HubServer({bed.repo: other}, [hubd.HUB_ADDRESS]) as wrong:
        run = deploy(bed, wrong.url(), "missing revision: refused")
        show("missing revision", run.out)
        served = wrong.content_gets()
        # positive control: huggingface_hub itself raises RevisionNotFoundError here (what the deploy showed as a
        # traceback before); the deploy's output has none of it
        with pytest.raises(RevisionNotFoundError):
            HfApi(endpoint=wrong.url()).model_info(bed.repo, revision=bed.revision, files_metadata=True)
    assert run.returncode != 0, run.out
    line = (f"preflight: {bed.repo}@{bed.revision[:12]}: revision {bed.revision} not found on the Hub "
            f"({wrong.url()}, HTTP 404): pin a commit that exists, e.g. from `HF_ENDPOINT={wrong.url()} "
            f"hf models info {bed.repo} --expand sha` or {wrong.url()}/{bed.repo}/commits/main")
    assert line in run.out, run.out[-4000:]
    assert "Traceback" not in run.out and "RevisionNotFoundError" not in run.out
    assert served == []
    assert tree(bed, VENV) == venv and not exists(bed, bed.model_dir) and unit_state(bed) in ("inactive", "")


def test_a_killed_download_fails_naming_sigkill_then_converges_fetching_only_what_was_in_flight(bed):
    # one shard's body stalls after 1 MiB: the other files complete, that one is in flight when the unit dies
    # (the host's GETs only: the controller's own reads of the shards' headers, for the memory plan, are
    # answered and must not use the rule up)
    stalled = bed.model.shard_names[-1]
    bed.hub.set_faults({"rules": [{"path": stalled, "stall": 120, "after_bytes": 1 << 20, "times": 1,
                                   "clients": [bed.host.address]}]})
    bed.hub.throttle_bps = 16_000_000
    run = None
    try:
        t0 = time.monotonic()
        run = background_deploy(bed)
        run.wait_for(f"model: downloading in {FETCH_UNIT}", timeout=300)  # python_env first
        FIGURES["first run to the download"] = time.monotonic() - t0
        others = set(bed.sizes) - {stalled}
        wait_until(lambda: others <= complete_files(bed), 60, "every file but the stalled shard")
        assert fetch_processes(bed), "the download runs"  # positive control of fetch_processes()
        in_flight = {name: size for name, size in bed.sizes.items() if name not in complete_files(bed)}
        bed.host.run(f"systemctl kill -s KILL {FETCH_UNIT}")
        rc = run.finish(timeout=60).returncode
        show("download killed", run.out)
    finally:
        if run:
            run.kill()
        bed.hub.throttle_bps = None
        bed.hub.clear_faults()
    assert rc != 0, run.out
    assert "was killed by SIGKILL" in run.out, run.out[-4000:]
    assert "model: done" not in run.out  # (positive control: the converging run below prints it)
    state = model_dir(bed)
    assert state.marker is None, state
    assert unit_state(bed) == "failed" and fetch_processes(bed) == []
    assert in_flight == {stalled: bed.sizes[stalled]}

    host_bytes(bed)
    t0 = time.monotonic()
    again = deploy(bed, what="after the kill: converge")
    FIGURES["after the kill: converge"] = time.monotonic() - t0
    show("after the kill", again.out)
    assert again.returncode == 0, again.out
    assert "model: done" in again.out
    assert "removed 1 partial file" in again.out, again.out[-4000:]
    refetched = reported_fetch(again.out)
    FIGURES["after the kill: bytes fetched again"] = refetched
    FIGURES["after the kill: model bytes"] = bed.model.total_bytes
    assert refetched == host_bytes(bed)  # what the step says is what the Hub served
    assert refetched <= sum(in_flight.values()) < bed.model.total_bytes
    assert_converged(bed)
    assert_no_change(bed, "after the kill: no change")


def test_a_reboot_mid_download_fails_the_run_then_a_rerun_converges(bed):
    bed.host.run(f"rm -rf {bed.model_dir}")
    bed.hub.throttle_bps = 4_000_000  # ~10 s for the 40 MB: the reboot lands mid-download
    run = None
    try:
        run = background_deploy(bed)
        run.wait_for(f"model: downloading in {FETCH_UNIT}", timeout=120)
        boot = boot_id(bed)
        assert fetch_processes(bed), "the download runs"
        t0 = time.monotonic()
        sandbox_api.reboot(bed.host.name)
        FIGURES["reboot"] = time.monotonic() - t0
        assert boot_id(bed) != boot  # it did reboot (the same check finds the same id without one:)
        assert boot_id(bed) == boot_id(bed)
        rc = run.finish(timeout=120).returncode
        show("reboot mid-download", run.out)
    finally:
        if run:
            run.kill()
        bed.hub.throttle_bps = None
    assert rc != 0, run.out  # the host went away mid-download: never a success
    assert "model: done" not in run.out, run.out[-4000:]
    state = model_dir(bed)
    assert state.marker is None and set(state.files) != set(bed.sizes), state  # it did not finish
    assert unit_state(bed) in ("inactive", "") and fetch_processes(bed) == []  # nothing runs after the boot

    host_bytes(bed)
    t0 = time.monotonic()
    again = deploy(bed, what="after the reboot: converge")
    FIGURES["after the reboot: converge"] = time.monotonic() - t0
    show("after the reboot", again.out)
    assert again.returncode == 0, again.out
    refetched = reported_fetch(again.out)
    FIGURES["after the reboot: bytes fetched"] = refetched
    assert refetched == host_bytes(bed) <= bed.model.total_bytes
    assert_converged(bed)
    assert_no_change(bed, "after the reboot: no change")
