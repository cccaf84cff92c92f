"""Routes modelyard does not serve itself, forwarded to an upstream alias's server as received.

    POST /v1/{path}                   -> the upstream's base URL + /{path} (rerank, audio, ...)
    POST /infill                      -> the upstream's root + the path (llama.cpp's server)
    (rerank, served here for local rerankers, forwards itself: gateway/api/embedding_routes.py)

The body's `model` picks the upstream (gateway/backends/dispatch.py); a body naming no
upstream alias gets what an unknown route got before: 405 where another method serves the
path, else 404. Registered after every route modelyard serves, so those always win.
"""
from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Route

from gateway.backends import dispatch

ROOT_PATHS = ("/infill",)
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]  # all: answers as before


async def _unserved(request: Request, body: bytes, entry: str | None, shown: str | None
                    ) -> Response:
    for route in request.app.routes:
        if getattr(route, "endpoint", None) in (_under_v1, _at_root):
            continue
        match, _ = route.matches(request.scope)
        if match is Match.PARTIAL:  # the path is served, by another method
            raise HTTPException(405)
    raise HTTPException(404)


async def _under_v1(request: Request) -> Response:
    if request.method != "POST":
        return await _unserved(request, b"", None, None)
    return await dispatch.serve(request, "/" + request.path_params["path"], _unserved)


async def _at_root(request: Request) -> Response:
    if request.method != "POST":
        return await _unserved(request, b"", None, None)
    return await dispatch.serve(request, request.url.path, _unserved, at_root=True)


def routes() -> list[BaseRoute]:
    # every method: a POST-only catch-all would turn other methods' 404s into 405s
    return [Route("/v1/{path:path}", _under_v1, methods=METHODS),
            *(Route(path, _at_root, methods=METHODS) for path in ROOT_PATHS)]
