"""python -m rollout INVENTORY --batch-size N [--canary 1] [--max-failed 0] [--dry] [--limit ...]
python -m rollout INVENTORY --status [--limit ...]
python -m rollout INVENTORY --rollback [--batch-size N] [--limit ...]
python -m rollout INVENTORY --verify [--limit ...]

Rolls deploy.py over the inventory's hosts: router hosts first, then the
servers in inventory order - the canary batch, then batches of N - each batch
ready before the next starts; stops after the batch in which more than
--max-failed hosts have failed (an unreachable host counts). Before any host
changes, every server's preflight (GPUs, driver, disk, port) is gathered and
every host that cannot take the model, or cannot be reached, is reported (exit 2).

--rollback rolls rollback.py instead, the same way: each server's previous
good configuration put back (tasks/rollback.py), out of its router and back.

--verify runs verify.py on every server at once: the readiness gates (the
launch fingerprint, the decode speed, the draft, the smoke checks) on each
server as it serves, every gate also after one failed; nothing restarts, no
configuration file is written, router membership stays (tasks/verify.py);
the summary's error column names each host's first failed gate, exit 1.

--status changes nothing: per host the unit, whether it serves, the model
revision on disk, drift (why the next deploy would restart it) and its place
in the router; exit 1 when any host is not as wanted (rollout/status.py).

A router lost during a batch (a router call of a server got no answer: its
drain or its registration; or a router host failed) stops the rollout after
that batch whatever --max-failed (exit 1): the summary's last lines name the
router, what failed, and each server out of its router (drained and not
registered again, or never registered); once the router answers, the next
rollout registers every ready server (rollout/router_loss.py).

Exit status: 0 all ok, 1 a host failed (the rollout stopped once more than
--max-failed had failed, or went on within it), 2 invalid settings or a
failed preflight, an unreachable host included (nothing changed). --dry
changes nothing and exits 1 when its plan already knows that the real run
would fail on a host (a repo or revision missing on the Hub, a refused token,
disk short: any fail_command a step yields while pyinfra prepares,
core/dry_run.py) or a host cannot be reached, its last lines naming each such
host and failure ("dry run: the real run would fail on sgc1: model: ...
(HTTP 404)"); 0 when no plan knows of a failure; 2 as above.
"""

from __future__ import annotations

import pyinfra_cli  # noqa: F401  (gevent's monkey patching, before anything opens a socket)

import argparse
import logging
import os
import sys

from rollout.driver import Driver
from rollout.summary import print_summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m rollout", description=__doc__.split("\n\n")[1])
    parser.add_argument("inventory", help="pyinfra inventory file, e.g. inventory/sandbox_fleet.py")
    parser.add_argument("--batch-size", type=int, default=1, help="servers per batch after the canary (default 1)")
    parser.add_argument("--canary", type=int, default=0, help="servers in the first batch, alone (default 0: none)")
    parser.add_argument("--max-failed", type=int, default=0,
                        help="failed hosts tolerated before the rollout stops after a batch (default 0)")
    parser.add_argument("--dry", action="store_true",
                        help="print every batch's per-host plan; change nothing (exit 1: a plan knows a failure)")
    parser.add_argument("--diff", action="store_true", help="with --dry: unified diffs of the managed files")
    parser.add_argument("--status", action="store_true",
                        help="read-only: each host's unit, serving, model revision, drift and router place")
    parser.add_argument("--limit", action="append", default=[], metavar="PATTERN",
                        help="only these hosts or groups (fnmatch patterns; repeatable)")
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                        help="override data for every host, like pyinfra's --data (JSON values parsed)")
    parser.add_argument("--group-data", action="append", default=[], metavar="DIR",
                        help="another group_data directory (its files override), like pyinfra's --group-data")
    parser.add_argument("--verify", action="store_true",
                        help="run the readiness gates on every server as it serves; changes nothing (verify.py)")
    parser.add_argument("--deploy", default="deploy.py", help="the deploy file (default deploy.py)")
    parser.add_argument("--rollback", action="store_true",
                        help="put each server's previous good configuration back (rollback.py), batch by batch")
    parser.add_argument("--no-preflight", action="store_true", help="skip the fleet preflight")
    parser.add_argument("--no-seed", action="store_true",
                        help="every host downloads from the Hub (default: a host copies a revision another host "
                             "holds verified from that peer, rsync over ssh, then checks it against the Hub)")
    parser.add_argument("--stage-parallel", type=int, default=4, metavar="N",
                        help="hosts staging at once (stage.py: venv and model revision prepared beside what serves) "
                             "after the canary passed, before their batches (default 4)")
    parser.add_argument("--stage-only", action="store_true",
                        help="stage every server (stage.py) and restart nothing: a fleet prepared for a window")
    parser.add_argument("--no-stage", action="store_true",
                        help="no staging ahead: each batch installs and downloads in its own run, then restarts")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings, errors and the summary")
    return parser.parse_args(argv)


