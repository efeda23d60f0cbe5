"""Bench: how the deploy scales with the number of hosts (1, 10, 20, 50 by default).

One host (sgc100) is converged for real; its converged state is snapshotted
(sandbox/clones.py) and the other hosts (sgc101...) boot as clones of it,
each with its own identity, and get one settling deploy run of their own.
For each N (hosts sgc100..sgc<99+N>, all at once: plain pyinfra over
inventory/sandbox_fleet.py with --parallel N, no router):

  dry:   pyinfra -y INVENTORY deploy.py --dry
  no-op: pyinfra -y INVENTORY deploy.py  (nothing left to change)

timed, with the controller's peak memory (max RSS of the pyinfra process from
wait4, and the peak sum of RSS over its process tree, polled) and the peak
number of its established ssh connections, and the CPU time the controller and
the guests used. The results are the ratios of the N-host times to the 1-host
time (`scale_dry_50_over_1`, `scale_noop_50_over_1` where 50 hosts ran;
otherwise `..._<N>_over_1` of the largest N). The machine is shared and its
load moves: each N-host run also follows a run over sgc100 alone, taken under
the same load (`scale_noop_<N>_over_adjacent_1`).

The guests share this machine's CPUs with each other and with the controller:
a guest's share of a no-op run (its fact commands; `scale_noop_guests_cpu_s_<N>`)
adds up over N here, where real hosts each run theirs on their own CPUs. So each
N also gets its CPU floor: all the CPU time the run used, controller's and guests',
over this machine's cores (`scale_noop_cpu_floor_s_<N>`), the least time the
machine could take, and the run's time over it (`scale_noop_<N>_over_cpu_floor`);
and the controller's CPU for each host added (`scale_noop_controller_cpu_per_added_host_s`),
the cost that stays on the controller when the hosts are real.

N is capped by what the machine has left: before more clones boot, the RAM
available must stay above MIN_FREE_RAM_GIB plus the measured cost of a
serving clone times the hosts to add, and the disk above MIN_FREE_DISK_GIB.

    python -m bench.scale [--hosts 1,10,20,50] [--repeats 3] [--keep]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.results import forget, record
from sandbox import clones
from sandbox import hosts as sandbox_api

ROOT = Path(__file__).resolve().parent.parent
FIRST = 100  # sgc100 is the template; clones are sgc101...
LAST = 160  # the highest index this bench may use (at most 61 hosts)
LABEL = "bench-scale"
MIN_FREE_RAM_GIB = 7.0  # 6 GiB for the machine's other users, 1 GiB for the controller
MIN_FREE_DISK_GIB = 20.0
BOOT_CHUNK = 5  # clones booted at once: each starts its SGLang stand-in (9 processes) at boot
CLONE_BOOT_TIMEOUT_S = 240.0  # on 2 shared cores a chunk of clones takes minutes to become reachable
GIB = 1024**3


@dataclass
class Run:
    seconds: float
    rc: int
    output: str
    max_rss: int = 0  # bytes, the pyinfra process (wait4)
    tree_rss: int = 0  # bytes, peak sum over its process tree (polled)
    ssh: int = 0  # peak established connections to port 22 of its sockets
    changed: int = 0  # "Grand total" Success column: operations that changed something
    cpu_s: float = 0.0  # the controller's CPU time (user + system, wait4)
    guest_cpu_s: float = 0.0  # CPU time the hosts' guests used meanwhile (their cgroups' cpu.stat)


@dataclass
class _Peaks:
    tree_rss: int = 0
    ssh: int = 0
    stop: threading.Event = field(default_factory=threading.Event)


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    return pids


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _socket_inodes(pid: int) -> set[str]:
    found = set()
    try:
        for fd in os.scandir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(fd.path)
            except OSError:
                continue
            if link.startswith("socket:["):
                found.add(link[8:-1])
    except OSError:
        pass
    return found


def ssh_connections(tcp_table: str, inodes: set[str]) -> int:
    """Established TCP connections to port 22 (a /proc/net/tcp text) among these socket inodes."""
    count = 0
    for line in tcp_table.splitlines()[1:]:
        cols = line.split()
        if len(cols) > 9 and cols[2].endswith(":0016") and cols[3] == "01" and cols[9] in inodes:
            count += 1
    return count


def _poll(pid: int, peaks: _Peaks) -> None:
    while not peaks.stop.is_set():
        pids = _tree(pid)
        peaks.tree_rss = max(peaks.tree_rss, sum(_rss(p) for p in pids))
        inodes = set().union(*(_socket_inodes(p) for p in pids))
        try:
            table = Path(f"/proc/{pid}/net/tcp").read_text()
        except OSError:
            table = ""
        peaks.ssh = max(peaks.ssh, ssh_connections(table, inodes))
        peaks.stop.wait(0.2)


def grand_total_changed(output: str) -> int:
    """The Success (changed) column of pyinfra's "Grand total" row (0 when '-' or absent)."""
    m = re.search(r"Grand total\s+(\S+)\s+(\S+)", output)
    return int(m.group(2)) if m and m.group(2).isdigit() else 0


