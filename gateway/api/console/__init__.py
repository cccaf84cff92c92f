"""The web console: a single page at GET / and /ui/, its files under /ui/NAME.

GET / is also where Ollama clients (ollama-python, Open WebUI, the ollama CLI's HEAD /) look for
"Ollama is running": a request whose Accept names text/html (a browser) gets the page, any other
the `other` handler `routes` is given (gateway/api/ollama.py's), so both work on one port.

The page is plain HTML, CSS and JavaScript in static/ (no build step, no CDN: it works offline).
The files are read once, when the routes are made, and served from memory with an ETag, so the
console costs the API nothing per request. Everything the page shows it asks the server for over
the public API: /admin/events (live models and reload status), /admin/models/*/load|unload,
/admin/reload, /metrics (activity) and /v1/chat/completions (playground).

The page holds no secret, so it is served without a key; the API calls it makes carry the key
the user types in when the server answers 401 (the page keeps it in sessionStorage and never
shows it).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute

from gateway.api import endpoints

STATIC = Path(__file__).with_name("static")
INDEX = "index.html"
PREFIX = "/ui/"
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png"}


def is_console_path(path: str) -> bool:
    """The page and its files: public, whatever the API keys (they hold nothing secret)."""
    return path in ("/", "/ui") or path.startswith(PREFIX)


@dataclass(frozen=True)
class _File:
    body: bytes
    media_type: str
    etag: str


def _read(directory: Path) -> dict[str, _File]:
    files = {}
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.suffix in _TYPES:
            body = path.read_bytes()
            etag = '"' + hashlib.blake2b(body, digest_size=8).hexdigest() + '"'
            files[path.name] = _File(body, _TYPES[path.suffix], etag)
    return files


def _serve(request: Request, file: _File) -> Response:
    # no-cache: the browser asks again each time, and an unchanged file costs a 304
    headers = {"ETag": file.etag, "Cache-Control": "no-cache",
               "X-Content-Type-Options": "nosniff"}
    if request.headers.get("if-none-match") == file.etag:
        return Response(status_code=304, headers=headers)
    return Response(file.body, media_type=file.media_type, headers=headers)


def wants_page(request: Request) -> bool:
    """A browser: its Accept names text/html (clients of the APIs send */* or JSON)."""
    return any(part.split(";")[0].strip().lower() == "text/html"
               for part in request.headers.get("accept", "").split(","))


def routes(directory: Path = STATIC, other: endpoints.Handler | None = None) -> list[BaseRoute]:
    """The console's routes; `other` answers GET / for what is not a browser."""
    files = _read(directory)
    index = files[INDEX]

    async def page(request: Request) -> Response:
        return _serve(request, index)

    async def root(request: Request) -> Response:
        if other is None or wants_page(request):
            response = _serve(request, index)
        else:
            response = await other(request)
        response.headers["Vary"] = "Accept"  # one URL, two bodies: caches must tell them apart
        return response

    async def asset(request: Request) -> Response:
        file = files.get(request.path_params["name"])
        if file is None:
            return Response("Not Found", status_code=404, media_type="text/plain")
        return _serve(request, file)

    async def to_page(request: Request) -> Response:
        return RedirectResponse(PREFIX, status_code=308)

    return endpoints.routes({
        "GET HEAD /": root,
        "GET HEAD /ui": to_page,
        f"GET HEAD {PREFIX}": page,
        f"GET HEAD {PREFIX}{{name}}": asset,
    })