def cli_mode() -> None:
    """What pyinfra's own CLI sets up before it loads a deploy file: op order
    from the deploy file's call stack (as `pyinfra ... deploy.py` orders and
    hashes them), click styling, and remote output lines echoed."""
    import click
    import pyinfra
    from pyinfra.api.output import set_echo, set_formatter

    pyinfra.is_cli = True
    set_formatter(click.style)
    set_echo(click.echo)
    sys.path.append(".")


def main(argv: list[str] | None = None) -> int:
    from pyinfra_cli.log import setup_logging
    from pyinfra_cli.util import parse_cli_arg

    args = parse_args(argv)
    for name, value in (("--batch-size", args.batch_size), ("--canary", args.canary + 1),
                        ("--max-failed", args.max_failed + 1), ("--stage-parallel", args.stage_parallel)):
        if value < 1:
            print(f"rollout: {name} must be >= {1 if name == '--batch-size' else 0}", file=sys.stderr)
            return 2
    if args.stage_only and (args.deploy != "deploy.py" or args.status or args.rollback or args.verify
                            or args.no_stage):
        print("rollout: --stage-only runs stage.py: not with --deploy, --status, --rollback, --verify or --no-stage",
              file=sys.stderr)
        return 2
    if args.rollback and (args.deploy != "deploy.py" or args.status):
        print("rollout: --rollback runs rollback.py: not with --deploy or --status", file=sys.stderr)
        return 2
    if args.verify and (args.deploy != "deploy.py" or args.status or args.rollback or args.dry):
        print("rollout: --verify runs verify.py: not with --deploy, --status, --rollback or --dry", file=sys.stderr)
        return 2
    data = {}
    for item in args.data:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"rollout: --data {item!r}: expected KEY=VALUE", file=sys.stderr)
            return 2
        data[key] = parse_cli_arg(value)
    if not sys.stderr.isatty():
        os.environ.setdefault("PYINFRA_PROGRESS", "off")
    setup_logging(logging.WARNING if args.quiet else logging.INFO)
    cli_mode()
    from tasks.spec import SpecError

    # --verify: every server at once (nothing restarts, so no batch has to wait for another)
    driver = Driver(
        args.inventory, batch_size=10**6 if args.verify else args.batch_size, canary=0 if args.verify else args.canary,
        max_failed=10**6 if args.verify else args.max_failed, dry=args.dry, diff=args.diff, limit=args.limit,
        data=data, group_data=args.group_data,
        deploy_file="verify.py" if args.verify else "rollback.py" if args.rollback else args.deploy,
        preflight=not args.no_preflight and not args.verify, seed=not args.no_seed and not args.rollback and not args.verify,
        # a custom deploy file, rollback.py and verify.py switch to nothing new: no stage ahead of them
        stage=not args.no_stage and args.deploy == "deploy.py" and not args.rollback and not args.verify,
        stage_parallel=args.stage_parallel, stage_only=args.stage_only,
    )
    from rollout import profile

    profile.start()
    try:
        if args.status:
            from rollout.status import gather, print_status

            return print_status(gather(driver))
        with profile.phase("run"):
            report = driver.run()
    except SpecError as err:
        print(f"rollout: {err}", file=sys.stderr)
        return 2
    print_summary(report)
    if os.environ.get("SGC_ROLLOUT_REPORT"):  # each host's result as JSON (the benchmarks read it)
        import dataclasses
        import json

        with open(os.environ["SGC_ROLLOUT_REPORT"], "w") as out:
            json.dump({name: dataclasses.asdict(result) for name, result in report.results.items()}, out, indent=1)
    profile.finish()
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
