"""OpenAI's Responses API: POST /v1/responses and /v1/responses/input_tokens.

Thin handlers: parse (gateway/protocol/responses.py), read previous_response_id's conversation
from the store (gateway/api/response_store.py), translate (gateway/api/responses_input.py),
then the backend seam (an upstream alias gets the body as received) and, for a local model,
the one pipeline with the Responses wire (gateway/api/responses_wire.py). Errors keep OpenAI's
shape, streamed ones as the `error` event.
"""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from gateway import protocol as p
from gateway.api import endpoints, pipeline, responses_input
from gateway.api.response_store import ResponseStore
from gateway.api.responses_wire import ResponsesWire
from gateway.backends import dispatch
from gateway.generation import serving
from gateway.protocol import responses as r
from gateway.state import app_state


def store(request: Request) -> ResponseStore:
    """The app's store, made on first use; its bounds are the config in force."""
    state = app_state(request.app)
    if state.responses is None:
        state.responses = ResponseStore(lambda: state.config.responses)
    return state.responses


def _turn(request: Request, req: r.ResponsesInput) -> responses_input.Turn:
    history = (store(request).history(req.previous_response_id)
               if req.previous_response_id is not None else [])
    return responses_input.turn(req, history)


async def create(request: Request) -> Response:
    return await dispatch.serve(request, "/responses", _local_create)


async def input_tokens(request: Request) -> Response:
    return await dispatch.serve(request, "/responses/input_tokens", _local_input_tokens)


async def _local_create(request: Request, body: bytes, local: str | None,
                        shown: str | None) -> Response:
    req = p.parse_request(r.ResponsesRequest, body)
    if local is not None:
        req = req.model_copy(update={"model": local})
    wire = ResponsesWire(store(request), _turn(request, req), req)
    return await pipeline.generate(request, wire, req, shown)


async def _local_input_tokens(request: Request, body: bytes, local: str | None,
                              shown: str | None) -> Response:
    req = p.parse_request(r.InputTokensRequest, body)
    if local is not None:
        req = req.model_copy(update={"model": local})
    turn = _turn(request, req)
    state = app_state(request.app)
    lease, _ = await pipeline.acquire(request, req.model, req.keep_alive, shown)
    try:
        responses_input.check_reasoning(req, lease.model)
        plan = await serving.plan_chat(lease.model, turn.chat, state.config.limits,
                                       image_params=turn.image_params)
        return JSONResponse(r.InputTokens(input_tokens=plan.prompt_tokens).model_dump())
    finally:
        state.registry.release(lease)


ENDPOINTS: endpoints.Table = {
    "POST /responses": create,
    "POST /responses/input_tokens": input_tokens,
}


def routes() -> list[BaseRoute]:
    """Under /v1 and again without the prefix, as OpenAI's other endpoints."""
    return endpoints.routes(ENDPOINTS, prefixes=("/v1", ""))
