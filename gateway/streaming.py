"""Server-sent events, and tying a request's resources to its connection.

Under Hypercorn a client disconnect cancels the task that is sending the stream. The response
below therefore releases what the request holds (its model lease) in `finally` around the whole
send - it runs once whether the stream ended, failed or the client left, even if the body
iterator never started. Closing the iterator runs its own `finally`, which cancels the
generation, so the model's worker moves on to the next request.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from .errors import to_api_error

log = logging.getLogger("modelyard.streaming")

DONE = b"data: [DONE]\n\n"
T = TypeVar("T")


# Characters some line readers (Python's str.splitlines among them) take for line breaks; SSE
# does not, but JSON may escape them, so we do and every client reads one event per line.
_LINE_BREAKS_IN_JSON = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\u0085": "\\u0085"}


def sse(payload: BaseModel | dict[str, Any]) -> bytes:
    """One `data:` event. JSON never contains a raw newline, so one line is enough."""
    if isinstance(payload, BaseModel):
        text = payload.model_dump_json()
    else:
        text = json.dumps(payload, ensure_ascii=False)
    for c, escaped in _LINE_BREAKS_IN_JSON.items():
        text = text.replace(c, escaped)
    return b"data: " + text.encode() + b"\n\n"


async def sse_body(chunks: AsyncIterator[BaseModel]) -> AsyncIterator[bytes]:
    """Encode chunks as events and end with `data: [DONE]`.

    An error after the headers went out cannot change the status any more; it is sent as an
    OpenAI error event (which the openai client raises) and the stream ends without [DONE].
    """
    try:
        async for chunk in chunks:
            yield sse(chunk)
    except Exception as exc:
        error = to_api_error(exc)
        if error.status >= 500:
            log.error("stream failed: %s", error.message, exc_info=exc)
        yield sse(error.body())
        return
    finally:
        await _aclose(chunks)
    yield DONE


async def _aclose(it: object) -> None:
    close = getattr(it, "aclose", None)
    if close is not None:
        result = close()
        if inspect.isawaitable(result):
            await result


class EventStreamResponse(StreamingResponse):
    """A `text/event-stream` response whose `on_close` runs exactly once, however it ends."""

    def __init__(self, chunks: AsyncIterator[BaseModel], on_close: Callable[[], None]) -> None:
        self._body = sse_body(chunks)
        super().__init__(self._body, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await asyncio.shield(_aclose(self._body))
            except BaseException:  # the body's own cleanup must not keep the lease
                log.exception("closing a stream failed")
            self._on_close()


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (http.disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it if the client disconnects first (then CancelledError)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task not in done:
            task.cancel()
            raise asyncio.CancelledError("client disconnected")
        return task.result()
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
