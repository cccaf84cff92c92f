"""A small HTTP server on loopback for download tests (a package index, a model hub): never the
network. Each path answers as its Route says: a body with byte ranges (`Range: bytes=N-`, 206),
a redirect, a status, a required bearer token, or a body cut short after some bytes once (a
dropped connection, for resume tests). Requests are recorded, headers included.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Route:
    body: bytes = b""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    redirect: str | None = None       # answer 302 to this path (or URL)
    token: str | None = None          # required as `Authorization: Bearer TOKEN`, else 401
    cut_after: int | None = None      # send this many bytes of the body, then drop (once)


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]


class FakeServer:
    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.seen: list[Seen] = []
        self.url = ""

    def handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                self._answer(head=True)

            def do_GET(self) -> None:
                self._answer(head=False)

            def _answer(self, head: bool) -> None:
                path = self.path.split("?", 1)[0]
                server.seen.append(Seen(self.command, path, {k.lower(): v for k, v in
                                                             self.headers.items()}))
                route = server.routes.get(path)
                if route is None:
                    return self._plain(404, b'{"error": "Entry not found"}', head)
                if route.token is not None and \
                        self.headers.get("Authorization") != f"Bearer {route.token}":
                    return self._plain(401, b'{"error": "Invalid credentials"}', head)
                if route.redirect is not None:
                    self.send_response(302)
                    self.send_header("Location", route.redirect)
                    for k, v in route.headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                if route.status != 200:
                    return self._plain(route.status, route.body, head)
                body, start = route.body, 0
                wanted = self.headers.get("Range")
                if wanted and wanted.startswith("bytes=") and wanted.endswith("-"):
                    start = int(wanted[len("bytes="):-1])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                part = body[start:]
                for k, v in route.headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(part)))
                self.end_headers()
                if head:
                    return None
                if route.cut_after is not None:
                    self.wfile.write(part[:route.cut_after])
                    route.cut_after = None  # the next attempt gets the rest
                    self.wfile.flush()
                    self.close_connection = True
                    return None
                self.wfile.write(part)
                return None

            def _plain(self, status: int, body: bytes, head: bool) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

        return Handler


@contextmanager
def serving() -> Iterator[FakeServer]:
    fake = FakeServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
    fake.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        httpd.shutdown()
        httpd.server_close()
