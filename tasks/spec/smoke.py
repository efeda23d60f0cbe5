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
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field, StrictStr, field_validator

from tasks.spec.fields import FROZEN

MAX_TOKENS = 1024  # a smoke check is a short answer: the gate's time stays bounded


class SmokeCheck(BaseModel):
    """One prompt and what its answer must match."""

    model_config = FROZEN

    prompt: StrictStr = Field(min_length=1, description="the prompt: a non-empty string")
    expect: StrictStr = Field(
        min_length=1, description="a Python regular expression the answer must match (re.search)"
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
    def _a_regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as e:
            raise ValueError(f"not a regular expression ({e}); allowed: a Python regex") from None
        return value
