"""POST /v1/responses and /v1/responses/input_tokens: OpenAI's Responses API bodies.

Ordered like OpenAI's reference (and openai-python's types/responses/*): the input items, the
tools, tool_choice, text.format and reasoning of a request; then the reply's output items,
usage and the Response object. The stream's events are built by gateway/api/responses_wire.py
from these same items. Fields we accept without acting on them are listed in the table of
docs/api/responses.md; fields we cannot honour are 400s (gateway/api/responses_input.py).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from gateway.protocol.base import KeepAlive, _check_keep_alive, _Request, _Response

# --------------------------------------------------------------------------------- input items

class InputText(_Request):
    type: Literal["input_text"]
    text: str


class OutputTextIn(_Request):
    """An earlier assistant turn's text, sent back as history."""
    type: Literal["output_text"]
    text: str


class RefusalIn(_Request):
    type: Literal["refusal"]
    refusal: str


class InputImage(_Request):
    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None


class InputFile(_Request):
    type: Literal["input_file"]


ContentPart = Annotated[InputText | OutputTextIn | RefusalIn | InputImage | InputFile,
                        Field(discriminator="type")]


class MessageItem(_Request):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]


class FunctionCallItem(_Request):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str
    arguments: str
    id: str | None = None


class ToolOutputText(_Request):
    type: Literal["input_text", "output_text"]
    text: str


class FunctionCallOutputItem(_Request):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[ToolOutputText]


class CustomToolCallItem(_Request):
    type: Literal["custom_tool_call"]
    call_id: str = Field(min_length=1)
    name: str
    input: str
    id: str | None = None


class CustomToolCallOutputItem(_Request):
    type: Literal["custom_tool_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[ToolOutputText]


class SummaryText(_Request):
    type: Literal["summary_text", "reasoning_text"]
    text: str


class ReasoningItem(_Request):
    """An earlier turn's reasoning: accepted; chat templates leave earlier turns' reasoning
    out of the prompt, and so do we."""
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[SummaryText] = Field(default_factory=list)
    content: list[SummaryText] | None = None
    encrypted_content: str | None = None


InputItem = Annotated[
    MessageItem | FunctionCallItem | FunctionCallOutputItem | CustomToolCallItem
    | CustomToolCallOutputItem | ReasoningItem, Field(discriminator="type")]


def output_text(output: str | list[ToolOutputText]) -> str:
    return output if isinstance(output, str) else "\n".join(part.text for part in output)


# --------------------------------------------------------------------------------- tools

class FunctionTool(_Request):
    """The flat form: name and parameters beside `type` (chat's nests them in `function`)."""
    type: Literal["function"]
    name: str = Field(pattern=r"^[a-zA-Z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextInputFormat(_Request):
    type: Literal["text"]


class GrammarInputFormat(_Request):
    type: Literal["grammar"]
    syntax: Literal["lark", "regex"]
    definition: str = Field(min_length=1)


class CustomTool(_Request):
    """A freeform tool: its input is plain text, following `format` when that is a grammar."""
    type: Literal["custom"]
    name: str = Field(pattern=r"^[a-zA-Z0-9_.-]{1,64}$")
    description: str | None = None
    format: Annotated[TextInputFormat | GrammarInputFormat, Field(discriminator="type")] | None = None


Tool = Annotated[FunctionTool | CustomTool, Field(discriminator="type")]


class NamedTool(_Request):
    type: Literal["function", "custom"]
    name: str


ToolChoice = Literal["none", "auto", "required"] | NamedTool


# --------------------------------------------------------------------------------- text, reasoning

class FormatText(_Request):
    type: Literal["text"]


class FormatJsonObject(_Request):
    type: Literal["json_object"]


class FormatJsonSchema(_Request):
    type: Literal["json_schema"]
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


TextFormat = Annotated[FormatText | FormatJsonObject | FormatJsonSchema,
                       Field(discriminator="type")]


class TextConfig(_Request):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted; no effect here


Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class Reasoning(_Request):
    effort: Effort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


# --------------------------------------------------------------------------------- requests

class ResponsesInput(_Request):
    """What /v1/responses and /v1/responses/input_tokens share: the prompt and its tools."""
    model: str | None = None
    input: str | list[InputItem] = ""
    instructions: str | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    previous_response_id: str | None = None
    truncation: Literal["auto", "disabled"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _typed_messages(cls, data: Any) -> Any:
        """An input message may leave out `"type": "message"` (the SDK's EasyInputMessage)."""
        if isinstance(data, dict) and isinstance(data.get("input"), list):
            data = {**data, "input": [
                {**item, "type": "message"} if isinstance(item, dict) and "type" not in item
                and "role" in item else item for item in data["input"]]}
        return data

    def items(self) -> list[InputItem]:
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)] if self.input else []
        return list(self.input)


class ResponsesRequest(ResponsesInput):
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    stream: bool = False
    store: bool = True
    metadata: dict[str, str] | None = None
    user: str | None = None
    background: bool = False
    include: list[str] | None = None           # accepted: nothing here is encrypted or hosted
    prompt_cache_key: str | None = None        # accepted: the prompt cache is by prefix anyway
    service_tier: str | None = None            # accepted: one tier
    safety_identifier: str | None = None
    # --- modelyard extras ---
    seed: int | None = None
    keep_alive: KeepAlive = None
    # llama-server's, on streams: response.in_progress events with `prompt_progress`, and
    # `timings` on the deltas and on response.completed (a stream without them is OpenAI's)
    return_progress: bool = False
    timings_per_token: bool = False

    _check_keep = field_validator("keep_alive")(_check_keep_alive)


class InputTokensRequest(ResponsesInput):
    stream: bool = False  # what the pipeline's acquire reads; never streams
    keep_alive: KeepAlive = None

    _check_keep = field_validator("keep_alive")(_check_keep_alive)


# --------------------------------------------------------------------------------- output items

Status = Literal["in_progress", "completed", "incomplete"]


class OutputText(_Response):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(_Response):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Status
    content: list[OutputText]


class FunctionCallOut(_Response):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Status


class CustomToolCallOut(_Response):
    type: Literal["custom_tool_call"] = "custom_tool_call"
    id: str
    call_id: str
    name: str
    input: str


class ReasoningText(_Response):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningOut(_Response):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText]
    status: Status


OutputItem = OutputMessage | FunctionCallOut | CustomToolCallOut | ReasoningOut


class InputTokensDetails(_Response):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(_Response):
    reasoning_tokens: int = 0


class ResponseUsage(_Response):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(_Response):
    reason: Literal["max_output_tokens", "content_filter"]


class Response(_Response):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    error: dict[str, Any] | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None = None
    reasoning: dict[str, Any]
    store: bool
    temperature: float | None = None
    text: dict[str, Any]
    tool_choice: Any
    tools: list[dict[str, Any]]
    top_p: float | None = None
    truncation: Literal["auto", "disabled"] = "disabled"
    usage: ResponseUsage | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    user: str | None = None


class InputTokens(_Response):
    object: Literal["response.input_tokens"] = "response.input_tokens"
    input_tokens: int
