"""The sandbox's Hub stand-in as a background process, serving every sandbox
profile's repo (models/sandbox-*.yaml) at its pinned revision - the tiny MLA
models in their quantization formats (sandbox/tinymodel.py), the tiny EAGLE3
draft model that models/sandbox-tiny-eagle3.yaml adds, the tiny Llamas and the real
pretrained SmolLM2 (sandbox/tinyllama.py, sandbox/smollm2.py) that the real SGLang
server serves - on HUB_ADDRESS, an
address the sandbox adds to the machine's loopback device: every guest reaches
it through its default route (the machine side of its veth), and it stays the
same whatever hosts come and go. `python -m sandbox up` starts it, `down`
stops it and removes the address.
"""

from __future__ import annotations

import json
import os
import signal
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.error import HTTPError

import yaml

from sandbox import smollm2

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
# while this file exists, the faults it holds (JSON, see sandbox/hub.py) apply: set_faults() writes it
FAULTS_FILE = STATE_DIR / "hub-faults.json"


def profile() -> dict:
    return yaml.safe_load((REPO_ROOT / "models" / "sandbox-tiny.yaml").read_text())


def draft() -> dict:
    """The draft model models/sandbox-tiny-eagle3.yaml adds to sandbox-tiny: {repo, revision, ...}."""
    return yaml.safe_load((REPO_ROOT / "models" / "sandbox-tiny-eagle3.yaml").read_text())["draft"]


def other_profiles() -> list[dict]:
    """Every other sandbox profile whose repo the hub generates (models/sandbox-*.yaml, by repo)."""
    main, out = profile(), []
    seen = {(main["repo"], main["revision"]), (draft()["repo"], draft()["revision"])}
    for path in sorted((REPO_ROOT / "models").glob("sandbox-*.yaml")):
        prof = yaml.safe_load(path.read_text())
        if (prof["repo"], prof["revision"]) not in seen:
            seen.add((prof["repo"], prof["revision"]))
            out.append(prof)
    return out


def _generate_profile(prof: dict, size_mb: int) -> Path:
    """The repo of a profile, generated once into MODEL_CACHE (by repo, revision and kind)."""
    if prof["repo"] == profile()["repo"]:  # another revision of the default profile's repo
        return _next_revision(prof, size_mb)
    if prof["repo"] == smollm2.REPO:  # the real pretrained model, converted from its PyPI wheel
        return _smollm2_revision(prof["revision"])
    quant = prof.get("quantization") or {}
    kind = "llama" if prof["attention"] == "mha" else quant.get("format", "dense")
    directory = MODEL_CACHE / f"{prof['repo'].replace('/', '--')}-{prof['revision'][:12]}-{kind}"
    done = directory / ".sandbox-generated"
    if done.is_file():
        return directory
    if kind == "llama":
        from sandbox import tinyllama

        qconfig = None
        if quant:  # the incident's checkpoint: a compressed-tensors quantization_config in config.json
            qconfig = tinyllama.compressed_tensors_config(quant["format"])
        tinyllama.generate(directory, quantization_config=qconfig, commit=prof["revision"], repo_name=prof["repo"])
    else:
        from sandbox import tinymodel

        tinymodel.generate(directory, size_mb, 3, kind, commit=prof["revision"], repo_name=prof["repo"])
    done.write_text("ok\n")
    return directory


# The venv the real model is converted and checked in (torch, transformers, gguf: Makefile's sglang-venv)
CONVERTER_PYTHON = REPO_ROOT / ".sandbox" / "sglang-venv" / "bin" / "python"


