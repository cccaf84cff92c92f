"""What one request may cost: its body's size and the time it takes to arrive (config `limits`).

`BodyLimits` wraps the app's `receive`. A `Content-Length` over `limits.max_body` is answered 413
before a byte of the body is read; a body without one (chunked) is counted as it arrives and
refused as soon as it passes the limit. A body still incomplete `limits.body_timeout` after the
request began gets 408. Both answers carry `Connection: close`, so the connection is dropped
rather than read on: a client trickling a body (or announcing more than it sends) holds nothing.
After the body is complete the wrapper steps aside (routes keep receiving to see a disconnect).

The limits are read from the app's config (gateway/state.py) for each request, so a reload applies them.
"""
from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from gateway.config import LimitSettings
from gateway.errors import APIError, error_response
from gateway.http.asgi import HttpMiddleware
from gateway.state import app_state
from gateway.units import format_duration, format_size

CLOSE = {"Connection": "close"}


def body_too_large(limit: int) -> APIError:
    return APIError(413, f"The request body is larger than this server accepts "
                         f"({format_size(limit)}, limits.max_body)", code="request_too_large",
                    headers=CLOSE)


def body_too_slow(seconds: float) -> APIError:
    return APIError(408, f"The request body did not arrive within "
                         f"{format_duration(seconds)} (limits.body_timeout)",
                    code="request_timeout", headers=CLOSE)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyLimits(HttpMiddleware):
    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        limits = app_state(scope["app"]).config.limits if "app" in scope else LimitSettings()
        length = _content_length(scope)
        if length is not None and length > limits.max_body:
            refusal = error_response(body_too_large(limits.max_body), scope["path"])
            await refusal(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limits.body_timeout
        received = 0
        complete = False

        async def limited_receive() -> Message:
            nonlocal received, complete
            if complete:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message: dict[str, Any] = dict(await receive())
            except TimeoutError:
                raise body_too_slow(limits.body_timeout) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limits.max_body:
                    raise body_too_large(limits.max_body)
                complete = not message.get("more_body", False)
            return message

        await self.app(scope, limited_receive, send)
