"""Model: the pinned revision's weights in its own revision dir, checked and verified.

Each revision has its own dir, ``<model_dir>-revisions/<revision[:12]>`` (``spec.model_path``), so a
new revision is downloaded and verified beside the serving one, which the server keeps reading until
the restart switches its unit over (core/model_revisions.py removes the revisions beyond
``keep_revisions`` after a good restart). Files a kept revision holds with the same Hub digest and
size (or any file of the same repo@revision, from a marker older than digests) are hard-linked from
there, not fetched, and the disk check does not count them. When the rest does not fit beside the
kept revisions, the step refuses with the numbers, unless ``model_update = "in-place"``: then the
plan says the server stops, the download links what it can and removes the kept revisions
(``--free-dir``), and the new revision is fetched into the room they leave.

Facts: ``FreeBytes`` (facts/files.py) - free bytes on the filesystem that holds
the model dir, measured at the nearest existing parent, so it works before the
model dir exists; ``ModelDirState`` (facts/model_dir.py) - the model dir as the
deploy last left it.

The download runs on the host (remote/fetch_model.py) in a transient systemd
unit that survives a dropped ssh session. The step succeeds only when, after
the unit ended, the host holds the marker of the wanted repo and revision with
every file it lists on disk at its size (read back with ModelDirState's own
command), whatever the unit's end looked like. Otherwise it fails with how the
unit ended, read from systemd (killed by a signal, or fetch_model's exit code
and what it means) and the journal's FAILED line.

One unit per model dir (``fetch_unit_name``: the dir's name and a digest of
its path), so several servers of one host (several inventory entries for the
same machine) download side by side into their own dirs, and servers that share
a dir share its download: whichever starts the unit first runs it, the others
attach to it and wait for it (also when both try to start it at the same
moment: systemd-run refuses the second, which then attaches), and one that
finds the marker already there (a sibling's download finished meanwhile) is
done. fetch_model's lock in the dir keeps any other writer out. A download an
older deploy started in the host's one unit (``LEGACY_FETCH_UNIT``) into the
same dir is attached to as well. The token and the peer's key files are the
server's own (named by its unit), so a run removes only what it uploaded.

The step does not start a failed unit again: fetch_model already retries
transient Hub failures (5 attempts per phase, backing off 5 s to 40 s) before
it exits 7, and a kill is meant (an operator's `systemctl kill`, the OOM
killer). The next run removes the killed run's partial files, fetches only the
files that were not complete, and says how many bytes that was.

A profile with a draft model (speculative decoding) pins a second download: the
draft, into its own revision dir (``spec.draft_path``, under ``draft_dir``) with its own marker. The disk check
counts both together, and each download still missing runs in its dir's unit, in
sequence (the model, then the draft; a failed one stops the step). The step
succeeds only when both markers hold the wanted revisions; with both there it is
a no-op. The draft's lines say "model: draft: ...".
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, replace
from io import StringIO
from shlex import quote as _shell_quote

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, FunctionCommand, QuoteString, StringCommand, deploy, operation

from core.disk import DiskNeed, HubError, Pin, disk_need, hf_token, model_complete, pins, shortfall
from core.ops import fail_command, gb, plan, record_failure, report, scripts_uploaded
from core.paths import (
    CONFIG_DIR,
    LEGACY_FETCH_UNIT,
    MODEL_MARKER,
    REMOTE_DIR,
    fetch_unit_name,
    seed_key_file,
    seed_known_hosts_file,
    token_file as token_path,
)
from core.seeding import SeedSource, seed_files_uploaded, seed_source
from facts.model_dir import ModelDir, ModelDirState
from tasks.spec import Spec

FETCH_SCRIPT = f"{REMOTE_DIR}/fetch_model.py"
# the script and the modules it imports from its own directory, uploaded beside it
FETCH_SCRIPTS = ("fetch_model.py", "hub_failures.py", "hub_bytes.py", "file_digests.py", "peer_seed.py")
# remote/fetch_model.py's exit codes
EXIT_MEANINGS = {
    1: "an error that is not retried",
    3: "not enough disk (refused before the download, or the disk filled up during it)",
    4: "verification failed",
    5: "the Hub refused the token",
    6: "the repo or the revision does not exist on the Hub",
    7: "gave up after repeated transient Hub failures",
}
RUNNING = ("active", "activating", "deactivating", "reloading")
UNIT_PROPS = "LoadState,ActiveState,Result,ExecMainCode,ExecMainStatus,InvocationID"
# what the step shows of a successful run's journal: cleanup, retries (the script's and the library's), bytes, proof
REPORTED = ("removed ", "linked ", "attempt ", "huggingface_hub: ", "seed: copying", "seed: copied", "seed: the copy",
            "fetched ", "DIGEST MISMATCH:", "verified ")
CAUSES = ("FAILED:", "VERIFY FAILED:", "REFUSED:")  # fetch_model's lines that say why it failed


class HostLost(Exception):
    """The controller lost the host while the download ran (ssh dropped, the host rebooted)."""


@dataclass(frozen=True)
class Download:
    """What the FunctionCommand needs: the unit's command line, and what the host must hold at the end."""

    repo: str
    revision: str
    local_dir: str
    argv: str  # fetch_model.py's command line, shell-quoted
    need: int  # bytes still to fetch when the step was planned
    expected: dict[str, int]  # the revision's files and sizes (the Hub's)
    token_file: str | None
    label: str = "model"  # how the lines name it: "model" or "model: draft"
    last: bool = True  # the last download of the run: the secret files go after it (or after a failure)
    seed_files: tuple[str, ...] = ()  # the peer's key and host keys (peer seeding): removed like the token

    @property
    def unit(self) -> str:
        return fetch_unit_name(self.local_dir)


