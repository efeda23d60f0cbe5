"""Where the deploy keeps things, on the controller and on the host, in one place."""

from __future__ import annotations

import hashlib
import posixpath
import re
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
SWITCHED = ".sgc-switched"  # touched in a venv or a model revision dir right before a restart switches a unit to it
MODEL_MARKER = ".sglang-converge.json"  # written into model_dir once a revision is verified
LEGACY_FETCH_UNIT = "sglang-model-fetch.service"  # the one download unit of a host, before units per model dir

GB = 10**9  # "GB" in messages and settings is decimal, like disk sizes


def revisions_root(model_dir: str) -> str:
    """The dir of a model dir's revisions, one subdir each (<model_dir>-revisions/<revision[:12]>),
    files shared between revisions hard-linked (stored once)."""
    return model_dir.rstrip("/") + "-revisions"


def fetch_unit_name(local_dir: str) -> str:
    """The download unit of one model dir: servers of one host that share the dir share its download
    (the second attaches), other dirs download side by side. The dir's last name keeps it readable,
    a digest of the whole path unique; shell-safe, unlike systemd-escape's \\x2d.

    >>> fetch_unit_name("/srv/models/kimi-k2.6/")
    'sglang-model-fetch-kimi-k2.6-730db7fd.service'
    >>> fetch_unit_name("/srv/models/kimi-k2.6-revisions/0123456789ab")
    'sglang-model-fetch-kimi-k2.6-0123456789ab-bbc2b4d7.service'
    """
    path = posixpath.normpath(local_dir)
    parent, base = posixpath.split(path)
    if parent.endswith("-revisions"):  # a revision dir: named by its model dir and revision
        base = f"{posixpath.basename(parent)[:-len('-revisions')]}-{base}"
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", base)[:64] or "root"
    return f"sglang-model-fetch-{name}-{hashlib.sha256(path.encode()).hexdigest()[:8]}.service"


def token_file(unit_stem: str) -> str:
    """The HF token for one server's downloads (0600, removed after them): per server, so a run
    removes only its own, never one a sibling server's download still reads."""
    return f"{CONFIG_DIR}/{unit_stem}.hf-token"


def seed_key_file(unit_stem: str) -> str:
    """A rollout's ssh key for copying the model from a peer (0600), per server like the token."""
    return f"{CONFIG_DIR}/{unit_stem}.seed-key"


def seed_known_hosts_file(unit_stem: str) -> str:
    """That peer's host keys (0600), per server like the token."""
    return f"{CONFIG_DIR}/{unit_stem}.seed-known-hosts"
