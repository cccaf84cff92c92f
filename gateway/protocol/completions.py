"""POST /v1/completions (legacy text completions): a prompt in; choices of text out."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gateway.protocol.base import (
    COMPLETION_DEFAULT_MAX_TOKENS,
    FinishReason,
    PromptProgress,
    Usage,
    _GenerationRequest,
    _MayCarryProgress,
    _prompt_batch,
    _Response,
)


class CompletionRequest(_GenerationRequest):
    prompt: str | list[str] | list[int] | list[list[int]]

    @model_validator(mode="before")
    @classmethod
    def _null_prompt(cls, data: Any) -> Any:
        # required, but nullable: null is the spec's default, the end-of-text document separator
        if isinstance(data, dict) and "prompt" in data and data["prompt"] is None:
            return {**data, "prompt": "<|endoftext|>"}
        return data
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=5)
    max_tokens: int | None = Field(default=COMPLETION_DEFAULT_MAX_TOKENS, ge=1)

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, value: str | list[Any]) -> str | list[Any]:
        if isinstance(value, list) and (not value or any(isinstance(p, list) and not p for p in value)):
            raise ValueError("prompt must not be an empty list")
        return value

    def token_budget(self) -> int | None:
        return self.max_tokens

    def wants_logprobs(self) -> bool:
        return self.logprobs is not None

    def n_top_logprobs(self) -> int:
        return self.logprobs or 0

    def prompts(self) -> list[str | list[int]]:
        """The batch of prompts: each a string or a list of token ids."""
        return _prompt_batch(self.prompt)


class CompletionLogprobs(_Response):
    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class CompletionChoice(_Response):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None


class Completion(_MayCarryProgress):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    # --- modelyard extras (stream chunks only) ---
    prompt_progress: PromptProgress | None = None
    timings: dict[str, Any] | None = None  # llama-server's, with timings_per_token