def _smollm2_revision(revision: str) -> Path:
    """A revision of the SmolLM2 repo (sandbox/smollm2.py REVISIONS), converted once into MODEL_CACHE; the
    good one first (each fault revision starts from it). Its greedy answers are kept beside it (.done)."""
    variants = {rev: name for name, rev in smollm2.REVISIONS.items()}
    if revision not in variants:
        raise RuntimeError(f"{smollm2.REPO}@{revision}: not a revision the sandbox makes "
                           f"(sandbox/smollm2.py REVISIONS: {', '.join(sorted(variants))})")

    def directory(rev: str) -> Path:
        return MODEL_CACHE / f"{smollm2.REPO.replace('/', '--')}-{rev[:12]}-smollm2"

    good = directory(smollm2.REVISIONS["good"])
    for variant in dict.fromkeys(("good", variants[revision])):
        out = directory(smollm2.REVISIONS[variant])
        done = out.with_name(out.name + ".done")  # beside it: the Hub serves every file in it
        if done.is_file():
            continue
        if not CONVERTER_PYTHON.is_file():
            raise RuntimeError(f"the sandbox Hub converts {smollm2.REPO} with {CONVERTER_PYTHON}, which is not there: "
                               f"`make test-venvs` makes it (`make up`, `make demo` and `make test` do it first)")
        argv = [str(CONVERTER_PYTHON), "-m", "sandbox.smollm2", str(out), "--variant", variant,
                "--good-dir", str(good), "--wheel-dir", str(MODEL_CACHE)]
        proc = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"converting {smollm2.REPO} ({variant}) failed: {proc.stderr.strip()[-2000:]}")
        done.write_text(proc.stdout.strip().splitlines()[-1] + "\n")
    return directory(revision)


def _next_revision(prof: dict, size_mb: int) -> Path:
    """A later revision of the default profile's repo (models/sandbox-tiny-next.yaml): its files, the
    README changed (a model card edit), every other file byte for byte the same - what a revision
    change that shares its weights looks like."""
    main = profile()
    base = MODEL_CACHE / f"{main['repo'].replace('/', '--')}-{main['revision'][:12]}-{size_mb}mb"
    directory = MODEL_CACHE / f"{prof['repo'].replace('/', '--')}-{prof['revision'][:12]}-next-{size_mb}mb"
    done = directory.with_name(directory.name + ".done")  # beside it: the Hub serves every file in it
    if done.is_file():
        return directory
    from sandbox import tinymodel

    if not (base / "config.json").is_file():
        tinymodel.generate(base, size_mb, 3, main["quantization"]["format"], commit=main["revision"],
                           repo_name=main["repo"])
    shutil.rmtree(directory, ignore_errors=True)
    shutil.copytree(base, directory, ignore=shutil.ignore_patterns(".sandbox-generated", ".cache", ".git"))
    with open(directory / "README.md", "a") as readme:
        readme.write(f"\nRevision {prof['revision'][:12]}: the model card edited; the weights are unchanged.\n")
    done.write_text("ok\n")
    return directory


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


def _serves(state: dict, prof: dict, size_mb: int) -> bool:
    """The running hub serves this checkout's sandbox profile (an older profile's hub is restarted)."""
    served = (state.get("repo"), state.get("revision"), state.get("format"), state.get("size_mb"),
              state.get("draft_repo"), state.get("draft_revision"))
    return served == (prof["repo"], prof["revision"], prof["quantization"]["format"], size_mb,
                      draft()["repo"], draft()["revision"]) and state.get("extra") == _extra_key()


def _extra_key() -> list[str]:
    return [f"{p['repo']}@{p['revision']}" for p in other_profiles()]


