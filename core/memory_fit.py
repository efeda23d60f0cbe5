"""Does the model fit in the GPUs, and how much KV cache is left? Checked
before anything is downloaded (preflight and the rollout's fleet preflight).

SGLang measures each GPU's free memory once NCCL is up (its baseline: the GPU
less the CUDA context, NCCL's buffers, loaded kernels) and gives the KV pool
``baseline x mem_fraction_static`` less what the weights took and a multimodal
model's reserve (sglang 0.5.23 mem_cache/kv_cache_configurator.py:2990-3060:
``rest = free after the load - baseline x (1 - mem_fraction_static) - mm``).
The weights per GPU are counted tensor by tensor, placed on the ranks by
SGLang's rules (core/tensor_plan.py), from the checkpoint's safetensors
headers (core/checkpoint_tensors.py: the host's files, else the Hub's); where
no header can be read, the checkpoint's bytes over TP stand in, and the plan
says so. The pool's size per token comes from the
model's config.json (its ``text_config`` for multimodal configs such as
Kimi K2.5/K2.6): MLA caches ``kv_lora_rank + qk_rope_head_dim`` values per
layer, replicated on every TP rank; MHA/GQA caches K and V of the rank's
share of the KV heads. Refuses when the weights do not fit; warns when the
pool holds fewer tokens than the context length, and suggests one that fits.
A profile's draft model (speculative decoding) is counted whole on every GPU
(MemoryFit.draft_bytes: see weights_per_gpu).

    fit = memory_fit(spec, gpus)        # (MemoryFit | None, notes)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pyinfra import host

from core import disk
from core.checkpoint_tensors import checkpoint_tensors
from core.ops import gb
from core.tensor_plan import TensorGroup, place
from facts.gpu import Gpu
from facts.model_dir import ModelConfig, ModelDirState
from tasks.spec import Spec

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tasks.spec.profile import ModelProfile


class PlanTarget(Protocol):
    """What the fit reads of a Spec; plan.py's described GPUs (no host, no inventory) have it too."""

    @property
    def profile(self) -> ModelProfile: ...
    @property
    def tp_size(self) -> int: ...
    @property
    def extra_server_args(self) -> Sequence[str]: ...

MIB = 1024 * 1024
GIB = 1024 * MIB
# What a GPU holds before the weights (the CUDA context, NCCL's communicators, loaded kernels): SGLang
# leaves it out of its baseline. A sourced estimate, not SGLang's own figure (it has none): 2 GiB, from a
# published SGLang start at TP 8 on a 96 GB-class GPU, "Load weight begin. avail mem=93.61 GB" of its
# 95.59 GiB (a capacity analyzer's log-pattern notes: "framework_overhead = GPU_HBM - avail_before_weight");
# a PyTorch user measured 723 MiB for the CUDA context alone (discuss.pytorch.org/t/73021). ASSUMPTION: the
# same at any TP on 80-100 GB CUDA GPUs; measure yours (SGLang logs "Load weight begin. avail mem=").
GPU_OVERHEAD_BYTES = 2 * GIB
# SGLANG_VLM_CACHE_SIZE_MB (default 100, srt/environ.py:1598): kept out of a multimodal model's KV budget
# (kv_cache_configurator.py:202-219); CUDA-IPC feature transport adds 1 GiB (not the default)
MM_RESERVE_BYTES = 100 * MIB
# SGLang 0.5.23 (srt/arg_groups/memory_hook.py) without --mem-fraction-static:
# fraction = (GPU memory - reserved) / GPU memory, reserved >= 10 GiB on GPUs over 60 GiB,
# else >= 512 MiB + 2048 tokens x 1.5 MiB + tp/8 GiB (more with CUDA graphs): an upper bound here.
_BIG_GPU_MIB, _BIG_GPU_RESERVE_MIB = 60 * 1024, 10 * 1024
_DTYPE_BYTES = {"bfloat16": 2.0, "bf16": 2.0, "float16": 2.0, "half": 2.0, "float32": 4.0, "float": 4.0,
                "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp4_e2m1": 0.5}  # fmt: skip
# SGLang's get_context_length(): the first of these keys in the (text) config
_CONTEXT_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")


