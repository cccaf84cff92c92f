"""Stream framing (server-sent events, NDJSON), and tying a request's resources to its connection.

A wire chooses its framing (`SSE` for OpenAI and llama.cpp, `SSE_EVENTS` for Anthropic's named
events, `NDJSON` for Ollama's /api/*): how a
chunk becomes bytes, the media type, and what ends a stream. Everything else below - the error
event, the release in `finally` - is the same for every framing.

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
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.errors import APIError, to_api_error
from gateway.generation.events import ServerStoppingError

log = logging.getLogger("modelyard.streaming")

DONE = b"data: [DONE]\n\n"
T = TypeVar("T")


# Characters some line readers (Python's str.splitlines among them) take for line breaks; SSE
# does not, but JSON may escape them, so we do and every client reads one event per line.
_LINE_BREAKS_IN_JSON = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\u0085": "\\u0085"}


def _escape_line_breaks(text: str) -> str:
    for c, escaped in _LINE_BREAKS_IN_JSON.items():
        text = text.replace(c, escaped)
    return text


def sse(payload: BaseModel | dict[str, Any]) -> bytes:
    """One `data:` event. JSON never contains a raw newline, so one line is enough."""
    if isinstance(payload, BaseModel):
        text = payload.model_dump_json()
    else:
        text = json.dumps(payload, ensure_ascii=False)
    return b"data: " + _escape_line_breaks(text).encode() + b"\n\n"


def ndjson(payload: BaseModel | dict[str, Any]) -> bytes:
    """One JSON object on its own line (Ollama's streams)."""
    if isinstance(payload, BaseModel):
        text = payload.model_dump_json()
    else:
        text = json.dumps(payload, ensure_ascii=False)
    return _escape_line_breaks(text).encode() + b"\n"


@dataclass(frozen=True)
class Framing:
    """How one wire frames its stream: a chunk's bytes, the media type, the end marker."""
    media_type: str
    frame: Callable[[BaseModel | dict[str, Any]], bytes]
    end: bytes  # sent after the last chunk (and after an error event at shutdown); b"": none


SSE = Framing("text/event-stream", sse, DONE)
SSE_EVENTS = Framing("text/event-stream", sse, b"")  # named events; the last one ends the stream
NDJSON = Framing("application/x-ndjson", ndjson, b"")

ErrorEvent = Callable[[APIError], dict[str, Any] | bytes]  # a payload, or a whole framed event


# json's string encoder agrees with pydantic's on every code point (non-ASCII kept, control
# characters as \uXXXX); tests/gateway/test_streaming.py checks it
_json_string = encode_basestring


class TextEventTemplate:
    """A stream's text chunks as SSE events, rendered by pydantic once and then filled in per token.

    The text chunks of one stream differ only in the choice index and the text. pydantic renders
    a sample chunk that carries marker values in those two places; each event is then the sample's
    bytes with the markers replaced - the bytes `sse(chunk)` gives, for a fraction of the CPU (no
    model construction or validation per token). The markers are searched from the end: the
    choices come after the id and the model name, which might contain anything.
    """
    INDEX = -987654321     # marker values for the sample chunk
    TEXT = "\x00text\x00"

    def __init__(self, sample: BaseModel) -> None:
        event = sse(sample)
        index_mark, text_mark = str(self.INDEX).encode(), _json_string(self.TEXT).encode()
        at_text = event.rindex(text_mark)
        at_index = event.rindex(index_mark, 0, at_text)
        self._head = event[:at_index]
        self._middle = event[at_index + len(index_mark):at_text]
        self._tail = event[at_text + len(text_mark):]

    def event(self, index: int, text: str) -> bytes:
        """The event of `sample` with this choice index and text."""
        body = _escape_line_breaks(_json_string(text)).encode()
        return b"".join((self._head, str(index).encode(), self._middle, body, self._tail))


def openai_error(error: APIError) -> dict[str, Any]:
    """OpenAI's error object (llama.cpp's server sends the same shape)."""
    return error.body()


async def sse_body(chunks: AsyncIterator[BaseModel | bytes | dict[str, Any]],
                   error_event: ErrorEvent = openai_error,
                   framing: Framing = SSE) -> AsyncIterator[bytes]:
    """Encode chunks in `framing` (bytes are framed already) and end with its end marker
    (SSE: `data: [DONE]`).

    An error after the headers went out cannot change the status any more; it is sent as an
    error event in the wire's shape (`error_event`; OpenAI's, which the openai client raises)
    and the stream ends without `done` -
    except when the server's shutdown deadline ended it: the stream was fine, so it closes
    properly, with `done` after the error event.
    """
    frame = framing.frame
    try:
        async for chunk in chunks:
            yield chunk if isinstance(chunk, bytes) else frame(chunk)
    except Exception as exc:
        error = to_api_error(exc)
        if error.status >= 500:
            log.error("stream failed: %s", error.message, exc_info=exc)
        event = error_event(error)
        yield event if isinstance(event, bytes) else frame(event)
        if isinstance(exc, ServerStoppingError) and framing.end:
            yield framing.end
        return
    finally:
        await _aclose(chunks)
    if framing.end:
        yield framing.end


async def _aclose(it: object) -> None:
    close = getattr(it, "aclose", None)
    if close is not None:
        result = close()
        if inspect.isawaitable(result):
            await result


class EventStreamResponse(StreamingResponse):
    """A streamed response (SSE unless `framing` says otherwise) whose `on_close` runs exactly
    once, however it ends."""

    def __init__(self, chunks: AsyncIterator[BaseModel | bytes | dict[str, Any]],
                 on_close: Callable[[], None],
                 error_event: ErrorEvent = openai_error,
                 framing: Framing = SSE) -> None:
        self._body = sse_body(chunks, error_event, framing)
        super().__init__(self._body, media_type=framing.media_type,
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
