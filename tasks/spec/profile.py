"""models/<name>.yaml: what to serve, pinned (ModelProfile), and its loader."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import (BaseModel, Field, PositiveFloat, StrictBool, StrictInt, StrictStr, ValidationError,
                      model_validator)

from core.paths import MODELS_DIR
from tasks.spec.errors import SpecError, format_errors, show, spec_lines
from tasks.spec.fields import (FROZEN, Number, PositiveInt, RepoId, Revision, ServedName, ServerArgs,
                               SpeculativeAlgorithm)
from tasks.spec.smoke import SmokeCheck
from tasks.spec.tables import COMPRESSED_TENSORS_FORMATS

_PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# The draft gate's minimum accept length when a profile with a draft sets none (LaunchExpectations)
DEFAULT_MIN_ACCEPT_LENGTH = 1.5


class Quantization(BaseModel):
    """A model's quantization, as its config.json quantization_config says."""

    model_config = FROZEN

    quant_method: StrictStr = Field(description="e.g. 'compressed-tensors', 'fp8', 'awq'")
    format: StrictStr | None = Field(
        None,
        description="compressed-tensors CompressionFormat value (dashes), e.g. 'pack-quantized'",
    )

    @model_validator(mode="after")
    def _format_known(self) -> Quantization:
        if self.quant_method == "compressed-tensors":
            if self.format not in COMPRESSED_TENSORS_FORMATS:
                raise spec_lines(
                    f"quantization.format = {self.format!r} is not a compressed-tensors "
                    f"CompressionFormat value: allowed: {', '.join(COMPRESSED_TENSORS_FORMATS)}"
                )
        return self

    @property
    def compressed_tensors_member(self) -> str | None:
        """CompressionFormat member name (underscores), e.g. 'nvfp4_pack_quantized'."""
        if self.quant_method != "compressed-tensors" or self.format is None:
            return None
        return self.format.replace("-", "_")

    @property
    def compressed_tensors_min_version(self) -> str | None:
        """First compressed-tensors release that has the needed format."""
        if self.quant_method != "compressed-tensors" or self.format is None:
            return None
        return COMPRESSED_TENSORS_FORMATS[self.format]


class DraftModel(BaseModel):
    """A model profile's draft model: speculative decoding with a separate, pinned
    checkpoint (SGLang's ``--speculative-*`` flags), downloaded and verified like
    the model into its own directory (the spec's ``draft_dir``).

    .. code:: yaml

        draft:
          repo: AQ-MedAI/Kimi-K26-eagle3
          revision: <40 hex>
          algorithm: EAGLE3
          num_steps: 3
          eagle_topk: 1
          num_draft_tokens: 4
    """

    model_config = FROZEN

    repo: RepoId = Field(description="Hugging Face repo id 'org/name' of the draft model")
    revision: Revision = Field(description="the draft's commit: 40 lowercase hex characters")
    algorithm: SpeculativeAlgorithm = Field(description="'EAGLE3' (SGLang's --speculative-algorithm)")
    num_steps: PositiveInt = Field(description="draft steps per verification, an integer >= 1 "
                                   "(--speculative-num-steps)")
    eagle_topk: PositiveInt = Field(description="branches kept per draft step, an integer >= 1 "
                                    "(--speculative-eagle-topk)")
    num_draft_tokens: PositiveInt = Field(description="tokens verified per step, an integer >= 1 "
                                          "(--speculative-num-draft-tokens)")

    @model_validator(mode="after")
    def _chain(self) -> DraftModel:
        # SGLang 0.5.23 (arg_groups/speculative_hook.py): with topk 1 the draft is a chain, and it silently
        # replaces num_draft_tokens by num_steps + 1; refused here so the profile says what runs.
        if self.eagle_topk == 1 and self.num_draft_tokens != self.num_steps + 1:
            raise spec_lines(
                f"draft.num_draft_tokens = {self.num_draft_tokens}: with eagle_topk 1 SGLang uses num_steps + 1 = "
                f"{self.num_steps + 1} instead: allowed: {self.num_steps + 1}, or eagle_topk > 1"
            )
        return self


class LaunchExpectations(BaseModel):
    """What SGLang must have chosen once the server serves (core/fingerprint.py reads its
    /server_info); each is checked only when set.

    .. code:: yaml

        expect:
          min_kv_tokens: 400000        # max_total_num_tokens at least
          min_context_length: 262144
          attention_backend: triton
          min_decode_tok_s: 60         # the speed gate's floor (always a failure, not on_mismatch)
          min_accept_length: 2.0       # with a draft: its accept length at least (default 1.5; a failure too)
          on_mismatch: fail            # or warn
    """

    model_config = FROZEN

    min_kv_tokens: PositiveInt | None = Field(None, description="an integer >= 1: max_total_num_tokens at least")
    min_context_length: PositiveInt | None = Field(None, description="an integer >= 1: context_length at least")
    attention_backend: StrictStr | None = Field(None, description="the attention backend SGLang must report")
    min_decode_tok_s: PositiveFloat | None = Field(
        None, description="a number > 0: decode tok/s at concurrency 1 at least (the speed gate)"
    )
    min_accept_length: Number | None = Field(
        None, gt=1.0,
        description="a number > 1.0, only with a draft: the draft's accept length (tokens per verify step, the "
        f"bonus token included) at least (the draft gate); unset with a draft: {DEFAULT_MIN_ACCEPT_LENGTH} (1.0 "
        "means every draft token was rejected; a working EAGLE3 draft of 3 steps accepts some 2.5-3.5, so 1.5 "
        "fails a draft that accepts next to nothing, not one that is merely weak on a prompt)",
    )
    on_mismatch: Literal["fail", "warn"] = Field("fail", description="'fail' or 'warn'")


