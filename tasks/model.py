"""Model: the pinned revision's weights in the model dir, checked and verified.

Facts: ``FreeBytes`` (facts/files.py) - free bytes on the filesystem that holds
the model dir, measured at the nearest existing parent, so it works before the
model dir exists; ``ModelDirState`` (facts/model_dir.py) - the model dir as the
deploy last left it.
"""

from __future__ import annotations

import time
from io import StringIO
from shlex import quote as _shell_quote

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, FunctionCommand, QuoteString, StringCommand, deploy, operation

from core.disk import disk_need, hf_token
from core.ops import explaining_line, fail_command, gb, plan, record_failure
from core.paths import CONFIG_DIR, REMOTE_DIR, REMOTE_SRC_DIR, TOKEN_FILE
from tasks.spec import Spec

FETCH_UNIT = "sglang-model-fetch.service"
FETCH_SCRIPT = f"{REMOTE_DIR}/fetch_model.py"
LOCAL_FETCH_SCRIPT = REMOTE_SRC_DIR / "fetch_model.py"


def _fetch(state, host, fetch_argv: str, local_dir: str, need: int, token_file: str | None) -> bool:
    """Start (or attach to) the download unit, print progress until it ends."""
    def run(command: str):
        return host.run_shell_command(StringCommand(command), print_output=False, print_input=False)

    unit = FETCH_UNIT
    _ok, out = run(f"systemctl show {unit} --property=ActiveState --value")
    if out.stdout.strip() in ("active", "activating"):
        host.log(f"model: attaching to the download already running ({unit})", logger.warning)
    else:
        run(f"systemctl reset-failed {unit} 2>/dev/null; true")
        ok, out = run(
            f"systemd-run --unit={unit} --collect --quiet --property=Type=exec "
            f"--description='sglang-converge model download' {fetch_argv}"
        )
        if not ok:
            host.log_styled(f"model: could not start the download unit: {out.stderr}", fg="red", log_func=logger.error)
            record_failure(state, host, f"model: could not start the download unit: {out.stderr}")
            return False
        host.log(f"model: downloading in {unit} (survives a dropped ssh session; a re-run attaches to it)",
                 logger.warning)
    size_cmd = f"du -sb --apparent-size {_shell_quote(local_dir)} 2>/dev/null | cut -f1"
    _ok, out = run(size_cmd)
    base = int(out.stdout.strip() or 0)
    started = last = time.monotonic()
    last_bytes = base
    while True:
        time.sleep(1.0)
        _ok, out = run(f"systemctl show {unit} --property=ActiveState,Result,ExecMainStatus")
        props = dict(line.split("=", 1) for line in out.stdout_lines if "=" in line)
        _ok, size_out = run(size_cmd)
        now_bytes = int(size_out.stdout.strip() or 0)
        now = time.monotonic()
        if now - last >= 2.0 or props.get("ActiveState") not in ("active", "activating"):
            done = max(0, now_bytes - base)
            rate = (now_bytes - last_bytes) / max(now - last, 1e-6)
            percent = 100.0 * min(done, need) / need if need else 100.0
            host.log(f"model: {percent:5.1f}% {gb(min(done, need))} of {gb(need)}, {rate / 1e6:.1f} MB/s", logger.warning)
            last, last_bytes = now, now_bytes
        if props.get("ActiveState") not in ("active", "activating"):
            break
    _ok, journal = run(f"journalctl -u {unit} -o cat --no-pager -n 20 _SYSTEMD_UNIT={unit}")
    if token_file:
        run(f"rm -f {token_file}")
    status = props.get("ExecMainStatus", "")
    if props.get("Result") == "success" and status in ("0", ""):
        for line in journal.stdout_lines[-2:]:
            host.log(f"model: {line}", logger.warning)
        host.log(f"model: done in {time.monotonic() - started:.1f} s", logger.warning)
        return True
    for line in journal.stdout_lines:
        host.log_styled(f"model: {line}", fg="red", log_func=logger.error)
    record_failure(state, host, "model: " + (explaining_line(journal.stdout_lines) or f"{unit} failed"),
                   journal.stdout_lines)
    return False


@operation()
def model_downloaded(
    repo: str,
    revision: str,
    local_dir: str,
    python: str,
    margin_bytes: int,
    endpoint: str | None = None,
    token: str | None = None,
):
    """
    Make ``local_dir`` hold exactly ``repo`` at ``revision``, verified.

    Refuses before downloading anything when the bytes still needed do not
    fit in the free space minus ``margin_bytes``; downloads in a transient
    systemd unit that survives a dropped ssh session; verifies and writes a
    marker, so the next run is a no-op.

    .. code:: python

        model_downloaded(repo="moonshotai/Kimi-K2.6", revision="<40 hex>",
                         local_dir="/srv/models/kimi-k2.6", python="/opt/sglang/venv/bin/python",
                         margin_bytes=50 * 10**9)
    """
    need = disk_need(repo, revision, local_dir, margin_bytes, endpoint, token)
    if need is None:
        host.noop(f"{repo}@{revision[:12]} is in {local_dir}, verified")
        return
    if need.short:
        message = f"model: {need.shortfall()}"
        plan(message)
        yield fail_command(message)
        return
    plan(
        f"download {repo}@{revision[:12]} into {local_dir}: {gb(need.need)} of {gb(need.total)} "
        f"({need.files} files; {gb(need.free)} free at {need.where})"
    )
    yield StringCommand("install -d -m 755", REMOTE_DIR, CONFIG_DIR)
    yield FileUploadCommand(str(LOCAL_FETCH_SCRIPT), FETCH_SCRIPT)
    token_file = None
    if token:
        token_file = TOKEN_FILE
        yield StringCommand("install -m 600 -o root -g root /dev/null", QuoteString(token_file))
        yield FileUploadCommand(StringIO(token), token_file)
    argv = [python, FETCH_SCRIPT, "--repo", repo, "--revision", revision, "--local-dir", local_dir,
            "--margin-bytes", str(margin_bytes)]
    if endpoint:
        argv += ["--endpoint", endpoint]
    if token_file:
        argv += ["--token-file", token_file]
    fetch_argv = " ".join(_shell_quote(arg) for arg in argv)
    yield FunctionCommand(_fetch, (fetch_argv, local_dir, need.need, token_file), {})


@deploy("Model")
def model(spec: Spec) -> None:
    """The pinned model revision in the model dir: disk checked, downloaded, verified."""
    token = hf_token(spec)
    model_downloaded(
        repo=spec.profile.repo,
        revision=spec.profile.revision,
        local_dir=spec.model_dir,
        python=spec.python_bin,
        margin_bytes=spec.margin_bytes,
        endpoint=spec.hf_endpoint,
        token=token,
        name=f"model {spec.profile.repo}@{spec.profile.revision[:12]}",
    )