class _Remote:
    """Commands on the host for the FunctionCommand; a connection that fails raises HostLost."""

    def __init__(self, host, unit: str) -> None:
        self.host = host
        self.unit_name = unit  # the download unit watched (a legacy one when attached to it)

    def run(self, command: str | StringCommand) -> tuple[bool, list[str]]:
        cmd = command if isinstance(command, StringCommand) else StringCommand(command)
        try:
            ok, out = self.host.run_shell_command(cmd, print_output=False, print_input=False)
        except Exception as err:  # noqa: BLE001 - paramiko, sockets, gevent: all mean the same here
            raise HostLost(f"{type(err).__name__}: {err}") from err
        return ok, list(out.stdout_lines)

    def unit(self, name: str | None = None, props: str = UNIT_PROPS) -> dict[str, str]:
        ok, lines = self.run(f"systemctl show {name or self.unit_name} --property={props}")
        return dict(line.split("=", 1) for line in lines if "=" in line) if ok else {}

    def model_dir(self, local_dir: str) -> ModelDir:
        """The model dir as ModelDirState reads it (the same command), now."""
        fact = ModelDirState()
        ok, lines = self.run(fact.command(local_dir))
        if not ok:
            raise HostLost(f"cannot read {local_dir} on the host")
        return fact.process(lines)

    def journal(self, invocation: str) -> list[str]:
        """This run's lines: the script's and systemd's about the unit (the last 40)."""
        where = (f"_SYSTEMD_INVOCATION_ID={invocation} + INVOCATION_ID={invocation}" if invocation
                 else f"-u {self.unit_name}")
        _ok, lines = self.run(f"journalctl --sync 2>/dev/null; journalctl --no-pager -o cat -n 40 {where}")
        return [line for line in lines if line.strip() and not line.startswith("-- ")]


def _attach(remote: _Remote, host, unit: str, label: str, whose: str = "") -> str:
    remote.unit_name = unit
    host.log(f"{label}: attaching to the download already running ({unit}{whose})", logger.warning)
    return remote.unit().get("InvocationID", "")


