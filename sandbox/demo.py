"""`make demo`: the reference incident, converged on a local sandbox host.

A sandbox host is put in the state ct200 was in (uv venv without pip, no
ensurepip, sglang 0.5.23 beside compressed-tensors 0.8.1 pinned by a vllm-like
package, another service holding 55 GB on GPU 0, the model disk too small) for
a model quantized like Kimi K2.6 (INT4 W4A16 pack-quantized, a format 0.8.1
has: it is SGLang that requires 0.18.0); then the operator's commands, with
their real output:

    pyinfra inventory/sandbox.py deploy.py --dry --diff    # the plan
    pyinfra -y inventory/sandbox.py deploy.py              # run 1: refused at the disk check
    python -m sandbox grow-disk sgc1 /srv/models 256       # the operator grows the disk
    pyinfra -y inventory/sandbox.py deploy.py              # run 2: converges
    pyinfra -y inventory/sandbox.py deploy.py              # run 3: no change

GPUs, the model and the Hub are simulated (the output says so); ssh, systemd,
venvs, pip, compressed-tensors and SGLang's argument parser are real.

`make demo REAL=1` (--real) instead converges one host that runs the REAL SGLang
server (sglang 0.5.23 on the guest's CPU, group_data/sandbox_real.py) serving a
tiny random Llama, and prints its answer to a chat request; only its GPU is
simulated. The first converge installs the ~8 GB venv (a few minutes).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from rich.console import Console

from sandbox import hosts as sandbox_api
from sandbox import scenario

ROOT = Path(__file__).resolve().parent.parent
console = Console(highlight=False)


def step(title: str) -> None:
    console.rule(f"[bold]{title}")


def run(argv: list[str], ok_codes=(0,)) -> float:
    console.print(f"[bold cyan]$ {' '.join(argv)}")
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT)
    elapsed = time.monotonic() - started
    console.print(f"[dim](exit {proc.returncode}, {elapsed:.1f} s)")
    if proc.returncode not in ok_codes:
        raise SystemExit(f"demo: unexpected exit {proc.returncode} from {' '.join(argv)}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.demo", description=__doc__)
    parser.add_argument("--keep", action="store_true", help="leave the sandbox host running")
    parser.add_argument("--real", action="store_true", help="the real SGLang server on a sandbox host's CPU")
    args = parser.parse_args(argv)
    if args.real:
        return real_demo(args.keep)
    pyinfra = [sys.executable, "-m", "pyinfra"]
    timings = {}
    try:
        step("1. a sandbox GPU host in the state of the ct200 incident (GPUs SIMULATED)")
        host = sandbox_api.up(indexes=[1])[0]
        scenario.ct200_incident(host, log=lambda line: console.print(f"  {line}"))
        console.print(host.run("nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv").stdout)
        console.print(host.run(f"df -h {scenario.MODEL_DISK}").stdout)

        step("2. the plan: what the deploy would change (nothing is touched)")
        run([*pyinfra, "--limit", "sgc1", "inventory/sandbox.py", "deploy.py", "--dry", "--diff"])

        step("3. run 1: refused at the disk check, before downloading anything")
        timings["run 1"] = run([*pyinfra, "-y", "--limit", "sgc1", "inventory/sandbox.py", "deploy.py"], ok_codes=(1,))

        step("4. the operator grows the model disk")
        sandbox_api.grow_disk(host, scenario.MODEL_DISK, scenario.GROWN_DISK_MIB)
        console.print(host.run(f"df -h {scenario.MODEL_DISK}").stdout)

        step("5. run 2: converge (pip, model, compressed-tensors as SGLang requires, stale GPU process, unit, "
             "readiness)")
        timings["run 2"] = run([*pyinfra, "-y", "--limit", "sgc1", "inventory/sandbox.py", "deploy.py"])

        step("6. run 3: the same deploy again changes nothing and restarts nothing")
        timings["run 3"] = run([*pyinfra, "-y", "--limit", "sgc1", "inventory/sandbox.py", "deploy.py"])

        step("7. the server answers (SIMULATED SGLang stand-in, real HTTP)")
        request = urllib.request.Request(
            f"http://{host.address}:30000/v1/chat/completions",
            data=json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hello"}]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            console.print(json.loads(response.read())["choices"][0]["message"])
        console.print("timings: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in timings.items()))
    finally:
        if not args.keep:
            step("cleanup: the demo's sandbox host is removed (python -m sandbox down removes all)")
            sandbox_api.remove("sgc1")
        else:
            console.print("kept running: python -m sandbox status / python -m sandbox down")
    return 0


REAL_HOST_INDEX = 290


def real_demo(keep: bool) -> int:
    pyinfra = [sys.executable, "-m", "pyinfra", "-y", "inventory/sandbox_real.py", "deploy.py"]
    name = sandbox_api.host_name(REAL_HOST_INDEX)
    try:
        step(f"1. a fresh sandbox host for the REAL SGLang server ({name}; its GPUs SIMULATED, its CPU real)")
        host = sandbox_api.up(indexes=[REAL_HOST_INDEX])[0]
        step("2. converge: venv with sglang 0.5.23 (~8 GB), the tiny Llama, the unit, readiness")
        converge = run(pyinfra)
        step("3. the same deploy again changes nothing and restarts nothing")
        again = run(pyinfra)
        step("4. the real server answers a chat request (random weights: the words are arbitrary)")
        body = json.dumps({"model": "tiny-llama", "messages": [{"role": "user", "content": "Hello"}],
                           "max_tokens": 16, "temperature": 0})
        # the deploy's root-only auth header file, when SGLANG_API_KEY was exported
        auth = "A=; [ -f /etc/sglang/sglang.auth ] && A='-H @/etc/sglang/sglang.auth'; curl -sf $A"
        out = host.run(f"{auth} -H 'content-type: application/json' -d '{body}' "
                       "http://127.0.0.1:30000/v1/chat/completions", timeout=60).stdout
        answer = json.loads(out)
        console.print(answer["choices"][0]["message"])
        info = json.loads(host.run(f"{auth} http://127.0.0.1:30000/get_server_info", timeout=60).stdout)
        console.print(f"served by sglang {info['version']} (device {info['device']}, "
                      f"KV pool {info['max_total_num_tokens']} tokens)")
        console.print(f"timings: converge {converge:.1f} s, no-op {again:.1f} s")
    finally:
        if not keep:
            step("cleanup: the demo's sandbox host is removed")
            sandbox_api.remove(name)
        else:
            console.print("kept running: python -m sandbox status / python -m sandbox down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
