"""POST /v1/rerank (and /rerank, /v1/reranking, /reranking): the shape llama.cpp's server, Jina
and Cohere share.

    {model, query, documents, top_n?, return_documents?}
      -> {id, model, object: "list", results: [{index, relevance_score, document?}], usage}

results go best first and stop after top_n; a document comes back as {"text": ...} when asked
(Jina's and Cohere's form). A document may be given as a string or as {"text": ...} (Cohere's
older form). llama.cpp's TEI form (`texts`, bare results) is not served.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.protocol.base import KeepAlive, _check_keep_alive, _Request, _Response


class DocumentText(BaseModel):
    model_config = ConfigDict(extra="ignore")
    text: str


class RerankRequest(_Request):
    model: str | None = None
    query: str
    documents: list[str | DocumentText] = Field(min_length=1)
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = False
    keep_alive: KeepAlive = None  # modelyard extra, as on generation requests

    _check_keep = field_validator("keep_alive")(_check_keep_alive)

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


class RerankResult(_Response):
    index: int
    relevance_score: float
    document: DocumentText | None = None


class RerankUsage(_Response):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(_Response):
    id: str
    object: Literal["list"] = "list"
    model: str
    results: list[RerankResult]
    usage: RerankUsage