def _legacy_download(remote: _Remote, local_dir: str) -> bool:
    """An older deploy's download into this dir, still running in the host's one unit (a second
    download into the dir would fail on fetch_model's lock)."""
    props = remote.unit(LEGACY_FETCH_UNIT, "ActiveState,ExecStart")
    return props.get("ActiveState") in RUNNING and f"--local-dir {local_dir} " in props.get("ExecStart", "")


def _start(remote: _Remote, host, download: Download) -> str | None:
    """Start the dir's download unit, or attach to the one running; its InvocationID. None: the dir
    holds the revision already (a sibling server's download finished since the step was planned)."""
    unit, label = download.unit, download.label
    if remote.unit().get("ActiveState") in RUNNING:
        return _attach(remote, host, unit, label)
    if _legacy_download(remote, download.local_dir):
        return _attach(remote, host, LEGACY_FETCH_UNIT, label, ", started by an older deploy")
    if model_complete(remote.model_dir(download.local_dir), download.repo, download.revision):
        return None
    remote.run(f"systemctl reset-failed {unit} 2>/dev/null; true")  # the last run's failed unit
    # no --collect: a failed unit stays loaded, with its Result and exit status, until the next run
    ok, lines = remote.run(f"systemd-run --unit={unit} --quiet --property=Type=exec "
                           f"--description={_shell_quote(f'sglang-converge model download into {download.local_dir}')} "
                           f"{download.argv} 2>&1")
    if not ok:
        # a sibling server (another ssh session) started it between our look and our start
        if "already" in " ".join(lines) or remote.unit().get("LoadState", "not-found") != "not-found":
            return _attach(remote, host, unit, label, ", started by a sibling server")
        raise RuntimeError(f"could not start {unit}: {' '.join(lines) or 'systemd-run failed'}")
    host.log(f"{label}: downloading in {unit} (survives a dropped ssh session; a re-run attaches to it)",
             logger.warning)
    return remote.unit().get("InvocationID", "")


def _watch(remote: _Remote, host, local_dir: str, need: int, label: str = "model") -> dict[str, str]:
    """Print progress until the unit is no longer running; its last properties."""
    size_cmd = f"du -sb --apparent-size {_shell_quote(local_dir)} 2>/dev/null | cut -f1"

    def size() -> int:
        _ok, lines = remote.run(size_cmd)
        return int(lines[0].strip()) if lines and lines[0].strip().isdigit() else 0

    base = last_bytes = size()
    last = time.monotonic()
    misses = 0
    while True:
        time.sleep(1.0)
        props = remote.unit()
        misses = 0 if props else misses + 1
        if misses >= 5:
            raise HostLost(f"systemctl show {remote.unit_name} failed {misses} times in a row")
        if not props:
            continue
        running = props.get("ActiveState") in RUNNING
        now_bytes, now = size(), time.monotonic()
        if now - last >= 2.0 or not running:
            done = max(0, now_bytes - base)
            rate = (now_bytes - last_bytes) / max(now - last, 1e-6)
            percent = 100.0 * min(done, need) / need if need else 100.0
            host.log(f"{label}: {percent:5.1f}% {gb(min(done, need))} of {gb(need)}, {rate / 1e6:.1f} MB/s",
                     logger.warning)
            last, last_bytes = now, now_bytes
        if not running:
            return props


