"""The memory plan of a model profile on described GPUs, before any host exists: the same per-GPU
plan the preflight prints (core/memory_fit.py), without an inventory, SSH or a GPU.

    python plan.py kimi-k2.6 --gpus 8 --gpu-mib 97887
    python plan.py kimi-k2.6 --gpus 8 --gpu-mib 97887 --mem-fraction-static 0.9 --json
    python plan.py kimi-k2.6 --gpus 8 --gpu-mib 97887 --config-dir tests/fixtures/kimi-k2.5

PROFILE is a models/*.yaml name (or a path to one). The model's config.json and its tensors
(name, dtype, shape) come from --config-dir (config.json, and *.safetensors headers or a
tensors.json of [pattern, dtype, shape, count] rows), else from the Hub at the profile's pinned
revision (HF_ENDPOINT, HF_TOKEN from the environment: the safetensors headers only, by range
requests); where the tensors cannot be read, the weights per GPU are the profile's size_bytes over
TP, and the plan says so. Exit status: 0 a plan that fits, 1 one that does not, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.memory_fit import MIB, MemoryFit, fit_for, hub_config
from core.tensor_plan import TensorGroup, file_tensors, from_rows, summarize
from tasks.spec import SpecError
from tasks.spec.profile import ModelProfile, load_profile

ROOT = Path(__file__).resolve().parent


@dataclass(frozen=True)
class DescribedGpus:
    """A profile on GPUs described by the command line (core.memory_fit.PlanTarget)."""

    profile: ModelProfile
    tp_size: int
    extra_server_args: list[str] = field(default_factory=list)


def read_profile(name: str) -> ModelProfile:
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return load_profile(path.stem, path.parent)
    return load_profile(name, ROOT / "models")


def dir_tensors(config_dir: Path) -> list[TensorGroup] | None:
    """tensors.json rows, else the *.safetensors headers in the dir; None when neither is there."""
    rows = config_dir / "tensors.json"
    if rows.is_file():
        return from_rows(json.loads(rows.read_text()))
    found = file_tensors(sorted(config_dir.glob("*.safetensors")))
    return summarize(found) if found else None


def model_inputs(profile: ModelProfile, config_dir: Path | None) -> tuple[dict[str, Any] | None, tuple[list[TensorGroup] | None, str], list[str]]:
    """(config.json, (tensor groups, where from), notes) from --config-dir, else the Hub."""
    notes: list[str] = []
    endpoint, token = os.environ.get("HF_ENDPOINT"), os.environ.get("HF_TOKEN")
    if config_dir is not None:
        config_file = config_dir / "config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else None
        if config is None:
            notes.append(f"no config.json in {config_dir}: KV bytes per token unknown")
        groups = dir_tensors(config_dir)
        return config, (groups, f"{config_dir}" if groups else f"no tensors in {config_dir}"), notes
    try:
        config = hub_config(profile.repo, profile.revision, endpoint, token)
    except Exception as err:  # noqa: BLE001 - offline, a placeholder revision, a private repo
        config = None
        notes.append(f"config.json of {profile.repo}@{profile.revision[:12]} not read from the Hub "
                     f"({type(err).__name__}): KV bytes per token unknown (--config-dir gives it)")
    from core.checkpoint_tensors import hub_tensor_groups

    try:
        groups: list[TensorGroup] | None = list(hub_tensor_groups(profile.repo, profile.revision, endpoint, token))
        source = "the Hub's safetensors headers"
    except Exception as err:  # noqa: BLE001
        groups, source = None, f"tensor headers not read from the Hub ({type(err).__name__})"
    return config, (groups, source), notes


def as_json(fit: MemoryFit, gpus: int, notes: list[str]) -> dict[str, Any]:
    return {"gpus": gpus, "gpu_bytes": fit.gpu_bytes, "tp": fit.tp, "mem_fraction_static": fit.fraction,
            "mem_fraction_from": fit.fraction_from, "weights_bytes_per_gpu": int(fit.weights_per_gpu),
            "weights_counted": fit.weights_text, "checkpoint_bytes": fit.weights_bytes,
            "overhead_bytes_per_gpu": fit.overhead_bytes, "multimodal_reserve_bytes": fit.mm_reserve_bytes,
            "static_bytes_per_gpu": int(fit.static_bytes), "kv_room_bytes_per_gpu": int(fit.kv_room),
            "kv_bytes_per_token": fit.per_token, "kv_bytes_per_token_counted": fit.per_token_from,
            "kv_tokens": fit.kv_tokens, "context_length": fit.context, "problems": fit.problems(),
            "warnings": fit.warnings(), "notes": notes}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="plan.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", help="a models/*.yaml name (e.g. kimi-k2.6) or a path to one")
    parser.add_argument("--gpus", type=int, required=True, help="GPUs on the host (TP by default)")
    parser.add_argument("--gpu-mib", type=int, required=True, help="each GPU's memory as nvidia-smi reports it (MiB)")
    parser.add_argument("--mem-fraction-static", type=float, help="default: the profile's, else SGLang's")
    parser.add_argument("--tp", type=int, help="tensor parallel size (default: --gpus)")
    parser.add_argument("--config-dir", type=Path, help="config.json and *.safetensors (or tensors.json) here")
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    args = parser.parse_args(argv)
    tp = args.tp or args.gpus
    bad = [f"--{name} {value}: allowed: {allowed}" for name, value, ok, allowed in (
        ("gpus", args.gpus, args.gpus >= 1, "an integer >= 1"),
        ("gpu-mib", args.gpu_mib, args.gpu_mib >= 1024, "an integer >= 1024 (MiB)"),
        ("tp", tp, 1 <= tp <= args.gpus, f"1 to --gpus ({args.gpus})"),
        ("mem-fraction-static", args.mem_fraction_static,
         args.mem_fraction_static is None or 0 < args.mem_fraction_static < 1, "a number between 0 and 1"),
        ("config-dir", args.config_dir, args.config_dir is None or args.config_dir.is_dir(), "a directory"),
    ) if not ok]  # fmt: skip
    try:
        profile = read_profile(args.profile)
    except SpecError as err:
        bad += err.lines
    if bad:
        print("plan.py: " + "\n  ".join(bad), file=sys.stderr)
        return 2
    extra = ["--mem-fraction-static", str(args.mem_fraction_static)] if args.mem_fraction_static else []
    target = DescribedGpus(profile=profile, tp_size=tp, extra_server_args=extra)
    config, tensors, notes = model_inputs(profile, args.config_dir)
    if tensors[0] is None:
        notes.append(f"weights per GPU estimated as the profile's size_bytes over TP: {tensors[1]}")
    fit = fit_for(target, args.gpu_mib * MIB, (profile.size_bytes, "(the profile's size_bytes)"), config,
                  tensors=tensors)
    if args.json:
        print(json.dumps(as_json(fit, args.gpus, notes), indent=2))
    else:
        print(f"{profile.name} ({profile.repo}) on {args.gpus} x {args.gpu_mib} MiB, TP {tp}:")
        for line in [fit.summary(), *fit.problems(), *fit.warnings(), *notes]:
            print(f"  {line}")
    return 1 if fit.problems() else 0


if __name__ == "__main__":
    sys.exit(main())
