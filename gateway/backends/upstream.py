"""One upstream server as a pool member: forward a request, stream its bytes back as they come.

The body goes upstream as received (only `model` is rewritten, when the config names another
model for the server), so fields modelyard does not parse still arrive. The response is sent on
once its first body chunk is in: until then a failure (no connection, a timeout, 502/503/504) is
`Retryable` and the pool tries another server; after it, bytes flow straight through, and a
broken connection ends an event stream with an OpenAI error event naming the server. A client
that leaves closes the upstream response, which closes its connection: the server sees the
disconnect and stops generating. At the shutdown deadline (gateway/shutdown.py) every relay
still running is ended as a local stream is: an event stream gets the stopping error as an
event (and OpenAI's `[DONE]` on OpenAI's routes), then the upstream connection closes.

Errors say which server failed by its label (gateway/config/upstream.py), never by its key; every
string an upstream's error holds is masked (gateway/backends/masking.py) before it is passed on.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from email.utils import parsedate_to_datetime
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.backends.base import BACKEND_HEADER, BackendKind, Call, Measured, Retryable, now
from gateway.backends.health import Failure, Health
from gateway.backends.masking import Masker, secret_header_values
from gateway.config.upstream import UpstreamServer
from gateway.errors import APIError

log = logging.getLogger("modelyard.upstream")

RETRY_STATUSES = frozenset({502, 503, 504})
# OpenAI's routes, whose streams end with `data: [DONE]` (a stopped relay sends it as a local
# stream does; Anthropic's and the Responses API's events have no such marker)
_DONE_ENDPOINTS = frozenset({"/chat/completions", "/completions"})
MAX_ERROR_BODY = 64 * 1024  # of an upstream's error response, read to pass its message on


class UpstreamBackend(Measured):
    """An upstream server: its connections, health and counts (kept across reloads that leave
    its settings alone)."""

    kind: BackendKind = "upstream"

    def __init__(self, server: UpstreamServer, *, cooldown: float, probing: bool) -> None:
        super().__init__(Health(cooldown=cooldown, probing=probing))
        self.server = server
        self.discovered: list[str] = []   # the aliases it serves (discover: true), by the probe
        self.retired = False
        self._relays: set[_Relay] = set()  # streams being relayed, for the shutdown deadline
        limits = httpx.Limits(max_connections=server.max_concurrent,
                              max_keepalive_connections=server.max_concurrent or 20)
        # no cookie jar: one client's upstream session must not be replayed for every other
        self.client = httpx.AsyncClient(limits=limits, trust_env=False,
                                        cookies=_refusing_jar())
        key = server.api_key
        self.masker = Masker([*([] if key is None else [key.get_secret_value()]),
                              *secret_header_values(server.headers)])

    @property
    def label(self) -> str:
        return self.server.label

    @property
    def max_concurrent(self) -> int | None:
        return self.server.max_concurrent

    # -- requests --------------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity",
                   **self.server.headers}
        if self.server.api_key is not None:
            headers["Authorization"] = f"Bearer {self.server.api_key.get_secret_value()}"
        return headers

    def _timeout(self) -> httpx.Timeout:
        s = self.server
        return httpx.Timeout(s.timeout, connect=s.connect_timeout, pool=s.timeout)

    async def serve(self, call: Call) -> Response:
        """The upstream's response, once its first bytes are in; Retryable before that."""
        body = _with_model(call.body, self.server.model)
        base = self.server.server_root if call.at_root else self.server.url
        request = self.client.build_request("POST", base + call.endpoint,
                                            content=body, headers=self._headers(),
                                            timeout=self._timeout())
        started = time.perf_counter()
        try:
            response = await self.client.send(request, stream=True)
        except httpx.TimeoutException:
            raise self._retryable(Failure.TIMEOUT, 504, "upstream_timeout",
                                  f"no answer within {self.server.connect_timeout:g}s "
                                  "(connect) or timeout") from None
        except httpx.HTTPError as e:
            raise self._retryable(Failure.CONNECT, 502, "upstream_unavailable",
                                  f"cannot connect ({_why(e)})") from None
        try:
            if response.status_code >= 400:
                raw = await _read_some(response)
                error = self._answered_error(response.status_code, raw,
                                             response.headers.get("retry-after"))
                if response.status_code in RETRY_STATUSES:
                    self.health.failed(now(), error.message)
                    self.stats.error(Failure.STATUS)
                    raise Retryable(error, Failure.STATUS)
                await response.aclose()
                return JSONResponse(error.body(), status_code=error.status,
                                    headers={BACKEND_HEADER: self.label, **error.headers})
            chunks = response.aiter_raw()
            try:
                first = await anext(chunks, b"")
            except httpx.TimeoutException:
                raise self._retryable(Failure.TIMEOUT, 504, "upstream_timeout",
                                      f"no first byte within {self.server.timeout:g}s") from None
            except httpx.HTTPError as e:
                raise self._retryable(Failure.CONNECT, 502, "upstream_unavailable",
                                      f"the connection failed before the first byte "
                                      f"({_why(e)})") from None
        except BaseException:
            await response.aclose()
            raise
        self.stats.first_byte(time.perf_counter() - started)
        return _Relay(self, response, first, chunks, done_marker=call.endpoint in _DONE_ENDPOINTS)

    def _retryable(self, kind: Failure, status: int, code: str, why: str) -> Retryable:
        message = self.mask(f"upstream {self.label}: {why}")
        self.health.failed(now(), message)
        self.stats.error(kind)
        return Retryable(APIError(status, message, type="server_error", code=code), kind)

    def _answered_error(self, status: int, raw: bytes, retry_after: str | None) -> APIError:
        """The upstream's own error, in OpenAI's shape, its message prefixed with our label.

        Every string field is masked, then truncated: an upstream may echo its key in any of
        them, and a body read up to MAX_ERROR_BODY may end in a key's first characters."""
        cut = len(raw) >= MAX_ERROR_BODY
        info: dict[str, Any] = {}
        try:
            parsed = json.loads(raw)
            if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
                info = parsed["error"]
            elif isinstance(parsed, dict) and isinstance(parsed.get("detail"), str):
                info = {"message": parsed["detail"]}  # FastAPI's shape (vLLM, llama-cpp-python)
        except ValueError:
            pass
        def text_of(key: str) -> str | None:
            value = info.get(key)
            return self.masker.mask_field(value) if isinstance(value, str) else None

        raw_text = self.masker.mask_field(raw.decode("utf-8", "replace").strip(), cut=cut)
        text = text_of("message") or raw_text or f"HTTP {status}"
        kind = text_of("type") or ("invalid_request_error" if status < 500 else "server_error")
        code = text_of("code") or ("upstream_error" if status >= 500 else None)
        param = text_of("param")
        headers = ({"Retry-After": retry_after}
                   if retry_after is not None and _is_retry_after(retry_after) else {})
        return APIError(status if status < 500 else 502,
                        self.mask(f"upstream {self.label} answered {status}: {text}"),
                        type=kind, param=param, code=code, headers=headers)

    def mask(self, text: str) -> str:
        """`text` with this server's secrets (should they appear) replaced by ***."""
        return self.masker.mask(text)

    def abort_relays(self, error: APIError) -> None:
        """End every stream being relayed now, telling its client `error` (the shutdown
        deadline); each closes its upstream connection as it ends."""
        for relay in list(self._relays):
            relay.abort(error)

    def stream_failed(self, why: str) -> bytes:
        """A failure after bytes were sent: counted, and said as an SSE error event."""
        message = self.mask(f"upstream {self.label} failed mid-stream: {why}")
        self.health.failed(now(), message)
        self.stats.error(Failure.STREAM)
        log.warning("%s", message)
        body = APIError(502, message, type="server_error", code="upstream_error").body()
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    # -- probing and closing ---------------------------------------------------------------------

    async def probe(self, path: str | None, timeout: float) -> None:
        """GET the probe path; healthy if it answers 2xx. With discover, read /models' ids."""
        url = self.server.url + "/models" if path is None or self.server.discover else (
            self.server.server_root + path)
        try:
            r = await self.client.get(url, headers=self._headers(), timeout=timeout)
            if r.status_code >= 300:
                raise ValueError(f"{url} answered {r.status_code}")
            if self.server.discover:
                self.discovered = _model_ids(r.json())
        except (httpx.HTTPError, ValueError) as e:
            if self.health.state.value == "healthy":
                log.warning("upstream %s is unhealthy: probe failed (%s)", self.label, _why(e))
            self.health.failed(now(), self.mask(f"probe failed: {_why(e)}"))
            self.stats.error(Failure.PROBE)
            return
        if self.health.state.value != "healthy":
            log.info("upstream %s is healthy again", self.label)
        self.health.probe_ok(now())

    async def close(self) -> None:
        await self.client.aclose()