def server_arg(spec: PlanTarget, flag: str) -> str | None:
    """The value of ``flag`` in the profile's and the host's extra_server_args (the last one wins, as in argparse)."""
    args = list(spec.profile.extra_server_args) + list(spec.extra_server_args)
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config.json (multimodal configs nest it in text_config)."""
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) and "num_hidden_layers" in nested else config


def context_length(config: dict[str, Any]) -> int | None:
    """The context length SGLang derives from a config (rope scaling factor unless the original length is given)."""
    text = text_config(config)
    rope = text.get("rope_scaling") or {}
    factor = rope.get("factor", 1) if isinstance(rope, dict) else 1
    if not isinstance(rope, dict) or "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
        factor = 1
    for key in _CONTEXT_KEYS:
        if text.get(key) is not None:
            return int(factor * text[key])
    return None


def kv_bytes_per_token(config: dict[str, Any], tp: int, kv_cache_dtype: str | None) -> tuple[float, str] | None:
    """KV-cache bytes per token on one GPU, and how they were computed; None when the config lacks the fields."""
    text = text_config(config)
    dtype = kv_cache_dtype if kv_cache_dtype not in (None, "auto") else (
        text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or config.get("dtype"))
    size = _DTYPE_BYTES.get(str(dtype).removeprefix("torch."))
    layers = text.get("num_hidden_layers")
    if size is None or not isinstance(layers, int):
        return None
    if isinstance(text.get("kv_lora_rank"), int):
        rank, rope = text["kv_lora_rank"], int(text.get("qk_rope_head_dim") or 0)
        return layers * (rank + rope) * size, f"MLA: {layers} layers x ({rank} + {rope}) x {size:g} bytes ({dtype})"
    heads = text.get("num_key_value_heads") or text.get("num_attention_heads")
    head_dim = text.get("head_dim") or (text.get("hidden_size", 0) // max(1, text.get("num_attention_heads") or 1))
    if not isinstance(heads, int) or not head_dim:
        return None
    per_rank = max(1, heads // tp)
    return (layers * 2 * per_rank * head_dim * size,
            f"{layers} layers x 2 (K, V) x {per_rank} KV head(s) per rank x {head_dim} x {size:g} bytes ({dtype})")


@dataclass(frozen=True)
class MemoryFit:
    gpu_bytes: int  # the smallest GPU used
    fraction: float  # mem_fraction_static
    fraction_from: str
    weights_bytes: int  # the whole checkpoint
    weights_from: str
    tp: int
    per_token: float | None = None  # KV bytes per token on one GPU
    per_token_from: str = ""
    context: int | None = None  # the context length asked for
    context_from: str = ""
    draft_bytes: int = 0  # the profile's draft model (speculative decoding), counted on every GPU
    draft_from: str = ""
    weights_per_rank: int | None = None  # counted tensor by tensor (core/tensor_plan.py); None: bytes / TP
    weights_plan: str = ""  # how weights_per_rank was counted
    overhead_bytes: int = GPU_OVERHEAD_BYTES  # what the GPU holds before the weights (CUDA, NCCL)
    mm_reserve_bytes: int = 0  # SGLang's multimodal reserve, out of the KV budget

    @property
    def weights_per_gpu(self) -> float:
        # The draft model is counted whole on every TP rank, not divided by TP. This is an upper bound:
        # SGLang 0.5.23 keeps part of an EAGLE3 draft whole on every rank (fc and the norms,
        # models/llama_eagle3.py) and shards the rest over the target's TP group (QKVParallelLinear, the
        # MLP, VocabParallelEmbedding, ParallelLMHead; speculative/draft_parallel.py), and it also gives the
        # draft a KV cache of its own, which is not modelled here; the whole draft per GPU covers both.
        if self.weights_per_rank is not None:
            return self.weights_per_rank + self.draft_bytes
        return self.weights_bytes / self.tp + self.draft_bytes

    @property
    def weights_text(self) -> str:
        """How weights_per_gpu was counted, e.g. '595.00 GB of safetensors / TP 8 + draft 3.00 GB ...'."""
        if self.weights_per_rank is not None:
            text = f"counted per tensor at TP {self.tp}: {self.weights_plan}"
        else:
            text = f"{gb(self.weights_bytes)} {self.weights_from} / TP {self.tp}"
        if self.draft_bytes:
            text += f" + draft {gb(self.draft_bytes)} {self.draft_from} on every GPU"
        return text

    @property
    def static_bytes(self) -> float:
        return (self.gpu_bytes - self.overhead_bytes) * self.fraction

    @property
    def kv_room(self) -> float:
        return self.static_bytes - self.weights_per_gpu - self.mm_reserve_bytes

    @property
    def kv_tokens(self) -> int | None:
        if self.per_token is None or self.kv_room <= 0:
            return None
        return int(self.kv_room // self.per_token)

    def summary(self) -> str:
        mm = f" - multimodal reserve {gb(self.mm_reserve_bytes)}" if self.mm_reserve_bytes else ""
        line = (f"memory fit per GPU: weights ~{gb(self.weights_per_gpu)} ({self.weights_text}); "
                f"({gb(self.gpu_bytes)} - {gb(self.overhead_bytes)} CUDA context and NCCL, estimated) x "
                f"mem_fraction_static {self.fraction:g} ({self.fraction_from}) = {gb(self.static_bytes)} static"
                f"{mm}; KV cache room {gb(self.kv_room)}")
        if self.kv_tokens is not None:
            line += f" = ~{self.kv_tokens} tokens ({self.per_token:g} bytes/token, {self.per_token_from})"
        return line

    def problems(self) -> list[str]:
        if self.kv_room > 0:
            return []
        draft = f" + draft {gb(self.draft_bytes)}" if self.draft_bytes else ""
        counted = f"{gb(self.weights_bytes)} / {self.tp}" if self.weights_per_rank is None else "counted per tensor"
        return [f"the model does not fit: its weights need ~{gb(self.weights_per_gpu)} per GPU at TP {self.tp} "
                f"({counted}{draft}) but ({gb(self.gpu_bytes)} - {gb(self.overhead_bytes)}) x mem_fraction_static "
                f"{self.fraction:g} = {gb(self.static_bytes)} leaves no KV cache room ({gb(self.kv_room)}): "
                "allowed: more GPUs (gpu_ids, tp_size), a smaller checkpoint, or a higher --mem-fraction-static"]

    def warnings(self) -> list[str]:
        tokens = self.kv_tokens
        if tokens is None or self.context is None or tokens >= self.context:
            return []
        suggest = suggested_context(tokens)
        return [f"WARNING: the KV cache room ({gb(self.kv_room)} per GPU) holds ~{tokens} tokens, fewer than the "
                f"context length {self.context} ({self.context_from}): one full-length request would not fit; "
                f"suggest --context-length {suggest} in extra_server_args (or more GPUs / a higher "
                "--mem-fraction-static)"]


def mem_fraction(spec: PlanTarget, gpu_bytes: int) -> tuple[float, str]:
    explicit = server_arg(spec, "--mem-fraction-static")
    if explicit is not None:
        return float(explicit), "--mem-fraction-static"
    gpu_mib = gpu_bytes // MIB
    reserve = _BIG_GPU_RESERVE_MIB if gpu_mib > _BIG_GPU_MIB else 512 + 2048 * 1.5 + spec.tp_size * 128
    return round((gpu_mib - reserve) / gpu_mib, 3), "SGLang's default, at most this (>= 10 GiB reserved on big GPUs)"


def safetensors_bytes(spec: Spec, repo: str, revision: str, local_dir: str) -> int:
    """The *.safetensors bytes of a pinned revision: on the host (verified) or on the Hub; 0 when neither says."""
    state = host.get_fact(ModelDirState, path=local_dir)
    if disk.model_complete(state, repo, revision):
        files = state.marker.get("files", {}) if state.marker else {}
    else:
        try:
            files = disk.hub_files(repo, revision, spec.hf_endpoint, disk.hf_token(spec))
        except Exception:  # noqa: BLE001 - the disk check reports the Hub's error
            files = {}
    return sum(size for name, size in files.items() if name.endswith(".safetensors"))


def checkpoint_bytes(spec: Spec) -> tuple[int, str]:
    """The checkpoint's size: its *.safetensors on the host (verified) or on the Hub, else the profile's estimate."""
    shards = safetensors_bytes(spec, spec.profile.repo, spec.profile.revision, spec.model_path)
    if shards:
        return shards, "of safetensors"
    return spec.model_bytes, "(the profile's size_bytes)"


def draft_bytes(spec: Spec) -> tuple[int, str]:
    """The draft model's *.safetensors bytes ((0, '') without a draft; (0, why) when unknown)."""
    if spec.draft is None or spec.draft_path is None:
        return 0, ""
    shards = safetensors_bytes(spec, spec.draft.repo, spec.draft.revision, spec.draft_path)
    return shards, "of safetensors" if shards else "unknown (not on the host, the Hub did not say)"


