"""One request pipeline for every API that generates; the wire format stays at the edge.

    acquire (lease; loads the model) -> plan (off the loop) -> prepare (grammar) -> submit
        -> whole: collect every choice, render one reply, release
        -> stream: render chunks as events arrive; release when the stream ends or the client
           leaves (EventStreamResponse's on_close)

A `Wire` is what one API adds: its request's plan (sampling defaults, prompts), its renderers
(a whole reply from the collected choices, stream chunks from the submitted generations, the
error event a stream ends with) and its stream's framing (SSE, Anthropic's named events, or
Ollama's NDJSON). OpenAI's chat and completions (gateway/api/openai_wire.py), llama.cpp's
/completion (gateway/api/llama_completion.py), Anthropic's /v1/messages
(gateway/api/anthropic_wire.py) and Ollama's /api/chat and /api/generate
(gateway/api/ollama_wire.py) are wires; OpenAI's /v1/responses would be one more, never another
copy of the lifecycle.

A lease counts the request as in flight, so its model cannot be evicted or unloaded under it.
Each request's RequestMetrics rides on its plan's generation requests and records time to first
token and tokens (gateway/metrics.py). The per-token path is the renderer's loop alone: the
pipeline adds no await or allocation per event.
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway import protocol as p
from gateway.config import LimitSettings
from gateway.errors import APIError, invalid_request
from gateway.fleet.registry import Lease
from gateway.generation.choices import ChoiceResult, collect
from gateway.generation.model import GenerativeModel
from gateway.generation.serving import Plan
from gateway.http import auth
from gateway.http.streaming import EventStreamResponse, Framing, cancel_on_disconnect
from gateway.metrics import RequestMetrics
from gateway.state import app_state


class WireRequest(Protocol):
    """What the pipeline reads of any API's parsed request."""

    @property
    def model(self) -> str | None: ...

    @property
    def stream(self) -> bool: ...

    @property
    def keep_alive(self) -> p.KeepAlive: ...


Req = TypeVar("Req", bound=WireRequest)
ReqIn = TypeVar("ReqIn", bound=WireRequest, contravariant=True)
P = TypeVar("P", bound=Plan)


class Wire(Protocol, Generic[ReqIn, P]):
    """One API's wire format for generations (see the module docstring)."""

    @property
    def framing(self) -> Framing: ...

    async def plan(self, model: GenerativeModel, lease: Lease, req: ReqIn,
                   limits: LimitSettings) -> P: ...

    def whole(self, model: GenerativeModel, alias: str, req: ReqIn, plan: P,
              results: list[ChoiceResult]) -> BaseModel | Any: ...

    def chunks(self, model: GenerativeModel, alias: str, req: ReqIn,
               plan: P) -> AsyncIterator[BaseModel | bytes | dict[str, Any]]: ...

    def error(self, error: APIError) -> dict[str, Any] | bytes: ...  # bytes: a whole event


async def acquire(request: Request, alias: str | None, keep_alive: p.KeepAlive = None,
                  shown: str | None = None) -> tuple[Lease, RequestMetrics]:
    """A lease on the model and this request's metrics (time to first token counts from here:
    loading the model and waiting for a slot are part of it). `shown`: the pool alias a local
    member serves under (responses and metrics name it)."""
    started = time.perf_counter()
    state = app_state(request.app)
    if shown is None:  # a pool's member: the pool's alias was checked
        auth.check_model(request, alias or state.config.default_alias())
    lease = await state.router.acquire(alias)  # its 404 lists upstream aliases too
    if shown is not None:
        lease.alias = shown
    label = state.config.configured_alias(lease.alias)  # a glob's name, not the client's
    request.state.model = label  # for the request log and metrics
    state.registry.keep_alive(lease, p.keep_alive_seconds(keep_alive))
    return lease, RequestMetrics(state.metrics, label, started)


def _not_generative(alias: str, role: str) -> str:
    if role == "rerank":
        return f"{alias} is a reranking model: it does not generate text (use /v1/rerank)"
    return f"{alias} is an embedding model: it does not generate text (use /v1/embeddings)"


async def generate(request: Request, wire: Wire[Req, P], req: Req,
                   shown: str | None = None) -> Response:
    """Serve one generating request of any API: the whole lifecycle, written once."""
    registry = app_state(request.app).registry
    lease, metrics = await acquire(request, req.model, req.keep_alive, shown)
    model = lease.model
    handed_off = False
    try:
        if model.role != "generation":  # an embedding model or reranker: no logits to sample
            raise invalid_request(_not_generative(lease.alias, model.role), "model")
        plan = await wire.plan(model, lease, req, app_state(request.app).config.limits)
        plan.observe(metrics)
        await plan.prepare(model)  # grammars compile on a worker thread
        plan.submit(model)  # a full queue is a 503 here, before any header goes out
        if req.stream and plan.requests:
            def close() -> None:
                plan.cancel()  # no-op once the stream ran: it cancels on its way out
                registry.release(lease)

            response = EventStreamResponse(wire.chunks(model, lease.alias, req, plan),
                                           on_close=close, error_event=wire.error,
                                           framing=wire.framing)
            handed_off = True
            return response
        try:
            results = await cancel_on_disconnect(request, collect(plan.submitted))
        finally:
            plan.cancel()
        body = wire.whole(model, lease.alias, req, plan, results)
        return JSONResponse(body.model_dump(mode="json") if isinstance(body, BaseModel) else body)
    finally:
        if not handed_off:
            registry.release(lease)
