"""OpenAI API request and response bodies, ordered like OpenAI's API reference.

Requests are validated strictly from the raw JSON (`parse_request`), so a wrong type is a 400
naming the parameter, never a silent coercion or a 500. Fields we accept beyond OpenAI's are
fenced off under "modelyard extras". `sampling_params` is the one place request fields become
engine sampling parameters.

One module per part of the reference: base.py (what the bodies share, errors), models.py,
chat.py, completions.py, embeddings.py, tools.py (tools and response_format); parsing.py holds
parse_request and sampling_params. Import from here: `from gateway import protocol as p`.
Anthropic's Messages API has its own module beside them (anthropic.py), imported by name:
`from gateway.protocol import anthropic as a`.
"""
from __future__ import annotations

from gateway.protocol.base import (
    COMPLETION_DEFAULT_MAX_TOKENS,
    MAX_N,
    MAX_STOP,
    MAX_TOP_LOGPROBS,
    Bias,
    ErrorInfo,
    ErrorResponse,
    FinishReason,
    KeepAlive,
    Penalty,
    PromptProgress,
    PromptTokensDetails,
    StreamOptions,
    Usage,
    keep_alive_seconds,
)
from gateway.protocol.chat import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    ChoiceDelta,
    ChoiceLogprobs,
    ChunkChoice,
    ImageContentPart,
    ImageURL,
    TextContentPart,
    TokenLogprob,
    TopLogprob,
)
from gateway.protocol.completions import Completion, CompletionChoice, CompletionLogprobs, CompletionRequest
from gateway.protocol.embeddings import Embedding, EmbeddingList, EmbeddingRequest, EmbeddingUsage
from gateway.protocol.models import ModelCard, ModelExtras, ModelList
from gateway.protocol.parsing import (
    GenerationRequestBody,
    RequestValidationError,
    new_id,
    now,
    param_path,
    parse_request,
    sampling_params,
)

__all__ = [
    "COMPLETION_DEFAULT_MAX_TOKENS", "MAX_N", "MAX_STOP", "MAX_TOP_LOGPROBS", "AssistantMessage",
    "Bias", "ChatChoice", "ChatCompletion", "ChatCompletionChunk", "ChatCompletionRequest",
    "ChatMessage", "ChoiceDelta", "ChoiceLogprobs", "ChunkChoice", "Completion",
    "CompletionChoice", "CompletionLogprobs", "CompletionRequest", "Embedding", "EmbeddingList",
    "EmbeddingRequest", "EmbeddingUsage", "ErrorInfo", "ErrorResponse", "FinishReason",
    "GenerationRequestBody", "ImageContentPart", "ImageURL", "KeepAlive", "ModelCard",
    "ModelExtras", "ModelList", "Penalty",
    "PromptProgress", "PromptTokensDetails", "RequestValidationError", "StreamOptions",
    "TextContentPart", "TokenLogprob", "TopLogprob", "Usage", "keep_alive_seconds", "new_id",
    "now", "param_path", "parse_request", "sampling_params",
]