def unit_outcome(props: dict[str, str]) -> tuple[str, int | None]:
    """How the unit ended, from systemd's properties: (words, fetch_model's exit code or None).

    >>> unit_outcome({"LoadState": "loaded", "Result": "signal", "ExecMainCode": "2", "ExecMainStatus": "9"})
    ('was killed by SIGKILL (Result=signal)', None)
    >>> unit_outcome({"LoadState": "loaded", "Result": "exit-code", "ExecMainCode": "1", "ExecMainStatus": "7"})
    ('exited with code 7: gave up after repeated transient Hub failures', 7)
    """
    result, code, status = props.get("Result", ""), props.get("ExecMainCode", ""), props.get("ExecMainStatus", "")
    if props.get("LoadState") == "not-found":
        return "ended and systemd kept no result (it unloads a unit that exited 0; a reboot forgets it)", None
    if code in ("2", "3") or result in ("signal", "core-dump"):
        try:
            name = signal.Signals(int(status)).name
        except ValueError:
            name = f"signal {status}"
        return f"was killed by {name}{' (core dumped)' if code == '3' else ''} (Result={result})", None
    if status.isdigit() and int(status) != 0:
        number = int(status)
        return f"exited with code {number}: {EXIT_MEANINGS.get(number, 'not a code fetch_model.py uses')}", number
    if result == "success":
        return "exited 0", 0
    return f"ended with Result={result or '?'}", None


def missing_summary(on_disk: ModelDir, expected: dict[str, int], repo: str, revision: str) -> str:
    """What the host lacks of the revision, in one line."""
    marker = on_disk.marker
    if not marker:
        what = f"no marker ({MODEL_MARKER})"
    elif (marker.get("repo"), marker.get("revision")) != (repo, revision):
        what = f"the marker is for {marker.get('repo')}@{str(marker.get('revision'))[:12]}"
    else:
        what = "the marker's files are not all on disk at their size"
    left = {name: size for name, size in expected.items() if on_disk.files.get(name) != size}
    partial = f"; {gb(on_disk.partial_bytes)} in partial files" if on_disk.partial_bytes else ""
    return (f"{what} for {repo}@{revision[:12]}; {len(left)} of {len(expected)} files "
            f"({gb(sum(left.values()))} of {gb(sum(expected.values()))}) still to fetch{partial}")


def _converged(host, journal: list[str], download: Download, started: float) -> bool:
    for line in journal:
        if line.startswith(REPORTED):
            host.log(f"{download.label}: {line}", logger.warning)
    host.log(f"{download.label}: done in {time.monotonic() - started:.1f} s: the host holds {download.repo}@"
             f"{download.revision[:12]}, every file at its size ({MODEL_MARKER} checked)", logger.warning)
    return True


def _failed(state, host, unit: str, outcome: str, journal: list[str], summary: str, label: str = "model") -> bool:
    for line in journal[-20:]:
        host.log_styled(f"{label}: {line}", fg="red", log_func=logger.error)
    because = [line for line in journal if line.startswith(CAUSES)]
    because += [line for line in journal if "Main process exited" in line or "Failed with result" in line]
    cause = f"{label}: {unit} {outcome}" + (f": {because[0]}" if because else "") + f"; on the host: {summary}"
    host.log_styled(cause, fg="red", log_func=logger.error)
    record_failure(state, host, cause, journal)
    return False


def _fetch(state, host, download: Download) -> bool:
    """Run the download unit to its end; succeed only on the host's verified marker for the revision."""
    remote = _Remote(host, download.unit)
    started = time.monotonic()
    ok = False
    try:
        ok = _until_converged(state, host, remote, download, started)
        return ok
    except HostLost as err:
        cause = (f"{download.label}: lost the host while {remote.unit_name} ran ({err}): if the host is up the download "
                 f"goes on and a re-run attaches to it; after a reboot a re-run fetches only what is missing")
    except RuntimeError as err:
        cause = f"{download.label}: {err}"
    finally:
        secrets = [*([download.token_file] if download.token_file else []), *download.seed_files]
        if secrets and (download.last or not ok):  # a later download of this run still needs them
            try:
                remote.run("rm -f " + " ".join(_shell_quote(path) for path in secrets))
            except HostLost:
                pass
    host.log_styled(cause, fg="red", log_func=logger.error)
    record_failure(state, host, cause)
    return False


