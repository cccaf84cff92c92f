"""llama.cpp server API request bodies (tools/server/README.md), beside OpenAI's in protocol/.

Field names and meanings are llama.cpp's. Unknown fields (grammar, mirostat, samplers, ...) are
ignored, as llama.cpp ignores what it does not know; wrong types are a 400 naming the field.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.protocol import ChatMessage, KeepAlive
from gateway.protocol.base import LoraEntry, _check_keep_alive

MAX_N_PROBS = 20



class _LlamaRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class MultimodalPrompt(_LlamaRequest):
    """llama.cpp's prompt object: a text whose media markers (`<__media__>`, /props'
    `media_marker`) the base64 images of `multimodal_data` replace, in order."""
    prompt_string: str
    multimodal_data: list[str] = Field(default_factory=list)


Prompt = (str | MultimodalPrompt | list[int | str]
          | list[str | MultimodalPrompt | list[int | str]])
OnePrompt = list[int | str] | MultimodalPrompt


class CompletionRequest(_LlamaRequest):
    """POST /completion."""
    prompt: Prompt
    model: str | None = None
    n_predict: int = Field(-1, ge=-1)  # -1: the default budget (see gateway/generation/defaults.py)
    stream: bool = False
    temperature: float | None = None   # <= 0: greedy
    top_k: int | None = None           # <= 0: off
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, gt=0.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    seed: int = -1                     # -1: random
    stop: list[str] = Field(default_factory=list, max_length=16)
    n_probs: int = Field(0, ge=0, le=MAX_N_PROBS)
    post_sampling_probs: bool = False  # n_probs as probabilities after the sampler's filters
    cache_prompt: bool = True          # false: reuse no cached prefix, read the whole prompt
    id_slot: int = Field(-1, ge=-1)    # the slot to run in (its cached prefix); -1: any
    return_tokens: bool = False
    return_progress: bool = False      # streamed: prompt_progress from the start, every chunk
    timings_per_token: bool = False    # streamed: `timings` on every chunk
    response_fields: list[str] = Field(default_factory=list)  # only these ("a/b": nested)
    ignore_eos: bool = False
    logit_bias: list[list[Any]] | dict[str, float | bool] | None = None
    keep_alive: KeepAlive = None       # modelyard extra, as on /v1 requests
    speculative: bool = True           # modelyard extra, as on /v1 requests: false = no drafts
    # llama-server's per-request draft limit; 0 turns drafting off (other values: the model's)
    speculative_n_max: int | None = Field(None, ge=0, alias="speculative.n_max")
    lora: list[LoraEntry] | None = None  # these adapter scales for this request (id: GET /lora-adapters)
    # base64 images for a string prompt's media markers (the prompt object's field, given
    # beside a plain string prompt)
    multimodal_data: list[str] | None = None

    _check_keep = field_validator("keep_alive")(_check_keep_alive)

    def prompts(self) -> list[OnePrompt]:
        """The prompts, each a list of token ids and texts or a multimodal prompt (llama.cpp's
        shapes: one string or prompt object, one list of ids and strings, or an array of those
        / of strings / of prompt objects = several prompts)."""
        p = self.prompt
        if isinstance(p, str) and self.multimodal_data is not None:
            return [MultimodalPrompt(prompt_string=p, multimodal_data=self.multimodal_data)]
        if isinstance(p, str):
            return [[p]]
        if isinstance(p, MultimodalPrompt):
            return [p]
        if p and all(isinstance(x, str | MultimodalPrompt) for x in p):
            return [x if isinstance(x, MultimodalPrompt) else [x] for x in p]  # type: ignore[list-item]
        if any(isinstance(x, list | MultimodalPrompt) for x in p):
            return [x if isinstance(x, list | MultimodalPrompt) else [x] for x in p]
        return [list(p)]  # type: ignore[arg-type]


class TokenizeRequest(_LlamaRequest):
    content: str
    model: str | None = None
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_LlamaRequest):
    tokens: list[int] = Field(default_factory=list)
    model: str | None = None


class ApplyTemplateRequest(_LlamaRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    model: str | None = None
    add_generation_prompt: bool = True  # false: the conversation only, no assistant header
    tools: list[dict[str, Any]] | None = None  # OpenAI's tool list, handed to the template
    chat_template_kwargs: dict[str, Any] | None = None  # as on chat: enable_thinking, ...


class RouterModelRequest(_LlamaRequest):
    """POST /models/load and /models/unload."""
    model: str


class EmbeddingRequest(_LlamaRequest):
    """/embedding (and /embeddings given `content`): texts or token ids, as /completion's."""
    content: str | list[int] | list[str | list[int]]
    embd_normalize: int = 2   # 2: Euclidean (L2); -1: none. llama.cpp's other norms: refused
    model: str | None = None
    keep_alive: KeepAlive = None

    _check_keep = field_validator("keep_alive")(_check_keep_alive)

    @field_validator("content")
    @classmethod
    def _non_empty(cls, value: Any) -> Any:
        if (isinstance(value, str | list) and not value) or (
                isinstance(value, list) and any(isinstance(v, str | list) and not v for v in value)):
            raise ValueError("content must not be empty")
        return value

    def items(self) -> list[str | list[int]]:
        """The texts or id lists to embed: one text, one list of ids, or a batch of them."""
        content = self.content
        if isinstance(content, str):
            return [content]
        ids = [v for v in content if isinstance(v, int)]
        if len(ids) == len(content):
            return [ids]
        return [v for v in content if not isinstance(v, int)]
