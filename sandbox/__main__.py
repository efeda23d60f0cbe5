"""python -m sandbox up|down|status|ssh|reboot|kill|build: local simulated GPU hosts."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from . import hosts as H
from . import pcisim, rootfs


def _cmd_up(args: argparse.Namespace) -> int:
    started = time.monotonic()
    result = H.up(
        args.hosts,
        gpus=args.gpus,
        gpu_mib=args.gpu_mib,
        compute_cap=args.compute_cap,
        p2p=args.p2p,
        gpu_name=args.gpu_name,
        iommu=args.iommu,
        acs_redirect=args.acs_redirect,
    )
    for host in result:
        print(f"{host.name}\t{host.address}\tup\t{host.gpu_summary()}")
    if args.scenario:
        from . import scenario

        scenario_started = time.monotonic()
        for host in result:
            scenario.SCENARIOS[args.scenario](host)
        print(f"scenario {args.scenario} prepared in {time.monotonic() - scenario_started:.1f} s "
              f"(grow the model disk: python -m sandbox grow-disk {result[0].name} "
              f"{scenario.MODEL_DISK} {scenario.GROWN_DISK_MIB})")
    print(f"{len(result)} sandbox host(s) up in {time.monotonic() - started:.1f} s "
          f"(ssh: python -m sandbox ssh {result[0].name} -- CMD; pyinfra inventory/sandbox.py ...)")
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    started = time.monotonic()
    names = H.down()
    print(f"removed {len(names)} sandbox host(s){': ' + ' '.join(names) if names else ''} "
          f"in {time.monotonic() - started:.1f} s")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    rows = H.status()
    if not rows:
        print("no sandbox hosts (python -m sandbox up --hosts N)")
        return 0
    for row in rows:
        print(f"{row['name']}\t{row['address']}\t{row['state']}\t{row['summary']}")
    return 0 if all(r["state"] in ("running", "degraded") for r in rows) else 1


def _cmd_ssh(args: argparse.Namespace) -> int:
    host = H.get_host(args.name)
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    argv = host.ssh_args()
    if not cmd:
        argv.insert(1, "-t")
    os.execvp(argv[0], argv + ([" ".join(cmd)] if cmd else []))
    return 0  # not reached


def _cmd_reboot(args: argparse.Namespace) -> int:
    started = time.monotonic()
    host = H.reboot(args.name, timeout=args.timeout)
    print(f"{host.name}\t{host.address}\trebooted in {time.monotonic() - started:.1f} s (disk kept, "
          f"/run and the simulated GPUs cleared)")
    return 0


def _cmd_kill(args: argparse.Namespace) -> int:
    H.kill(args.name)
    print(f"{args.name}\tkilled (disk, address and state kept: `up` boots it again on its disk)")
    return 0


def _cmd_grow_disk(args: argparse.Namespace) -> int:
    host = H.get_host(args.name)
    H.grow_disk(host, args.path, args.mib)
    print(f"{host.name}: {args.path} now {args.mib} MiB, {H.free_bytes(host, args.path)} bytes free")
    return 0


def _cmd_hub_stats(args: argparse.Namespace) -> int:
    import json

    from . import hubd

    print(json.dumps(hubd.stats(reset=args.reset, url=args.url or hubd.ENDPOINT), indent=1, sort_keys=True))
    return 0


def _cmd_build(args: argparse.Namespace) -> int:
    rootfs.ensure_tools()
    rootfs.ensure_ssh_key()
    print(rootfs.ensure_rootfs(rebuild=args.rebuild))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("up", help="ensure sandbox hosts sgc1..sgcN run (keeps running ones)")
    p.add_argument("--hosts", type=int, default=1)
    p.add_argument("--gpus", type=int, default=H.DEFAULT_LAYOUT["gpus"])
    p.add_argument("--gpu-mib", type=int, default=H.DEFAULT_LAYOUT["gpu_mib"])
    p.add_argument("--compute-cap", default=H.DEFAULT_LAYOUT["compute_cap"])
    p.add_argument("--p2p", default=H.DEFAULT_LAYOUT["p2p"], choices=["OK", "NS", "CNS", "GNS", "TNS", "U"])
    p.add_argument("--gpu-name", default=H.DEFAULT_LAYOUT["gpu_name"])
    p.add_argument("--iommu", default=H.DEFAULT_LAYOUT["iommu"], choices=sorted(pcisim.IOMMU),
                   help="the simulated IOMMU (sandbox/pcisim.py): pt or off are good, dma-fq or dma translate "
                        "(the host-fitness preflight refuses the host); default %(default)s")
    p.add_argument("--acs-redirect", default=H.DEFAULT_LAYOUT["acs_redirect"], metavar="GPUS",
                   help='ACS redirect (ReqRedir+ CmpltRedir+) on the bridge above these GPUs ("0,3"), or "all" '
                        "bridges (the preflight refuses the host); default none")
    p.add_argument("--scenario", choices=["ct200-incident"],
                   help="put the hosts in the state of a known incident (see sandbox/scenario.py)")
    p.set_defaults(func=_cmd_up)

    p = sub.add_parser("grow-disk", help="resize a disk made by a scenario: grow-disk NAME PATH MIB")
    p.add_argument("name")
    p.add_argument("path")
    p.add_argument("mib", type=int)
    p.set_defaults(func=_cmd_grow_disk)

    p = sub.add_parser("down", help="remove every sandbox host (also after a crashed run)")
    p.set_defaults(func=_cmd_down)

    p = sub.add_parser("status", help="list sandbox hosts and their state")
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("ssh", help="ssh into a sandbox host: ssh NAME [-- CMD ...]")
    p.add_argument("name")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_ssh)

    p = sub.add_parser("reboot", help="reboot a host (keeps its disk), wait until it is booted again")
    p.add_argument("name")
    p.add_argument("--timeout", type=float, default=H.REBOOT_TIMEOUT_S, help="seconds (default %(default)s)")
    p.set_defaults(func=_cmd_reboot)

    p = sub.add_parser("kill", help="cut a host's power (every process killed at once), keep its disk for `up`")
    p.add_argument("name")
    p.set_defaults(func=_cmd_kill)

    p = sub.add_parser("hub-stats", help="bytes the Hub stand-in served (JSON: total, per file, per client)")
    p.add_argument("--reset", action="store_true", help="print the counts, then start them over")
    p.add_argument("--url", help="another hub's endpoint (default: the sandbox hub)")
    p.set_defaults(func=_cmd_hub_stats)

    p = sub.add_parser("build", help="build the cached rootfs (up does this when needed)")
    p.add_argument("--rebuild", action="store_true", help="rebuild even when cached (hosts must be down)")
    p.set_defaults(func=_cmd_build)

    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: an interrupted `up` removes what it started
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        return args.func(args)
    except (RuntimeError, KeyError, PermissionError, ValueError) as err:
        print(f"sandbox: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