class _Relay(StreamingResponse):
    """The upstream response's status, type and bytes, sent on as they arrive, until the
    upstream ends, fails, the client leaves or abort() (the shutdown deadline) ends it."""

    def __init__(self, backend: UpstreamBackend, response: httpx.Response, first: bytes,
                 rest: AsyncIterator[bytes], *, done_marker: bool) -> None:
        self._backend = backend
        self._upstream = response
        self._events = "text/event-stream" in response.headers.get("content-type", "")
        self._done_marker = done_marker and self._events
        self._aborted: asyncio.Future[APIError] = asyncio.get_running_loop().create_future()
        self._reading: asyncio.Future[bytes | None] | None = None  # the upstream read under way
        self._body = self._relay(first, rest)
        headers = {BACKEND_HEADER: backend.label}
        if self._events:
            headers.update({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        super().__init__(self._body, status_code=response.status_code, headers=headers,
                         media_type=response.headers.get("content-type", "application/json"))
        backend._relays.add(self)

    def abort(self, error: APIError) -> None:
        if not self._aborted.done():
            self._aborted.set_result(error)

    async def _relay(self, first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        tail = first[-2:]
        if first:
            yield first
        try:
            while True:
                chunk = await self._next(rest)
                if chunk is None:
                    break
                if isinstance(chunk, APIError):  # the shutdown deadline
                    if self._events:
                        yield ((b"" if tail == b"\n\n" else b"\n\n") + b"data: "
                               + json.dumps(chunk.body()).encode() + b"\n\n"
                               + (b"data: [DONE]\n\n" if self._done_marker else b""))
                    return
                if chunk:
                    tail = (tail + chunk)[-2:]
                    yield chunk
        except httpx.HTTPError as e:
            if not self._events:
                raise  # a JSON body cannot say more: the connection ends incomplete
            # end the event the server was sending, then say what happened
            yield (b"" if tail == b"\n\n" else b"\n\n") + self._backend.stream_failed(_why(e))

    async def _next(self, rest: AsyncIterator[bytes]) -> bytes | APIError | None:
        """The upstream's next chunk (None at its end), or the abort's error if that comes
        first."""
        if self._aborted.done():
            return self._aborted.result()
        read = self._reading = asyncio.ensure_future(anext(rest, None))
        try:
            await asyncio.wait((read, self._aborted), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not read.done():  # aborted, or the client left: _close waits for it to end
                read.cancel()
        if read.done() and not read.cancelled():
            return read.result()
        return self._aborted.result()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._backend._relays.discard(self)
            # the client may have left mid-stream: closing the connection cancels upstream
            await asyncio.shield(self._close())

    async def _close(self) -> None:
        try:
            await self._body.aclose()  # type: ignore[attr-defined]
            if self._reading is not None:  # a read cancelled mid-way: let it unwind first
                await asyncio.wait((self._reading,))
                if not self._reading.cancelled():
                    self._reading.exception()  # seen: a late read error is no loose end
        finally:
            await self._upstream.aclose()


def _with_model(body: bytes, model: str | None) -> bytes:
    """The body with `model` set to the configured upstream name (untouched without one)."""
    if model is None:
        return body
    try:
        data = json.loads(body)
    except ValueError:
        return body  # not ours to judge: the upstream answers with its own 400
    if not isinstance(data, dict) or data.get("model") == model:
        return body
    data["model"] = model
    return json.dumps(data, ensure_ascii=False).encode()


async def _read_some(response: httpx.Response) -> bytes:
    out = b""
    try:
        async for chunk in response.aiter_raw():
            out += chunk
            if len(out) >= MAX_ERROR_BODY:
                break
    except httpx.HTTPError:
        pass
    finally:
        await response.aclose()
    return out[:MAX_ERROR_BODY]


def _model_ids(listing: object) -> list[str]:
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list):
        raise ValueError("the model list has no `data` list")
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


def _refusing_jar() -> CookieJar:
    """A jar that keeps no cookie: what goes upstream is the configured headers, nothing learned."""
    return CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))


def _is_retry_after(value: str) -> bool:
    """Seconds or an HTTP date: anything else (an echoed secret, say) is not passed on."""
    if value.isdigit():
        return True
    try:
        return parsedate_to_datetime(value) is not None
    except (TypeError, ValueError):
        return False


def _why(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
