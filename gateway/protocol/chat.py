"""POST /v1/chat/completions: messages in; a completion or its stream chunks out."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_serializer

from gateway.protocol.base import (
    MAX_TOP_LOGPROBS,
    FinishReason,
    PromptProgress,
    Usage,
    _GenerationRequest,
    _MayCarryProgress,
    _Request,
    _Response,
    without_unset,
)
from gateway.protocol.tools import ToolCall, ToolCallDelta, ToolCallIn, ToolChoice, ToolDefinition

ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]
ReasoningFormat = Literal["none", "auto", "deepseek", "deepseek-legacy"]


class TextContentPart(_Request):
    type: Literal["text"]
    text: str


class ImageURL(_Request):
    url: str                                   # data:image/...;base64,... (http(s) if allowed)
    detail: Literal["auto", "low", "high"] | None = None  # accepted; mtmd's layout decides


class ImageContentPart(_Request):
    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[TextContentPart | ImageContentPart, Field(discriminator="type")]
IMAGE_MARKER = "<__media__>"  # where an image part goes in the rendered template (llama-server's)


class ChatMessage(_Request):
    role: Literal["developer", "system", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # assistant messages
    tool_call_id: str | None = None             # tool messages
    # llama.cpp's: an earlier assistant turn's thinking, which templates such as Qwen3's render
    # for the turns after the last user message (interleaved thinking and tool calls)
    reasoning_content: str | None = None

    def text(self) -> str:
        """Content as one string: parts are joined by newlines, an image part is IMAGE_MARKER
        (gateway/generation/images.py puts the image there after the template has run)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text if isinstance(part, TextContentPart) else IMAGE_MARKER
                         for part in self.content)

    def image_urls(self) -> list[tuple[int, str]]:
        """(part index, url) of each image part, in order."""
        if not isinstance(self.content, list):
            return []
        return [(j, part.image_url.url) for j, part in enumerate(self.content)
                if isinstance(part, ImageContentPart)]

    def for_template(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:  # gateway/generation/structured.py turns the arguments into objects
            message["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.reasoning_content is not None:
            message["reasoning_content"] = self.reasoning_content
        return message


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    max_completion_tokens: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    reasoning_effort: ReasoningEffort | None = None
    # --- llama.cpp's reasoning controls (gateway/generation/reasoning.py reads them all) ---
    chat_template_kwargs: dict[str, Any] | None = None  # names the template reads, e.g. enable_thinking
    reasoning_format: ReasoningFormat | None = None
    reasoning_budget: int | None = Field(default=None, ge=-1)  # thinking tokens; -1 = unlimited, 0 = off

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_needs_logprobs(cls, value: int | None, info: Any) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError("logprobs must be true when top_logprobs is used")
        return value

    def token_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def wants_logprobs(self) -> bool:
        return self.logprobs

    def n_top_logprobs(self) -> int:
        return (self.top_logprobs or 0) if self.logprobs else 0


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(_Response):
    content: list[TokenLogprob] | None
    refusal: list[TokenLogprob] | None = None


class AssistantMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None  # modelyard/llama.cpp extra: a <think> span
    reasoning: str | None = None          # the same again, when the entry's reasoning_field asks

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler: Any) -> dict[str, Any]:
        return without_unset(handler(self), ("tool_calls", "reasoning_content", "reasoning"))


class ChatChoice(_Response):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason


class ChatCompletion(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class ChoiceDelta(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallDelta] | None = None

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: Any) -> dict[str, Any]:
        # OpenAI sends `role` in the first delta only and an empty delta `{}` at the end
        return {k: v for k, v in handler(self).items() if v is not None}


class ChunkChoice(_Response):
    index: int
    delta: ChoiceDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(_MayCarryProgress):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None  # only on the last chunk, when stream_options.include_usage
    system_fingerprint: str | None = None
    # --- modelyard extras ---
    prompt_progress: PromptProgress | None = None
    timings: dict[str, Any] | None = None  # llama-server's, with timings_per_token
