"""`make demo`: the reference incident, converged on a local sandbox host.

A sandbox host is put in the state ct200 was in (uv venv without pip, no
ensurepip, sglang 0.5.23 beside compressed-tensors 0.8.1 pinned by a vllm-like
package, another service holding 55 GB on GPU 0, the model disk too small) for
a model quantized like Kimi K2.6 (INT4 W4A16 pack-quantized, a format 0.8.1
has: it is SGLang that requires 0.18.0); then the operator's commands, with
their real output:

    pyinfra inventory/sandbox.py deploy.py --dry --diff    # the plan: exits 1, run 1 would be refused
    pyinfra -y inventory/sandbox.py deploy.py              # run 1: refused at the disk check
    python -m sandbox grow-disk sgc1 /srv/models 256       # the operator grows the disk
    pyinfra -y inventory/sandbox.py deploy.py              # run 2: converges
    pyinfra -y inventory/sandbox.py deploy.py              # run 3: no change

GPUs, the model and the Hub are simulated (the output says so); ssh, systemd,
venvs, pip, compressed-tensors and SGLang's argument parser are real. Each
chapter's point is checked from the commands' own output and said as a
`demo: milestone: ...` line; a chapter that does not happen as told ends the
demo with exit 1 and what was seen instead (tests/integration/test_demo.py runs
`make demo` and reads these lines).

`make demo REAL=1` (--real) instead converges one host that runs the REAL SGLang
server (sglang 0.5.23 on the guest's CPU, group_data/sandbox_real.py) serving a
real pretrained chat model (SmolLM2-135M-Instruct), and prints its answer to a
chat question; only its GPU is simulated. The first converge installs the ~8 GB venv (a few minutes).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from rich.console import Console

from sandbox import hosts as sandbox_api
from sandbox import scenario

ROOT = Path(__file__).resolve().parent.parent
DEMO_HOST_INDEX = 1  # sgc1
console = Console(highlight=False)


def step(title: str) -> None:
    console.rule(f"[bold]{title}")


class Failed(SystemExit):
    """The story did not happen as told: the demo exits 1 naming the chapter and what was missing."""


def run(argv: list[str], expect_exit: int = 0) -> tuple[float, str]:
    """Run a command as the operator would, its output shown as it comes and kept; (seconds, output).
    An exit status other than ``expect_exit`` ends the demo (Failed)."""
    console.print(f"[bold cyan]$ {' '.join(argv)}")
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        lines.append(line)
    rc = proc.wait()
    elapsed = time.monotonic() - started
    console.print(f"[dim](exit {rc}, {elapsed:.1f} s)")
    if rc != expect_exit:
        raise Failed(f"demo: unexpected exit {rc} (expected {expect_exit}) from {' '.join(argv)}")
    return elapsed, "".join(lines)


def changes(output: str) -> tuple[int, int]:
    """(operations that changed something, errors) from pyinfra's results table ("Grand total")."""
    match = re.search(r"Grand total\s+\d+\s+(\S+)\s+(\S+)\s+\S+", output)
    if not match:
        raise Failed("demo: pyinfra printed no results table (Grand total)")
    success, error = (0 if value == "-" else int(value) for value in match.groups())
    return success, error


def milestone(what: str, holds: bool, evidence: str) -> None:
    """Say a chapter's point held (`demo: milestone: ...`), or end the demo with what was seen instead."""
    if not holds:
        raise Failed(f"demo: milestone missed: {what}\n{evidence[-3000:]}")
    console.print(f"[bold green]demo: milestone: {what}", soft_wrap=True)  # one line whatever the width


