"""Runs ON the target host, with the server venv's python and the unit's environment: a bounded
all-reduce over the TP GPUs through torch.distributed, before SGLang starts on them. The ranks'
start (imports, process group) is bounded apart (--startup-timeout): a loaded host imports torch slowly.

One process per GPU (spawned), NCCL on the GPUs; on a sandbox host (--simulated) gloo on the CPU
over its simulated GPUs, and the output says so. After a warmup it times --iters all-reduces of
--size-mb and reports the bus bandwidth as nccl-tests defines it (algorithm bandwidth x
2 (n - 1) / n). The whole check is bounded by --timeout: a rank that never returns from its
all-reduce (the NCCL hang of IOMMU translation or ACS redirect) fails it, its processes killed.

    python allreduce_check.py --gpus 0,1,2,3 --timeout 120 --min-busbw-gbs 0 --key KEY --out FILE

Prints one line ``allreduce: {json}``; exit 0 and the JSON kept in --out (root-only) when it
passed, exit 1 with the reason otherwise (--out untouched). SGC_ALLREDUCE_STALL_RANK=N (with
--simulated only): rank N never enters its all-reduce, how the sandbox shows the bound;
SGC_ALLREDUCE_FAIL_RANK=N: rank N raises before it joins, and the failure names the rank and its error
(a rank the kernel killed: its signal).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import shutil
import signal
import sys
import tempfile
import time


def rank_main(rank: int, world: int, store: str, simulated: bool, size_mb: int, iters: int, timeout: float,
              group_timeout: float, results) -> None:
    try:
        _rank_main(rank, world, store, simulated, size_mb, iters, timeout, group_timeout, results)
    except BaseException as err:  # the parent names it: a rank's exit code alone says nothing
        results.put({"rank": rank, "error": f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"})
        raise


def _rank_main(rank: int, world: int, store: str, simulated: bool, size_mb: int, iters: int, timeout: float,
               group_timeout: float, results) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    if simulated and os.environ.get("SGC_ALLREDUCE_FAIL_RANK") == str(rank):
        raise RuntimeError("SIMULATED rank failure (SGC_ALLREDUCE_FAIL_RANK)")
    backend = "gloo" if simulated else "nccl"
    device = torch.device("cpu") if simulated else torch.device("cuda", rank)
    if not simulated:
        torch.cuda.set_device(rank)
    # The rendezvous goes through a file of the check's own, not a TCP port picked free beforehand (on a
    # loaded host rank 0 binds it late, and the other ranks' connection attempts can take it meanwhile).
    # The group's own timeout, the rendezvous's too, lies past both of the parent's bounds: the bounds
    # decide, not a backend's timer racing them.
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=group_timeout))
    tensor = torch.ones(size_mb * 2**20 // 4, dtype=torch.float32, device=device)
    results.put({"rank": rank, "ready": True})  # the bound starts once every rank is here (imports take long)
    if simulated and os.environ.get("SGC_ALLREDUCE_STALL_RANK") == str(rank):
        time.sleep(timeout * 10)
    dist.all_reduce(tensor)  # warmup (NCCL builds its rings here: where the hang happens)
    if not simulated:
        torch.cuda.synchronize()
    started = time.monotonic()
    for _ in range(iters):
        dist.all_reduce(tensor)
    if not simulated:
        torch.cuda.synchronize()
    seconds = (time.monotonic() - started) / max(1, iters)
    ok = abs(float(tensor[0]) - world ** (iters + 1)) < 1e-3 * world ** (iters + 1)
    results.put({"rank": rank, "seconds": seconds, "correct": ok})
    dist.destroy_process_group()


def drain_errors(results, errors: dict[int, str]) -> None:
    """The errors the ranks sent that are still queued."""
    while True:
        try:
            message = results.get(timeout=0.2)
        except (queue.Empty, OSError, ValueError):
            return
        if "error" in message:
            errors[message["rank"]] = message["error"]


def exit_reason(code: int | None) -> str:
    """A rank's exit code in words (one killed by a signal: -N)."""
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}" + (" (out of memory?)" if code == -9 else "")
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def check(gpus: list[str], simulated: bool, size_mb: int, iters: int, timeout: float,
          startup_timeout: float = 600.0) -> dict:
    world = len(gpus)
    if not simulated:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    store_dir = tempfile.mkdtemp(prefix="sgc-allreduce-")  # 0700, removed below
    store = os.path.join(store_dir, "rendezvous")
    group_timeout = startup_timeout + 3 * timeout + 60
    procs = [ctx.Process(target=rank_main, daemon=True,
                         args=(r, world, store, simulated, size_mb, iters, timeout, group_timeout, results))
             for r in range(world)]
    for proc in procs:
        proc.start()
    ready: set[int] = set()
    errors: dict[int, str] = {}
    done: list[dict] = []
    deadline = time.monotonic() + startup_timeout
    while len(done) < world and time.monotonic() < deadline:
        try:
            message = results.get(timeout=0.5)
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                drain_errors(results, errors)  # what the rank that exited said first
                break
            continue
        if "error" in message:
            errors[message["rank"]] = message["error"]
        elif message.get("ready"):
            ready.add(message["rank"])
            if len(ready) == world:
                deadline = time.monotonic() + timeout  # every rank up: the all-reduces' own bound
        else:
            done.append(message)
    # the exit codes before the kill below (a rank the kernel killed shows here), and every rank killed at
    # once: killed one after another, the ranks still waiting lose their peers and fail with gloo's
    # "Connection closed by peer", which would read as ranks that failed rather than a hang
    codes = [proc.exitcode for proc in procs]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    for proc in procs:
        proc.join(5)
    shutil.rmtree(store_dir, ignore_errors=True)
    base = {"gpus": gpus, "backend": "gloo (SIMULATED: the sandbox's CPU, no GPU)" if simulated else "nccl",
            "size_mb": size_mb, "timeout_s": timeout}
    if len(done) < world:
        failed = sorted({r for r, code in enumerate(codes) if code not in (None, 0)} | set(errors))
        missing = sorted(set(range(world)) - {d["rank"] for d in done})
        late = sorted(set(range(world)) - ready)
        causes = "; ".join(f"rank {r}: {errors.get(r) or exit_reason(codes[r])}" for r in failed)
        why = (f"rank(s) {failed} exited with an error ({causes})" if failed else
               f"rank(s) {late} did not start within {startup_timeout:g} s" if late else
               f"rank(s) {missing} did not finish an all-reduce within {timeout:g} s (a hang)")
        return {**base, "ok": False, "error": why}
    seconds = max(d["seconds"] for d in done)
    algbw = size_mb * 2**20 / seconds / 1e9 if seconds > 0 else 0.0
    busbw = algbw * 2 * (world - 1) / world
    if not all(d["correct"] for d in done):
        return {**base, "ok": False, "error": "the all-reduce returned wrong sums"}
    return {**base, "ok": True, "seconds": round(seconds, 6), "algbw_gbs": round(algbw, 3), "busbw_gbs": round(busbw, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", required=True, help="the TP GPUs, comma-separated (nvidia-smi indexes)")
    parser.add_argument("--simulated", action="store_true", help="gloo on the CPU (sandbox hosts)")
    parser.add_argument("--size-mb", type=int, default=64)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds for the all-reduces, once every rank is up")
    parser.add_argument("--startup-timeout", type=float, default=600.0, help="seconds for the ranks to start")
    parser.add_argument("--min-busbw-gbs", type=float, default=0.0)
    parser.add_argument("--key", default="", help="what the result was measured with (kept beside it)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()]
    result = check(gpus, args.simulated, args.size_mb, args.iters, args.timeout, args.startup_timeout)
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_") or k == "CUDA_DEVICE_ORDER"}
    result.update({"key": args.key, "env": env})
    if result["ok"] and result["busbw_gbs"] < args.min_busbw_gbs:
        result.update(ok=False, error=f"bus bandwidth {result['busbw_gbs']:g} GB/s is below the floor of "
                                      f"{args.min_busbw_gbs:g} GB/s")
    print("allreduce: " + json.dumps(result), flush=True)
    if not result["ok"]:
        tried = ", ".join(f"{k}={v}" for k, v in env.items()) or "no NCCL_* variable"
        print(f"all-reduce check failed over GPUs {','.join(gpus)}: {result['error']}; env: {tried}; try: the host "
              "fitness fixes the preflight names (iommu=pt, ACS off on the GPUs' bridges), NCCL_P2P_DISABLE=1 in "
              "extra_env to rule P2P out, NCCL_DEBUG=INFO in extra_env for NCCL's own account", file=sys.stderr)
        return 1
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        fd = os.open(args.out + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(result, handle)
        os.replace(args.out + ".tmp", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