def fleet_env(indexes: list[int]) -> dict:
    return {"SGC_FLEET_INDEXES": ",".join(map(str, indexes)), "SGC_FLEET_ROUTER": "", "PYINFRA_PROGRESS": "off"}


def guest_cpu_seconds(indexes: list[int]) -> float:
    """CPU time used so far by these guests (cgroup2 cpu.stat usage_usec; 0 where absent)."""
    total = 0
    for index in indexes:
        for d in sandbox_api._cgroup_dirs(sandbox_api.host_name(index)):
            try:
                text = (d / "cpu.stat").read_text()
            except OSError:
                continue
            total += next((int(line.split()[1]) for line in text.splitlines() if line.startswith("usage_usec")), 0)
    return total / 1e6


def pyinfra(indexes: list[int], *args: str) -> Run:
    """Plain pyinfra over these sandbox hosts, all at once; timed and watched."""
    argv = [sys.executable, "-m", "pyinfra", "-y", "--parallel", str(len(indexes)), "inventory/sandbox_fleet.py",
            "deploy.py", *args]
    guest_cpu = guest_cpu_seconds(indexes)
    with tempfile.TemporaryFile("w+") as out:
        started = time.monotonic()
        proc = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **fleet_env(indexes)}, stdout=out,
                                stderr=subprocess.STDOUT, text=True)
        peaks = _Peaks()
        watcher = threading.Thread(target=_poll, args=(proc.pid, peaks), daemon=True)
        watcher.start()
        _, status, usage = os.wait4(proc.pid, 0)
        took = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        peaks.stop.set()
        watcher.join()
        out.seek(0)
        text = out.read()
    return Run(took, proc.returncode, text, usage.ru_maxrss * 1024, peaks.tree_rss, peaks.ssh,
               grand_total_changed(text), usage.ru_utime + usage.ru_stime, guest_cpu_seconds(indexes) - guest_cpu)


def guest_memory(name: str) -> dict:
    """RSS and PSS (bytes) summed over the processes of a guest's cgroup."""
    rss = pss = 0
    pids: set[int] = set()
    for d in sandbox_api._cgroup_dirs(name):
        pids |= sandbox_api._cgroup_pids(d)
    for pid in pids:
        rss += _rss(pid)
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1]) * 1024
        except OSError:
            pass
    return {"rss": rss, "pss": pss, "processes": len(pids)}


def host_cost(name: str) -> dict:
    return {"upper_disk": clones.disk_bytes(sandbox_api._host_dir(name) / "upper"), **guest_memory(name)}


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def fits(extra: int, per_host_ram: int, per_host_disk: int) -> tuple[bool, str]:
    """Whether `extra` more clones leave MIN_FREE_* of RAM and disk."""
    ram_left = mem_available() - extra * per_host_ram
    disk_left = shutil.disk_usage(sandbox_api.VAR_DIR).free - extra * per_host_disk
    ok = ram_left >= MIN_FREE_RAM_GIB * GIB and disk_left >= MIN_FREE_DISK_GIB * GIB
    return ok, f"RAM left after {ram_left / GIB:.1f} GiB, disk {disk_left / GIB:.1f} GiB"


