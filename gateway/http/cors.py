"""CORS from the config: `cors: {allow_origins: [...]}` (none by default, so no browser page on
another origin can call the API). Preflights (OPTIONS with Access-Control-Request-Method) are
answered here, before API keys are checked: browsers send them without credentials.

The origins are read from the running config per request, so a reload changes them at once;
Starlette's CORSMiddleware does the protocol, one instance per distinct setting.
"""
from __future__ import annotations

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.config import CorsSettings
from gateway.state import app_state

EXPOSED = ["Retry-After"]  # a browser app reading a 429 or 503 needs to see when to retry


class ConfigCors:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._built: tuple[tuple[str, ...], ASGIApp] | None = None

    def _for(self, settings: CorsSettings) -> ASGIApp:
        origins = tuple(settings.allow_origins)
        if self._built is None or self._built[0] != origins:
            self._built = (origins, CORSMiddleware(
                self.app, allow_origins=list(origins), allow_methods=["*"], allow_headers=["*"],
                expose_headers=EXPOSED, max_age=600))
        return self._built[1]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        settings = app_state(scope["app"]).config.cors if scope["type"] == "http" else None
        if settings is None or not settings.allow_origins:
            await self.app(scope, receive, send)
            return
        await self._for(settings)(scope, receive, send)
