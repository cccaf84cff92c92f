"""ASGI plumbing the middlewares share."""
from __future__ import annotations

from starlette.types import Message, Send


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
