"""POST /v1/embeddings: inputs in; one vector each out."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from gateway.protocol.base import KeepAlive, _check_keep_alive, _Request, _Response

# An input: a text, or (llama.cpp's extension) token ids and texts mixed in one sequence.
EmbeddingInput = str | list[int | str]


class EmbeddingRequest(_Request):
    """OpenAI's body; `input` also takes llama-server's shapes (tools/server/README.md,
    server-common.cpp `tokenize_input_prompts`): a list holding any number at its top level is
    one sequence of ids and texts, else each element is one input: a text, such a sequence,
    `{"prompt_string": text}` or `{"content": [{"type": "text", "text": ...}, ...]}`."""
    input: str | list[Any] | dict[str, Any]
    model: str | None = None
    dimensions: int | None = Field(default=None, ge=1)
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = None
    keep_alive: KeepAlive = None  # modelyard extra, as on generation requests

    _check_keep = field_validator("keep_alive")(_check_keep_alive)

    @field_validator("input")
    @classmethod
    def _known_shape(cls, value: Any) -> Any:
        embedding_inputs(value)  # a ValueError names what is wrong; the 400 names `input`
        return value

    def inputs(self) -> list[EmbeddingInput]:
        return embedding_inputs(self.input)


def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _object_text(obj: dict[str, Any]) -> str:
    """llama-server's input objects: `prompt_string`, or `content` parts of which only text
    embeds on a model without a vision projector."""
    if "prompt_string" in obj:
        text = obj["prompt_string"]
        if not isinstance(text, str):
            raise ValueError("prompt_string must be a string")
        return text
    parts = obj.get("content")
    if not isinstance(parts, list):
        raise ValueError("an input object needs prompt_string, or content as a list of parts")
    texts = []
    for part in parts:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(
                part.get("text"), str):
            raise ValueError("input content parts must be {\"type\": \"text\", \"text\": ...}")
        texts.append(part["text"])
    return "".join(texts)


def _one(item: Any) -> EmbeddingInput:
    if isinstance(item, str):
        return item
    if isinstance(item, dict):
        return _object_text(item)
    if isinstance(item, list) and item and all(_is_id(x) or isinstance(x, str) for x in item):
        return list(item)
    raise ValueError("each input must be a text, a list of token ids and texts, or an object")


def embedding_inputs(value: Any) -> list[EmbeddingInput]:
    """`input` as its inputs; a ValueError when it has no shape llama-server or OpenAI takes."""
    if isinstance(value, list) and not value:
        raise ValueError("input must not be empty")
    if isinstance(value, list) and any(_is_id(x) for x in value):
        items: list[EmbeddingInput] = [_one(value)]
    elif isinstance(value, list):
        items = [_one(x) for x in value]
    else:
        items = [_one(value)]
    if any(not item for item in items):
        raise ValueError("input must not be empty")
    return items


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
