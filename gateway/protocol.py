"""OpenAI API request and response bodies, ordered like OpenAI's API reference.

Requests are validated strictly from the raw JSON (`parse_request`), so a wrong type is a 400
naming the parameter, never a silent coercion or a 500. Fields we accept beyond OpenAI's are
fenced off under "modelyard extras". `sampling_params` is the one place request fields become
engine sampling parameters.
"""
from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_serializer, model_validator)

from .protocol_tools import (ResponseFormat, ToolCall, ToolCallDelta, ToolCallIn, ToolChoice,
                             ToolDefinition)

if TYPE_CHECKING:
    import engine

MAX_N = 16           # choices per request; they run side by side in the batch
MAX_STOP = 16        # OpenAI allows 4; more costs us nothing
MAX_TOP_LOGPROBS = 20
COMPLETION_DEFAULT_MAX_TOKENS = 16  # the legacy completions endpoint's documented default


class _Request(BaseModel):
    # Strict: JSON types must match (no "1" -> 1); unknown fields (tools, metadata...) are ignored.
    model_config = ConfigDict(strict=True, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data: Any) -> Any:
        """OpenAI's spec marks most optional fields nullable (`"stream": null`, `"echo": null`):
        null means the field's default."""
        if isinstance(data, dict):
            fields = cls.model_fields
            return {k: v for k, v in data.items()
                    if v is not None or k not in fields or fields[k].default is None}
        return data


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------------- errors

class ErrorInfo(BaseModel):
    model_config = ConfigDict(extra="allow")  # e.g. n_prompt_tokens and n_ctx on context errors
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


# --------------------------------------------------------------------------------- models

class ModelExtras(_Response):
    """modelyard extra on model objects: what the registry and the file's header know."""
    aliases: list[str]            # every name of this model, the first one as logs use it
    state: str                    # unloaded, loading, ready, draining, failed
    loaded: bool
    context_length: int           # n_ctx as configured (the KV cache per request)
    n_ctx_train: int | None
    architecture: str | None
    quantization: str | None
    parameters: int | None


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "modelyard"
    # --- modelyard extras ---
    modelyard: ModelExtras | None = None


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# --------------------------------------------------------------------------------- shared pieces

Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
KeepAlive = str | int | float | None  # Ollama's: a duration ("5m", 300), 0 = unload, -1 = keep


def keep_alive_seconds(value: KeepAlive) -> float | None:
    """A keep_alive value in seconds: None (not given), 0, a duration, or inf (negative)."""
    from .units import parse_duration

    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("keep_alive must be a duration such as \"5m\", a number of seconds, "
                         "0 or -1")
    if isinstance(value, int | float):
        return float("inf") if value < 0 else float(value)
    text = value.strip()
    if text.startswith("-"):
        return float("inf")
    return float(parse_duration(text))


def _check_keep_alive(value: KeepAlive) -> KeepAlive:
    try:
        keep_alive_seconds(value)
    except ValueError as e:
        raise ValueError(f"keep_alive: {e}") from None
    return value

Bias = Annotated[float, Field(ge=-100.0, le=100.0)]


class StreamOptions(_Request):
    include_usage: bool = False


class PromptTokensDetails(_Response):
    cached_tokens: int = 0  # prompt tokens whose KV came from the prompt cache


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class PromptProgress(_Response):
    """modelyard extra on stream chunks while a long prompt is read (before the first token)."""
    processed: int  # prompt tokens in the KV cache so far, cached ones included
    total: int
    cached: int     # of those, reused from the prompt cache


class _MayCarryProgress(_Response):
    @model_serializer(mode="wrap")
    def _omit_progress_unless_set(self, handler: Any) -> dict[str, Any]:
        # plain chunks keep exactly OpenAI's shape; only progress chunks carry the extra field
        data: dict[str, Any] = handler(self)
        if data.get("prompt_progress") is None:
            data.pop("prompt_progress", None)
        return data


def _check_logit_bias(value: dict[str, float] | None) -> dict[str, float] | None:
    for key in value or {}:
        if not key.isdigit():
            raise ValueError(f"keys must be token ids, got {key!r}")
    return value


