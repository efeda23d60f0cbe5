"""The checkpoint's tensors (name, dtype, shape) for the memory plan, from where they can be read
without downloading the weights: the host's files once verified (their headers, facts/model_dir.py
CheckpointTensors), else the Hub's safetensors headers (huggingface_hub's get_safetensors_metadata:
range requests for the headers only), else nothing (the plan falls back to bytes / TP and says so).

    groups, source = checkpoint_tensors(spec)     # (list[TensorGroup] | None, how they were read)
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from pyinfra import host

from core import disk
from core.tensor_plan import TensorGroup, summarize
from facts.model_dir import CheckpointTensors, ModelDirState

if TYPE_CHECKING:
    from tasks.spec import Spec


@cache
def hub_tensor_groups(repo: str, revision: str, endpoint: str | None, token: str | None) -> tuple[TensorGroup, ...]:
    """The tensors of a pinned revision from the Hub's safetensors headers (a pinned revision never changes)."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    quiet = are_progress_bars_disabled()
    disable_progress_bars()  # its "Parse safetensors files" bar would land in the deploy's output
    try:
        meta = HfApi(endpoint=endpoint, token=token).get_safetensors_metadata(repo, revision=revision)
    finally:
        if not quiet:
            enable_progress_bars()
    return tuple(summarize((name, info.dtype, info.shape) for file in meta.files_metadata.values()
                           for name, info in file.tensors.items()))


def checkpoint_tensors(spec: Spec) -> tuple[list[TensorGroup] | None, str]:
    """The model's tensors: the host's verified files, else the Hub's headers; (None, why) when neither."""
    state = host.get_fact(ModelDirState, path=spec.model_path)
    if disk.model_complete(state, spec.profile.repo, spec.profile.revision):
        rows = host.get_fact(CheckpointTensors, path=spec.model_path)
        if rows:
            return summarize(rows), "the host's safetensors headers"
    repo, revision, endpoint, token = spec.profile.repo, spec.profile.revision, spec.hf_endpoint, disk.hf_token(spec)
    try:  # the listing the disk check asked for (once per run): a Hub that cannot list is not asked again
        files = disk.hub_files(repo, revision, endpoint, token)
    except Exception as err:  # noqa: BLE001 - disk.HubError, offline: the disk check reports it
        return None, f"tensor headers unreadable (the Hub: {type(err).__name__})"
    if not any(name.endswith(".safetensors") for name in files):
        return None, "no *.safetensors in the revision"
    try:
        groups = hub_tensor_groups(repo, revision, endpoint, token)
    except Exception as err:  # noqa: BLE001 - a header the Hub cuts off, a timeout
        return None, f"tensor headers unreadable (the Hub: {type(err).__name__})"
    return (list(groups), "the Hub's safetensors headers") if groups else (None, "no safetensors headers on the Hub")