def _check(run: Run, what: str) -> Run:
    if run.rc != 0:
        raise RuntimeError(f"{what} failed ({run.rc}):\n{run.output[-4000:]}")
    return run


def _log(msg: str) -> None:
    print(f"bench: scale: {msg}", flush=True)


def changed_operations(output: str) -> list[str]:
    """Operations of pyinfra's results table that changed something on some host."""
    names = []
    table = output.rpartition("--> Results:")[2] if "--> Results:" in output else ""
    for line in table.splitlines():
        m = re.match(r"\s*(.+?)\s+(\d+)\s+(\d+|-)\s+(\d+|-)\s+(\d+|-)\s*$", line)
        if m and m.group(3) != "-" and m.group(1) != "Grand total":
            names.append(m.group(1))
    return names


def measure(indexes: list[int], repeats: int) -> dict:
    """Dry run and no-op re-run over these hosts: median seconds, peaks over all runs.

    With more than one host, each run over all of them follows a run of the same kind
    over the first host alone (the others idle): the "adjacent" 1-host baseline, taken
    under the same load from the machine's other users."""
    runs: dict[str, list[Run]] = {"dry": [], "noop": [], "dry_1": [], "noop_1": []}
    for kind in ("dry", "noop"):
        args = ["--dry"] if kind == "dry" else []
        for _ in range(repeats):
            if len(indexes) > 1:
                runs[f"{kind}_1"].append(_check(pyinfra(indexes[:1], *args), f"{kind} run, 1 host"))
            runs[kind].append(_check(pyinfra(indexes, *args), f"{kind} run, {len(indexes)} hosts"))
    every = runs["dry"] + runs["noop"]
    return {
        "dry_s": statistics.median(r.seconds for r in runs["dry"]),
        "noop_s": statistics.median(r.seconds for r in runs["noop"]),
        "dry_1_adjacent_s": statistics.median(r.seconds for r in runs["dry_1"] or runs["dry"]),
        "noop_1_adjacent_s": statistics.median(r.seconds for r in runs["noop_1"] or runs["noop"]),
        "noop_changed": max(r.changed for r in runs["noop"] + runs["noop_1"]),
        "noop_cpu_s": statistics.median(r.cpu_s for r in runs["noop"]),
        "noop_guest_cpu_s": statistics.median(r.guest_cpu_s for r in runs["noop"]),
        "dry_guest_cpu_s": statistics.median(r.guest_cpu_s for r in runs["dry"]),
        "peak_rss_mib": max(max(r.max_rss, r.tree_rss) for r in every) / 2**20,
        "peak_ssh": max(r.ssh for r in every),
    }


def _grow(up: list[int], target: int, layer: Path, est: dict, settles: list[dict]) -> str:
    """Boot clones until `target` hosts run (or what fits); each chunk gets its settling run."""
    while len(up) < target:
        chunk = list(range(FIRST + len(up), FIRST + min(target, len(up) + BOOT_CHUNK)))
        ok, why = fits(len(chunk), est["ram"], est["disk"])
        while not ok and len(chunk) > 1:
            chunk.pop()
            ok, why = fits(len(chunk), est["ram"], est["disk"])
        if not ok:
            return f"stopped at {len(up)} hosts: one more clone would leave too little ({why})"
        try:
            sandbox_api.up(indexes=chunk, snapshot=layer, boot_timeout=CLONE_BOOT_TIMEOUT_S)  # a failed boot removes that chunk only
        except RuntimeError as err:
            return f"stopped at {len(up)} hosts: clones sgc{chunk[0]}..sgc{chunk[-1]} did not boot: {str(err)[:600]}"
        settle = _check(pyinfra(chunk), f"first deploy over clones {chunk[0]}..{chunk[-1]}")
        again = pyinfra(chunk)  # the clones now converged: a second run changes nothing
        settles.append({"hosts": len(chunk), "settle_s": settle.seconds, "changed": changed_operations(settle.output),
                        "second_run_changed": again.changed})
        _log(f"booted clones sgc{chunk[0]}..sgc{chunk[-1]}; their first deploy: {settle.seconds:.1f} s, changed "
             f"{', '.join(changed_operations(settle.output)) or 'nothing'}; a second run changed {again.changed}")
        up += chunk
        cost = host_cost(sandbox_api.host_name(chunk[-1]))
        est["clone"] = cost
        est["ram"] = int(cost["pss"] * 1.25)
        est["disk"] = max(cost["upper_disk"] * 2, 64 * 2**20)
    return ""