def start(size_mb: int = 40) -> dict:
    """Start the hub unless it runs, serving this checkout's profile (else restart it)."""
    state = read_state()
    if state and _serves(state, profile(), size_mb):
        return state
    stop()
    _address_on_lo(True)
    addresses = [HUB_ADDRESS]
    prof, extra = profile(), draft()
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    MODEL_CACHE.mkdir(parents=True, exist_ok=True)
    model_dir = MODEL_CACHE / f"{prof['repo'].replace('/', '--')}-{prof['revision'][:12]}-{size_mb}mb"
    ready = STATE_DIR / "hub-ready.json"
    ready.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "sandbox.hub", "serve", "--port", str(HUB_PORT), "--repo", prof["repo"],
            "--commit", prof["revision"], "--size-mb", str(size_mb), "--model-dir", str(model_dir),
            "--format", prof["quantization"]["format"], "--throttle-mbps", str(THROTTLE_MBPS),
            "--ready-file", str(ready), "--throttle-file", str(THROTTLE_FILE), "--faults-file", str(FAULTS_FILE),
            "--draft-repo", extra["repo"], "--draft-commit", extra["revision"],
            "--draft-dir", str(MODEL_CACHE / f"{extra['repo'].replace('/', '--')}-{extra['revision'][:12]}")]
    for prof_extra in other_profiles():
        directory = _generate_profile(prof_extra, size_mb)
        argv += ["--extra-repo", f"{prof_extra['repo']}@{prof_extra['revision']}={directory}"]
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
             "revision": prof["revision"], "format": prof["quantization"]["format"], "size_mb": size_mb,
             "draft_repo": extra["repo"], "draft_revision": extra["revision"], "src": str(REPO_ROOT),
             "extra": _extra_key()}
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


def stats(reset: bool = False, url: str = ENDPOINT, settle_s: float = 2.0) -> dict:
    """The running hub's byte accounting (see HubServer.stats), after waiting up to settle_s for requests
    in flight to finish; reset=True also starts it over."""
    from sandbox.hub import admin_request

    path = ("/_sandbox/stats/reset" if reset else "/_sandbox/stats") + f"?settle={settle_s:g}"
    try:
        return admin_request(url, path, body={} if reset else None, timeout=10 + settle_s)
    except HTTPError as e:
        raise RuntimeError(f"{url} answered HTTP {e.code} to {path}: not the sandbox hub, or one started before it "
                           f"had /_sandbox/ endpoints (python -m sandbox down; up)") from None
    except OSError as e:
        raise RuntimeError(f"the sandbox hub does not answer at {url} ({e}); python -m sandbox up starts it") from None


def set_faults(spec: dict | None, url: str = ENDPOINT, wait_s: float = 5.0) -> dict:
    """Put faults in force on the running hub through FAULTS_FILE (None: clear them); waits until it
    has loaded them (a hub started before the faults file existed: RuntimeError). Returns its faults."""
    import hashlib

    from sandbox.hub import _Faults, admin_request

    _Faults(spec)  # a malformed spec fails here (ValueError), before anything changes
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    if not spec:
        FAULTS_FILE.unlink(missing_ok=True)
        try:  # also faults set through the endpoint
            admin_request(url, "/_sandbox/faults", body={})
        except OSError as e:
            raise RuntimeError(f"the sandbox hub does not answer at {url} ({e})") from None
        want = None
    else:
        raw = json.dumps(spec, indent=1).encode()
        tmp = FAULTS_FILE.with_suffix(".tmp")
        tmp.write_bytes(raw)
        tmp.replace(FAULTS_FILE)
        want = hashlib.sha256(raw).hexdigest()
    deadline = time.monotonic() + wait_s
    while True:
        try:
            now = admin_request(url, "/_sandbox/faults")
        except HTTPError as e:
            raise RuntimeError(f"{url} answered HTTP {e.code} to /_sandbox/faults: not the sandbox hub, or one "
                               f"started before it had /_sandbox/ endpoints (python -m sandbox down; up)") from None
        except OSError as e:
            raise RuntimeError(f"the sandbox hub does not answer at {url} ({e})") from None
        if now.get("digest") == want:
            return now
        if time.monotonic() > deadline:
            raise RuntimeError(f"the sandbox hub did not load {FAULTS_FILE} within {wait_s:.0f} s "
                               f"(started before it followed a faults file? python -m sandbox down; up)")
        time.sleep(0.05)
