"""Runs ON the target host, inside a transient systemd unit, with the venv's python:
download one pinned model revision into a local dir with huggingface_hub, then
verify it and write the marker that makes the next deploy a no-op.

    fetch_model.py --repo moonshotai/Kimi-K2.6 --revision <40 hex> --local-dir /srv/models/kimi-k2.6 \
        --margin-bytes 50000000000 [--endpoint URL] [--token-file /etc/sglang/hf-token]

The token is read from a root-only file (never argv). Exit codes: 0 done,
3 not enough disk (nothing downloaded), 4 verification failed, 1 other errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

MARKER = ".sglang-converge.json"
GB = 1000**3


def log(message: str) -> None:
    print(message, flush=True)


def local_size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def remote_files(api, repo: str, revision: str) -> dict[str, int]:
    info = api.model_info(repo, revision=revision, files_metadata=True)
    return {sibling.rfilename: int(sibling.size or 0) for sibling in info.siblings}


def verify(local_dir: Path, expected: dict[str, int]) -> list[str]:
    """Problems with the files on disk: empty when the snapshot is complete."""
    problems = []
    partial = list(local_dir.glob(".cache/huggingface/download/**/*.incomplete"))
    partial += [p for p in local_dir.rglob("*.incomplete") if ".cache" not in p.parts]
    problems += [f"partial file left: {p.relative_to(local_dir)}" for p in partial]
    for name, size in sorted(expected.items()):
        have = local_size(local_dir / name)
        if have is None:
            problems.append(f"missing: {name}")
        elif have != size:
            problems.append(f"size mismatch: {name} has {have} bytes, the Hub says {size}")
    index = local_dir / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        for shard in shards:
            if local_size(local_dir / shard) is None:
                problems.append(f"shard named in the safetensors index is missing: {shard}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    parser.add_argument("--revision", required=True)
    parser.add_argument("--local-dir", required=True)
    parser.add_argument("--margin-bytes", type=int, default=0)
    parser.add_argument("--endpoint")
    parser.add_argument("--token-file")
    parser.add_argument("--max-workers", type=int, default=8)
    args = parser.parse_args(argv)

    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # the deploy prints its own progress
    if args.endpoint:
        os.environ["HF_ENDPOINT"] = args.endpoint
    from huggingface_hub import HfApi, snapshot_download

    token = None
    if args.token_file and os.path.exists(args.token_file):
        token = Path(args.token_file).read_text().strip() or None
    local_dir = Path(args.local_dir)
    api = HfApi(endpoint=args.endpoint, token=token)
    expected = remote_files(api, args.repo, args.revision)

    # The disk check, on the host, before a byte is written.
    need = sum(size for name, size in expected.items() if local_size(local_dir / name) != size)
    probe = local_dir
    while not probe.exists():
        probe = probe.parent
    stat = os.statvfs(probe)
    free = stat.f_bavail * stat.f_frsize
    log(f"need {need} bytes ({need / GB:.2f} GB) of {sum(expected.values())}; "
        f"free {free} bytes ({free / GB:.2f} GB) at {probe}; margin {args.margin_bytes / GB:.2f} GB")
    if need > free - args.margin_bytes:
        log(f"REFUSED: {args.repo}@{args.revision[:12]} needs {need / GB:.2f} GB more, "
            f"{probe} has {free / GB:.2f} GB free and {args.margin_bytes / GB:.2f} GB must stay free")
        return 3

    local_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    snapshot_download(
        args.repo,
        revision=args.revision,
        local_dir=str(local_dir),
        endpoint=args.endpoint,
        token=token,
        max_workers=args.max_workers,
    )
    problems = verify(local_dir, expected)
    if problems:
        for problem in problems:
            log(f"VERIFY FAILED: {problem}")
        return 4
    marker = {
        "repo": args.repo,
        "revision": args.revision,
        "files": expected,
        "completed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    tmp = local_dir / (MARKER + ".tmp")
    tmp.write_text(json.dumps(marker, indent=1, sort_keys=True))
    tmp.replace(local_dir / MARKER)
    log(f"verified {len(expected)} files, {sum(expected.values())} bytes, "
        f"downloaded {need} bytes in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
