"""HTTP handlers: parse -> acquire -> plan -> JSON or stream. Nothing else lives here.

A lease counts the request as in flight, so its model cannot be evicted or unloaded under it.
Whole responses release it before returning; streams hand it to the response, which releases it
when the stream ends or the client leaves. The served model the handlers see records time to
first token and tokens into the app's metrics (gateway/metrics.py).
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from . import protocol as p
from . import serving
from .metrics import observe_request
from .registry import Lease
from .scheduler import ServedModel
from .streaming import EventStreamResponse, cancel_on_disconnect

R = TypeVar("R", p.ChatCompletionRequest, p.CompletionRequest)


def _json(body: BaseModel) -> JSONResponse:
    return JSONResponse(body.model_dump(mode="json"))


async def list_models(request: Request) -> Response:
    config = request.app.state.config
    created = request.app.state.started
    cards = [p.ModelCard(id=alias, created=created) for alias in config.aliases()]
    return _json(p.ModelList(data=cards))


async def _acquire(request: Request, alias: str | None) -> tuple[Lease, ServedModel]:
    """A lease on the model, and the model as the handlers see it (recording into the metrics)."""
    started = time.perf_counter()
    lease = await request.app.state.registry.acquire(alias)
    request.state.model = lease.alias  # for the request log and metrics
    return lease, observe_request(lease.model, request.app.state.metrics, lease.alias, started)


async def _generate(request: Request, req: R, plan: Callable[[ServedModel, R], serving.Plan],
                    whole: Callable[[ServedModel, str, R, serving.Plan], Awaitable[BaseModel]],
                    chunks: Callable[[ServedModel, str, R, serving.Plan],
                                     AsyncIterator[BaseModel | bytes]]) -> Response:
    registry = request.app.state.registry
    lease, served = await _acquire(request, req.model)
    handed_off = False
    try:
        planned = plan(served, req)
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
    req = p.parse_request(p.ChatCompletionRequest, await request.body())
    return await _generate(request, req, serving.plan_chat, serving.chat_completion,
                           serving.chat_chunks)


async def completions(request: Request) -> Response:
    req = p.parse_request(p.CompletionRequest, await request.body())
    return await _generate(request, req, serving.plan_completion, serving.completion,
                           serving.completion_chunks)


async def embeddings(request: Request) -> Response:
    req = p.parse_request(p.EmbeddingRequest, await request.body())
    lease, served = await _acquire(request, req.model)
    try:
        return _json(await cancel_on_disconnect(request, serving.embeddings(served, lease.alias, req)))
    finally:
        request.app.state.registry.release(lease)


def routes() -> list[BaseRoute]:
    """Every endpoint under /v1 and again without the prefix."""
    table: list[tuple[str, Callable[[Request], Awaitable[Response]], list[str]]] = [
        ("/models", list_models, ["GET"]),
        ("/chat/completions", chat_completions, ["POST"]),
        ("/completions", completions, ["POST"]),
        ("/embeddings", embeddings, ["POST"]),
    ]
    out: list[BaseRoute] = []
    for prefix in ("/v1", ""):
        out += [Route(prefix + path, handler, methods=methods) for path, handler, methods in table]
    return out