def _until_converged(state, host, remote: _Remote, download: Download, started: float) -> bool:
    invocation = _start(remote, host, download)
    if invocation is None:
        host.log(f"{download.label}: {download.local_dir} holds {download.repo}@{download.revision[:12]} already "
                 f"(a sibling server's download finished it): nothing to fetch", logger.warning)
        return True
    props = _watch(remote, host, download.local_dir, download.need, download.label)
    journal = remote.journal(invocation)
    on_disk = remote.model_dir(download.local_dir)  # the postcondition, read on the host after the unit ended
    if model_complete(on_disk, download.repo, download.revision):
        return _converged(host, journal, download, started)
    outcome, _code = unit_outcome(props)
    return _failed(state, host, remote.unit_name, outcome, journal,
                   missing_summary(on_disk, download.expected, download.repo, download.revision), download.label)


def _needs(todo: list[Pin], margin_bytes: int, endpoint: str | None,
           token: str | None) -> list[tuple[Pin, DiskNeed | None]]:
    """Each pinned download and what it still needs (None: on the host, verified). Raises HubError."""
    return [(pin, disk_need(pin.repo, pin.revision, pin.local_dir, margin_bytes, endpoint, token, pin.root))
            for pin in todo]


def _in_place(pin: Pin) -> str:
    return f"{'draft ' if pin.what == 'draft' else ''}{pin.repo}@{pin.revision[:12]} is in {pin.local_dir}, verified"


def _fetch_argv(python: str, pin: Pin, margin_bytes: int, reserve: int, options: dict, token_file: str | None,
                seed: SeedSource | None = None, owner: str = "sglang", need: DiskNeed | None = None,
                in_place: bool = False) -> str:
    """fetch_model.py's command line for one download, shell-quoted; ``reserve``: bytes a later download of
    this run still needs on the same disk (fetch_model keeps them free too); ``seed``: a peer to copy from
    first, when it holds this revision (its key files are the server ``owner``'s)."""
    argv = [python, FETCH_SCRIPT, "--repo", pin.repo, "--revision", pin.revision, "--local-dir", pin.local_dir,
            "--margin-bytes", str(margin_bytes), "--attempts", str(options["attempts"]),
            "--backoff-s", str(options["backoff_s"]), "--read-timeout", str(options["read_timeout_s"])]
    if reserve:
        argv += ["--reserve-bytes", str(reserve)]
    for path in need.link_from if need else ():
        argv += ["--link-from", path] + (["--free-dir", path] if in_place else [])
    if options["endpoint"]:
        argv += ["--endpoint", options["endpoint"]]
    if token_file:
        argv += ["--token-file", token_file]
    peer_dir = seed.dir_for(pin.repo, pin.revision) if seed else None
    if seed and peer_dir:
        argv += ["--seed-from", seed.source(peer_dir), "--seed-port", str(seed.port), "--seed-key",
                 seed_key_file(owner), "--seed-known-hosts", seed_known_hosts_file(owner)]
    return " ".join(_shell_quote(arg) for arg in argv)


def _downloads(python: str, todo: list[tuple[Pin, DiskNeed]], margin_bytes: int, options: dict,
               token_file: str | None, seed: SeedSource | None = None, owner: str = "sglang",
               in_place: bool = False) -> list[Download]:
    """One Download per missing revision, in order; each keeps what the later ones need on its disk free."""
    out = []
    seed_files = (seed_key_file(owner), seed_known_hosts_file(owner)) if seed else ()
    for i, (pin, need) in enumerate(todo):
        reserve = sum(later.need for _pin, later in todo[i + 1:] if later.mount == need.mount)
        out.append(Download(repo=pin.repo, revision=pin.revision, local_dir=pin.local_dir,
                            argv=_fetch_argv(python, pin, margin_bytes, reserve, options, token_file, seed, owner,
                                             need, in_place),
                            need=need.need, expected=need.expected, token_file=token_file,
                            label="model: draft" if pin.what == "draft" else "model", last=i == len(todo) - 1,
                            seed_files=seed_files))
    return out


