"""Anthropic's Messages API: thin handlers over the one pipeline and the Anthropic wire.

    POST /v1/messages                 a message, or its event stream (gateway/api/anthropic_wire.py)
    POST /v1/messages/count_tokens    {"input_tokens": n}: the prompt as it would be planned

Keys come as `x-api-key` (Anthropic's SDK) or `Authorization: Bearer` (gateway/http/auth.py);
`anthropic-version` and `anthropic-beta` headers are accepted and change nothing. Errors under
these paths take Anthropic's shape (`{"type": "error", "error": {"type", "message"}}`), the
middlewares' too: the shape is registered for the path (gateway/errors.py shape_errors).
An alias served upstream is forwarded as received (gateway/backends/dispatch.py).
"""
from __future__ import annotations

from typing import TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from gateway import errors
from gateway.api import anthropic_request, anthropic_wire, endpoints, pipeline
from gateway.backends import dispatch
from gateway.generation import serving
from gateway.protocol import anthropic as a
from gateway.protocol import parse_request
from gateway.state import app_state

PREFIX = "/v1/messages"
errors.shape_errors(PREFIX, anthropic_wire.error_shape)


async def messages(request: Request) -> Response:
    return await dispatch.serve(request, "/messages", _local_messages)


async def count_tokens(request: Request) -> Response:
    return await dispatch.serve(request, "/messages/count_tokens", _local_count_tokens)


R = TypeVar("R", a.MessageCreateRequest, a.CountTokensRequest)


def _served_by(request: Request, req: R, local: str | None) -> R:
    """`req` naming the alias that serves it: a pool's local member (served under the pool's
    alias), or the API's default model (`default_models.anthropic`) for a name nobody serves."""
    model = local if local is not None else app_state(request.app).config.alias_for(
        "anthropic", req.model)
    return req if model == req.model else req.model_copy(update={"model": model})


async def _local_messages(request: Request, body: bytes, local: str | None,
                          shown: str | None) -> Response:
    req = _served_by(request, parse_request(a.MessageCreateRequest, body), local)
    return await pipeline.generate(request, anthropic_wire.MESSAGES, req, shown)


async def _local_count_tokens(request: Request, body: bytes, local: str | None,
                              shown: str | None) -> Response:
    req = _served_by(request, parse_request(a.CountTokensRequest, body), local)
    chat = anthropic_request.chat_request(req)  # a 400 before any model loads
    lease, _ = await pipeline.acquire(request, req.model, req.keep_alive, shown)
    try:
        n = await serving.count_chat_tokens(lease.model, chat, app_state(request.app).config.limits,
                                            image_params=anthropic_request.image_params(req))
    finally:
        app_state(request.app).registry.release(lease)
    return JSONResponse(a.MessageTokensCount(input_tokens=n).model_dump())


ENDPOINTS: endpoints.Table = {
    "POST /messages": messages,
    "POST /messages/count_tokens": count_tokens,
}


def routes() -> list[BaseRoute]:
    return endpoints.routes(ENDPOINTS, prefixes=("/v1",))
