"""The backend seam: what a pool member is, whatever serves it (the local engine or a server).

A route hands a pool a `Call` (the endpoint, the body exactly as received, the alias asked); the
pool picks a member and awaits `member.serve(call)`, which returns the response to send or
raises `Retryable` when it failed before any byte reached the client, so another member may be
tried. The member's in-flight count spans the whole response, streams included (`Tracked`).
"""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.backends.health import Failure, Health, Stats
from gateway.errors import APIError

BackendKind = Literal["local", "upstream"]
BACKEND_HEADER = "X-Modelyard-Backend"  # which member served a pooled request

# The local path of a route: parse the body and serve it from the local entry `local_alias`,
# naming `shown` in the response (the pool's alias); (None, None) = the alias the body names.
LocalHandler = Callable[[Request, bytes, str | None, str | None], Awaitable[Response]]


@dataclass(frozen=True)
class Call:
    """One request for a pool: where it goes, what it carries, and the local path to use."""

    request: Request
    endpoint: str                 # "/chat/completions", "/completions", "/embeddings", ...
    body: bytes                   # as received: fields modelyard does not parse reach upstream
    alias: str                    # the alias the client asked for
    local: LocalHandler
    at_root: bool = False         # the endpoint is under the server's root, not its base URL
                                  # (llama.cpp's /completion beside OpenAI's /v1)


class Retryable(Exception):
    """A member failed before anything was sent: the pool may try another one."""

    def __init__(self, error: APIError, failure: Failure):
        super().__init__(error.message)
        self.error = error
        self.failure = failure


class Backend(Protocol):
    """A pool member."""

    @property
    def kind(self) -> BackendKind: ...

    @property
    def label(self) -> str: ...   # safe to show: no key

    @property
    def health(self) -> Health: ...

    @property
    def stats(self) -> Stats: ...

    @property
    def max_concurrent(self) -> int | None: ...

    async def serve(self, call: Call) -> Response: ...


@dataclass(eq=False)
class Measured:
    """What every backend keeps about itself: its health and its counts (each object changes
    itself as events come in; nothing replaces them)."""

    health: Health
    stats: Stats = field(default_factory=Stats)


class Tracked(Response):
    """`inner`, with `done()` called once when its last byte was sent or the client left."""

    def __init__(self, inner: Response, done: Callable[[], None]) -> None:
        # no super().__init__: the inner response renders itself; we only wrap its sending
        self.inner = inner
        self.status_code = inner.status_code
        self.background = None
        self._done = done

    @property
    def headers(self) -> MutableHeaders:
        return self.inner.headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.inner(scope, receive, send)
        finally:
            self._done()


def now() -> float:
    return time.monotonic()
