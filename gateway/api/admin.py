"""Operator endpoints: health, Prometheus metrics, status, reload, and models by hand.

    GET  /health (and /v1/health)       200 {"status": "ok"} while serving, 503 while stopping
    GET  /metrics                       Prometheus text (gateway/metrics.py)
    GET  /admin/status                  config file, watching, last reload, counts
    POST /admin/reload                  reload the config file now: 200, or 422 with its errors
    GET  /admin/models                  every entry: state, memory, in flight, queued, ...; and
                                        every upstream server: health, in flight, errors, ...
    POST /admin/models/{alias}/load     load now (waits up to registry.load_timeout)
    POST /admin/models/{alias}/unload   drain (running requests finish), then unload;
                                        ?timeout=SECONDS bounds the wait (default 30)

Errors use the API's error shape (gateway/errors.py): an unknown alias is 404 model_not_found.
With API keys configured (gateway/http/auth.py) /admin/* needs the admin key; /health and /metrics
stay public unless `auth.public` says otherwise.
"""
from __future__ import annotations

import math
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from gateway.api import endpoints
from gateway.errors import invalid_request
from gateway.metrics import CONTENT_TYPE_LATEST
from gateway.state import app_state

UNLOAD_TIMEOUT = 30.0


def is_stopping(app: Starlette) -> bool:
    """True once shutdown began (the CLI marks it on SIGINT/SIGTERM; the lifespan on exit)."""
    state = app_state(app)
    return state.stopping or (state.running is not None and state.running.registry.closed)


async def health(request: Request) -> Response:
    if is_stopping(request.app):
        # `status` for load balancers; `error` in llama.cpp's shape for its clients
        return JSONResponse({"status": "stopping", "error": {
            "code": 503, "message": "The server is stopping", "type": "unavailable_error"}},
            status_code=503, headers={"Retry-After": "5"})
    return JSONResponse({"status": "ok"})


async def metrics(request: Request) -> Response:
    return Response(app_state(request.app).metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def activity(request: Request) -> Response:
    """The last minutes of per-model totals (gateway/activity.py): the console's chart history."""
    return JSONResponse(app_state(request.app).metrics.activity.history())


async def status(request: Request) -> Response:
    return JSONResponse(status_body(request.app))


def status_body(app: Starlette) -> dict[str, Any]:
    """GET /admin/status's body (the console's event stream sends it too)."""
    state = app_state(app)
    registry, reloader, watcher = state.registry, state.reloader, state.watcher
    rows = registry.snapshot()
    last = reloader.last
    return {
        "status": "stopping" if is_stopping(app) else "serving",
        "started": state.started,
        "uptime_seconds": round(time.time() - state.started, 3),
        "config": None if reloader.path is None else str(reloader.path),
        "watch": {
            "enabled": watcher is not None,
            "polling": bool(watcher is not None and watcher.polling),
            "paths": [] if watcher is None else [str(p) for p in watcher.watching],
        },
        "last_reload": None if last is None else last.as_dict(),
        "reloads": dict(reloader.counts),
        "warnings": list(registry.config.warnings),
        "models": {
            "configured": len(registry.config.models) + len(registry.config.upstreams),
            "loaded": sum(r["state"] == "ready" for r in rows),
            "aliases": registry.config.aliases(),
        },
    }


async def reload(request: Request) -> Response:
    record = await app_state(request.app).reloader.reload("admin")
    return JSONResponse(record.as_dict(), status_code=200 if record.ok else 422)


async def list_models(request: Request) -> Response:
    state = app_state(request.app)  # local entries, then upstream servers (`kind`)
    return JSONResponse({"object": "list",
                         "data": [*state.registry.snapshot(), *state.router.upstream_rows()]})


async def load_model(request: Request) -> Response:
    alias = request.path_params["alias"]
    row = await app_state(request.app).registry.load(alias)
    request.state.model = alias  # a configured alias: safe as a metrics label
    return JSONResponse(row)


async def unload_model(request: Request) -> Response:
    raw = request.query_params.get("timeout")
    try:
        timeout = UNLOAD_TIMEOUT if raw is None else float(raw)
    except ValueError:
        timeout = math.nan
    if not 0 <= timeout < math.inf:
        raise invalid_request(f"timeout must be a number of seconds, got {raw!r}", "timeout")
    alias = request.path_params["alias"]
    row = await app_state(request.app).registry.unload(alias, timeout)
    request.state.model = alias
    # 202: accepted but still draining (requests running); the row says so too.
    return JSONResponse(row, status_code=202 if row["state"] == "draining" else 200)


ENDPOINTS: endpoints.Table = {
    "GET /health": health,
    "GET /metrics": metrics,
    "GET /metrics/activity": activity,
    "GET /admin/status": status,
    "POST /admin/reload": reload,
    "GET /admin/models": list_models,
    # `:path` so aliases with a slash ("org/model") work
    "POST /admin/models/{alias:path}/load": load_model,
    "POST /admin/models/{alias:path}/unload": unload_model,
}


def routes() -> list[BaseRoute]:
    return endpoints.routes(ENDPOINTS)
