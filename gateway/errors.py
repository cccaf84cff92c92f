"""Exceptions -> OpenAI-shaped error bodies `{"error": {"message", "type", "param", "code"}}`.

`to_api_error` is the single mapping from anything raised while serving to an APIError;
`error_response` renders it. The app installs `handle_exception` for every exception type, so a
handler never builds an error body itself.

A route family whose clients expect another shape (Anthropic's /v1/messages, Ollama's /api/)
names its own `ErrorShape` for its paths with `shape_errors`: APIError -> the status and body
its clients read. The mapping stays the one above; only the rendering differs, and it follows
the path, so the middlewares' errors (keys, body limits) take the route's shape too.
"""
from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

import engine
from engine.chat import ChatTemplateError
from gateway.config import ModelNotFoundError
from gateway.fleet.registry import ModelLoadFailedError, RegistryBusyError
from gateway.generation.events import (
    ModelBrokenError,
    QueueFullError,
    SchedulerClosedError,
    ServerStoppingError,
)
from gateway.protocol import ErrorInfo, ErrorResponse, RequestValidationError

log = logging.getLogger("modelyard.errors")

# What a client must not see in a message: where files live on the server, and our class names.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])(?:/[^/\s:'\"()]+)+/([^/\s:'\"()]+)")
_CLASS_PREFIX = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception)): ")


def public_message(text: str) -> str:
    """`text` fit for a client: absolute paths cut to their file name, no leading class name."""
    return _ABSOLUTE_PATH.sub(r"\1", _CLASS_PREFIX.sub("", text))


class APIError(Exception):
    """An error with everything the client sees: status, OpenAI type/param/code, headers."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.extra = extra

    def body(self) -> dict[str, Any]:
        info = ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code,
                         **self.extra)
        return ErrorResponse(error=info).model_dump()


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def context_length_exceeded(n_prompt_tokens: int, n_ctx: int, param: str | None) -> APIError:
    return APIError(
        400,
        f"This model's maximum context length is {n_ctx} tokens, but the prompt has "
        f"{n_prompt_tokens} tokens. Shorten the prompt.",
        param=param, code="context_length_exceeded", n_prompt_tokens=n_prompt_tokens, n_ctx=n_ctx,
    )


def _retry_after(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def to_api_error(exc: BaseException) -> APIError:
    """The one mapping from exceptions to client-visible errors."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, RequestValidationError):
        return invalid_request(exc.message, exc.param)
    if isinstance(exc, ModelNotFoundError):
        available = ", ".join(exc.available) or "(none)"
        return APIError(404, f"The model '{exc.alias}' does not exist. Available models: {available}",
                        param="model", code="model_not_found")
    if isinstance(exc, ModelLoadFailedError):
        return APIError(500, f"Model could not be loaded: {public_message(exc.cause)}",
                        type="server_error", code="model_load_failed")
    if isinstance(exc, ModelBrokenError):  # a changed file may load again; corrupt weights not
        if exc.retryable:
            return APIError(503, public_message(str(exc)), type="server_error",
                            code="model_unavailable", headers=_retry_after(exc.retry_after))
        return APIError(500, public_message(str(exc)), type="server_error", code="model_failed")
    if isinstance(exc, RegistryBusyError | QueueFullError | SchedulerClosedError
                  | ServerStoppingError):
        return APIError(503, str(exc), type="server_error", code="server_busy",
                        headers=_retry_after(exc.retry_after))
    if isinstance(exc, ChatTemplateError):
        return invalid_request(f"The chat template rejected these messages: {exc}", "messages")
    if isinstance(exc, engine.ContextOverflowError):
        return context_length_exceeded(exc.n_tokens, exc.n_ctx, None)
    if isinstance(exc, HTTPException):
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return APIError(exc.status_code, str(exc.detail), type=kind, code=code,
                        headers=dict(exc.headers or {}))
    return APIError(500, "Internal server error; the server's log has the details",
                    type="server_error", code="internal_error")


# Exception types the app routes to `handle_exception` (anything else is a 500 from Starlette's
# outermost handler, which also logs it).
HANDLED: tuple[type[Exception], ...] = (
    APIError, RequestValidationError, ModelNotFoundError, ModelLoadFailedError, RegistryBusyError,
    QueueFullError, SchedulerClosedError, ModelBrokenError, ServerStoppingError, ChatTemplateError,
    engine.ContextOverflowError, HTTPException, Exception,
)


ErrorShape = Callable[[APIError], tuple[int, dict[str, Any]]]  # -> the status and the body


def openai_shape(err: APIError) -> tuple[int, dict[str, Any]]:
    return err.status, err.body()


_SHAPES: dict[str, ErrorShape] = {}  # path prefix -> the shape of its errors


def shape_errors(path_prefix: str, shape: ErrorShape) -> None:
    """Render the errors of requests under `path_prefix` with `shape` (see the docstring)."""
    _SHAPES[path_prefix] = shape


def shape_for(path: str) -> ErrorShape:
    """The error shape of `path`: the longest registered prefix's, else OpenAI's."""
    best = max((prefix for prefix in _SHAPES if path.startswith(prefix)), key=len, default=None)
    return openai_shape if best is None else _SHAPES[best]


def error_response(exc: BaseException, path: str = "") -> JSONResponse:
    """`exc` as the error response a request for `path` gets."""
    err = to_api_error(exc)
    status, body = shape_for(path)(err)
    return JSONResponse(body, status_code=status, headers=err.headers)


async def handle_exception(request: Request, exc: Exception) -> JSONResponse:
    response = error_response(exc, request.url.path)
    if response.status_code >= 500 and not isinstance(exc, APIError):
        log.error("%s %s failed: %s", request.method, request.url.path, exc, exc_info=exc)
    return response
