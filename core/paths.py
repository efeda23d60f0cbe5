"""Where the deploy keeps things, on the controller and on the host, in one place."""

from __future__ import annotations

from pathlib import Path

# Controller side: this checkout.
REPO_ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = REPO_ROOT / "models"  # one YAML profile per model
TEMPLATES_DIR = REPO_ROOT / "templates"  # Jinja templates of the unit, env, options and router files
REMOTE_SRC_DIR = REPO_ROOT / "remote"  # scripts uploaded to the host

# Host side.
CONFIG_DIR = "/etc/sglang"  # env, options and auth files (root-only where they hold secrets)
SYSTEMD_DIR = "/etc/systemd/system"
MODELS_ROOT = "/srv/models"  # default parent of model_dir
STATE_DIR = "/var/lib/sglang-converge"  # restart stamps, root-only (0700)
CACHE_DIR = "/var/cache/sglang-converge"  # get-pip.py, pip wheels, constraints files
REMOTE_DIR = "/usr/local/lib/sglang-converge"  # uploaded helper scripts
TOKEN_FILE = f"{CONFIG_DIR}/hf-token"  # the HF token for the download unit, 0600
SEED_KEY_FILE = f"{CONFIG_DIR}/seed-key"  # a rollout's ssh key for copying the model from a peer, 0600
SEED_KNOWN_HOSTS = f"{CONFIG_DIR}/seed-known-hosts"  # that peer's host keys, 0600
MODEL_MARKER = ".sglang-converge.json"  # written into model_dir once a revision is verified

GB = 10**9  # "GB" in messages and settings is decimal, like disk sizes