@cache
def hub_config(repo: str, revision: str, endpoint: str | None, token: str | None) -> dict[str, Any]:
    """config.json of a pinned revision, from the Hub (a pinned revision never changes)."""
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(repo, "config.json", revision=revision, endpoint=endpoint, token=token)
    loaded: dict[str, Any] = json.loads(Path(path).read_text())
    return loaded


def model_config(spec: Spec) -> tuple[dict[str, Any] | None, str]:
    """The model's config.json: the host's copy once downloaded, else the Hub's; (None, why) when neither."""
    config = host.get_fact(ModelConfig, path=spec.model_path)
    if config is not None:
        return config, ""
    try:
        return hub_config(spec.profile.repo, spec.profile.revision, spec.hf_endpoint, disk.hf_token(spec)), ""
    except Exception as err:  # noqa: BLE001 - offline controller, a repo the Hub does not know, ...
        return None, f"config.json is not on the host yet and the Hub did not give it ({type(err).__name__})"


def fit_for(spec: PlanTarget, gpu_bytes: int, weights: tuple[int, str], config: dict[str, Any] | None,
            draft: tuple[int, str] = (0, ""), tensors: tuple[list[TensorGroup] | None, str] = (None, "")) -> MemoryFit:
    """The memory fit from its inputs (no facts): what the preflight prints. ``draft``: the draft model's
    bytes and where they came from (draft_bytes); ``tensors``: the checkpoint's tensor groups and where
    they were read (checkpoint_tensors), placed on the ranks by SGLang's rules."""
    fraction, fraction_from = mem_fraction(spec, gpu_bytes)
    tp = max(spec.tp_size, 1)
    plan = place(tensors[0], config or {}, tp) if tensors[0] else None
    per_token = kv_bytes_per_token(config, spec.tp_size, server_arg(spec, "--kv-cache-dtype")) if config else None
    explicit = server_arg(spec, "--context-length")
    context = int(explicit) if explicit else (context_length(config) if config else None)
    return MemoryFit(
        gpu_bytes=gpu_bytes, fraction=fraction, fraction_from=fraction_from, weights_bytes=weights[0],
        weights_from=weights[1], tp=max(spec.tp_size, 1),
        per_token=per_token[0] if per_token else None, per_token_from=per_token[1] if per_token else "",
        context=context,
        context_from="--context-length" if explicit else "the model's config.json, SGLang's default",
        draft_bytes=draft[0], draft_from=draft[1],
        weights_per_rank=plan.per_rank_bytes if plan else None,
        weights_plan=f"{plan.text()} (from {tensors[1]})" if plan else "",
        mm_reserve_bytes=MM_RESERVE_BYTES if config and isinstance(config.get("vision_config"), dict) else 0,
    )  # fmt: skip


