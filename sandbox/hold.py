#!/usr/bin/python3
"""Hold simulated GPU memory until killed: the "stale process" of another service.

    python3 /usr/local/lib/sandbox-gpu/hold.py --gpu 0 --mib 56320 [--name NAME] [--pidfile PATH]

Registers its own PID with gpusim (so `nvidia-smi --query-compute-apps` lists
it and memory.used grows), then sleeps. SIGTERM/SIGINT: unregister, exit 0.
SIGKILL works too: gpusim drops registrations of dead processes.
Stdlib only; copied into every sandbox guest beside gpusim.py.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys


def _import_gpusim():
    here = os.path.dirname(os.path.realpath(__file__))
    for path in (os.environ.get("SANDBOX_GPU_LIB", ""), here, "/usr/local/lib/sandbox-gpu"):
        if path and os.path.isfile(os.path.join(path, "gpusim.py")):
            sys.path.insert(0, path)
            break
    import gpusim  # noqa: E402

    return gpusim


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="0", help="GPU index, or a comma list (0,1)")
    parser.add_argument("--mib", type=int, required=True, help="MiB held on each listed GPU")
    parser.add_argument("--name", default=None, help="process name nvidia-smi shows (default: comm)")
    parser.add_argument("--pidfile", default=None, help="write the PID here once registered")
    args = parser.parse_args(argv)

    gpusim = _import_gpusim()
    pid = os.getpid()
    gpus = {int(i): args.mib for i in str(args.gpu).split(",") if i.strip()}

    def _stop(signum, frame):
        gpusim.unregister(pid)
        if args.pidfile:
            try:
                os.unlink(args.pidfile)
            except OSError:
                pass
        sys.exit(0)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    gpusim.register(pid, gpus, name=args.name)
    if args.pidfile:
        tmp = f"{args.pidfile}.tmp"
        with open(tmp, "w") as fh:
            fh.write(f"{pid}\n")
        os.replace(tmp, args.pidfile)
    print(f"holding {args.mib} MiB on GPU {args.gpu} (pid {pid})", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
