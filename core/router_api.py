"""Talking to SGLang's router from a host: remote/router_client.py sent inline
(stdlib only), registering workers, and the root-only file with the key.

    yield FunctionCommand(register_workers, (python, router_url, [worker_url], False), {})
"""

from __future__ import annotations

import shlex

from pyinfra.operations import files

from core.ops import managed_file, stream
from core.paths import REMOTE_SRC_DIR
from facts.router import RouterWorker
from tasks.spec import RouterSpec, Spec

CLIENT_SCRIPT = REMOTE_SRC_DIR / "router_client.py"
REGISTER_TIMEOUT_S = 60


def client_command(python: str, *args: str) -> str:
    """remote/router_client.py run on the host with ``python`` (stdlib only), sent inline."""
    return " ".join(shlex.quote(arg) for arg in (python, "-u", "-c", CLIENT_SCRIPT.read_text(), *args))


def register_workers(state, host, python: str, router_url: str, worker_urls: list[str], skip_unready: bool,
              auth_file: str | None = None) -> bool:
    args = ["register", "--router", router_url, "--timeout", str(REGISTER_TIMEOUT_S)]
    for url in worker_urls:
        args += ["--worker", url]
    if skip_unready:
        args.append("--skip-unready")
    if auth_file:
        args += ["--auth-file", auth_file]
    return stream(state, host, client_command(python, *args), REGISTER_TIMEOUT_S * len(worker_urls) + 30,
                  step="router", changes=())  # the router's state only: no file of this host


def auth_file_written(spec: Spec | RouterSpec) -> None:
    """The root-only file with the spec's API key as a header line; none without a key."""
    if spec.api_key is not None:
        managed_file(dest=spec.auth_path, content=spec.auth_header(), mode="600",
                     secrets=[spec.api_key.get_secret_value()], name=f"API key file {spec.auth_path} (0600)")
    else:
        files.file(path=spec.auth_path, present=False, name=f"no API key file {spec.auth_path}")




def workers_of(worker_url: str, listed: list[RouterWorker] | None) -> list[RouterWorker]:
    """The router's entries for ``worker_url``."""
    return [w for w in listed or [] if w.url == worker_url]