def memory_fit(spec: Spec, gpus: list[Gpu]) -> tuple[MemoryFit | None, list[str]]:
    """The fit on the GPUs this spec uses, and notes on what could not be known."""
    used = [gpu for gpu in gpus if gpu.index in spec.gpu_ids]
    if not used:
        return None, []
    unknown = [gpu for gpu in used if gpu.memory_total_mib is None]
    if unknown:
        return None, [f"WARNING: GPU memory unknown: nvidia-smi reports memory.total [N/A] for GPU(s) "
                      f"{[gpu.index for gpu in unknown]} ({unknown[0].name}; unified memory?): the model's memory "
                      "fit is not checked"]
    smallest = min(gpu.memory_total_mib or 0 for gpu in used) * MIB
    config, why = model_config(spec)
    draft = draft_bytes(spec)
    tensors = checkpoint_tensors(spec)
    fit = fit_for(spec, smallest, checkpoint_bytes(spec), config, draft, tensors)
    notes = []
    if tensors[0] is None:
        notes.append(f"weights per GPU estimated as the checkpoint's bytes over TP: {tensors[1]}")
    if fit.per_token is None:
        notes.append(f"KV cache room in tokens unknown: {why or 'config.json lacks the attention fields'}")
    if spec.draft is not None and not draft[0]:
        notes.append(f"WARNING: the draft model's size is {draft[1]}: not counted in the memory fit")
    return fit, notes


def suggested_context(tokens: int) -> int:
    """The largest multiple of 1024 tokens that fits (what warnings() suggests)."""
    return max(1024, math.floor(tokens / 1024) * 1024)