def sweep(sizes: list[int], repeats: int) -> dict:
    template = sandbox_api.host_name(FIRST)
    sandbox_api.up(indexes=[FIRST])
    _log(f"converging the template host {template} ...")
    converge = _check(pyinfra([FIRST]), "converge of the template")
    cost = host_cost(template)
    layer = clones.snapshot(template, LABEL)
    out: dict = {"converge_s": converge.seconds, "template": cost, "layer_disk": clones.disk_bytes(layer),
                 "by_n": {}, "settles": [], "capped": ""}
    _log(f"template converged in {converge.seconds:.0f} s: upper dir {cost['upper_disk'] / 2**20:.0f} MiB, guest "
         f"RSS {cost['rss'] / 2**20:.0f} MiB (PSS {cost['pss'] / 2**20:.0f} MiB); snapshot {layer}")
    est = {"ram": cost["rss"], "disk": 256 * 2**20}
    up = [FIRST]
    for n in sorted(sizes):
        if n > len(up):
            out["capped"] = _grow(up, n, layer, est, out["settles"])
        if len(up) in out["by_n"]:
            break
        m = measure(list(up), repeats)
        out["by_n"][len(up)] = m
        _log(f"{len(up)} hosts: dry run {m['dry_s']:.1f} s (1 host beside it {m['dry_1_adjacent_s']:.1f} s), no-op "
             f"re-run {m['noop_s']:.1f} s (1 host beside it {m['noop_1_adjacent_s']:.1f} s; changed "
             f"{m['noop_changed']}; CPU: controller {m['noop_cpu_s']:.1f} s, guests {m['noop_guest_cpu_s']:.1f} s), "
             f"controller peak RSS "
             f"{m['peak_rss_mib']:.0f} MiB, peak ssh {m['peak_ssh']}")
        if out["capped"]:
            break
    out["clone"] = est.get("clone")
    return out