def _plan_downloads(todo: list[tuple[Pin, DiskNeed]], seed: SeedSource | None) -> None:
    for pin, need in todo:
        peer_dir = seed.dir_for(pin.repo, pin.revision) if seed else None
        linked = f", {gb(need.linked)} shared with a kept revision hard-linked" if need.linked else ""
        plan(f"download {'draft ' if pin.what == 'draft' else ''}{pin.repo}@{pin.revision[:12]} into "
             f"{pin.local_dir}: {gb(need.need)} of {gb(need.total)} ({need.files} files{linked}; {gb(need.free)} "
             f"free at {need.where})" + (f", copied from the peer {seed.peer} ({peer_dir}) first, the rest from the Hub, "
                                    f"all checked against the Hub's digests" if seed and peer_dir else ""))


def _seeded(seed: SeedSource | None, todo: list[tuple[Pin, DiskNeed]]) -> SeedSource | None:
    """The peer, when it holds one of the revisions still missing (else no copy is tried)."""
    if seed is None or not any(seed.dir_for(pin.repo, pin.revision) for pin, _need in todo):
        return None
    return seed


def _disk_decision(needs: list[DiskNeed], model_update: str) -> tuple[str | None, str | None]:
    """(why the downloads do not fit, or None; why they go in place, or None). In place only with
    model_update = "in-place", when they fit once the kept revisions are removed."""
    short = shortfall(needs)
    if not short or model_update != "in-place" or not any(need.link_from for need in needs):
        return short, None
    freed = [replace(need, free=need.free + need.freeable) for need in needs]
    still = shortfall(freed)
    if still:
        return f"{still} (even with the kept revisions removed: model_update = \"in-place\")", None
    return None, short


def _stopped_for_download(todo: list[tuple[Pin, DiskNeed]], why: str, stop_unit: str | None):
    """model_update = "in-place": the server stops, its revision goes, the new one is downloaded."""
    dirs = sorted({path for _pin, need in todo for path in need.link_from})
    freed = sum(need.freeable for _pin, need in todo)
    message = (f"model: in place (model_update = \"in-place\"): {why.split(': allowed')[0]}: stops "
               f"{stop_unit or 'the server'} for the download and removes {', '.join(dirs)} after linking what "
               f"the new revision shares (frees ~{gb(freed)}); the server is down until the restart, and a "
               f"rollback to the removed revision downloads it again")
    plan(message)
    report(message)
    if stop_unit:
        yield StringCommand("systemctl stop", QuoteString(stop_unit))


def _room_made(todo: list[tuple[Pin, DiskNeed]], model_update: str, stop_unit: str | None):
    """Refuses when the downloads do not fit (returns None); with model_update = "in-place" and room once
    the kept revisions go, stops the server first (returns True); else returns False."""
    short, in_place = _disk_decision([need for _pin, need in todo], model_update)
    if short:
        plan(f"model: {short}")
        yield fail_command(f"model: {short}")
        return None
    if in_place:
        yield from _stopped_for_download(todo, in_place, stop_unit)
    return bool(in_place)


