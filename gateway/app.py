"""The ASGI application: routes, error handlers, request log, and the registry's lifespan."""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .config import Config
from .errors import HANDLED, handle_exception
from .registry import Registry
from .routes import routes
from .scheduler import load_served_model

access_log = logging.getLogger("modelyard.access")


class RequestLog:
    """One log line per HTTP request: method, path, status, duration (also for streams)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 0

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            client = scope.get("client") or ("-", 0)
            ms = (time.perf_counter() - start) * 1000
            access_log.info("%s %s %s %s %.0fms", client[0], scope["method"], scope["path"],
                            status or "-", ms)


def create_app(config: Config, *, loader: Callable[[Any], Any] = load_served_model) -> Starlette:
    """The gateway for `config`. Models load lazily on first use (or at start-up if pinned)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        registry = Registry(config, loader=loader)
        app.state.registry = registry
        await registry.start()
        try:
            yield
        finally:
            await registry.close()

    app = Starlette(
        routes=routes(),
        lifespan=lifespan,
        exception_handlers={cls: handle_exception for cls in HANDLED},
    )
    app.state.config = config
    app.state.started = int(time.time())
    app.add_middleware(RequestLog)
    return app
