"""The sandbox's Hub stand-in as a background process, serving
models/sandbox-tiny.yaml's repo at its pinned revision on HUB_ADDRESS, an
address the sandbox adds to the machine's loopback device: every guest reaches
it through its default route (the machine side of its veth), and it stays the
same whatever hosts come and go. `python -m sandbox up` starts it, `down`
stops it and removes the address.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
STATE_DIR = Path(os.environ.get("SGC_STATE_DIR", "/run/sglang-converge-sandbox"))
HUB_STATE = STATE_DIR / "hub.json"
MODEL_CACHE = Path("/var/cache/sglang-converge/hub-models")
HUB_ADDRESS = "10.77.0.1"
HUB_PORT = 18080
# slow enough that the deploy's download progress is visible, fast enough for CI
THROTTLE_MBPS = 16.0
# while this file exists, the rate it holds (MB/s) applies instead (tests slow a download down)
THROTTLE_FILE = STATE_DIR / "hub-throttle-mbps"


def profile() -> dict:
    return yaml.safe_load((REPO_ROOT / "models" / "sandbox-tiny.yaml").read_text())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        return "sandbox.hub" in Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return False


def read_state() -> dict | None:
    try:
        state = json.loads(HUB_STATE.read_text())
    except (OSError, ValueError):
        return None
    return state if _alive(int(state.get("pid", 0))) else None


ENDPOINT = f"http://{HUB_ADDRESS}:{HUB_PORT}"


def _address_on_lo(present: bool) -> None:
    shown = subprocess.run(["ip", "-o", "addr", "show", "dev", "lo"], capture_output=True, text=True).stdout
    there = f" {HUB_ADDRESS}/32 " in shown
    if present and not there:
        subprocess.run(["ip", "addr", "add", f"{HUB_ADDRESS}/32", "dev", "lo"], check=True)
    elif not present and there:
        subprocess.run(["ip", "addr", "del", f"{HUB_ADDRESS}/32", "dev", "lo"], check=False)


def start(size_mb: int = 40) -> dict:
    """Start the hub unless it runs."""
    state = read_state()
    if state:
        return state
    stop()
    _address_on_lo(True)
    addresses = [HUB_ADDRESS]
    prof = profile()
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    MODEL_CACHE.mkdir(parents=True, exist_ok=True)
    model_dir = MODEL_CACHE / f"{prof['repo'].replace('/', '--')}-{prof['revision'][:12]}-{size_mb}mb"
    ready = STATE_DIR / "hub-ready.json"
    ready.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "sandbox.hub", "serve", "--port", str(HUB_PORT), "--repo", prof["repo"],
            "--commit", prof["revision"], "--size-mb", str(size_mb), "--model-dir", str(model_dir),
            "--format", prof["quantization"]["format"], "--throttle-mbps", str(THROTTLE_MBPS),
            "--ready-file", str(ready), "--throttle-file", str(THROTTLE_FILE)]
    for address in addresses:
        argv += ["--addr", address]
    log = open(STATE_DIR / "hub.log", "ab")
    proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the sandbox hub did not start; see {STATE_DIR / 'hub.log'}")
        time.sleep(0.1)
    state = {"pid": proc.pid, "addresses": addresses, "port": HUB_PORT, "repo": prof["repo"],
             "revision": prof["revision"]}
    HUB_STATE.write_text(json.dumps(state))
    return state


def stop() -> None:
    try:
        state = json.loads(HUB_STATE.read_text())
    except (OSError, ValueError):
        _address_on_lo(False)
        return
    pid = int(state.get("pid", 0))
    if pid and _alive(pid):
        os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            if not _alive(pid):
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
    HUB_STATE.unlink(missing_ok=True)
    _address_on_lo(False)
