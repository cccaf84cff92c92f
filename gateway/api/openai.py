"""OpenAI's HTTP handlers: parse, then the backend seam (gateway/backends/dispatch.py) and, for a
local model, the one pipeline (gateway/api/pipeline.py) with OpenAI's wires
(gateway/api/openai_wire.py). Nothing else lives here.
"""
from __future__ import annotations

import json
from typing import TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from gateway import protocol as p
from gateway.api import embedding_routes, endpoints, model_cards, openai_wire, pipeline
from gateway.backends import dispatch
from gateway.generation import embedding
from gateway.http import auth
from gateway.http.streaming import cancel_on_disconnect
from gateway.state import app_state


def _json(body: BaseModel) -> JSONResponse:
    return JSONResponse(body.model_dump(mode="json"))


async def list_models(request: Request) -> Response:
    state = app_state(request.app)
    aliases = state.config.aliases() + state.router.discovered_aliases()
    visible = auth.visible_aliases(request, aliases)
    cards = await model_cards.cards(state.config, state.registry.snapshot(), state.started,
                                    visible)
    cards += dispatch.upstream_cards(state.router, state.started, visible)
    body = p.ModelList(data=cards).model_dump(mode="json")
    if not request.url.path.startswith("/v1/"):  # llama.cpp's router API: `status` per model
        for item, card in zip(body["data"], cards):
            item["status"] = model_cards.router_status(card)
    return JSONResponse(body)


async def retrieve_model(request: Request) -> Response:
    state = app_state(request.app)
    alias = request.path_params["model"]
    if state.router.route(alias) is not None:
        auth.check_named(request, alias)
        card = next(c for c in dispatch.upstream_cards(state.router, state.started, [alias]))
        request.state.model = alias
        return _json(card)
    auth.check_model(request, alias)
    card = await model_cards.card(state.config, state.registry.snapshot(), state.started, alias)
    request.state.model = alias  # a configured alias: safe as a metrics label
    return _json(card)


async def chat_completions(request: Request) -> Response:
    return await dispatch.serve(request, "/chat/completions", _local_chat)


async def completions(request: Request) -> Response:
    return await dispatch.serve(request, "/completions", _local_completion)


async def embeddings(request: Request) -> Response:
    return await dispatch.serve(request, "/embeddings", _local_embeddings)


# The local path of each endpoint (gateway/backends/dispatch.py): `local` is the local entry a
# pool picked, served under the pool's alias `shown`; both None for a local alias.

async def _local_chat(request: Request, body: bytes, local: str | None,
                      shown: str | None) -> Response:
    req = _for_member(p.parse_request(p.ChatCompletionRequest, body), local)
    return await pipeline.generate(request, openai_wire.CHAT, req, shown)


async def _local_completion(request: Request, body: bytes, local: str | None,
                            shown: str | None) -> Response:
    req = _for_member(p.parse_request(p.CompletionRequest, body), local)
    return await pipeline.generate(request, openai_wire.COMPLETION, req, shown)


async def _local_embeddings(request: Request, body: bytes, local: str | None,
                            shown: str | None) -> Response:
    if _is_llama_shape(body):  # llama-server's /embeddings with `content`: its answer's shape
        return await embedding_routes.local_llama_embedding(request, body, local, shown)
    req = _for_member(p.parse_request(p.EmbeddingRequest, body), local)
    lease, metrics = await pipeline.acquire(request, req.model, req.keep_alive, shown)
    try:
        return _json(await cancel_on_disconnect(request, embedding.embeddings(
            lease.model, lease.alias, req, app_state(request.app).config.limits, metrics)))
    finally:
        app_state(request.app).registry.release(lease)


def _is_llama_shape(body: bytes) -> bool:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # nested past the parser's depth: the 400 comes next
        return False
    return isinstance(data, dict) and "content" in data and "input" not in data


M = TypeVar("M", p.ChatCompletionRequest, p.CompletionRequest, p.EmbeddingRequest)


def _for_member(req: M, local: str | None) -> M:
    return req if local is None else req.model_copy(update={"model": local})


ENDPOINTS: endpoints.Table = {
    "GET /models": list_models,
    "GET /models/{model:path}": retrieve_model,
    "POST /chat/completions": chat_completions,
    "POST /completions": completions,
    "POST /embeddings": embeddings,
}


def routes() -> list[BaseRoute]:
    """Every endpoint under /v1 and again without the prefix."""
    return endpoints.routes(ENDPOINTS, prefixes=("/v1", ""))
