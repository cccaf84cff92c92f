"""HTTP handlers: parse -> acquire -> plan -> JSON or stream. Nothing else lives here.

A lease counts the request as in flight, so its model cannot be evicted or unloaded under it.
Whole responses release it before returning; streams hand it to the response, which releases it
when the stream ends or the client leaves. Each request's RequestMetrics rides on its plan's
generation requests and records time to first token and tokens (gateway/metrics.py).
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from gateway import protocol as p
from gateway.api import endpoints, model_cards
from gateway.backends import dispatch
from gateway.config import LimitSettings
from gateway.fleet.registry import Lease
from gateway.generation import defaults, serving
from gateway.generation.model import GenerativeModel
from gateway.http import auth
from gateway.http.streaming import EventStreamResponse, cancel_on_disconnect
from gateway.metrics import RequestMetrics
from gateway.state import app_state

R = TypeVar("R", p.ChatCompletionRequest, p.CompletionRequest)


def _json(body: BaseModel) -> JSONResponse:
    return JSONResponse(body.model_dump(mode="json"))


async def list_models(request: Request) -> Response:
    state = app_state(request.app)
    aliases = state.config.aliases() + state.registry.upstreams.discovered_aliases()
    visible = auth.visible_aliases(request, aliases)
    cards = await model_cards.cards(state.config, state.registry.snapshot(), state.started,
                                    visible)
    cards += dispatch.upstream_cards(state.registry, state.started, visible)
    body = p.ModelList(data=cards).model_dump(mode="json")
    if not request.url.path.startswith("/v1/"):  # llama.cpp's router API: `status` per model
        for item, card in zip(body["data"], cards):
            item["status"] = model_cards.router_status(card)
    return JSONResponse(body)


async def retrieve_model(request: Request) -> Response:
    state = app_state(request.app)
    alias = request.path_params["model"]
    if state.registry.route(alias) is not None:
        auth.check_named(request, alias)
        card = next(c for c in dispatch.upstream_cards(state.registry, state.started, [alias]))
        request.state.model = alias
        return _json(card)
    auth.check_model(request, alias)
    card = await model_cards.card(state.config, state.registry.snapshot(), state.started, alias)
    request.state.model = alias  # a configured alias: safe as a metrics label
    return _json(card)


async def acquire(request: Request, alias: str | None, keep_alive: p.KeepAlive = None,
                  shown: str | None = None) -> tuple[Lease, GenerativeModel, RequestMetrics]:
    """A lease on the model, the model, and this request's metrics (time to first token counts
    from here: loading the model and waiting for a slot are part of it). `shown`: the pool alias
    a local member serves under (responses and metrics name it)."""
    started = time.perf_counter()
    if shown is None:  # a pool's member: the pool's alias was checked
        auth.check_model(request, alias or app_state(request.app).config.default_alias())
    lease = await app_state(request.app).registry.acquire(alias)
    if shown is not None:
        lease.alias = shown
    request.state.model = lease.alias  # for the request log and metrics
    app_state(request.app).registry.keep_alive(lease, p.keep_alive_seconds(keep_alive))
    return lease, lease.model, RequestMetrics(app_state(request.app).metrics, lease.alias, started)


def with_defaults(req: R, lease: Lease, served: GenerativeModel) -> R:
    """`req` with the sampling fields and budget it left out taken from the entry, the GGUF or
    llama.cpp's defaults (gateway/generation/defaults.py)."""
    budget = (defaults.chat_max_tokens(lease.entry, served.n_ctx)
              if isinstance(req, p.ChatCompletionRequest)
              else defaults.completion_max_tokens(lease.entry))
    return defaults.fill(req, lease.entry, served.sampling_defaults, budget)


async def _generate(request: Request, req: R, shown: str | None,
                    plan: Callable[[GenerativeModel, R, LimitSettings], Awaitable[serving.Plan]],
                    whole: Callable[[GenerativeModel, str, R, serving.Plan], Awaitable[BaseModel]],
                    chunks: Callable[[GenerativeModel, str, R, serving.Plan],
                                     AsyncIterator[BaseModel | bytes]]) -> Response:
    registry = app_state(request.app).registry
    lease, served, metrics = await acquire(request, req.model, req.keep_alive, shown)
    handed_off = False
    try:
        req = with_defaults(req, lease, served)
        planned = await plan(served, req, app_state(request.app).config.limits)  # off the loop
        planned.observe(metrics)
        await planned.prepare(served)  # grammars compile on a worker thread
        if req.stream:
            planned.submit(served)  # a full queue is a 503 here, before any header goes out

            def close() -> None:
                planned.cancel()  # no-op once the stream ran: it cancels on its way out
                registry.release(lease)

            response = EventStreamResponse(chunks(served, lease.alias, req, planned), on_close=close)
            handed_off = True
            return response
        return _json(await cancel_on_disconnect(request, whole(served, lease.alias, req, planned)))
    finally:
        if not handed_off:
            registry.release(lease)


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
    return await _generate(request, req, shown, serving.plan_chat, serving.chat_completion,
                           serving.chat_chunks)


async def _local_completion(request: Request, body: bytes, local: str | None,
                            shown: str | None) -> Response:
    req = _for_member(p.parse_request(p.CompletionRequest, body), local)
    return await _generate(request, req, shown, serving.plan_completion, serving.completion,
                           serving.completion_chunks)


async def _local_embeddings(request: Request, body: bytes, local: str | None,
                            shown: str | None) -> Response:
    req = _for_member(p.parse_request(p.EmbeddingRequest, body), local)
    lease, served, metrics = await acquire(request, req.model, req.keep_alive, shown)
    try:
        return _json(await cancel_on_disconnect(request, serving.embeddings(
            served, lease.alias, req, app_state(request.app).config.limits, metrics)))
    finally:
        app_state(request.app).registry.release(lease)


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
