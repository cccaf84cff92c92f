"""Embedding and rerank endpoints beyond OpenAI's /v1/embeddings (gateway/api/openai.py):

    POST /v1/rerank /rerank /v1/reranking /reranking   {model, query, documents, top_n,
                   return_documents} -> {results: [{index, relevance_score, document?}], usage}
                   (llama.cpp's, Jina's and Cohere's shape; gateway/protocol/rerank.py)
    POST /embedding   llama.cpp's: {content, embd_normalize} -> [{index, embedding: rows}]
                      (pooling none: every token's row). /embeddings with `content` rather than
                      `input` answers the same (openai.py hands it here), as llama-server does.

Each is a lease, the work in gateway/generation/embedding.py, a release; an upstream alias's
request goes to its server as received (gateway/backends/dispatch.py).
"""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from gateway.api import endpoints, pipeline
from gateway.api import llama_protocol as lp
from gateway.backends import dispatch
from gateway.generation import embedding
from gateway.http.streaming import cancel_on_disconnect
from gateway.protocol import parse_request
from gateway.protocol import rerank as r
from gateway.state import app_state


async def _local_rerank(request: Request, body: bytes, local: str | None,
                        shown: str | None) -> Response:
    req = parse_request(r.RerankRequest, body)
    if local is not None:
        req = req.model_copy(update={"model": local})
    state = app_state(request.app)
    lease, metrics = await pipeline.acquire(request, req.model, req.keep_alive, shown)
    try:
        reply = await cancel_on_disconnect(request, embedding.rerank(
            lease.model, lease.alias, req, state.config.limits, metrics))
        return JSONResponse(reply.model_dump(mode="json", exclude_none=True))
    finally:
        state.registry.release(lease)


async def rerank(request: Request) -> Response:
    """An upstream alias gets the path it was sent: /v1/... under its base URL, the bare
    llama.cpp paths at its root."""
    path = request.url.path
    if path.startswith("/v1/"):
        return await dispatch.serve(request, path[len("/v1"):], _local_rerank)
    return await dispatch.serve(request, path, _local_rerank, at_root=True)


async def local_llama_embedding(request: Request, body: bytes, local: str | None,
                                shown: str | None) -> Response:
    req = parse_request(lp.EmbeddingRequest, body)
    state = app_state(request.app)
    lease, metrics = await pipeline.acquire(request, local or req.model, req.keep_alive, shown)
    try:
        rows = await cancel_on_disconnect(request, embedding.llama_embeddings(
            lease.model, lease.alias, req.items(), req.embd_normalize, state.config.limits,
            metrics))
        return JSONResponse(rows)
    finally:
        state.registry.release(lease)


async def llama_embedding(request: Request) -> Response:
    return await dispatch.serve(request, "/embedding", local_llama_embedding, at_root=True)


ENDPOINTS: endpoints.Table = {
    "POST /v1/rerank": rerank,
    "POST /rerank": rerank,
    "POST /v1/reranking": rerank,
    "POST /reranking": rerank,
    "POST /embedding": llama_embedding,
}


def routes() -> list[BaseRoute]:
    return endpoints.routes(ENDPOINTS)
