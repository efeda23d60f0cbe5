"""(g) What the readiness gates add to a restart (issue 20 item 8): on the bench's converged host
(sgc9), each round restarts the server twice by a deploy that changes its environment, once with
the gates (the defaults) and once with them turned off (`kv_plan_tolerance = 0`,
`perf_tolerance = 0`), side by side. Per round: the deploy's own line "readiness: gates passed in
X s (...)" (core/gates.py) and the server's time to ready ("(N s to ready" in the ready line), and
the deploy's wall time of each. Figures (medians): gates_s, restart_to_ready_s, gates_over_restart,
deploy_with_gates_s, deploy_without_gates_s.

The server is the sandbox's stand-in (its start takes seconds, a real 595 GB start minutes): the
gates' own seconds are the figure that carries over; the ratio to the restart is the sandbox's.
"""

from __future__ import annotations

import re
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

GATES_LINE = re.compile(r"readiness: gates passed in ([\d.]+) s \(([^)]*)\)")
READY_LINE = re.compile(r"ready: \S+ serves .* \(([\d.]+) s to ready")
GATES_OFF = ("--data", "kv_plan_tolerance=0", "--data", "perf_tolerance=0")


def _override(folder: Path, tag: str) -> str:
    """A --group-data dir whose extra_env differs per round (a restart), the sandbox's own env kept."""
    import runpy

    root = Path(__file__).resolve().parent.parent
    extra = {**runpy.run_path(str(root / "group_data" / "sandbox.py"))["extra_env"], "SGC_BENCH_ROUND": tag}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sandbox.py").write_text(f"extra_env = {extra!r}\n")
    return str(folder)


def _one(pyinfra: Callable[..., CompletedProcess], folder: Path, tag: str, *args: str) -> tuple[float, str]:
    started = time.monotonic()
    proc = pyinfra("deploy.py", "--group-data", _override(folder, tag), *args)
    wall = time.monotonic() - started
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"the bench's restart ({tag}) failed:\n{out[-3000:]}")
    return wall, out


def measure(pyinfra: Callable[..., CompletedProcess], rounds: int) -> dict:
    """``rounds`` pairs of restarts (with, without the gates); the medians."""
    gates, ready, with_s, without_s, parts = [], [], [], [], ""
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            wall, out = _one(pyinfra, Path(tmp) / f"g{i}", f"gates-{i}-{time.time():.0f}")
            found, up = GATES_LINE.search(out), READY_LINE.search(out)
            if not found or not up:
                raise RuntimeError(f"no gates/ready line in the bench's restart:\n{out[-3000:]}")
            gates.append(float(found.group(1)))
            ready.append(float(up.group(1)))
            parts = found.group(2)
            with_s.append(wall)
            wall, out = _one(pyinfra, Path(tmp) / f"n{i}", f"none-{i}-{time.time():.0f}", *GATES_OFF)
            without_s.append(wall)
    med = statistics.median
    return {"gates_s": med(gates), "restart_to_ready_s": med(ready), "gates_over_restart": med(gates) / med(ready),
            "deploy_with_gates_s": med(with_s), "deploy_without_gates_s": med(without_s), "gates_parts": parts,
            "gates_rounds": rounds}


def describe(f: dict) -> str:
    return (f"(g) readiness gates: {f['gates_s']:.2f} s ({f['gates_parts']}) on top of the restart's "
            f"{f['restart_to_ready_s']:.2f} s to ready -> gates_over_restart {f['gates_over_restart']:.2f}; deploy "
            f"with the gates {f['deploy_with_gates_s']:.2f} s vs without {f['deploy_without_gates_s']:.2f} s "
            f"(median of {f['gates_rounds']}; the stand-in starts in seconds, a 595 GB model in minutes)")
