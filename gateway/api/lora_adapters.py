"""llama.cpp server's /lora-adapters for a model entry (tools/server/README.md's shapes).

    GET  /lora-adapters    ?model=: [{id, path, scale}], the entry's `lora` in order, at the
                           model's global scales (loads it if needed, as a request would)
    POST /lora-adapters    ?model=, body [{id, scale}]: the global scales (an adapter not listed
                           gets 0; loads the model if needed); a reload starts over from the config

Requests override the global scales for themselves with their own `lora` field
(gateway/generation/lora_scales.py). `path` is the file's name only, as /props' model_path:
where it lies is not a client's business.
"""
from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.api import pipeline
from gateway.errors import invalid_request
from gateway.http.auth import check_model
from gateway.state import app_state


async def list_adapters(request: Request) -> Response:
    alias = request.query_params.get("model")
    entry = app_state(request.app).config.resolve(alias)
    check_model(request, alias or entry.name)
    adapters = list(getattr(entry, "lora", ()))
    if not adapters:
        request.state.model = alias or entry.name
        return JSONResponse([])
    lease, _ = await pipeline.acquire(request, alias)  # its global scales live with the model
    try:
        scales = lease.model.lora.global_scales
    finally:
        app_state(request.app).registry.release(lease)
    return JSONResponse([{"id": i, "path": a.path.name, "scale": s}
                         for i, (a, s) in enumerate(zip(adapters, scales))])


async def set_adapters(request: Request) -> Response:
    try:
        body = json.loads(await request.body())
    except ValueError:
        raise invalid_request("the body is not JSON", "lora") from None
    if not isinstance(body, list) or not all(
            isinstance(e, dict) and isinstance(e.get("id"), int)
            and isinstance(e.get("scale", 0.0), int | float) for e in body):
        raise invalid_request("the body must be an array of {id: integer, scale: number}", "lora")
    lease, _ = await pipeline.acquire(request, request.query_params.get("model"))
    try:
        lease.model.lora.set_global([(int(e["id"]), float(e.get("scale", 0.0))) for e in body])
    finally:
        app_state(request.app).registry.release(lease)
    return JSONResponse({"success": True})
