"""What the OpenAI bodies share: strict request parsing, the error shape, usage, keep_alive,
the fields chat and text completions have in common."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from gateway.protocol.tools import ResponseFormat

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


def without_unset(data: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """`data` (a serialized body) without those of `keys` whose value is None: fields OpenAI's
    shape has only sometimes, or extras of ours, are left out rather than sent as null."""
    for key in keys:
        if data.get(key) is None:
            data.pop(key, None)
    return data


# --------------------------------------------------------------------------------- errors

class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None
    # --- llama.cpp's extras, on context_length_exceeded only: the prompt's and the context's size
    n_prompt_tokens: int | None = None
    n_ctx: int | None = None

    @model_serializer(mode="wrap")
    def _omit_extras_unless_set(self, handler: Any) -> dict[str, Any]:
        return without_unset(handler(self), ("n_prompt_tokens", "n_ctx"))


class ErrorResponse(BaseModel):
    error: ErrorInfo


# --------------------------------------------------------------------------------- shared pieces

Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
KeepAlive = str | int | float | None  # Ollama's: a duration ("5m", 300), 0 = unload, -1 = keep


def keep_alive_seconds(value: KeepAlive) -> float | None:
    """A keep_alive value in seconds: None (not given), 0, a duration, or inf (negative)."""
    from gateway.units import parse_duration

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
    """Extra on stream chunks while a prompt is read (before the first token), llama-server's
    `prompt_progress` (tools/server/server-task.cpp): every chunk with `return_progress`, else
    only for a long prompt."""
    total: int
    cache: int      # prompt tokens reused from the prompt cache
    processed: int  # prompt tokens in the KV cache so far, cached ones included
    time_ms: int    # since the request's slot took it


class _MayCarryProgress(_Response):
    @model_serializer(mode="wrap")
    def _omit_progress_unless_set(self, handler: Any) -> dict[str, Any]:
        # plain chunks keep exactly OpenAI's shape; only progress chunks, and with
        # timings_per_token the timed ones, carry llama-server's extra fields
        return without_unset(handler(self), ("prompt_progress", "timings"))


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


class LoraEntry(_Request):
    """llama-server's per-request adapter scale (ids as GET /lora-adapters lists them)."""
    id: int
    scale: float


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
    speculative: bool = True  # false: no drafting for this request (a model's `draft:` key)
    lora: list[LoraEntry] | None = None  # llama-server's: these adapter scales for this request
    return_progress: bool = False    # llama-server's: prompt_progress from the start, every chunk
    timings_per_token: bool = False  # llama-server's: `timings` on every streamed chunk

    def lora_pairs(self) -> list[tuple[int, float]] | None:
        return None if self.lora is None else [(e.id, e.scale) for e in self.lora]
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


FinishReason = Literal["stop", "length", "tool_calls"]
