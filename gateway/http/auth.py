"""API keys, per-key limits, and which models a key may use.

    request -> public path (auth.public: /health, /metrics; the console's page) -> through
            -> admin path while the admin routes are closed (no config, exposed)? -> 403
            -> no keys configured at all? ------------------------------------> through
            -> key from `Authorization: Bearer K` or `X-Api-Key: K`
               none -> 401 | no match -> 401 (invalid_api_key)
            -> admin path (/admin/*, POST /models/load|unload)? needs the admin key, else 403
            -> the key's limits: max_concurrent in flight, requests_per_minute
               (a sliding minute) -> 429 + Retry-After
            -> through, with the key noted in scope["state"]["api_key"]; the routes ask
               check_model() before acquiring a model (403 model_not_allowed)

Keys are compared with hmac.compare_digest against every configured key (the time taken does not
depend on which one, or how much of one, matched). A key's value is never logged: logs and the
`modelyard_key_requests_total` metric name it by its `name`. The config is read per request, so
a reload changes keys and limits at once; the limits' counters live here, by key name.
"""
from __future__ import annotations

import hmac
import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.api.console import is_console_path
from gateway.config import AuthSettings, Config
from gateway.errors import APIError, error_response
from gateway.http.asgi import HttpMiddleware, StatusNotingSend
from gateway.state import app_state

ADMIN = "admin"               # the name the admin key goes by
WINDOW = 60.0                 # requests_per_minute counts over this sliding window (s)


@dataclass(frozen=True)
class KeyInfo:
    """The key a request came with, as the routes may ask about it (never its value)."""

    name: str
    models: tuple[str, ...] | None   # aliases it may use; None = all
    admin: bool


def is_admin_path(method: str, path: str) -> bool:
    return path.startswith("/admin/") or path == "/admin" or (
        method == "POST" and path in ("/models/load", "/models/unload"))


def _presented(scope: Scope) -> str | None:
    headers: dict[bytes, bytes] = dict(scope.get("headers") or [])
    auth = headers.get(b"authorization", b"").decode("latin-1").strip()
    if auth[:7].lower() == "bearer " and auth[7:].strip():
        return auth[7:].strip()
    key = headers.get(b"x-api-key", b"").decode("latin-1").strip()
    return key or None


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def identify(settings: AuthSettings, presented: str) -> KeyInfo | None:
    """The key `presented` is, checking every configured key (constant time per key)."""
    found: KeyInfo | None = None
    admin = settings.admin_key
    if admin is not None and _same(presented, admin.get_secret_value()):
        found = KeyInfo(ADMIN, None, admin=True)
    for key in settings.keys:
        if _same(presented, key.key.get_secret_value()) and found is None:
            found = KeyInfo(key.name, tuple(key.models) if key.models is not None else None,
                            admin=False)
    return found


def _error(status: int, message: str, code: str | None, *, type: str = "invalid_request_error",
           headers: dict[str, str] | None = None) -> APIError:
    return APIError(status, message, type=type, code=code, headers=headers)


class _Limits:
    """Per key name: requests in flight and the start times of the last minute's requests."""

    def __init__(self) -> None:
        self.in_flight: dict[str, int] = {}
        self.recent: dict[str, deque[float]] = {}

    def admit(self, name: str, max_concurrent: int | None, per_minute: int | None,
              now: float) -> APIError | None:
        if max_concurrent is not None and self.in_flight.get(name, 0) >= max_concurrent:
            return _error(429, f"Key '{name}' has {max_concurrent} requests running already "
                               "(max_concurrent); retry when one is done", "rate_limit_exceeded",
                          type="requests", headers={"Retry-After": "1"})
        recent = self.recent.setdefault(name, deque())
        while recent and recent[0] <= now - WINDOW:
            recent.popleft()
        if per_minute is not None and len(recent) >= per_minute:
            wait = max(1, math.ceil(recent[0] + WINDOW - now))
            return _error(429, f"Rate limit reached for key '{name}': {per_minute} requests per "
                               f"minute; retry in {wait}s", "rate_limit_exceeded",
                          type="requests", headers={"Retry-After": str(wait)})
        recent.append(now)
        self.in_flight[name] = self.in_flight.get(name, 0) + 1
        return None

    def done(self, name: str) -> None:
        self.in_flight[name] -= 1


