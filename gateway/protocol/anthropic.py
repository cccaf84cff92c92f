"""Anthropic's Messages API bodies (POST /v1/messages, /v1/messages/count_tokens), ordered like
Anthropic's reference and the anthropic SDK's types (anthropic/types/).

Requests parse as strictly as OpenAI's (gateway/protocol/base.py: JSON types must match, unknown
fields are ignored, so the fields Claude Code adds over time - `context_management`,
`output_config`, `service_tier` - never break it). Fields accepted and not acted on:
`cache_control` anywhere (our prompt cache is automatic, by prefix), `citations`, `metadata`
beyond `user_id`. Content block types we do not know are a 400 naming the block.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer

from gateway.protocol.base import KeepAlive, _check_keep_alive, _Request, _Response

MAX_STOP_SEQUENCES = 16  # as gateway/protocol/base.py MAX_STOP


class _Block(_Request):
    cache_control: dict[str, Any] | None = None  # accepted: our cache is by prefix


# --------------------------------------------------------------------------------- content blocks

class TextBlockParam(_Block):
    type: Literal["text"]
    text: str
    citations: list[dict[str, Any]] | None = None


class ImageBlockParam(_Block):
    type: Literal["image"]
    source: dict[str, Any]


class DocumentBlockParam(_Block):
    type: Literal["document"]
    source: dict[str, Any]


class ToolUseBlockParam(_Block):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str
    input: dict[str, Any]


class ToolResultBlockParam(_Block):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[Annotated[TextBlockParam | ImageBlockParam | DocumentBlockParam,
                                  Field(discriminator="type")]] = ""
    is_error: bool = False


class ThinkingBlockParam(_Block):
    type: Literal["thinking"]
    thinking: str
    signature: str = ""


class RedactedThinkingBlockParam(_Block):
    type: Literal["redacted_thinking"]
    data: str


ContentBlockParam = Annotated[
    TextBlockParam | ImageBlockParam | DocumentBlockParam | ToolUseBlockParam
    | ToolResultBlockParam | ThinkingBlockParam | RedactedThinkingBlockParam,
    Field(discriminator="type")]


class MessageParam(_Request):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlockParam]

    def blocks(self) -> list[ContentBlockParam]:
        if isinstance(self.content, str):
            return [TextBlockParam(type="text", text=self.content)]
        return list(self.content)


# --------------------------------------------------------------------------------- tools, thinking

class ToolParam(_Request):
    """A client tool (`type` absent or "custom"), or a server/Anthropic-defined one such as
    `web_search_20250305` or `bash_20250124`, which has no `input_schema` and is skipped."""
    model_config = ConfigDict(strict=True, extra="allow")
    type: str | None = None
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None

    @property
    def is_client_tool(self) -> bool:
        return self.type in (None, "custom") and self.input_schema is not None


class ToolChoice(_Request):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None                  # type "tool"
    disable_parallel_tool_use: bool = False


class ThinkingConfig(_Request):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=1)  # with "enabled"
    display: str | None = None


class Metadata(_Request):
    user_id: str | None = None


# --------------------------------------------------------------------------------- requests

class CountTokensRequest(_Request):
    """POST /v1/messages/count_tokens: what a message request holds, without max_tokens."""
    model: str | None = None  # required by Anthropic; None -> the configured default model
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[TextBlockParam] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    # --- modelyard extras ---
    keep_alive: KeepAlive = None  # Ollama's meaning; see gateway/protocol/base.py

    _check_keep = field_validator("keep_alive")(_check_keep_alive)

    def system_texts(self) -> list[str]:
        if self.system is None:
            return []
        if isinstance(self.system, str):
            return [self.system]
        return [block.text for block in self.system]


class MessageCreateRequest(CountTokensRequest):
    """POST /v1/messages."""
    max_tokens: int = Field(ge=1)
    metadata: Metadata | None = None
    stop_sequences: list[str] | None = Field(default=None, max_length=MAX_STOP_SEQUENCES)
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)


# --------------------------------------------------------------------------------- responses

class TextBlock(_Response):
    type: Literal["text"] = "text"
    text: str


class ThinkingBlock(_Response):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""  # ours are not signed: history thinking is read as plain text


class ToolUseBlock(_Response):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


ContentBlock = TextBlock | ThinkingBlock | ToolUseBlock
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class Usage(_Response):
    """Anthropic bills input three ways: input_tokens are the prompt tokens read afresh, so
    input_tokens + cache_read_input_tokens + cache_creation_input_tokens is the whole prompt."""
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0  # our cache fills as a side effect: nothing extra
    cache_read_input_tokens: int = 0


class Message(_Response):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: list[ContentBlock]
    model: str
    stop_reason: StopReason | None
    stop_sequence: str | None = None
    usage: Usage


class MessageTokensCount(_Response):
    input_tokens: int


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorResponse(BaseModel):
    type: Literal["error"] = "error"
    error: ErrorDetail
    request_id: str | None = None

    @model_serializer(mode="wrap")
    def _omit_request_id(self, handler: Any) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("request_id") is None:
            data.pop("request_id", None)
        return data