def figures(out: dict) -> dict:
    """latest.json keys: seconds and peaks per N, the ratios of the largest N (and 50) to 1 host, host costs."""
    by_n = out["by_n"]
    fig: dict = {"scale_template_converge_s": out["converge_s"], "scale_snapshot_disk_mib": out["layer_disk"] / 2**20,
                 "scale_host_upper_disk_mib": out["template"]["upper_disk"] / 2**20,
                 "scale_host_rss_mib": out["template"]["rss"] / 2**20,
                 "scale_host_pss_mib": out["template"]["pss"] / 2**20,
                 "scale_max_hosts": max(by_n), "scale_capped": out["capped"]}
    if out.get("clone"):
        fig |= {"scale_clone_upper_disk_mib": out["clone"]["upper_disk"] / 2**20,
                "scale_clone_rss_mib": out["clone"]["rss"] / 2**20, "scale_clone_pss_mib": out["clone"]["pss"] / 2**20}
    if out["settles"]:
        fig["scale_clone_first_deploy_s"] = [s["settle_s"] for s in out["settles"]]
        fig["scale_clone_first_deploy_changed"] = sorted({op for s in out["settles"] for op in s["changed"]})
        fig["scale_clone_second_run_changed"] = max(s["second_run_changed"] for s in out["settles"])
    for n, m in sorted(by_n.items()):
        fig |= {f"scale_dry_s_{n}": m["dry_s"], f"scale_noop_s_{n}": m["noop_s"],
                f"scale_noop_changed_{n}": m["noop_changed"],
                f"scale_noop_controller_cpu_s_{n}": m["noop_cpu_s"],
                f"scale_noop_guests_cpu_s_{n}": m["noop_guest_cpu_s"],
                f"scale_dry_guests_cpu_s_{n}": m["dry_guest_cpu_s"],
                f"scale_peak_rss_mib_{n}": m["peak_rss_mib"], f"scale_peak_ssh_{n}": m["peak_ssh"]}
        if n > 1:
            fig |= {f"scale_dry_s_1_beside_{n}": m["dry_1_adjacent_s"],
                    f"scale_noop_s_1_beside_{n}": m["noop_1_adjacent_s"],
                    f"scale_dry_{n}_over_adjacent_1": m["dry_s"] / m["dry_1_adjacent_s"],
                    f"scale_noop_{n}_over_adjacent_1": m["noop_s"] / m["noop_1_adjacent_s"]}
        # the least time this machine could take: every CPU-second the run used (controller and guests
        # alike share its cores here), spread over all its cores
        floor = (m["noop_cpu_s"] + m["noop_guest_cpu_s"]) / (os.cpu_count() or 1)
        fig |= {f"scale_noop_cpu_floor_s_{n}": floor, f"scale_noop_{n}_over_cpu_floor": m["noop_s"] / floor}
    if 1 in by_n and max(by_n) > 1:
        top = max(by_n)
        # what one more host costs the controller, and what its no-op costs the host itself
        fig["scale_noop_controller_cpu_per_added_host_s"] = \
            (by_n[top]["noop_cpu_s"] - by_n[1]["noop_cpu_s"]) / (top - 1)
        fig["scale_noop_guest_cpu_per_host_s"] = by_n[top]["noop_guest_cpu_s"] / top
    if 1 in by_n:
        for n in {max(by_n)} | ({50} & set(by_n)):
            fig[f"scale_dry_{n}_over_1"] = by_n[n]["dry_s"] / by_n[1]["dry_s"]
            fig[f"scale_noop_{n}_over_1"] = by_n[n]["noop_s"] / by_n[1]["noop_s"]
    return fig


def cleanup(keep: bool) -> None:
    """Remove the template and its clones (sgc100..sgc160 of this bench), then the snapshot."""
    if keep:
        return
    names = [h.name for h in sandbox_api.load_hosts() if FIRST <= h.index <= LAST]
    for name in dict.fromkeys([*clones.users(LABEL), *names]):
        sandbox_api.remove(name)
    clones.remove_snapshot(LABEL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1,10,20,50", help="host counts to measure (default 1,10,20,50)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each kind per N (median)")
    parser.add_argument("--keep", action="store_true", help="leave the hosts (and the snapshot) in place")
    args = parser.parse_args(argv)
    sizes = sorted({int(n) for n in args.hosts.split(",")})
    if not sizes or sizes[0] < 1 or sizes[-1] > LAST - FIRST + 1:
        parser.error(f"--hosts: 1..{LAST - FIRST + 1} each (sgc{FIRST}..sgc{LAST})")
    try:
        out = sweep(sizes, args.repeats)
    finally:
        cleanup(args.keep)
    fig = figures(out)
    forget("scale_")  # an earlier `python -m bench.scale`'s N may not be measured again
    record(fig)
    top = max(out["by_n"])
    if 1 in out["by_n"] and top > 1:
        _log(f"(f) {top} hosts vs 1: dry run x{fig[f'scale_dry_{top}_over_1']:.2f}, no-op re-run "
             f"x{fig[f'scale_noop_{top}_over_1']:.2f} (goal: <= 2)")
    if out["capped"]:
        _log(out["capped"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