@operation()
def model_downloaded(
    repo: str,
    revision: str,
    local_dir: str,
    python: str,
    margin_bytes: int,
    endpoint: str | None = None,
    token: str | None = None,
    attempts: int = 5,
    backoff_s: float = 5.0,
    read_timeout_s: int = 30,
    draft_repo: str | None = None,
    draft_revision: str | None = None,
    draft_dir: str | None = None,
    seed: SeedSource | None = None,
    owner: str = "sglang",
    root: str | None = None,
    draft_root: str | None = None,
    model_update: str = "side-by-side",
    stop_unit: str | None = None,
):
    """
    Make ``local_dir`` hold exactly ``repo`` at ``revision``, verified (and
    ``draft_dir`` the draft model ``draft_repo`` at ``draft_revision``, when given).

    ``seed`` (offered by a rollout, core/seeding.py): a peer that holds a
    revision verified; the download copies it from there first (rsync over
    ssh), then fetches from the Hub what is still missing, and checks every
    file against the Hub's digests either way.

    ``owner``: the server's unit stem, which names the token and key files
    this run uploads (and removes), apart from a sibling server's.

    Refuses before any change when the Hub does not have a revision (or the
    repo, or refuses the token), or when the bytes still needed (model and
    draft together) do not fit in the free space minus ``margin_bytes``;
    downloads in a transient systemd unit that survives a dropped ssh session,
    once per revision still missing; succeeds only when the host then holds
    the marker of each revision with every file at its size, so the next run
    is a no-op.

    .. code:: python

        model_downloaded(repo="moonshotai/Kimi-K2.6", revision="<40 hex>",
                         local_dir="/srv/models/kimi-k2.6", python="/opt/sglang/venv/bin/python",
                         margin_bytes=50 * 10**9, draft_repo="AQ-MedAI/Kimi-K26-eagle3",
                         draft_revision="<40 hex>", draft_dir="/srv/models/kimi-k2.6-draft")
    """
    wanted = [Pin("model", repo, revision, local_dir, root)]
    if draft_repo and draft_revision and draft_dir:
        wanted.append(Pin("draft", draft_repo, draft_revision, draft_dir, draft_root))
    try:
        needs = _needs(wanted, margin_bytes, endpoint, token)
    except HubError as err:
        plan(f"model: {err}")
        yield fail_command(f"model: {err}")
        return
    todo = [(pin, need) for pin, need in needs if need is not None]
    if not todo:
        host.noop("; ".join(_in_place(pin) for pin in wanted))
        return
    in_place = yield from _room_made(todo, model_update, stop_unit)
    if in_place is None:
        return
    seed = _seeded(seed, todo)
    _plan_downloads(todo, seed)
    yield StringCommand("install -d -m 755", REMOTE_DIR, CONFIG_DIR)
    yield from scripts_uploaded(owner, FETCH_SCRIPTS)
    token_file = None
    if token:
        token_file = token_path(owner)
        yield StringCommand("install -m 600 -o root -g root /dev/null", QuoteString(token_file))
        yield FileUploadCommand(StringIO(token), token_file)
    if seed:
        yield from seed_files_uploaded(seed, owner)
    options = {"attempts": attempts, "backoff_s": backoff_s, "read_timeout_s": read_timeout_s, "endpoint": endpoint}
    for download in _downloads(python, todo, margin_bytes, options, token_file, seed, owner, in_place):
        yield FunctionCommand(_fetch, (download,), {})


@deploy("Model")
def model(spec: Spec) -> None:
    """The pinned model revision in the model dir (and the profile's draft model in the draft dir): disk
    checked, downloaded, verified."""
    draft = {p.what: p for p in pins(spec)}.get("draft")
    model_downloaded(
        repo=spec.profile.repo,
        revision=spec.profile.revision,
        local_dir=spec.model_path,
        root=spec.model_dir,
        draft_root=spec.draft_dir if draft else None,
        model_update=spec.model_update,
        stop_unit=spec.unit_name,
        python=spec.python_bin,
        margin_bytes=spec.margin_bytes,
        endpoint=spec.hf_endpoint,
        token=hf_token(spec),
        attempts=spec.download_attempts,
        backoff_s=spec.download_backoff_s,
        read_timeout_s=spec.download_read_timeout_s,
        draft_repo=draft.repo if draft else None,
        draft_revision=draft.revision if draft else None,
        draft_dir=draft.local_dir if draft else None,
        seed=seed_source(host.name),
        owner=spec.unit_stem,
        name=f"model {spec.profile.repo}@{spec.profile.revision[:12]}"
        + (f" + draft {draft.repo}@{draft.revision[:12]}" if draft else ""),
    )
