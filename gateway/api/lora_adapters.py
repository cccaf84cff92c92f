"""llama.cpp server's /lora-adapters for a model entry (tools/server/README.md's shapes).

    GET  /lora-adapters    ?model=: [{id, path, scale}], the entry's `lora` in order
    POST /lora-adapters    400: adapters are merged into the weights at load (engine/lora.py),
                           so their scales change with the config (a reload), not per server call

`path` is the file's name only, as /props' model_path: where it lies is not a client's business.
"""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.errors import invalid_request
from gateway.http.auth import check_model
from gateway.state import app_state

FIXED = ("LoRA adapters are merged into the model's weights at load: set their scales with the "
         "entry's `lora` in the config (a change reloads the model); per-request and runtime "
         "scales are not supported")


async def list_adapters(request: Request) -> Response:
    alias = request.query_params.get("model")
    entry = app_state(request.app).config.resolve(alias)
    check_model(request, alias or entry.name)
    request.state.model = alias or entry.name
    return JSONResponse([{"id": i, "path": a.path.name, "scale": a.scale}
                         for i, a in enumerate(getattr(entry, "lora", ()))])


async def set_adapters(request: Request) -> Response:
    raise invalid_request(FIXED, param="lora")
