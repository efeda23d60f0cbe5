"""bench/results/latest.json: every benchmark's figures from the latest `make bench`, one flat
JSON object (absolute seconds and the ratios computed from the same run). Each part records its
own keys; `start()` begins a new file for a new `make bench` run."""

from __future__ import annotations

import json
import time
from pathlib import Path

# `python -m bench --quick` points it at .sandbox/bench-quick.json: a smoke run of the benches never
# replaces the figures of a real one
RESULTS = Path(__file__).resolve().parent / "results" / "latest.json"


def start() -> None:
    """A new run: the figures of an earlier run are not mixed with this one's."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=1))


def record(figures: dict) -> None:
    """Add (or replace) these keys in latest.json."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    try:
        current = json.loads(RESULTS.read_text())
    except (OSError, ValueError):
        current = {}
    current.update(figures)
    RESULTS.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")


def forget(prefix: str) -> None:
    """Drop the keys starting with `prefix` (a part's figures of an earlier run, before it records anew)."""
    try:
        current = json.loads(RESULTS.read_text())
    except (OSError, ValueError):
        return
    RESULTS.write_text(json.dumps({k: v for k, v in current.items() if not k.startswith(prefix)}, indent=1,
                                  sort_keys=True) + "\n")
