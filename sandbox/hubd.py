"""The sandbox's Hub stand-in as a background process, bound to the machine
side of every sandbox host's veth (10.77.N.1), serving models/sandbox-tiny.yaml's
repo at its pinned revision. `python -m sandbox up` starts it, `down` stops it.
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
HUB_PORT = 18080
# slow enough that the deploy's download progress is visible, fast enough for CI
THROTTLE_MBPS = 16.0


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


def endpoint_for(machine_address: str) -> str:
    return f"http://{machine_address}:{HUB_PORT}"


def start(addresses: list[str], size_mb: int = 40) -> dict:
    """(Re)start the hub so it listens on exactly ``addresses``."""
    state = read_state()
    if state and sorted(state["addresses"]) == sorted(addresses):
        return state
    stop()
    prof = profile()
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    MODEL_CACHE.mkdir(parents=True, exist_ok=True)
    model_dir = MODEL_CACHE / f"{prof['repo'].replace('/', '--')}-{prof['revision'][:12]}-{size_mb}mb"
    ready = STATE_DIR / "hub-ready.json"
    ready.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "sandbox.hub", "serve", "--port", str(HUB_PORT), "--repo", prof["repo"],
            "--commit", prof["revision"], "--size-mb", str(size_mb), "--model-dir", str(model_dir),
            "--format", prof["quantization"]["format"], "--throttle-mbps", str(THROTTLE_MBPS),
            "--ready-file", str(ready)]
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