class AuthMiddleware(HttpMiddleware):
    """Checks keys and limits before any route runs (see the module doc)."""

    def __init__(self, app: ASGIApp) -> None:
        super().__init__(app)
        self.limits = _Limits()

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = app_state(scope["app"])
        settings = state.config.auth
        path, method = scope["path"], scope["method"]
        public = SAME_AS.get(path, path) in settings.public
        if settings.admin_closed and is_admin_path(method, path):
            closed = _error(403, "The admin routes are closed: this server was started "
                                    "without a config on an address beyond loopback, where no "
                                    "key guards them. Serve a config with auth.admin_key to use "
                                    f"{path}.", "permission_denied")
            await error_response(closed, path)(scope, receive, send)
            return
        if (not settings.enabled or public or method == "OPTIONS"
                or (method in ("GET", "HEAD") and is_console_path(path))):
            await self.app(scope, receive, send)
            return
        presented = _presented(scope)
        info = identify(settings, presented) if presented else None
        rejection = None
        if presented is None:
            rejection = _error(401, "You didn't provide an API key: send it as `Authorization: "
                                    "Bearer KEY` or `X-Api-Key: KEY`.", None)
        elif info is None:
            rejection = _error(401, "Incorrect API key provided.", "invalid_api_key")
        elif is_admin_path(method, path) and not info.admin:
            rejection = _error(403, f"Key '{info.name}' may not use {path}: it needs the admin "
                                    "key (auth.admin_key)", "permission_denied")
        metrics = state.metrics
        if rejection is not None:
            metrics.key_request(info.name if info else "-", rejection.status)
            await error_response(rejection, path)(scope, receive, send)
            return
        assert info is not None
        key = next((k for k in settings.keys if k.name == info.name), None)
        limited = self.limits.admit(info.name, key.max_concurrent if key else None,
                                    key.requests_per_minute if key else None, time.monotonic())
        if limited is not None:
            metrics.key_request(info.name, 429)
            await error_response(limited, path)(scope, receive, send)
            return
        scope.setdefault("state", {})["api_key"] = info
        noting = StatusNotingSend(send)
        try:
            await self.app(scope, receive, noting)
        finally:
            self.limits.done(info.name)
            metrics.key_request(info.name, noting.status or 500)


# paths that answer as another one does, and so are public exactly when it is
SAME_AS = {"/v1/health": "/health", "/metrics/activity": "/metrics"}  # as public as these


def _key(request: Request) -> KeyInfo | None:
    return getattr(request.state, "api_key", None)


def _allowed_entries(config: Config, info: KeyInfo) -> set[str]:
    """The local entries (by name) a key may use: those with an alias in its list (any alias
    of the entry then works). Entries, not model files: two entries on one file differ in
    context, template and limits, and a key granted one is not granted the other."""
    allowed = set(info.models or ())
    return {e.name for e in config.models if allowed & set(e.aliases)}


def check_model(request: Request, alias: str) -> None:
    """403 model_not_allowed if the request's key may not use `alias` (unknown aliases pass:
    the registry answers 404 for them)."""
    info = _key(request)
    if info is None or info.models is None:
        return
    config = app_state(request.app).config
    try:
        entry = config.resolve(alias)
    except LookupError:
        return
    if entry.name not in _allowed_entries(config, info):
        raise APIError(403, f"Key '{info.name}' may not use the model '{alias}'",
                       param="model", code="model_not_allowed")


def check_named(request: Request, alias: str) -> None:
    """403 model_not_allowed unless the request's key lists `alias` itself (an upstream alias
    has no model file to share with other aliases)."""
    info = _key(request)
    if info is not None and info.models is not None and alias not in info.models:
        raise APIError(403, f"Key '{info.name}' may not use the model '{alias}'",
                       param="model", code="model_not_allowed")


def visible_aliases(request: Request, aliases: Iterable[str]) -> list[str] | None:
    """The aliases a key may see in model lists; None = all."""
    info = _key(request)
    if info is None or info.models is None:
        return None
    config = app_state(request.app).config
    entries = _allowed_entries(config, info)
    return [a for a in aliases
            if (config.resolve(a).name in entries if config.is_local(a, exact=True)
                else a in info.models)]
