"""Bench (d): the model download and its content verification, each against a plain tool doing
the same work side by side.

A model repo (sandbox.tinymodel, --size-mb MB in --shards safetensors shards) is served by the
Hub stand-in on loopback, unthrottled, so the tools' own costs are what is measured. Each
round runs, one after the other, on the same files:

  download: remote/fetch_model.py as the deploy runs it (the real huggingface_hub, the same
            --max-workers) into an empty dir, timed up to its "fetched ..." line (start-up,
            listing and transfer; not its verification), against curl fetching the same URLs
            into another empty dir, --max-workers at a time (xargs -P);
            download_over_curl = curl seconds / fetch_model seconds (>= 0.9: as fast as curl).
  verify:   remote/file_digests.hash_files (what fetch_model runs after the download) over the
            downloaded files, against `sha256sum` over the same files with the same
            parallelism (xargs -P, one file per call); both read from the page cache;
            verify_over_sha256sum = sha256sum seconds / hash_files seconds.

The medians of --repeats rounds go into bench/results/latest.json (bench/results.py). Nothing
here is asserted: tests assert behaviour, benchmarks measure.

The default size is ~3.5 GB (--size-mb 4000; the generator rounds to whole layers and experts): at 1 GB, fetch_model's
fixed start-up (~0.2 s: importing huggingface_hub and httpx, the listing) was a fifth of its time, so
the figure measured start-up more than throughput (0.68-0.97 from one run to the next); the real
model is 595 GB in ~9 GB shards, where that start-up is nothing.

    python -m bench.transfer [--size-mb 4000] [--shards 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from huggingface_hub import HfApi

from bench.results import record
from sandbox.hub import HubServer
from sandbox.tinymodel import generate

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "remote"))  # as on the host: the script's modules from its directory
import file_digests  # noqa: E402
from fetch_model import remote_files  # noqa: E402

REPO = "bench/transfer"
MAX_WORKERS = 8  # fetch_model.py's default --max-workers (huggingface_hub's snapshot_download threads)


def fetch_model_seconds(url: str, commit: str, dest: Path, home: Path) -> float:
    """Seconds from starting remote/fetch_model.py to its "fetched ..." line (the download done)."""
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1"}
    for var in ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE"):
        env.pop(var, None)
    argv = [sys.executable, str(ROOT / "remote" / "fetch_model.py"), "--repo", REPO, "--revision", commit,
            "--local-dir", str(dest), "--endpoint", url, "--max-workers", str(MAX_WORKERS)]
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    fetched_at, lines = None, []
    for line in proc.stdout:  # type: ignore[union-attr]
        lines.append(line)
        if fetched_at is None and line.startswith("fetched "):
            fetched_at = time.monotonic()
    if proc.wait() != 0 or fetched_at is None:
        raise RuntimeError(f"fetch_model.py failed (exit {proc.returncode}):\n{''.join(lines[-20:])}")
    return fetched_at - started


def curl_seconds(url: str, commit: str, files: list[str], dest: Path) -> float:
    """Seconds for curl to fetch the same files, MAX_WORKERS at a time."""
    listing = "".join(f"{url}/{REPO}/resolve/{commit}/{name}\n{dest / name}\n" for name in files)
    for name in files:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    subprocess.run(["xargs", "-P", str(MAX_WORKERS), "-n", "2", "sh", "-c", 'exec curl -sfL -o "$1" "$0"'],
                   input=listing, text=True, check=True)
    return time.monotonic() - started


def sha256sum_seconds(root: Path, files: list[str], workers: int) -> float:
    started = time.monotonic()
    subprocess.run(["xargs", "-0", "-P", str(workers), "-n", "1", "sha256sum"], cwd=root,
                   input="\0".join(files), text=True, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - started


def hash_files_seconds(root: Path, wanted: dict[str, str], workers: int) -> float:
    hashed = file_digests.hash_files(root, wanted, log=lambda _line: None, workers=workers)
    bad = hashed.mismatched(wanted)
    if bad:
        raise RuntimeError(f"digests differ from the Hub's: {sorted(bad)}")
    return hashed.seconds


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench.transfer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=4000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    workers = min(os.cpu_count() or 1, 8)  # hash_files' default parallelism
    with tempfile.TemporaryDirectory(prefix="sgc-bench-transfer-") as tmp:
        work = Path(tmp)
        model = generate(work / "repo", size_mb=args.size_mb, shards=args.shards, repo_name=REPO)
        files = sorted(f.path for f in model.files)
        print(f"bench (d): {len(files)} files, {model.total_bytes / 1e6:.0f} MB from the Hub stand-in on loopback; "
              f"{MAX_WORKERS} download workers, {workers} hashing threads", flush=True)
        rounds: dict[str, list[float]] = {"fetch": [], "curl": [], "hash": [], "sha256sum": []}
        with HubServer({REPO: model}, ["127.0.0.1"]) as hub:
            for _ in range(args.repeats):
                for name in ("fetched", "curled", "hf-home"):
                    shutil.rmtree(work / name, ignore_errors=True)
                    (work / name).mkdir()
                rounds["fetch"].append(fetch_model_seconds(hub.url(), model.commit, work / "fetched", work / "hf-home"))
                rounds["curl"].append(curl_seconds(hub.url(), model.commit, files, work / "curled"))
                # the digests fetch_model verifies against: the Hub's listing, read as the script reads it
                listing = remote_files(HfApi(endpoint=hub.url()), REPO, model.commit)
                wanted = {name: digest for name, digest in listing.digests.items() if digest}
                rounds["hash"].append(hash_files_seconds(work / "fetched", wanted, workers))
                rounds["sha256sum"].append(sha256sum_seconds(work / "fetched", files, workers))
        median = {name: statistics.median(values) for name, values in rounds.items()}
        size = model.total_bytes
    result = {
        "download_s": median["fetch"], "curl_download_s": median["curl"],
        "download_over_curl": median["curl"] / median["fetch"],
        "verify_s": median["hash"], "sha256sum_verify_s": median["sha256sum"],
        "verify_over_sha256sum": median["sha256sum"] / median["hash"],
        "transfer_bytes": size,
    }
    print(f"(d) download {size / 1e6:.0f} MB: fetch_model {median['fetch']:.2f} s vs curl x{MAX_WORKERS} "
          f"{median['curl']:.2f} s -> download_over_curl {result['download_over_curl']:.2f} (goal >= 0.9)")
    print(f"(d) verify {size / 1e6:.0f} MB: hash_files {median['hash']:.2f} s vs sha256sum x{workers} "
          f"{median['sha256sum']:.2f} s -> verify_over_sha256sum {result['verify_over_sha256sum']:.2f} "
          f"(goal >= 0.9; median of {args.repeats})", flush=True)
    record(result)
    return result


if __name__ == "__main__":
    main()