DISK_REFUSAL = "preflight: not enough disk for "


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.demo", description=__doc__)
    parser.add_argument("--keep", action="store_true", help="leave the sandbox host running")
    parser.add_argument("--real", action="store_true", help="the real SGLang server on a sandbox host's CPU")
    args = parser.parse_args(argv)
    if args.real:
        return real_demo(args.keep)
    name = sandbox_api.host_name(DEMO_HOST_INDEX)
    deploy = [sys.executable, "-m", "pyinfra", "--limit", name, "inventory/sandbox.py", "deploy.py"]
    timings = {}
    try:
        step(f"1. a sandbox GPU host ({name}) in the state of the ct200 incident (GPUs SIMULATED)")
        host = sandbox_api.up(indexes=[DEMO_HOST_INDEX])[0]
        scenario.ct200_incident(host, log=lambda line: console.print(f"  {line}"))
        console.print(host.run("nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv").stdout)
        console.print(host.run(f"df -h {scenario.MODEL_DISK}").stdout)

        step("2. the plan: what the deploy would change, and that the real run would be refused (nothing is touched)")
        _, out = run([*deploy, "--dry", "--diff"], expect_exit=1)
        milestone("the plan already knows run 1 will be refused for the disk (the dry run exits 1 saying so)",
                  f"dry run: the real run would fail on {name}: {DISK_REFUSAL}" in out, out)

        step("3. run 1 all the same: refused at the disk check, before downloading anything")
        timings["run 1"], out = run([*deploy[:3], "-y", *deploy[3:]], expect_exit=1)
        left = host.run(f"ls -A {scenario.MODEL_DISK}").stdout.strip()
        milestone(f"run 1 refused at the disk check before any download ({scenario.MODEL_DISK} is still empty)",
                  DISK_REFUSAL in out and left == "", out + f"\n{scenario.MODEL_DISK}: {left!r}")

        step("4. the operator grows the model disk")
        sandbox_api.grow_disk(host, scenario.MODEL_DISK, scenario.GROWN_DISK_MIB)
        console.print(host.run(f"df -h {scenario.MODEL_DISK}").stdout)

        step("5. run 2: converge (pip, model, compressed-tensors as SGLang requires, stale GPU process, unit, "
             "readiness)")
        timings["run 2"], out = run([*deploy[:3], "-y", *deploy[3:]])
        upgraded = re.search(r"quant deps: compressed-tensors is now (\S+): it satisfies (\S+)", out)
        milestone("run 2 converged: compressed-tensors upgraded as SGLang requires"
                  + (f" ({upgraded.group(1)}, {upgraded.group(2)})" if upgraded else ""), bool(upgraded), out)
        milestone("run 2: the server is ready", "ready: sglang.service serves tiny at " in out, out)

        step("6. run 3: the same deploy again changes nothing and restarts nothing")
        timings["run 3"], out = run([*deploy[:3], "-y", *deploy[3:]])
        milestone("run 3 changed nothing (no operation changed the host)", changes(out) == (0, 0), out)

        step("7. the server answers (SIMULATED SGLang stand-in, real HTTP)")
        request = urllib.request.Request(
            f"http://{host.address}:30000/v1/chat/completions",
            data=json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hello"}]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            console.print(json.loads(response.read())["choices"][0]["message"])
        console.print("timings: " + ", ".join(f"{label} {seconds:.1f} s" for label, seconds in timings.items()))
    finally:
        if not args.keep:
            step("cleanup: the demo's sandbox host is removed (python -m sandbox down removes all)")
            sandbox_api.remove(name)
            console.print(f"demo: {name} removed")
        else:
            console.print("kept running: python -m sandbox status / python -m sandbox down")
    return 0


REAL_HOST_INDEX = 290
REAL_MODEL = "smollm2"  # the served name of models/sandbox-real-smollm2.yaml (group_data/sandbox_real.py)


def real_demo(keep: bool) -> int:
    pyinfra = [sys.executable, "-m", "pyinfra", "-y", "inventory/sandbox_real.py", "deploy.py"]
    name = sandbox_api.host_name(REAL_HOST_INDEX)
    try:
        step(f"1. a fresh sandbox host for the REAL SGLang server ({name}; its GPUs SIMULATED, its CPU real)")
        host = sandbox_api.up(indexes=[REAL_HOST_INDEX])[0]
        step("2. converge: venv with sglang 0.5.23 (~8 GB), SmolLM2-135M-Instruct, the unit, readiness and its gates")
        converge, _ = run(pyinfra)
        step("3. the same deploy again changes nothing and restarts nothing")
        again, out = run(pyinfra)
        milestone("the second converge changed nothing", changes(out) == (0, 0), out)
        step("4. the real server answers a chat request (a real pretrained model: its own answer)")
        question = "What is the capital of France?"
        body = json.dumps({"model": REAL_MODEL, "messages": [{"role": "user", "content": question}],
                           "max_tokens": 32, "temperature": 0})
        # the deploy's root-only auth header file, when SGLANG_API_KEY was exported
        auth = "A=; [ -f /etc/sglang/sglang.auth ] && A='-H @/etc/sglang/sglang.auth'; curl -sf $A"
        out = host.run(f"{auth} -H 'content-type: application/json' -d '{body}' "
                       "http://127.0.0.1:30000/v1/chat/completions", timeout=60).stdout
        answer = json.loads(out)["choices"][0]["message"]["content"]
        console.print(f"Q: {question}\nA ({REAL_MODEL}): {answer}")
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
