"""POST /v1/embeddings: inputs in; one vector each out."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from gateway.protocol.base import KeepAlive, _check_keep_alive, _prompt_batch, _Request, _Response


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