class ModelProfile(BaseModel):
    """models/<name>.yaml: what to serve, pinned."""

    model_config = FROZEN

    name: StrictStr = Field(description="the profile's file stem (filled in by the loader)")
    description: StrictStr | None = Field(None, description="free text")
    repo: RepoId = Field(description="Hugging Face repo id 'org/name'")
    revision: Revision = Field(description="the commit: 40 lowercase hex characters")
    served_model_name: ServedName = Field(description="the name clients ask for in /v1/models")
    quantization: Quantization | None = Field(None, description="{quant_method, format} or absent")
    attention: Literal["mla", "mha"] = Field(description="'mla' or 'mha'")
    size_bytes: StrictInt = Field(gt=0, description="approximate total bytes of the weights (> 0)")
    extra_server_args: ServerArgs = Field(default_factory=list, description="extra SGLang flags, a list of strings")
    trust_remote_code: StrictBool = Field(False, description="true or false")
    draft: DraftModel | None = Field(
        None,
        description="absent, or the draft model for speculative decoding: {repo, revision, algorithm: EAGLE3, "
        "num_steps, eagle_topk, num_draft_tokens}",
    )
    expect: LaunchExpectations = Field(
        default_factory=LaunchExpectations,
        description="absent, or what SGLang must choose: {min_kv_tokens, min_context_length, attention_backend, "
        "on_mismatch: fail|warn}",
    )

    smoke: list[SmokeCheck] = Field(
        default_factory=list,
        description="absent, or a list of checks {prompt, expect (a regex), api: chat|completions, max_tokens, "
        "chat_template_kwargs} that a restarted server must answer right (core/smoke_gate.py)",
    )

    @model_validator(mode="after")
    def _tool_checks_need_a_parser(self) -> ModelProfile:
        for i, check in enumerate(self.smoke):
            if check.tool is not None and "--tool-call-parser" not in self.extra_server_args:
                raise spec_lines(
                    f"smoke[{i}].tool = {check.tool.name!r}: the server parses no tool calls (no --tool-call-parser "
                    "in extra_server_args): allowed: a tool check with --tool-call-parser, or none"
                )
        return self

    @model_validator(mode="after")
    def _accept_length_needs_a_draft(self) -> ModelProfile:
        # the draft gate reads a draft's accept length: without a draft the setting would check nothing
        if self.draft is None and self.expect.min_accept_length is not None:
            raise spec_lines(
                f"expect.min_accept_length = {self.expect.min_accept_length!r}: the profile has no draft "
                "(speculative decoding) whose accept length it could hold: allowed: only in a profile with a "
                "draft: block; leave it out here"
            )
        return self

    @property
    def min_accept_length(self) -> float | None:
        """The draft gate's minimum accept length: the profile's, or the default with a draft; None: no draft."""
        if self.draft is None:
            return None
        return self.expect.min_accept_length or DEFAULT_MIN_ACCEPT_LENGTH


def available_profiles(models_dir: Path = MODELS_DIR) -> list[str]:
    """The profile names in ``models_dir`` (the file stems of its *.yaml)."""
    return sorted(p.stem for p in Path(models_dir).glob("*.yaml"))


def load_profile(name: str, models_dir: Path = MODELS_DIR) -> ModelProfile:
    """Read and validate models/<name>.yaml; SpecError lines (without host)."""
    models_dir = Path(models_dir)
    available = available_profiles(models_dir)
    if not isinstance(name, str) or not _PROFILE_NAME.match(name) or name not in available:
        raise SpecError(
            [
                f"model = {show(name)} is not a model profile in {models_dir}: "
                f"allowed: {', '.join(available) or '(none found)'}"
            ]
        )
    path = models_dir / f"{name}.yaml"
    where = f"model {name!r} ({path.name})"
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SpecError([f"{where}: not valid YAML: {e}"]) from None
    if not isinstance(raw, dict):
        raise SpecError([f"{where}: must be a YAML mapping of profile keys, got {type(raw).__name__}"])
    if "name" in raw and raw["name"] != name:
        raise SpecError([f"{where}: name = {raw['name']!r} must match the file name {name!r} or be left out"])
    try:
        return ModelProfile.model_validate({**raw, "name": name})
    except ValidationError as e:
        raise SpecError([f"{where}: {line}" for line in format_errors(e, ModelProfile)]) from None
