"""SpecError, and pydantic's errors as lines that name the field, the bad
value and what is allowed (secrets hidden)."""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, SecretStr, ValidationError
from pydantic_core import PydanticCustomError
from pyinfra.api.exceptions import PyinfraError

from tasks.spec.tables import SECRET_FLAGS

HIDDEN = "<hidden>"

# Fields whose value may be a secret pasted by mistake (they want its NAME).
_SECRET_NAME_FIELDS = frozenset({"api_key_env", "hf_token_env"})


class SpecError(PyinfraError):
    """Invalid settings. ``lines`` holds one problem per line, each naming
    the host, the field, the bad value and what is allowed."""

    def __init__(self, lines: Iterable[str], header: str | None = None):
        self.lines = list(lines)
        self.header = header
        text = "\n".join(self.lines)
        super().__init__(f"{header}\n{text}" if header else text)


def show(value: Any) -> str:
    """A value as it appears in messages: repr, secrets hidden."""
    if isinstance(value, SecretStr):
        return HIDDEN
    return repr(value)


def redact_args(args: Any) -> Any:
    """A copy of an argument list with the values of secret flags hidden."""
    if not isinstance(args, (list, tuple)):
        return args
    out: list[Any] = []
    hide_next = False
    for arg in args:
        if hide_next:
            out.append(HIDDEN)
            hide_next = False
            continue
        if isinstance(arg, str) and arg.split("=", 1)[0] in SECRET_FLAGS:
            if "=" in arg:
                out.append(arg.split("=", 1)[0] + "=" + HIDDEN)
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return out


def spec_lines(*lines: str) -> PydanticCustomError:
    """A validation error whose text is complete message lines (field = value: why)."""
    return PydanticCustomError("spec_lines", "{text}", {"text": "\n".join(lines)})


Loc = Sequence[int | str]


def _loc(loc: Loc) -> str:
    """('node_group', 'hosts', 1) -> 'node_group.hosts[1]'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif out:
            out += f".{part}"
        else:
            out = str(part)
    return out


def _model_at(model: type[BaseModel], loc: Loc) -> type[BaseModel]:
    """The (nested) model that a location points into."""
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            break
        candidates = [field.annotation, *typing.get_args(field.annotation)]
        nested = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not nested:
            break
        model = nested[0]
    return model


def _allowed(model: type[BaseModel], loc: Loc) -> str | None:
    """What the field at ``loc`` allows: its description (a nested model's own field says more)."""
    top = loc[0] if loc and isinstance(loc[0], str) else None
    field = model.model_fields.get(top) if top else None
    allowed = field.description if field is not None and field.description else None
    if len(loc) > 1 and isinstance(loc[-1], str):  # node_group.*
        inner = _model_at(model, loc[:-1])
        nested = inner.model_fields.get(loc[-1])
        if nested is not None and nested.description and inner is not model:
            allowed = nested.description
    return allowed


def format_errors(err: ValidationError, model: type[BaseModel]) -> list[str]:
    """pydantic's errors as 'field = value: why; allowed: ...' lines."""
    lines: list[str] = []
    for e in err.errors(include_url=False):
        loc = tuple(e["loc"])
        allowed = _allowed(model, loc)
        where = _loc(loc)
        hidden = bool(loc) and loc[0] in _SECRET_NAME_FIELDS
        shown = HIDDEN if hidden else show(redact_args(e.get("input")))
        if e["type"] == "spec_lines":
            lines.extend(str(e.get("ctx", {})["text"]).splitlines())
        elif e["type"] == "missing":
            lines.append(f"{where} is required: {allowed or 'set it'}")
        elif e["type"] == "extra_forbidden":
            known = list(_model_at(model, loc[:-1]).model_fields)
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            lines.append(f"{where} is not a known key{hint}: allowed: {', '.join(k for k in known if k != 'name')}")
        elif e["type"] == "value_error":
            lines.append(f"{where} = {shown}: {e['msg'].removeprefix('Value error, ')}")
        else:
            reason = e["msg"]
            if allowed and e["type"] != "literal_error":
                reason += f"; allowed: {allowed}"
            lines.append(f"{where} = {shown}: {reason}")
    # Union members can report the same problem twice.
    return list(dict.fromkeys(lines))
