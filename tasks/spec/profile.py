"""models/<name>.yaml: what to serve, pinned (ModelProfile), and its loader."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, Field, StrictBool, StrictInt, StrictStr, ValidationError, model_validator

from core.paths import MODELS_DIR
from tasks.spec.errors import SpecError, format_errors, show, spec_lines
from tasks.spec.fields import FROZEN, RepoId, Revision, ServedName, ServerArgs
from tasks.spec.tables import COMPRESSED_TENSORS_FORMATS

_PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


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