def _stop_list(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [s for s in ([stop] if isinstance(stop, str) else stop) if s]


def _prompt_batch(value: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    """A `prompt` or `input` field as its batch: each a string or a list of token ids."""
    if isinstance(value, str):
        return [value]
    if all(isinstance(x, int) for x in value):
        return [list(value)]  # type: ignore[arg-type]
    return list(value)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------- chat

class TextContentPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: Literal["developer", "system", "user", "assistant", "tool"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # assistant messages
    tool_call_id: str | None = None             # tool messages

    def text(self) -> str:
        """Content as one string: text parts are joined by newlines."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)

    def for_template(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:  # gateway/structured.py turns the arguments into objects
            message["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class _GenerationRequest(_Request):
    """Fields that chat and text completions share, as OpenAI's reference lists them for both."""
    model: str | None = None  # None -> the configured default model
    frequency_penalty: Penalty = 0.0
    logit_bias: dict[str, Bias] | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    presence_penalty: Penalty = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, ge=0.0, le=1.0)
    user: str | None = None
    # --- modelyard extras (llama.cpp-style sampling knobs) ---
    top_k: int = Field(default=0, ge=0)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repeat_penalty: float = Field(default=1.0, gt=0.0)
    # --- structured output (OpenAI's response_format; llama.cpp's json_schema and grammar) ---
    response_format: ResponseFormat | None = None
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None
    keep_alive: KeepAlive = None  # Ollama's meaning; see keep_alive_seconds

    _check_bias = field_validator("logit_bias")(_check_logit_bias)
    _check_keep = field_validator("keep_alive")(_check_keep_alive)

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences")
        return value

    def stop_list(self) -> list[str]:
        return _stop_list(self.stop)

    def include_usage_in_stream(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    max_completion_tokens: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True

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

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler: Any) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for key in ("tool_calls", "reasoning_content"):
            if data.get(key) is None:
                data.pop(key, None)
        return data


FinishReason = Literal["stop", "length", "tool_calls"]


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


# --------------------------------------------------------------------------------- completions

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


# --------------------------------------------------------------------------------- embeddings

class EmbeddingRequest(_Request):
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    dimensions: int | None = Field(default=None, ge=1)
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = None
    keep_alive: KeepAlive = None  # modelyard extra, as on generation requests

    _check_keep = field_validator("keep_alive")(_check_keep_alive)

    @field_validator("input")
    @classmethod
    def _non_empty(cls, value: str | list[Any]) -> str | list[Any]:
        if isinstance(value, list) and (not value or any(isinstance(p, list | str) and not p for p in value)):
            raise ValueError("input must not be empty")
        if isinstance(value, str) and not value:
            raise ValueError("input must not be empty")
        return value

    def inputs(self) -> list[str | list[int]]:
        return _prompt_batch(self.input)


class Embedding(_Response):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # str: base64 of little-endian float32


class EmbeddingUsage(_Response):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(_Response):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


# --------------------------------------------------------------------------------- helpers

GenerationRequestBody = ChatCompletionRequest | CompletionRequest
R = TypeVar("R", bound=BaseModel)


class RequestValidationError(Exception):
    """A request body that is not JSON or does not fit the schema; `param` names the field."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def _is_union_tag(part: str) -> bool:
    # pydantic labels union branches with type names ('str', 'list[int]', 'TextContentPart');
    # our field names are lower snake_case, so anything else is a tag, not a path step.
    return "[" in part or part in {"str", "int", "float", "bool", "none"} or part[:1].isupper()


def param_path(loc: tuple[int | str, ...]) -> str | None:
    """('messages', 0, 'str', 'content') -> 'messages[0].content'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _is_union_tag(part):
            out += f".{part}" if out else part
    return out or None


def parse_request(model: type[R], body: bytes) -> R:
    """Validate a raw JSON body; raises RequestValidationError (-> 400) on any problem."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = errors[0]
        if first["type"] == "json_invalid":
            raise RequestValidationError(f"We could not parse the JSON body of your request: {first['msg']}",
                                         None) from None
        param = param_path(first["loc"])
        details: list[str] = []
        for err in errors:
            where = param_path(err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            text = f"'{where}': {msg}" if where else msg
            if text not in details:
                details.append(text)
        message = "Invalid request: " + "; ".join(details[:4])
        if len(details) > 4:
            message += f" (and {len(details) - 4} more)"
        raise RequestValidationError(message, param) from None


def sampling_params(req: GenerationRequestBody, choice: int = 0) -> engine.SamplingParams:
    """Request fields -> engine sampling parameters for choice number `choice`.

    Choices of one request get seeds seed, seed+1, ... so `n` > 1 with a seed gives n different
    but reproducible answers.
    """
    import engine

    seed = None if req.seed is None else req.seed + choice
    greedy = req.top_p == 0.0  # OpenAI allows top_p 0: only the most likely token survives
    return engine.SamplingParams(
        temperature=0.0 if greedy else req.temperature,
        top_k=req.top_k,
        top_p=1.0 if greedy else req.top_p,
        min_p=req.min_p,
        repeat_penalty=req.repeat_penalty,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        logit_bias={int(k): v for k, v in (req.logit_bias or {}).items()},
        seed=seed,
        top_logprobs=req.n_top_logprobs(),
        logprobs=req.wants_logprobs(),
    )


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())
