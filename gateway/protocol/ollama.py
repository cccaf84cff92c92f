"""Ollama's /api/* request bodies, as its API reference (docs/api.md) and ollama-python's types
(`ollama/_types.py`) define them, ordered like the reference: generate, chat, embed (and the
legacy embeddings), show; then the pieces of its replies.

Parsing is strict like OpenAI's bodies (a wrong type is a 400 naming the field); unknown fields
and unknown `options` are ignored, as Ollama does. What a request asks that this server cannot
do (images, Go templates, a different context size...) is refused by the wire
(gateway/api/ollama_wire.py) with a message that says so, never silently dropped.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer

from gateway.protocol.base import KeepAlive, _check_keep_alive, _Request, without_unset

Format = Literal["", "json"] | dict[str, Any]  # "json" mode, or a JSON Schema
Think = bool | Literal["low", "medium", "high"]


class Options(_Request):
    """`options`: the Modelfile parameters a request may set (runtime ones; load-time ones
    such as num_gpu or num_thread describe the loader, which the config file owns)."""
    num_ctx: int | None = None       # must equal the entry's n_ctx: a reload is never implied
    seed: int | None = None
    num_predict: int | None = None   # <= 0 (-1 "infinite", -2 "fill"): the entry's chat budget
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    temperature: float | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: list[str] | None = None
    # samplers this engine does not have: a value that would change the output is a 400
    typical_p: float | None = None
    mirostat: int | None = None


class _OllamaRequest(_Request):
    model: str = Field(min_length=1)
    keep_alive: KeepAlive = None

    _check_keep = field_validator("keep_alive")(_check_keep_alive)


class _GenerativeRequest(_OllamaRequest):
    stream: bool = True              # Ollama streams unless told not to
    format: Format | None = None
    options: Options | None = None
    think: Think | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)


class GenerateRequest(_GenerativeRequest):
    """POST /api/generate. An empty prompt only loads the model (or unloads it: keep_alive 0)."""
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = None


class FunctionCall(_Request):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCall(_Request):
    function: FunctionCall


class Message(_Request):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    thinking: str | None = None      # an earlier reply's thinking; not sent back to the model
    images: list[str] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None     # on tool messages: which tool answered


class ChatRequest(_GenerativeRequest):
    """POST /api/chat. No messages only loads the model (or unloads it: keep_alive 0)."""
    messages: list[Message] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None  # OpenAI's function tools, checked by its parser


class EmbedRequest(_OllamaRequest):
    """POST /api/embed."""
    input: str | list[str]
    truncate: bool = True            # cut each input to the context instead of a 400
    options: Options | None = None
    dimensions: int | None = Field(default=None, ge=1)

    def inputs(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class EmbeddingsRequest(_OllamaRequest):
    """POST /api/embeddings (superseded by /api/embed): one prompt, one raw vector."""
    prompt: str = ""
    options: Options | None = None


class ShowRequest(_Request):
    """POST /api/show; older clients send `name`."""
    model: str | None = None
    name: str | None = None
    verbose: bool = False

    def named(self) -> str | None:
        return self.model or self.name


class ModelRequest(_Request):
    """The bodies of /api/pull, /api/push, /api/delete, /api/create: only the name matters."""
    model: str | None = None
    name: str | None = None


# --------------------------------------------------------------------------------- replies

class _Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReplyToolCall(_Reply):
    function: dict[str, Any]         # {"index", "name", "arguments": an object}


class ReplyMessage(_Reply):
    role: Literal["assistant"] = "assistant"
    content: str = ""
    thinking: str | None = None
    tool_calls: list[ReplyToolCall] | None = None

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler: Any) -> dict[str, Any]:
        return without_unset(handler(self), ("thinking", "tool_calls"))


class TokenLogprob(_Reply):
    token: str
    logprob: float
    bytes: list[int] | None = None


class Logprob(TokenLogprob):
    top_logprobs: list[TokenLogprob] | None = None


class Stats(_Reply):
    """What the last object of a reply adds (durations in nanoseconds)."""
    done_reason: str
    total_duration: int
    load_duration: int
    prompt_eval_count: int               # the whole prompt, cached tokens included (Ollama >= 0.30)
    prompt_eval_cached_count: int = 0    # of them, read from the prompt cache
    prompt_eval_duration: int
    eval_count: int
    eval_duration: int
