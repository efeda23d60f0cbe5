"""Run the pyinfra CLI and write every command it sends over ssh to a JSON file.

    python -m bench.record_commands OUT.json -y --limit sgc9 inventory/sandbox.py deploy.py

The no-op bench's floor (bench/noop.py) replays the commands of a no-op run in
one ssh round trip: the least any tool could spend to look at the same things.
Each command is recorded as paramiko sends it (the `sh -c '...'` pyinfra
wraps it in), so the floor runs exactly what the deploy runs.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> None:
    out, pyinfra_args = argv[0], argv[1:]
    import paramiko

    sent: list[str] = []
    original = paramiko.SSHClient.exec_command

    def exec_command(self, command, *args, **kwargs):
        sent.append(command if isinstance(command, str) else command.decode())
        return original(self, command, *args, **kwargs)

    paramiko.SSHClient.exec_command = exec_command  # type: ignore[method-assign]
    from pyinfra_cli.main import main as pyinfra_main

    sys.argv = ["pyinfra", *pyinfra_args]
    try:
        pyinfra_main()
    finally:
        with open(out, "w") as handle:
            json.dump(sent, handle, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
