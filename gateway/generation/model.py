"""The generation-level seam: what every API needs of a model it may generate with.

    facts        n_ctx, n_vocab, n_embd, max_token_bytes, fingerprint
    text         tokenizer, text_prompt(), chat_template, tool_format (tool calls and reasoning)
    images       vision: the projector (engine.vision.VisionModel) or None (text only)
    defaults     sampling_defaults (the file's; the entry's and the request's go over them)
    work         prepare(fn, *args): CPU work (templates, tokenizing) off the event loop
                 submit(GenerationRequest) -> Generation: its events, in order; cancel()
                 embed(ids) -> the model's pooling of ids (engine.pooling): a float32
                 [n_embd] vector (not normalised), [n, n_embd] (pooling none) or rank scores
    embedding    role (generation, embedding, rerank), pooling, rerank_prompt(query, document)

A lease's model is one (gateway/fleet/registry/slots.py); the APIs and the pipeline see nothing
else of it. The local engine is one implementation (gateway/local/served_model.py); an engine
with its own scheduler, or a remote one that speaks in events, would be another.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    import numpy as np

    from engine.chat import ChatTemplate
    from engine.loaded import ModelTokenizer
    from engine.tool_formats import ToolFormat
    from engine.vision import VisionModel
    from gateway.generation.defaults import Sampling
    from gateway.generation.events import Event, GenerationRequest
    from gateway.generation.lora_scales import LoraScales

T = TypeVar("T")


class Generation(Protocol):
    """One submitted generation: PromptProgress* -> TextDelta* -> Finished (or an exception).
    cancel() frees its place at once; iterating a cancelled one raises GenerationCancelled."""

    def __aiter__(self) -> AsyncIterator[Event]: ...

    def cancel(self) -> None: ...


class GenerativeModel(Protocol):
    """A model the APIs may generate with (see the module docstring)."""

    @property
    def n_ctx(self) -> int: ...            # tokens a sequence may hold, prompt and reply

    @property
    def n_vocab(self) -> int: ...

    @property
    def n_embd(self) -> int: ...           # an embedding's dimensions

    @property
    def max_token_bytes(self) -> int: ...  # the longest token's text, in bytes

    @property
    def fingerprint(self) -> str: ...      # OpenAI's system_fingerprint

    @property
    def tokenizer(self) -> ModelTokenizer: ...

    @property
    def chat_template(self) -> ChatTemplate: ...

    @property
    def tool_format(self) -> ToolFormat: ...

    @property
    def sampling_defaults(self) -> Sampling: ...

    @property
    def vision(self) -> VisionModel | None: ...  # None: the model takes no images

    @property
    def lora(self) -> LoraScales: ...       # its LoRA adapters' global and per-request scales

    def text_prompt(self, text: str) -> list[int]: ...  # BOS when the model wants one

    async def prepare(self, fn: Callable[..., T], *args: Any) -> T: ...

    def submit(self, request: GenerationRequest) -> Generation: ...  # QueueFullError when full

    async def embed(self, ids: list[int]) -> np.ndarray: ...

    @property
    def role(self) -> str: ...              # generation, embedding or rerank

    @property
    def pooling(self) -> str: ...           # engine.pooling's kind

    def rerank_prompt(self, query: str, document: str) -> list[int]: ...  # a pair's ids
