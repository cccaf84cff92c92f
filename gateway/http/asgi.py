"""ASGI plumbing the middlewares share."""
from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HttpMiddleware:
    """ASGI middleware for HTTP requests: `http()` sees each one; lifespan and other scopes
    pass straight through to the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


class StatusNotingSend:
    """A `send` that passes every message on and keeps the response's status (0 until the
    response starts: a request that never answered)."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.status = 0

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self._send(message)
