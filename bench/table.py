"""The table `make bench` ends with: every figure in bench/results/latest.json, its goal and
whether it is met. Read from the file, so a part run alone (`python -m bench --part noop`)
shows beside the figures of the parts run before it.

    python -m bench.table
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable
from pathlib import Path

from bench.results import RESULTS

# figure -> (comparison, bound, where the goal comes from); a figure without a goal is shown as context
GOALS: dict[str, tuple[str, float, str]] = {
    "ansible_over_noop": (">=", 6.0, "issue 12: the no-op re-run 6x faster than the same checks in Ansible"),
    "noop_over_floor": ("<=", 2.0, "issue 12: at most twice one ssh round trip running the same commands"),
    "ready_report_s": ("<=", 0.5, "issue 12: reports ready within half a second of it being ready"),
    "crash_report_s": ("<=", 1.0, "DESIGN.md: fails within a second of the unit failing"),
    "rollout_overhead_per_host_s": ("<=", 3.0, "issue 12: the rollout's overhead per host beyond time to ready"),
    "rollout_overhead_over_per_host_deploys": ("<=", 1.5, "assumed: the rollout's own work per host"),
    "download_over_curl": (">=", 0.9, "bench/transfer.py"),
    "verify_over_sha256sum": (">=", 0.9, "bench/transfer.py"),
    "seed_hub_bytes_over_model": ("<=", 1.05, "README: one Hub download per fleet (peer seeding)"),
    "seed_over_hub_only_s": ("<=", 1.0, "assumed: seeding is no slower than every host from the Hub"),
    "gates_s": ("<=", 75.0, "issue 20: the speed gate's two measurements at most ~30 s each, the rest seconds"),
    "staged_rollout_over_unstaged": ("<=", 0.6, "issue 21: a staged rollout of a change against an unstaged one"),
    "scale_dry_50_over_1": ("<=", 2.0, "issue 12: 50 hosts take at most twice one host (dry run)"),
    "scale_noop_50_over_1": ("<=", 2.0, "issue 12: 50 hosts take at most twice one host (no-op re-run)"),
}
_COMPARE: dict[str, Callable[[float, float], bool]] = {">=": operator.ge, "<=": operator.le}
# figures listed first, in this order (the issue's); any other recorded figure follows, sorted
ORDER = ["noop_s", "ansible_noop_s", "floor_noop_s", "ansible_over_noop", "noop_over_floor", "ready_report_s",
         "crash_report_s", "gates_s", "restart_to_ready_s", "gates_over_restart", "rollout_overhead_per_host_s", "baseline_overhead_per_host_s",
         "rollout_overhead_over_per_host_deploys", "download_over_curl", "verify_over_sha256sum",
         "seed_rollout_s", "hub_only_rollout_s", "seed_over_hub_only_s", "seed_hub_bytes_over_model"]


def rows(figures: dict) -> list[tuple[str, str, str, str]]:
    """(figure, value, goal, met) for every number in ``figures``."""
    names = [n for n in ORDER if n in figures] + sorted(n for n in figures if n not in ORDER)
    out = []
    for name in names:
        value = figures[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        if name in GOALS:
            op, bound, _why = GOALS[name]
            out.append((name, shown, f"{op} {bound:g}", "yes" if _COMPARE[op](value, bound) else "NO"))
        else:
            out.append((name, shown, "", ""))
    return out


def render(figures: dict) -> str:
    table = [("figure", "value", "goal", "met"), *rows(figures)]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def main(path: Path = RESULTS) -> str:
    try:
        figures = json.loads(path.read_text())
    except (OSError, ValueError):
        figures = {}
    text = render(figures)
    print(f"bench: every figure in {path.name} (started {figures.get('started_at', '?')})\n{text}", flush=True)
    return text


if __name__ == "__main__":
    main()
