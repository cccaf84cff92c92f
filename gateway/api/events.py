"""GET /admin/events: the registry and the last reload as server-sent events, for live views.

    event: models   data: the rows of GET /admin/models (every entry and retiring instance)
    event: status   data: GET /admin/status without uptime_seconds (config, watch, last reload)

Each event is sent when the stream opens and again whenever its data changed. The stream wakes
when the registry changes (a load starts or ends, a request begins or ends, a reload applies) and
at least every TICK seconds, which also catches what the registry is not told about: the
scheduler's queued/active counts and reloads that failed. A comment line every KEEPALIVE seconds
keeps proxies from closing a quiet stream. It ends when the client leaves or the server stops.

Nothing here runs unless someone watches: the API's own requests never wait for it.
"""
from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute

from gateway.api import endpoints
from gateway.api.admin import is_stopping, status_body
from gateway.state import app_state

TICK = 0.5        # seconds: the longest a change the registry is not told about waits
KEEPALIVE = 15.0  # seconds between comment lines on a quiet stream


def event(name: str, data: Any) -> bytes:
    """One named SSE event; JSON has no raw newline, so one data line holds it."""
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def _views(app: Starlette) -> dict[str, Any]:
    status = status_body(app)
    status.pop("uptime_seconds")  # changes every tick; the page counts from `started`
    return {"models": app_state(app).registry.snapshot(), "status": status}


async def _stream(app: Starlette) -> AsyncIterator[bytes]:
    sent: dict[str, Any] = {}
    quiet_since = time.monotonic()
    # retry: how long a browser's EventSource waits before reconnecting (ms)
    yield b"retry: 1000\n\n"
    while not is_stopping(app):
        for name, data in _views(app).items():
            if sent.get(name) != data:
                sent[name] = data
                quiet_since = time.monotonic()
                yield event(name, data)
        if time.monotonic() - quiet_since >= KEEPALIVE:
            quiet_since = time.monotonic()
            yield b": keepalive\n\n"
        await app_state(app).registry.wait_changed(TICK)


async def events(request: Request) -> Response:
    return StreamingResponse(_stream(request.app), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def routes() -> list[BaseRoute]:
    return endpoints.routes({"GET /admin/events": events})
