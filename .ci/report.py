"""CI's closing report: each phase's wall time and the slowest tests, from what `make test` left.

    python .ci/report.py --setup-seconds 120 --wall-seconds 2400 [--reports .sandbox/reports] [--top 10]

Phases: setup (timed by .ci/run), then what the Makefile's test target wrote to <reports>/phases.txt
(one "name<TAB>seconds" line per phase: lint + unit tests, which run beside the integration tests,
and the integration tests). The slowest tests come from the JUnit XML reports pytest wrote there; a
test's time is its setup, call and teardown together (pytest's junit_duration_report default), so a
module's shared host shows in its first test. Then the sandbox hosts' CPU, from guest-cpu.tsv (each
removed guest's cgroup usage, sandbox/hosts.py). Standard library only: it runs whatever broke.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def phases(reports: Path) -> list[tuple[str, int]]:
    try:
        lines = (reports / "phases.txt").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        name, _, seconds = line.rpartition("\t")
        if name and seconds.strip().isdigit():
            out.append((name, int(seconds)))
    return out


def slowest(reports: Path, top: int) -> list[tuple[float, str, str]]:
    """(seconds, test id, outcome) of the ``top`` slowest test cases of every report."""
    cases = []
    for path in sorted(reports.glob("*.xml")):
        try:
            root = ET.parse(path).getroot()
        except (ET.ParseError, OSError):
            continue
        for case in root.iter("testcase"):
            outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
            test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
            cases.append((float(case.get("time") or 0), test_id, outcome))
    return sorted(cases, reverse=True)[:top]


def guest_cpu(reports: Path, top: int) -> tuple[float, list[tuple[float, str]]]:
    """(all guests' core-seconds, the ``top`` hungriest hosts) from guest-cpu.tsv, one line per removed
    guest (sandbox/hosts.py; a host booted again by a later module adds a line)."""
    per_host: dict[str, float] = {}
    try:
        lines = (reports / "guest-cpu.tsv").read_text().splitlines()
    except OSError:
        return 0.0, []
    for line in lines:
        name, _, seconds = line.partition("\t")
        try:
            per_host[name] = per_host.get(name, 0.0) + float(seconds)
        except ValueError:
            continue
    ranked = sorted(((seconds, name) for name, seconds in per_host.items()), reverse=True)
    return sum(per_host.values()), ranked[:top]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=Path, default=Path(".sandbox/reports"))
    parser.add_argument("--setup-seconds", type=int, default=None)
    parser.add_argument("--wall-seconds", type=int, default=None)
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args(argv)
    print("== CI phases (seconds) ==")
    if args.setup_seconds is not None:
        print(f"{args.setup_seconds:>7}  setup (venv, apt tools)")
    for name, seconds in phases(args.reports):
        print(f"{seconds:>7}  {name}")
    if args.wall_seconds is not None:
        print(f"{args.wall_seconds:>7}  in all (wall)")
    cases = slowest(args.reports, args.top)
    print(f"== the {len(cases)} slowest tests (setup + call + teardown, seconds) ==")
    for seconds, test_id, outcome in cases:
        print(f"{seconds:>7.1f}  {test_id}{'' if outcome == 'passed' else f'  [{outcome}]'}")
    total, hungriest = guest_cpu(args.reports, args.top)
    if hungriest:
        print(f"== sandbox hosts' CPU (core-seconds in their cgroups): {total:.0f} in all, the "
              f"{len(hungriest)} hungriest ==")
        for seconds, name in hungriest:
            print(f"{seconds:>7.1f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
