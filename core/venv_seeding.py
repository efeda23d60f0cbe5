"""A server venv copied from a peer in a rollout, instead of built with pip.

The venv of a package set is named by its digest (``<venv_path>-envs/<digest>``),
so every host of a fleet builds the same venv at the same path; a rollout
offers the hosts of its later batches a peer that built and verified it
(rollout/seeding.py, core/seeding.py ``venv_key``). remote/venv_seed.py copies it
with rsync over ssh under the rollout's key, uses it only when it was made on
the same Python for the same platform, and renames it into place; otherwise it
says why and the venv is built as without a peer. Either way the steps after
it check the venv as they check a built one, so the step's postcondition is the
same. On real hosts this trades pip's download and unpack of torch, sglang &
co. (minutes, several GB) for a copy at the network's speed.

    venv_seeded(path=spec.server_venv, python=spec.venv_python, seed=seed_source(host.name),
                digest=spec.env_digest, owner=spec.unit_stem)
"""

from __future__ import annotations

from shlex import quote

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, StringCommand, operation

from core.ops import plan, record_failure, scripts_uploaded
from core.paths import CONFIG_DIR, REMOTE_DIR, SWITCHED, seed_key_file, seed_known_hosts_file
from core.seeding import SeedSource, seed_files_uploaded
from core.venv_ops import PIP_LOCK_NAME
from facts.venv import VenvState

SCRIPTS = ("venv_seed.py", "peer_seed.py")
NOT_COPIED = (SWITCHED, PIP_LOCK_NAME)  # the peer's switch time and pip lock are its own


def copy_command(path: str, python: str, source: str, port: int, owner: str) -> str:
    """Shell text: the copy, then the key files removed whatever happened (also on a hang-up).

    >>> print(copy_command("/e/abc", "/usr/bin/python3", "root@10.0.0.5:/e/abc", 22, "sglang"))
    ... # doctest: +NORMALIZE_WHITESPACE
    trap 'rm -f /etc/sglang/sglang.seed-key /etc/sglang/sglang.seed-known-hosts' EXIT HUP INT TERM;
    /usr/bin/python3 /usr/local/lib/sglang-converge/venv_seed.py --from root@10.0.0.5:/e/abc --into /e/abc
    --port 22 --key /etc/sglang/sglang.seed-key --known-hosts /etc/sglang/sglang.seed-known-hosts
    --exclude .sgc-switched --exclude .sgc-pip.lock
    """
    key, known = seed_key_file(owner), seed_known_hosts_file(owner)
    argv = [python, f"{REMOTE_DIR}/venv_seed.py", "--from", source, "--into", path, "--port", str(port),
            "--key", key, "--known-hosts", known, *[part for name in NOT_COPIED for part in ("--exclude", name)]]
    return f"trap {quote(f'rm -f {quote(key)} {quote(known)}')} EXIT HUP INT TERM; {' '.join(map(quote, argv))}"


def _copy(state, host, command: str) -> bool:
    ok, output = host.run_shell_command(StringCommand("sh -c", quote(command)), print_output=False,
                                        print_input=False)
    lines = [line for line in output.output_lines if line.strip()]
    last = lines[-1] if lines else "?"
    if ok:  # its one line: copied, or why not (then the build follows)
        host.log(f"python env: {last}", logger.warning)
    else:  # only bad arguments or a crash get here: a copy that failed says so and exits 0
        record_failure(state, host, f"python env: the venv copy from a peer failed: {last}", lines[-8:])
    return ok


@operation()
def venv_seeded(path: str, python: str, seed: SeedSource, digest: str, owner: str):
    """
    Copy the venv at ``path`` from ``seed``'s peer when it is missing here; the build follows either way
    (and finds it in place).

    .. code:: python

        venv_seeded(path="/opt/sglang/venv-envs/95f9894a772e", python="/usr/bin/python3", seed=source,
                    digest="95f9894a772e", owner="sglang")
    """
    if host.get_fact(VenvState, path=path).exists:
        host.noop(f"venv {path} exists: nothing to copy from {seed.peer}")
        return
    peer_dir = seed.venv_for(digest)
    if peer_dir is None:
        host.noop(f"{seed.peer} does not hold the venv {digest}: it is built here")
        return
    plan(f"copy the venv {path} from the peer {seed.peer} ({peer_dir}) over ssh when it was made on the same "
         f"Python; else build it here")
    yield StringCommand("install -d -m 755", REMOTE_DIR, CONFIG_DIR)
    yield from scripts_uploaded(owner, SCRIPTS)
    yield from seed_files_uploaded(seed, owner)
    yield FunctionCommand(_copy, (copy_command(path, python, seed.source(peer_dir), seed.port, owner),), {})
