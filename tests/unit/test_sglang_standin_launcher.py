"""remote/server_launch.py, the unit's ExecStart: the server module runs in-process
and the API key (from the root-only --config file) is redacted from every log
record and from stdout/stderr, in the main process and in the processes it
spawns (SGLang's TP ranks). Each check has its positive control: the same run
without the launcher shows the key."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.unit.test_sglang_standin import READY, Bed, free_port

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "remote" / "server_launch.py"
KEY = "sk-launch-7f3a9c"

# A server module that leaks the key every way a server can: log records (args,
# f-string, exception), prints, an uncaught traceback, a file handler, and the
# same from a child started with multiprocessing "spawn" (as SGLang's ranks are).
LEAKY = textwrap.dedent(
    """
    import importlib, logging, multiprocessing, sys

    def child(key, log_file):
        logging.basicConfig(force=True, format="[child] %(message)s", level=logging.INFO)  # like configure_logger
        logging.getLogger().addHandler(logging.FileHandler(log_file))
        logging.getLogger("sglang.srt.managers.scheduler").info("child sees %s", key)
        print("child print", key, flush=True)

    if __name__ == "__main__":
        args = sys.argv[1:]
        key = open(args[args.index("--config") + 1]).read().split('"')[1]
        log_file = args[args.index("--log-file") + 1]
        logging.basicConfig(force=True, format="[main] %(message)s", level=logging.INFO)
        logging.getLogger().addHandler(logging.FileHandler(log_file))
        logging.getLogger("sglang.srt.entrypoints.engine").info(f"server_args={{'api_key': {key!r}}}")
        print("MARKER main print", key, flush=True)
        proc = multiprocessing.get_context("spawn").Process(
            target=importlib.import_module("leaky").child, args=(key, log_file + ".child"))
        proc.start()
        proc.join()
        try:
            raise ValueError(f"bad value {key}")
        except ValueError:
            logging.getLogger().exception("caught")
        raise RuntimeError(f"uncaught {key}")
    """
)


def _run_leaky(tmp: Path, through_launcher: bool) -> tuple[subprocess.CompletedProcess, str]:
    (tmp / "leaky.py").write_text(LEAKY)
    opts = tmp / "opts.yaml"
    opts.write_text(f'# Managed by sglang-converge\napi-key: "{KEY}"\n')
    opts.chmod(0o600)
    log_file = tmp / "server.log"
    args = ["leaky", "--config", str(opts), "--log-file", str(log_file)]
    cmd = [sys.executable, str(LAUNCHER), *args] if through_launcher else [sys.executable, "-m", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp)})
    files = log_file.read_text() + Path(str(log_file) + ".child").read_text()
    return proc, files


@pytest.mark.parametrize("through_launcher", [True, False])
def test_key_redacted_everywhere_in_main_and_spawned_processes(tmp_path, through_launcher):
    proc, files = _run_leaky(tmp_path, through_launcher)
    everything = proc.stdout + proc.stderr + files
    shown = "<redacted>" if through_launcher else KEY
    assert proc.returncode == 1, proc.stderr  # the uncaught RuntimeError
    assert "MARKER main print" in proc.stdout  # the output is there...
    for line in (f"[main] server_args={{'api_key': '{shown}'}}", f"main print {shown}",
                 f"[child] child sees {shown}", f"child print {shown}", f"ValueError: bad value {shown}",
                 f"RuntimeError: uncaught {shown}"):
        assert line in everything, (line, everything)
    # ...and in the file handlers' files (the record itself is redacted, not only the streams)
    assert f"child sees {shown}" in files and f"server_args={{'api_key': '{shown}'}}" in files
    assert (KEY in everything) is (not through_launcher)


def test_standin_through_the_launcher_logs_sglangs_line_without_the_key(tmp_path):
    bed = Bed(tmp_path, gpu_count=4)
    try:
        opts = tmp_path / "opts.yaml"
        opts.write_text(f'api-key: "{KEY}"\n')
        port = free_port()
        args = ["sglang_standin", "--model-path", str(bed.model), "--tp-size", "2", "--port", str(port),
                "--config", str(opts)]
        launched = bed.start(args, python=sys.executable, launcher=True)
        direct = bed.start(args[1:-4] + ["--port", str(free_port()), "--config", str(opts)],
                           CUDA_VISIBLE_DEVICES="2,3")
        launched.wait_for(READY)
        direct.wait_for(READY)
    finally:
        bed.cleanup()
    assert "server_args={" in launched.out() and "'api_key': '<redacted>'" in launched.out()
    assert " TP1] Load weight end" in launched.out()  # the ranks' lines went through it too
    assert KEY not in launched.out()
    assert f"'api_key': '{KEY}'" in direct.out()  # positive control: the stand-in logs it like SGLang


def _launcher_module():
    spec = importlib.util.spec_from_file_location("server_launch_under_test", LAUNCHER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_read_secrets_and_redaction(tmp_path):
    launch = _launcher_module()
    opts = tmp_path / "o.yaml"
    opts.write_text('# Managed by sglang-converge\napi-key: "k\\"ey-1"\nadmin-api-key: plain-2\ntp-size: 8\n')
    assert launch.read_secrets(str(opts)) == ['k"ey-1', "plain-2"]
    redact = launch.Redactor(['k"ey-1'])
    assert redact(json.dumps({"api_key": 'k"ey-1'})) == '{"api_key": "<redacted>"}'
    assert redact(repr({"api_key": 'k"ey-1'})) == "{'api_key': '<redacted>'}"
    assert redact("no secret here") == "no secret here"
    assert launch.config_path(["--tp-size", "8", "--config", "/etc/sglang/x.yaml"]) == "/etc/sglang/x.yaml"
    assert launch.config_path(["--config=/etc/sglang/y.yaml"]) == "/etc/sglang/y.yaml"
    assert launch.config_path(["--tp-size", "8"]) is None
