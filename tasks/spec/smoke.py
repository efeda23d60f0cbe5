"""A profile's ``smoke:`` checks (core/smoke_gate.py runs them once a restarted server passed the
other gates): prompts at temperature 0, each with a regular expression its answer must match.

    .. code:: yaml

        smoke:
          - prompt: "What is 17 + 25? Answer with the number only."
            expect: '\\b42\\b'
          - prompt: "Reply with exactly the word OK."
            expect: '^\\s*OK\\b'
            api: chat                    # or completions (the prompt as raw text)
            max_tokens: 16
            chat_template_kwargs: {thinking: false}
          - prompt: "What is the weather in Paris right now? Use the tool."
            tool:                        # a tool-call round trip (needs --tool-call-parser)
              name: get_weather
              description: The current weather in a city
              parameters: {type: object, properties: {city: {type: string}}, required: [city]}
            expect: '(?i)paris'          # optional with a tool: what the call's arguments must match
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field, StrictStr, field_validator, model_validator

from tasks.spec.fields import FROZEN

MAX_TOKENS = 1024  # a smoke check is a short answer: the gate's time stays bounded


class ToolFunction(BaseModel):
    """The function a tool-call check offers (OpenAI's tools[].function)."""

    model_config = FROZEN

    name: StrictStr = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$", description="the function's name")
    description: StrictStr = Field("", description="what it does (the model reads it)")
    parameters: dict[str, Any] = Field(
        description="its JSON schema: {type: object, properties: {...}, required: [...]}"
    )

    @field_validator("parameters")
    @classmethod
    def _an_object_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        required, properties = value.get("required", []), value.get("properties", {})
        if value.get("type") != "object" or not isinstance(properties, dict) or not isinstance(required, list):
            raise ValueError("not an object schema; allowed: {type: object, properties: {...}, required: [...]}")
        missing = [name for name in required if name not in properties]
        if missing:
            raise ValueError(f"required {missing} not among the properties; allowed: names from properties")
        return value


class SmokeCheck(BaseModel):
    """One prompt and what its answer must match."""

    model_config = FROZEN

    prompt: StrictStr = Field(min_length=1, description="the prompt: a non-empty string")
    expect: StrictStr | None = Field(
        None, min_length=1, description="a Python regular expression the answer (with a tool: the call's arguments) "
        "must match (re.search); required without a tool"
    )
    tool: ToolFunction | None = Field(
        None, description="absent, or {name, description, parameters}: the answer must call it, its arguments JSON "
        "holding every required property (needs --tool-call-parser in the profile's extra_server_args)"
    )
    api: Literal["chat", "completions"] = Field(
        "chat", description="'chat' (/v1/chat/completions, the prompt as the user's message) or 'completions'"
    )
    max_tokens: int = Field(64, ge=1, le=MAX_TOKENS, description=f"an integer 1..{MAX_TOKENS}: the answer's length")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="absent, or a mapping passed to the chat template (e.g. {thinking: false})"
    )

    @field_validator("expect")
    @classmethod
    def _a_regex(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            re.compile(value)
        except re.error as e:
            raise ValueError(f"not a regular expression ({e}); allowed: a Python regex") from None
        return value

    @model_validator(mode="after")
    def _something_to_check(self) -> SmokeCheck:
        if self.expect is None and self.tool is None:
            raise ValueError("a check needs expect (a regex) or tool; allowed: either or both")
        if self.tool is not None and self.api != "chat":
            raise ValueError("a tool-call check goes through chat; allowed: api: chat")
        return self
